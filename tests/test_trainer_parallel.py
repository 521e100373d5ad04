"""Every parallel layout gives the numbers of the single-rank run (gloo, multi-process, fp32, dropout 0)."""

import subprocess
import sys

import pytest

from nlp_bench.analysis.parsers import parse_text

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
         "--seq-length", "32", "--train-iters", "5", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1",
         "--lr-decay-style", "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "1000",
         "--distributed-backend", "gloo", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
         "--global-batch-size", "8"]


def train(nproc: int, *flags: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), "-m", "nlp_bench.train", *MODEL, *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def losses(nproc: int, *flags: str) -> list[float]:
    records = parse_text(train(nproc, *flags).stdout)
    assert [r.iteration for r in records] == [1, 2, 3, 4, 5]
    return [r.loss for r in records]


def close(a: list[float], b: list[float], rel: float = 1e-5) -> bool:
    return all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def serial() -> list[float]:
    out = losses(1, "--micro-batch-size", "8")
    assert len(set(out)) == 5, "the losses must change from iteration to iteration, or the test proves nothing"
    return out


@pytest.mark.parametrize("nproc,flags", [
    (2, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "8"]),
    (2, ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]),
    (2, ["--micro-batch-size", "4"]),
    (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]),
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "8"]),
    (2, ["--use-distributed-optimizer", "--micro-batch-size", "4"]),
    (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
         "--micro-batch-size", "1"]),
    (4, ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--ddp-bucket-size", "5000"]),
    (1, ["--micro-batch-size", "1"]),
    (1, ["--micro-batch-size", "8", "--recompute-activations"]),
    (1, ["--micro-batch-size", "4", "--recompute-granularity", "full", "--recompute-num-layers", "2"]),
    (4, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
         "--micro-batch-size", "4", "--recompute-granularity", "full", "--recompute-method", "block",
         "--recompute-num-layers", "1"]),
], ids=["tp2", "pp2", "dp2", "tp2pp2", "tp2-sp", "dp2-distopt", "pp2-interleaved-v2", "pp2-dp2-buckets", "gas8", "selective-recompute", "full-recompute",
        "tp2-sp-pp2-block-recompute"])
def test_layout_matches_single_rank(serial, nproc, flags):
    got = losses(nproc, *flags)
    assert close(got, serial), (got, serial)


def test_a_different_seed_gives_different_losses(serial):
    other = losses(1, "--micro-batch-size", "8", "--seed", "8")
    assert not close(other, serial, rel=1e-3)


@pytest.mark.parametrize("pp", [2, 4])
def test_1f1b_first_stage_holds_at_most_pp_micro_batches(pp):
    # 8 micro-batches per iteration: without 1F1B the first stage would hold all 8
    out = train(pp, "--pipeline-model-parallel-size", str(pp), "--micro-batch-size", "1", "--train-iters", "2").stdout
    assert f"the first pipeline stage held at most {pp} forward passes' activations" in out, out[-1500:]


def test_validation_loss_is_layout_independent():
    import re

    def validation(nproc, *flags):
        out = train(nproc, "--eval-interval", "2", "--eval-iters", "2", "--train-iters", "4", *flags).stdout
        return [float(v) for v in re.findall(r"validation loss at iteration \d+ \| lm loss value: (\S+) \|", out)]

    serial = validation(1, "--micro-batch-size", "8")
    assert len(serial) == 2
    interleaved = validation(2, "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                             "--micro-batch-size", "2")
    assert close(interleaved, serial), (interleaved, serial)


def test_gradient_buckets_are_reduced_during_the_backward_pass():
    import re

    out = train(2, "--micro-batch-size", "2", "--ddp-bucket-size", "5000").stdout
    done, total = map(int, re.search(r"(\d+) of (\d+) data-parallel gradient buckets", out).groups())
    assert total > 5 and done == total, out[-800:]
