"""Peaks per precision in system profiles: the dgx-b200 profile, the `peaks:` block, and the old single-peak
profiles, which keep what they meant."""

import pytest

from nlp_bench.errors import SpecError
from nlp_bench.spec.switches import decode, read_settings
from nlp_bench.spec.systems import known_systems, load_system, load_system_file


def test_dgx_b200_gives_every_figure_dense_per_gpu_with_its_source():
    b200 = load_system("dgx-b200")
    assert (b200.devices_per_node, b200.device_memory_gib, b200.memory_bandwidth_gbps) == (8, 180, 8000)
    assert (b200.intra_node_gbps, b200.inter_node_gbps) == (900, 400)  # NVLink 5 one way; 8 x 400 Gb/s
    assert {p: e["tflops"] for p, e in b200.peaks.items()} == {"bf16": 2250, "fp8": 4500, "mxfp8": 4500, "nvfp4": 9000}
    for precision, entry in b200.peaks.items():
        source = entry["source"]  # says it halved the sparse figure
        assert "NVIDIA" in source and "sparsity" in source and "dense" in source, precision
    # the single-peak keys follow from the block, so everything that reads them (catalog, planner) sees B200's
    assert (b200.peak_tflops, b200.peak_precision, b200.peak_fp8_tflops) == (2250, "bf16", 4500)
    assert b200.peak_source == b200.peaks["bf16"]["source"]
    for key in ("devices_per_node", "device_memory_gib", "memory_bandwidth_gbps", "intra_node_gbps", "inter_node_gbps"):
        assert "NVIDIA DGX B200 datasheet" in b200.sources[key], key


def test_each_run_precision_gets_its_own_peak_on_b200():
    b200 = load_system("dgx-b200")
    chosen = {p: b200.peak(p)[0] for p in ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32")}
    assert {p: (c.precision, c.tflops) for p, c in chosen.items()} == {
        "bf16": ("bf16", 2250), "fp16": ("bf16", 2250), "fp8": ("fp8", 4500), "mxfp8": ("mxfp8", 4500),
        "nvfp4": ("nvfp4", 9000), "fp32": ("bf16", 2250)}
    assert chosen["fp16"].note is None  # FP16 and BF16 share one rate
    assert "no fp32 peak" in chosen["fp32"].note  # an upper bound, said


def test_a_single_peak_profile_means_what_it_meant():
    h100, local = load_system("h100-8"), load_system("local")
    bf16, fp8 = h100.peak("bf16")[0], h100.peak("fp8")[0]
    assert (bf16.tflops, fp8.tflops) == (989, 1979)
    assert "device table" in bf16.source and "1979 dense" in fp8.source
    assert h100.peak("mxfp8")[0].tflops == 1979  # MXFP8's GEMMs never beat the FP8 rate
    assert local.peak("bf16")[0].tflops == 0.1 and local.peak("fp32")[0].note is None  # its one fp32 peak, as before
    a100 = load_system("selene")
    peak, why = a100.peak("fp8")
    assert peak is None and "no fp8 peak" in why  # never the BF16 peak for an FP8 run (it would read double)


def test_every_shipped_profile_with_a_peak_has_it_as_its_main_precision():
    for name in known_systems():
        system = load_system(name)
        if system.peak_tflops is not None:
            assert system.peaks[system.peak_precision]["tflops"] == system.peak_tflops, name
            assert system.peak(system.peak_precision)[0].tflops == system.peak_tflops, name


PROFILE = "name: {name}\ndevice: cuda\ndevices_per_node: 8\nbackend: nccl\nlauncher: srun\nexecutor: slurm\n"


@pytest.mark.parametrize("block, message", [
    ("peaks:\n  fp6: 10\n", "'fp6' is not one of"),
    ("peaks:\n  bf16: {tflops: -1}\n", "peaks.bf16 must be a positive number"),
    ("peaks:\n  bf16: {tflops: 5, sparse: true}\n", "peaks.bf16 takes tflops and source"),
    ("peak_tflops: 900\npeaks:\n  bf16: 989\n", "peak_tflops 900 disagrees with the peaks block's 989"),
    ("peaks: 989\n", "peaks must map precisions"),
])
def test_a_wrong_peaks_block_is_one_line_naming_the_file(tmp_path, block, message):
    path = tmp_path / "site.yaml"
    path.write_text(PROFILE.format(name="site") + block)
    with pytest.raises(SpecError, match=message) as caught:
        load_system_file(path)
    assert str(path) in str(caught.value)


def test_the_recipe_and_fp4_decide_the_precision_the_gemms_run_in():
    fp8 = {"bf16": True, "fp8-format": "hybrid"}
    assert decode(fp8).compute_precision == "fp8"
    assert decode({**fp8, "fp8-recipe": "tensorwise"}).compute_precision == "fp8"
    assert decode({**fp8, "fp8-recipe": "blockwise"}).compute_precision == "fp8"
    assert decode({**fp8, "fp8-recipe": "mxfp8"}).compute_precision == "mxfp8"
    assert decode({"bf16": True, "fp4-format": "e2m1"}).compute_precision == "nvfp4"
    base = decode({"bf16": True})
    assert read_settings({"precision": "fp8", "fp8_recipe": "mxfp8"}, base, "rows.yaml").compute_precision == "mxfp8"
    with pytest.raises(SpecError, match="rows.yaml: fp8_recipe goes with precision fp8"):
        read_settings({"fp8_recipe": "mxfp8"}, base, "rows.yaml")


def test_the_gemm_rate_follows_the_precision_s_peak():
    b200, h100 = load_system("dgx-b200"), load_system("h100-8")
    assert b200.matmul_rate()[0] == pytest.approx(0.8 * 2250)
    fp8 = b200.matmul_rate(fp8=True)[0]
    assert fp8 == pytest.approx(0.7 * 4500)
    assert b200.matmul_rate(fp8=True, precision="mxfp8")[0] == pytest.approx(fp8)
    assert b200.matmul_rate(fp8=True, precision="nvfp4")[0] == pytest.approx(2 * fp8)
    # a profile whose device has no MXFP8 figure keeps its measured FP8 rate
    assert h100.matmul_rate(fp8=True, precision="mxfp8") == h100.matmul_rate(fp8=True)
