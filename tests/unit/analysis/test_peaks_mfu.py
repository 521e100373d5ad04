"""MFU against the peak of the precision a run's GEMMs run in: an FP8 run's against the FP8 peak, and no
measured or predicted MFU of the shipped examples above 100% of the peak it is compared with."""


import pytest

from nlp_bench import flops
from nlp_bench.analysis import metrics
from nlp_bench.analysis.reference import reference_rows
from nlp_bench.analysis.results import analyse_point
from nlp_bench.plan import points, timing, validation
from nlp_bench.plan.corpus import load_corpus
from nlp_bench.report.html import _bases
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.models import pad_vocab
from nlp_bench.spec.switches import decode
from nlp_bench.spec.systems import load_system
from nlp_bench.store.point_folder import PointDir

FP8 = {"fp8-format": "hybrid"}
MXFP8 = {"fp8-format": "hybrid", "fp8-recipe": "mxfp8"}


def _analysed(tmp_path, system: str, train: dict, seconds: float) -> dict:
    """A llama3-8b point's result from a log of three intervals of `seconds` each."""
    point = load_benchmark("nlp").point(tag="llama3-8b", system=system, train=train)
    folder = PointDir(tmp_path / f"{system}-{len(train)}")
    folder.path.mkdir(parents=True)
    folder.write_point(point.to_dict(), "#!/bin/sh\n")
    gbs = point.layout.global_batch_size
    (folder.path / "job.out").write_text("".join(
        f"iteration {10 * i:8d}/   1000 | elapsed time per iteration (s): {seconds:.4f} | global batch size: "
        f"{gbs:5d} | lm loss: 8.0E+00 |\n" for i in (1, 2, 3)))
    return analyse_point(folder.path)


def test_an_fp8_point_s_mfu_is_against_the_fp8_peak(tmp_path):
    bf16, fp8 = _analysed(tmp_path, "h100-8", {}, 2.0), _analysed(tmp_path, "h100-8", FP8, 2.0)
    assert bf16["summary"]["mfu_basis"]["peak_tflops"] == 989
    basis = fp8["summary"]["mfu_basis"]
    assert (basis["peak_tflops"], basis["precision"], basis["run_precision"]) == (1979, "fp8", "fp8")
    assert "FP8" in basis["source"] and basis["dense"]
    # the same FLOPs in the same time: the FP8 run's MFU is the BF16 run's over the peaks' ratio
    assert fp8["summary"]["mfu"] == pytest.approx(bf16["summary"]["mfu"] * 989 / 1979)
    mx = _analysed(tmp_path, "dgx-b200", MXFP8, 1.0)["summary"]["mfu_basis"]
    assert (mx["peak_tflops"], mx["precision"]) == (4500, "mxfp8")
    lines = _bases({("r", "a"): bf16, ("r", "b"): fp8})[0]
    assert any("1979 TFLOP/s dense fp8" in line and "for fp8 runs" in line for line in lines)
    assert any("989 TFLOP/s dense bf16" in line and "for bf16 runs" in line for line in lines)


def test_an_fp8_run_on_a_profile_without_an_fp8_peak_gets_no_mfu_and_the_reason():
    info = {"device_name": "A100-SXM4-80GB", "peak_tflops": 312, "peak_precision": "bf16", "peak_source": "A100 datasheet"}
    basis, note = metrics.mfu_basis("selene", info, precision="fp8")
    assert basis is None and "selene" in note and "no fp8 peak" in note
    basis, note = metrics.mfu_basis("selene", info)  # a caller that names no precision: the one peak, as before
    assert basis["peak_tflops"] == 312 and note is None


def _mfu(planned, tokens_per_s: float) -> float | None:
    """Model FLOPs per device per second at `tokens_per_s` over the peak of the precision its GEMMs run in."""
    model, c = planned.model, planned.candidate
    lay = c.layout
    peak = planned.system.peak(c.switches.compute_precision)[0]
    if peak is None:
        return None
    shape = model.flops_shape(lay.global_batch_size, pad_vocab(model.vocab_size, lay.tp), recompute=c.switches.recomputes)
    seconds = lay.global_batch_size * model.seq_length / tokens_per_s
    return flops.tflops_per_device(flops.megatron_model_flops(shape), seconds, lay.world) / peak.tflops


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> timing.Efficiency:
    """The corpus fit, worked out afresh (results/plan/corpus-validation.json is a cache a fresh clone has not
    made yet)."""
    return validation.corpus_trust(tmp_path_factory.mktemp("results")).efficiency


def test_no_published_or_predicted_corpus_row_passes_its_peak(fitted):
    eff = fitted
    for row in load_corpus():
        assert _mfu(row.planned, row.tokens_per_s) < 1, row.id
        assert _mfu(row.planned, validation.predict_row(row, eff)) < 1, row.id
    for row in reference_rows():
        assert 0 < row["MFU"] < 1, row["point"]


def test_no_shipped_tag_on_any_profile_is_predicted_past_its_peak(fitted):
    eff, benchmark = fitted, load_benchmark("nlp")
    checked = 0
    for tag, spec in benchmark.tags.items():
        for system in {spec["system"], *(spec.get("systems") or {}), "dgx-b200"}:
            for train in ({}, FP8, MXFP8) if load_system(system).peak_fp8_tflops else ({},):
                point = benchmark.point(tag=tag, system=system, train=train)
                planned = points.from_point(point)
                try:
                    estimate = timing.estimate(planned.model, point.vocab_padded, planned.candidate, planned.system, eff)
                except timing.NotPlannable:
                    continue
                tokens = point.layout.global_batch_size * point.model.seq_length / estimate.iteration_s
                mfu = _mfu(planned, tokens)
                assert mfu is None or mfu < 1, (tag, system, train)
                checked += mfu is not None
    assert checked >= 20


def test_a_point_records_its_profile_s_peaks_for_later_analysis():
    """point.json keeps the peaks, so a result analysed after the profile changed divides by what the run met."""
    point = load_benchmark("nlp").point(tag="llama3-8b", system="dgx-b200", train=MXFP8)
    info = point.to_dict()["system_info"]
    assert {p: e["tflops"] for p, e in info["peaks"].items()} == {"bf16": 2250, "fp8": 4500, "mxfp8": 4500, "nvfp4": 9000}
    basis, _ = metrics.mfu_basis("dgx-b200", info, precision=decode(point.train).compute_precision)
    assert basis["peak_tflops"] == 4500 and "sparsity" in basis["source"]
