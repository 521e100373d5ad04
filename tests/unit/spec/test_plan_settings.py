"""What `bench plan` ranks beside the sizes, chosen for one point: interleaving (vp), recompute and the
distributed optimizer become the flags Megatron reads, the point's id names them where they are not the
tag's, and a point that keeps the tag's settings keeps its flags and its id (issue 53, finding 1)."""

from __future__ import annotations

import pytest

from nlp_bench.errors import LayoutError
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.switches import decode

_RECOMPUTE_FLAGS = ("recompute-activations", "recompute-granularity", "recompute-method", "recompute-num-layers")


def test_the_plans_best_175b_layout_as_a_point():
    point = load_benchmark().point("175", pp=16, vp=6, recompute="none")
    assert point.id == "gpt-175b_n96_tp8_pp16_vp6_mbs1_gas32_rc-none"
    assert point.layout.vp == 6 and point.layout.gas == 32
    assert point.train["num-layers-per-virtual-pipeline-stage"] == 1  # 96 layers / (pp 16 x vp 6)
    assert not set(_RECOMPUTE_FLAGS) & set(point.train)
    assert decode(point.train).recompute == "none"


def test_the_tags_own_settings_keep_its_flags_and_id():
    bench = load_benchmark()
    for tag in ("175", "13", "smoke"):
        plain = bench.point(tag)
        on = decode(plain.train)
        same = bench.point(tag, vp=1, recompute=on.recompute, distributed_optimizer=on.distributed_optimizer)
        assert same.id == plain.id and same.train == plain.train
    assert bench.point("175").id == "gpt-175b_n96_tp8_pp8_mbs1_gas16"


@pytest.mark.parametrize("recompute,flags", [
    ("full", {"recompute-granularity": "full", "recompute-method": "uniform", "recompute-num-layers": 1}),
    ("none", {}),
])
def test_recompute_replaces_every_recompute_flag(recompute, flags):
    point = load_benchmark().point("13", recompute=recompute)
    assert {k: v for k, v in point.train.items() if k in _RECOMPUTE_FLAGS} == flags
    assert decode(point.train).recompute == recompute and point.id.endswith(f"_rc-{recompute}")


def test_the_distributed_optimizer_both_ways():
    bench = load_benchmark()
    off = bench.point("175", distributed_optimizer=False)
    assert "use-distributed-optimizer" not in off.train and off.id.endswith("_dist-opt-off")
    on = bench.point("smoke", distributed_optimizer=True)
    assert on.train["use-distributed-optimizer"] is True and on.id.endswith("_dist-opt-on")


def test_vp_one_turns_the_tags_interleaving_off():
    bench = load_benchmark()
    interleaved = bench.point("175", pp=16, vp=6)
    assert interleaved.id == "gpt-175b_n96_tp8_pp16_vp6_mbs1_gas32"
    plain = bench.point("175", pp=16, vp=1, train={"num-layers-per-virtual-pipeline-stage": 1})
    assert plain.layout.vp == 1 and "num-layers-per-virtual-pipeline-stage" not in plain.train


@pytest.mark.parametrize("given,words", [
    ({"pp": 16, "vp": 5}, "pp 16 x vp 5 = 80 does not divide the 96 layers"),
    ({"vp": 2, "tp": 8, "pp": 1}, "vp 2 interleaves the pipeline, which needs pp > 1"),
    ({"pp": 16, "vp": 2, "gas": 40}, "multiple of pp 16"),
])
def test_an_interleaving_that_cannot_run_is_refused(given, words):
    with pytest.raises(LayoutError, match=words):
        load_benchmark().point("175", **given)


def test_bench_run_takes_them_and_says_a_bad_one_in_one_line(bench):
    out = bench("run", "--help")
    assert all(option in out.output for option in ("--vp", "--recompute", "--no-distributed-optimizer"))
    assert "--num-layers-per-virtual-pipeline-stage" in "".join(out.output.split())  # click folds the help
    out = bench("run", "--tag", "175", "--pp", "16", "--vp", "5", "--dry-run")
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1
    assert "does not divide the 96 layers" in out.output
    out = bench("run", "--resume", "somerun", "--vp", "2")
    assert out.exit_code == 2 and "--vp" in out.output
