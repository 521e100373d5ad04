"""The xla backend: the CPU stand-in (NLP_BENCH_XLA_CPU=1) trains exactly as the CPU path does with tensor
and data parallelism, one graph execution per step; a real torch-xla CPU device where torch_xla exists."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from nlp_bench.analysis.parsers import parse_text
from nlp_bench.train.xla import STAND_IN, XlaRuntime

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
         "--seq-length", "32", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1",
         "--lr-decay-style", "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "1000",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--global-batch-size", "8",
         "--eval-iters", "0"]


def train(nproc: int, backend: str, *flags: str, env: dict | None = None, iters: int = 5) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in (STAND_IN, "XLA_USE_BF16", "PJRT_DEVICE")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), "-m", "nlp_bench.train", *MODEL, "--train-iters", str(iters),
                           "--distributed-backend", backend, *flags],
                          capture_output=True, text=True, timeout=300, env={**clean, **(env or {})})


def losses(proc: subprocess.CompletedProcess) -> list[float]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [r.loss for r in parse_text(proc.stdout)]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--tensor-model-parallel-size", "2", "--micro-batch-size", "8"],
                                   ["--micro-batch-size", "4"]], ids=["tp2", "dp2"])
def test_stand_in_matches_the_cpu_path_and_syncs_once_per_step(flags):
    reference = losses(train(2, "gloo", *flags))
    proc = train(2, "xla", *flags, env={STAND_IN: "1"})
    stand_in = losses(proc)
    assert len(reference) == 5 and len(set(reference)) == 5
    assert stand_in == pytest.approx(reference, rel=1e-5)
    (count,) = re.findall(r"xla: (\d+) step graph executions \(CPU stand-in", proc.stdout)
    assert int(count) == 5


def test_runtime_counts_syncs_and_feeds_int32_ids(monkeypatch):
    monkeypatch.setenv(STAND_IN, "1")
    runtime = XlaRuntime()
    batches = runtime.to_device([(torch.arange(6).view(2, 3), torch.arange(6).view(2, 3))], torch.device("cpu"))
    assert all(t.dtype == torch.int32 for t in batches[0])
    for _ in range(3):
        runtime.sync()
    assert runtime.syncs == 3


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed here")
def test_without_torch_xla_the_backend_is_one_line():
    proc = train(1, "xla", "--micro-batch-size", "8", iters=2)
    assert proc.returncode != 0
    assert "nlp_bench.train: error: --distributed-backend xla needs torch_xla" in proc.stdout + proc.stderr


def test_xla_refuses_pipeline_parallelism_before_starting():
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *MODEL, "--train-iters", "1",
                           "--distributed-backend", "xla", "--pipeline-model-parallel-size", "2",
                           "--micro-batch-size", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nlp_bench.train: error: pipeline parallelism is not available with --distributed-backend xla (as in the "
        "Neuron reference); use tensor and data parallelism"]


@pytest.mark.slow
def test_xla_use_bf16_means_bf16():
    proc = train(1, "xla", "--micro-batch-size", "8", env={STAND_IN: "1", "XLA_USE_BF16": "1"}, iters=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"threads per rank, bf16", proc.stdout)


@pytest.mark.xla
@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed")
def test_real_torch_xla_cpu_device_matches_the_cpu_path():
    """PJRT_DEVICE=CPU: torch-xla's own CPU device, graphs and all (see the README for the venv)."""
    flags = ["--micro-batch-size", "8"]
    reference = losses(train(1, "gloo", *flags, iters=3))
    on_xla = losses(train(1, "xla", *flags, env={"PJRT_DEVICE": "CPU"}, iters=3))
    assert on_xla == pytest.approx(reference, rel=1e-4)
