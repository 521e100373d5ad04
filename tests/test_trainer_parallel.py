"""Tensor and data parallelism give the numbers of the serial model (gloo, multi-process)."""

import re
import subprocess
import sys

import pytest

from nlp_bench.analysis.parsers import parse_text

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
         "--seq-length", "32", "--train-iters", "5", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1",
         "--lr-decay-style", "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "1000",
         "--distributed-backend", "gloo", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7"]


def losses(nproc: int, *flags: str) -> list[float]:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), "-m", "nlp_bench.train", *MODEL, *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = parse_text(proc.stdout)
    assert [r.iteration for r in records] == [1, 2, 3, 4, 5]
    return [r.loss for r in records]


def close(a: list[float], b: list[float], rel: float = 1e-4) -> bool:
    return all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def serial() -> list[float]:
    out = losses(1, "--tensor-model-parallel-size", "1", "--micro-batch-size", "4", "--global-batch-size", "4")
    assert len(set(out)) == 5, "the losses must change from iteration to iteration, or the test proves nothing"
    return out


def test_tp2_matches_tp1(serial):
    tp2 = losses(2, "--tensor-model-parallel-size", "2", "--micro-batch-size", "4", "--global-batch-size", "4")
    assert close(tp2, serial), (tp2, serial)


def test_dp2_matches_dp1_at_equal_global_batch(serial):
    dp2 = losses(2, "--tensor-model-parallel-size", "1", "--micro-batch-size", "2", "--global-batch-size", "4")
    assert close(dp2, serial), (dp2, serial)


def test_gradient_accumulation_matches_one_big_micro_batch(serial):
    gas = losses(1, "--tensor-model-parallel-size", "1", "--micro-batch-size", "1", "--global-batch-size", "4")
    assert close(gas, serial), (gas, serial)


def test_a_different_seed_gives_different_losses(serial):
    other = losses(1, "--tensor-model-parallel-size", "1", "--micro-batch-size", "4", "--global-batch-size", "4",
                   "--seed", "8")
    assert not close(other, serial, rel=1e-3)
