"""Grouped-query attention in every parallel layout gives the numbers of the single-rank run (gloo,
multi-process, fp32, dropout 0), with the Llama architecture: 2 query groups for 4 heads, SwiGLU, RMSNorm,
rope with base 500000, untied output weights and no biases. tp 4 exceeds the groups: each pair of ranks
keeps a copy of its group's key and value heads."""

import os
import subprocess
import sys

import pytest

from nlp_bench.analysis.parsers import parse_text

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
         "--num-query-groups", "2", "--ffn-hidden-size", "96", "--swiglu", "--normalization", "RMSNorm",
         "--position-embedding-type", "rope", "--rotary-base", "500000", "--untie-embeddings-and-output-weights",
         "--disable-bias-linear", "--seq-length", "32", "--train-iters", "5", "--log-interval", "1", "--lr", "3e-3",
         "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--vocab-size", "1000",
         "--distributed-backend", "gloo", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "11",
         "--global-batch-size", "8", "--clip-grad", "0.5"]


def run(nproc: int, *flags: str) -> list[tuple[float, float]]:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), "-m", "nlp_bench.train", *MODEL, *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = parse_text(proc.stdout)
    assert [r.iteration for r in records] == [1, 2, 3, 4, 5]
    return [(r.loss, r.grad_norm) for r in records]


def close(a: list[tuple[float, float]], b: list[tuple[float, float]], rel: float = 1e-5) -> bool:
    return all(abs(x - y) <= rel * abs(y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True))


@pytest.fixture(scope="module")
def serial() -> list[tuple[float, float]]:
    out = run(1, "--micro-batch-size", "8")
    assert len({loss for loss, _ in out}) == 5, "the losses must change, or the test proves nothing"
    # the gradient norm is clipped (0.5): a norm that counted the key/value copies twice would change the losses
    assert all(norm > 0.5 for _, norm in out)
    return out


@pytest.mark.parametrize("nproc,flags", [
    (2, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "8"]),
    (4, ["--tensor-model-parallel-size", "4", "--micro-batch-size", "8"]),
    (4, ["--tensor-model-parallel-size", "4", "--sequence-parallel", "--micro-batch-size", "4"]),
    (2, ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]),
    (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
         "--micro-batch-size", "1"]),
    (2, ["--micro-batch-size", "4"]),
    (2, ["--use-distributed-optimizer", "--micro-batch-size", "2"]),
    (4, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2", "--use-distributed-optimizer"]),
], ids=["tp2", "tp4-kv-copies", "tp4-sp", "pp2", "pp2-interleaved", "dp2", "dp2-zero1", "tp2-dp2-zero1"])
def test_gqa_layout_matches_single_rank(serial, nproc, flags):
    got = run(nproc, *flags)
    assert close(got, serial), (got, serial)


def test_tp_neither_dividing_nor_a_multiple_of_the_groups_is_refused_before_any_process_group():
    """6 heads in 2 groups over tp 3: each rank would need one and a half key/value heads."""
    flags = [*MODEL, "--num-attention-heads", "6", "--hidden-size", "96", "--tensor-model-parallel-size", "3",
             "--micro-batch-size", "8"]
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *flags], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "WORLD_SIZE": "3", "RANK": "0"})
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "tp 3 must divide the 2 query groups or be a multiple of them" in proc.stderr
