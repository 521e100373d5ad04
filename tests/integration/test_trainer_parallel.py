"""Every parallel layout gives the numbers of the single-rank run (gloo, multi-process, fp32, dropout 0).

The module's runs start once, together (`runs`); each test reads the runs it checks."""

import re

import pytest
from trainer_harness import Launch, close, launch_all, records, succeeded, torchrun, validation_losses

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
         "--seq-length", "32", "--train-iters", "5", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1",
         "--lr-decay-style", "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "1000",
         "--distributed-backend", "gloo", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
         "--global-batch-size", "8", "--eval-iters", "0"]
#: validation after iterations 2, 4 and the last (5), two global batches each
EVALUATION = ["--eval-interval", "2", "--eval-iters", "2"]
INTERLEAVED = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
               "--micro-batch-size", "1"]
LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "8"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]),
    "dp2": (2, ["--micro-batch-size", "4"]),
    "tp2pp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size",
                   "2"]),
    "tp2-sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "8"]),
    "dp2-distopt": (2, ["--use-distributed-optimizer", "--micro-batch-size", "4"]),
    "pp2-interleaved-v2": (2, [*INTERLEAVED, *EVALUATION]),
    "pp2-dp2-buckets": (4, ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--ddp-bucket-size",
                            "5000"]),
    "gas8": (1, ["--micro-batch-size", "1"]),
    "selective-recompute": (1, ["--micro-batch-size", "8", "--recompute-activations"]),
    "full-recompute": (1, ["--micro-batch-size", "4", "--recompute-granularity", "full", "--recompute-num-layers",
                           "2"]),
    "tp2-sp-pp2-block-recompute": (4, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                       "--pipeline-model-parallel-size", "2", "--micro-batch-size", "4",
                                       "--recompute-granularity", "full", "--recompute-method", "block",
                                       "--recompute-num-layers", "1"]),
}
#: 1F1B on pp 4: 8 micro-batches an iteration, of which the first stage would hold all without it
PP4 = ["--pipeline-model-parallel-size", "4", "--micro-batch-size", "1", "--train-iters", "2"]


@pytest.fixture(scope="module")
def runs():
    wanted = {"serial": Launch(1, [*MODEL, "--micro-batch-size", "8", *EVALUATION]),
              "seed 8": Launch(1, [*MODEL, "--micro-batch-size", "8", "--seed", "8"]),
              "pp4": Launch(4, [*MODEL, *PP4]),
              **{name: Launch(nproc, [*MODEL, *flags]) for name, (nproc, flags) in LAYOUTS.items()}}
    return launch_all(wanted)


def losses(proc) -> list[float]:
    found = records(proc)
    assert [r.iteration for r in found] == [1, 2, 3, 4, 5]
    return [r.loss for r in found]


@pytest.fixture(scope="module")
def serial(runs) -> list[float]:
    out = losses(runs["serial"])
    assert len(set(out)) == 5, "the losses must change from iteration to iteration, or the test proves nothing"
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_single_rank(runs, serial, layout):
    got = losses(runs[layout])
    assert close(got, serial), (got, serial)


def test_a_different_seed_gives_different_losses(runs, serial):
    other = losses(runs["seed 8"])
    assert not close(other, serial, rel=1e-3)


@pytest.mark.parametrize("pp,run", [(2, "pp2"), (4, "pp4")])
def test_1f1b_first_stage_holds_at_most_pp_micro_batches(runs, pp, run):
    # 4 (pp 2) and 8 (pp 4) micro-batches per iteration: without 1F1B the first stage would hold them all
    out = succeeded(runs[run]).stdout
    assert f"the first pipeline stage held at most {pp} forward passes' activations" in out, out[-1500:]


def test_validation_loss_is_layout_independent(runs):
    serial = validation_losses(runs["serial"].stdout)
    assert len(serial) == 3
    interleaved = validation_losses(runs["pp2-interleaved-v2"].stdout)
    assert close(interleaved, serial), (interleaved, serial)


def test_gradient_buckets_are_reduced_during_the_backward_pass(runs):
    out = succeeded(runs["pp2-dp2-buckets"]).stdout
    done, total = map(int, re.search(r"(\d+) of (\d+) data-parallel gradient buckets", out).groups())
    assert total > 5 and done == total, out[-800:]


def test_the_real_torchrun_trains_what_the_launcher_does(runs):
    """The runs here are forked from one launcher with torchrun's variables; under torchrun itself the same
    layout must give the same numbers, or the other tests would check another trainer than the one users run."""
    assert close(losses(torchrun(2, *MODEL, *LAYOUTS["tp2"][1])), losses(runs["tp2"]), rel=1e-6)
