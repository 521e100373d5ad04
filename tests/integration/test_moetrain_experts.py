"""Expert parallelism in the trainer (gloo, fp32, dropout 0, dropless): ep 2 and 4, the experts' own tp,
with tp 2 (sequence parallel: each tp rank routes its own tokens), pp 2 and dp, each give the single rank's
losses, gradient norms and load-balancing losses. The micro-batch is 2 samples everywhere, as the aux loss is
a micro-batch's (summed over the tp ranks that split its sequence)."""

import pytest
from trainer_harness import MOE_MODEL, Launch, close, launch_all, records

pytestmark = pytest.mark.slow

BASE = [*MOE_MODEL, "--moe-aux-loss-coeff", "0.5", "--micro-batch-size", "2"]
BASE[BASE.index("--global-batch-size") + 1] = "8"  # 4 micro-batches of 2 on one rank, 1 on dp 4
SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]


def ep(n: int) -> list[str]:
    return ["--expert-model-parallel-size", str(n)]


def etp(n: int) -> list[str]:
    return ["--expert-tensor-parallel-size", str(n)]


LAYOUTS = {
    "ep2-dp2": (2, ep(2)),
    "ep2-tp2": (2, [*SP, *ep(2), *etp(1)]),
    "etp2-tp2": (2, SP),  # expert tp defaults to tp (Megatron's default)
    "ep2-pp2-dp2": (4, ["--pipeline-model-parallel-size", "2", *ep(2)]),
    "ep4-tp2-dp2": (4, [*SP, *ep(4), *etp(1)]),
    "ep2-etp2-dp4": (4, [*ep(2), *etp(2)]),
    "ep4-dp4": (4, ep(4)),
}


#: a checkpoint of spread experts (every expert shard its own file), resumed on the same layout
RESUMED = LAYOUTS["ep2-etp2-dp4"][1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return tmp_path_factory.mktemp("experts-checkpoint")


@pytest.fixture(scope="module")
def runs(saved):
    return launch_all({"one": Launch(1, BASE), **{name: Launch(n, [*BASE, *flags]) for name, (n, flags) in LAYOUTS.items()},
                       "first": Launch(4, [*BASE, *RESUMED, "--save", str(saved), "--exit-interval", "1"]),
                       "resumed": Launch(4, [*BASE, *RESUMED, "--load", str(saved)]),
                       "other ep": Launch(4, [*BASE, *ep(4), "--load", str(saved)])})


def _numbers(proc) -> list[tuple[float, float, float]]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(r.loss, r.grad_norm, r.load_balancing_loss) for r in records(proc)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_expert_layout_gives_the_single_rank_numbers(runs, layout):
    one, got = _numbers(runs["one"]), _numbers(runs[layout])
    assert len(one) == 3 and len({n[0] for n in one}) == 3
    assert close(got, one), (got, one)


def test_the_run_says_its_expert_layout(runs):
    said = [line for line in runs["ep2-etp2-dp4"].stdout.splitlines() if line.startswith("nlp-bench trainer: experts:")]
    assert said and said[0].endswith("expert parallel 2, expert tp 2")


def test_spread_experts_resume_equal_an_uninterrupted_run(runs, saved):
    """ep 2 x expert tp 2 on 4 ranks: 4 expert shards, each in its own file; the resumed iterations 2 and 3
    are the uninterrupted run's."""
    whole, first, resumed = (_numbers(runs[k]) for k in ("ep2-etp2-dp4", "first", "resumed"))
    assert len(first) == 1 and close(first, whole[:1])
    assert len(resumed) == 2 and close(resumed, whole[1:]), (resumed, whole)
    assert sorted(p.name for p in (saved / "iter_0000001").glob("experts_*")) == [
        f"experts_000_ep{e:03d}_etp{t:03d}.pt" for e in range(2) for t in range(2)]


def test_a_checkpoint_of_another_expert_layout_is_refused_in_one_line(runs):
    proc = runs["other ep"]
    assert proc.returncode != 0
    assert "was saved with --expert-model-parallel-size 2 (now 4), --expert-tensor-parallel-size 2 (now 1)" in proc.stderr
