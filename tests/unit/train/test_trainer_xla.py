"""The xla backend. The CPU stand-in (NLP_BENCH_XLA_CPU=1) trains exactly as the CPU path does with tensor and
data parallelism; what it cannot show (graphs, compiles, the xla process group's refusal of CPU tensors, the
device RNG, torch-xla's world) the tests marked `xla` check on the real torch-xla's CPU device (PJRT_DEVICE=CPU),
in a venv of their own (.ci/run builds it; see docs/testing.md)."""

from __future__ import annotations

import pytest
import torch

from nlp_bench.analysis.results import xla_counts
from nlp_bench.train.device_adam import DeviceAdamW
from nlp_bench.train.xla import STAND_IN, XlaRuntime


def test_stand_in_counts_its_step_ends_and_feeds_int32_ids(monkeypatch):
    monkeypatch.setenv(STAND_IN, "1")
    runtime = XlaRuntime()
    batches = runtime.to_device([(torch.arange(6).view(2, 3), torch.arange(6).view(2, 3))], torch.device("cpu"))
    assert all(t.dtype == torch.int32 for t in batches[0])
    for _ in range(3):
        runtime.sync()
    assert runtime.syncs == 3

def _adam_pair(weight_decay: float = 0.1):
    """DeviceAdamW and torch's AdamW on the same four parameters laid out flat (two matrices decay)."""
    torch.manual_seed(0)
    shapes = [(4, 3), (3,), (2, 3), (2,)]
    flat = torch.randn(sum(torch.Size(s).numel() for s in shapes))
    grads = torch.zeros_like(flat)
    runs, views, offset = [], [], 0
    for shape in shapes:
        n = torch.Size(shape).numel()
        if len(shape) == 2:
            runs.append((offset, offset + n))
        views.append((offset, offset + n, len(shape) == 2))
        offset += n
    mine = DeviceAdamW(flat.clone(), grads, runs, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    params = [torch.nn.Parameter(flat[a:b].clone()) for a, b, _ in views]
    decays = [v[2] for v in views]
    theirs = torch.optim.AdamW([{"params": [p for p, d in zip(params, decays, strict=True) if d],
                                 "weight_decay": weight_decay},
                                {"params": [p for p, d in zip(params, decays, strict=True) if not d],
                                 "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    return mine, theirs, params, views

def test_the_device_adam_is_torchs_adamw():
    mine, theirs, params, views = _adam_pair()
    for step in range(5):
        g = torch.randn_like(mine.grads)
        mine.grads.copy_(g)
        for p, (a, b, _) in zip(params, views, strict=True):
            p.grad = g[a:b].clone()
        lr = 1e-2 * (step + 1) / 5
        for group in theirs.param_groups:
            group["lr"] = lr
        theirs.step()
        mine.step(lr, torch.tensor(1.0))
    assert torch.cat([p.detach() for p in params]) == pytest.approx(mine.master, rel=1e-5, abs=1e-7)
    assert float(mine.steps) == 5.0

def test_a_skipped_device_adam_step_changes_nothing_whatever_the_gradients_hold():
    mine, *_ = _adam_pair()
    for good in (0.0, 1.0, 0.0):  # a skipped first step must not divide by a zero bias correction either
        before = [t.clone() for t in (mine.master, mine.exp_avg, mine.exp_avg_sq, mine.steps)]
        mine.grads.copy_(torch.randn_like(mine.grads))
        if not good:
            mine.grads[3] = float("inf")
            mine.grads[5] = float("nan")
        mine.step(1e-2, torch.tensor(good))
        after = (mine.master, mine.exp_avg, mine.exp_avg_sq, mine.steps)
        assert all(torch.isfinite(t).all() for t in after)
        assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True)) == (not good)

def test_the_result_reads_the_xla_counts_whether_or_not_a_step_compiled_nothing():
    line = "[default0]:nlp-bench trainer: xla: 9 graph executions, 7 compiles (27.6 s), 7 transfers to the host in all"
    assert xla_counts(line + "; every one of the 4 steps compiled (torch_xla.debug.metrics)")["steps"] == 4
    steady = xla_counts(line + "; per step that compiled nothing (3 of 6 steps): at most 1 graph executions and 2 "
                               "transfers (torch_xla.debug.metrics)")
    assert (steady["steps"], steady["steps_without_compile"], steady["graph_executions_per_step"],
            steady["transfers_per_step"]) == (6, 3, 1, 2)
    assert xla_counts("nlp-bench trainer: finished at iteration 4") is None
