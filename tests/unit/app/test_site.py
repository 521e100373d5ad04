"""The site layer from a live cluster: `bench system detect` (Slurm's records read, the device table) and
`bench doctor` (what a first run needs). These run on recorded scontrol output; tests/test_slurm.py runs
both against the emulated cluster."""

import re

import pytest

from nlp_bench.launch.slurm_inventory import parse_gres, parse_record
from nlp_bench.spec.devices import find_device


def _node(name: str, gres: str, cpus: int, partitions: str, features: str = "(null)") -> str:
    return (f"NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUTot={cpus} AvailableFeatures={features} "
            f"ActiveFeatures={features} Gres={gres} NodeAddr={name} OS=Linux 5.14.0-362.el9.x86_64 #1 SMP PREEMPT "
            f"RealMemory=515000 Sockets=2 Boards=1 State=IDLE Partitions={partitions} Reason=cable swap by ops "
            f"[root@2026-11-01]\n")

def test_scontrol_records_keep_values_with_spaces():
    record = parse_record(_node("g01", "gpu:h100:4(S:0-1)", 96, "gpu"))
    assert record["OS"] == "Linux 5.14.0-362.el9.x86_64 #1 SMP PREEMPT"
    assert record["Reason"] == "cable swap by ops [root@2026-11-01]" and record["CPUTot"] == "96"

@pytest.mark.parametrize("gres,expected", [
    ("gpu:4", (4, None)), ("gpu:a100:4(S:0-1)", (4, "a100")), ("gpu:h100:8,nic:mlx5:1", (8, "h100")),
    ("(null)", (0, None)), ("gpu:a100:2(S:0),gpu:a100:2(S:1)", (4, "a100")), ("shard:8", (0, None)),
])
def test_gres(gres, expected):
    assert parse_gres(gres) == expected

@pytest.mark.parametrize("names,key", [
    (("NVIDIA H100 80GB HBM3",), "h100"), (("h100",), "h100"), (("NVIDIA H100 PCIe",), "h100-pcie"),
    (("NVIDIA GH200 480GB",), "gh200"), (("NVIDIA H200",), "h200"), (("A100-SXM4-40GB",), "a100"),
    (("NVIDIA A100-SXM4-80GB",), "a100-80"), (("", "amd", "mi250x"), "mi250x"), (("MI300X",), "mi300x"),
    (("mi300a",), "mi300a"), (("NVIDIA GeForce RTX 4090",), None),
])
def test_known_devices(names, key):
    found = find_device(*names)
    assert (found.key if found else None) == key
    if found:
        assert found.peak_tflops > 0 and found.source




def test_a_point_predicted_not_to_fit_is_refused_unless_forced(bench, results):
    out = bench("run", "--tag", "13", "--tp", "1", "--pp", "1")
    assert out.exit_code == 2
    assert "gpt-13b_n8_tp1_pp1_mbs1_gas32 is predicted not to fit: needs 70.8 GiB per device, 40 GiB available" in out.output
    assert "--force submits it anyway" in out.output and not list(results.rglob("run.json"))
    out = bench("run", "--tag", "13", "--tp", "1", "--pp", "1", "--force", "--account", "p")
    assert out.exit_code == 2 and "predicted not to fit" not in out.output  # the profile's own problems remain

def test_the_doctor_tells_the_truth_about_the_environment_and_the_data(bench, site, monkeypatch, tmp_path):
    """`ok python environment` beside `.venv/bin/activate: No such file or directory`; a shipped vocabulary
    "missing (bench data preprocess writes it)"; `$PROJECT` printed unexpanded."""
    profile = site / "slurm" / "systems" / "local.yaml"
    profile.write_text(profile.read_text().replace("max_nodes: 1\n", "max_nodes: 8\n")
                       + f"env_setup:\n  - source {tmp_path}/nowhere/bin/activate\ndata_dir: $PROJECT/data\n")
    monkeypatch.delenv("PROJECT", raising=False)
    monkeypatch.delenv("NLP_BENCH_DATA", raising=False)
    out = bench("doctor", "--system", "local", "--tag", "13")
    assert out.exit_code == 1
    assert "FAIL  environment" in out.output and f"{tmp_path}/nowhere/bin/activate, which does not exist" in out.output
    assert "ok    python environment" not in out.output
    assert re.search(r"FAIL  python environment .*\(run the doctor on a login node of the site", out.output)
    assert "reads $PROJECT, which is not set here" in out.output
    monkeypatch.setenv("NLP_BENCH_DATA", str(tmp_path))
    out = bench("doctor", "--system", "local", "--tag", "13")
    assert "gpt2-vocab.json is missing (copy it from benchmark/data/gpt2-vocab.json)" in out.output
    assert "oscar_text_document.bin is missing (bench data preprocess writes it)" in out.output
