"""Mixed precision: bf16 trains, fp16 skips an overflowing step and lowers its loss scale."""

import subprocess
import sys

import pytest

from nlp_bench.analysis.parsers import parse_text

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "8", "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine",
         "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "256", "--distributed-backend", "gloo",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3"]


def run(*flags: str):
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *MODEL, *flags], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, parse_text(proc.stdout)


def test_bf16_lowers_the_loss_over_50_iterations():
    out, records = run("--bf16", "--train-iters", "50", "--log-interval", "10")
    assert "bf16" in out
    first, last = records[0].loss, records[-1].loss
    assert last < 0.8 * first, (first, last)


def test_fp16_overflow_is_skipped_and_lowers_the_scale():
    _, records = run("--fp16", "--train-iters", "5", "--log-interval", "1", "--initial-loss-scale", "4096",
                     "--hysteresis", "1", "--inject-inf-grad-at-iteration", "3")
    assert [r.skipped_iterations for r in records] == [0, 0, 1, 0, 0]
    assert [r.loss_scale for r in records] == [4096.0, 4096.0, 2048.0, 2048.0, 2048.0]
    # a skipped step leaves the weights and the learning-rate schedule alone
    assert records[2].learning_rate == records[1].learning_rate
