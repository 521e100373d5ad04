"""Megatron's `--profile --use-pytorch-profiler`: the torch profiler over iterations
[--profile-step-start, --profile-step-end) on the ranks of --profile-ranks, a Chrome trace in the TensorBoard
folder (or ./profile), and the time by category that decides what to optimise next.

Categories come from kernel and operator names (device time on a GPU, self CPU time on a CPU): GEMM,
attention, norms and element-wise, loss (cross-entropy), optimizer, communication, other; on a GPU the
host gap is the step's wall time the device was idle (launch overhead, synchronisation, Python).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

CATEGORIES = (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|gloo|send|recv|c10d"),
    ("optimizer", r"adam|multi_tensor|foreach|_fused_adam|optimizer"),
    ("attention", r"flash|attention|attn|fmha|sdpa|softmax"),
    ("loss", r"cross_entropy|nll_loss|log_softmax|logsumexp"),
    ("gemm", r"gemm|matmul|\bmm\b|aten::mm|addmm|bmm|linear|cutlass|xmma|nvjet|sm\d+_.*(?:tn|nt|nn)"),
    ("norm/elementwise", r"norm|gelu|swiglu|silu|elementwise|vectorized|add|mul|copy|fill|triton|cat|where|"
                         r"dropout|embedding|index|sum|mean|div|sub|pow|rsqrt|exp|tanh"),
)


def category(name: str) -> str:
    low = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, low):
            return label
    return "other"


class StepProfiler:
    """Starts the profiler before iteration `start`, stops it after iteration `end - 1`, then writes the
    trace and the summary. Inactive (no cost) on ranks not profiled or without --profile."""

    def __init__(self, profile, rank: int, device_type: str, say) -> None:
        self.active = profile.enabled and rank in profile.ranks
        self.start, self.end = profile.start, profile.end
        self.folder = Path(profile.folder)
        self.device_type, self.say, self.rank = device_type, say, rank
        self._profiler, self._t0 = None, 0.0

    def before(self, iteration: int) -> None:
        if not self.active or iteration != self.start:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=False)
        self._profiler.__enter__()
        self._t0 = time.perf_counter()

    def after(self, iteration: int) -> None:
        if self._profiler is None or iteration != self.end - 1:
            return
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        self._profiler.__exit__(None, None, None)
        steps = self.end - self.start
        summary = summarise_profile(self._profiler.key_averages(), wall, steps, self.device_type)
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / f"trace_rank{self.rank}.json"
        self._profiler.export_chrome_trace(str(trace))
        (self.folder / f"profile_rank{self.rank}.json").write_text(json.dumps(summary, indent=2))
        shares = ", ".join(f"{k} {v['share']:.1%}" for k, v in summary["categories"].items())
        self.say(f"profile of iterations {self.start}-{self.end - 1} ({summary['basis']}): {shares}; trace {trace}")
        self._profiler = None


def _on_device(event) -> bool:
    """A kernel's own event. The kineto profiler also gives each CPU operator the device time of the kernels
    it launched; counting those too would count every kernel twice. User annotations (the profiler's step
    markers) span kernels rather than being one."""
    from torch.autograd import DeviceType

    if getattr(event, "is_user_annotation", False):
        return False
    if getattr(event, "is_legacy", False):  # the legacy profiler keeps kernel time on the CPU operators
        return event.device_type == DeviceType.CPU
    return event.device_type != DeviceType.CPU


def summarise_profile(events, wall_s: float, steps: int, device_type: str, top: int = 12) -> dict:
    """Time per category per step (ms) and its share of the step's wall time, and the `top` kernels (or
    operators) by time; `events` are the profiler's key averages. On a GPU each kernel's device time is
    counted once and the rest of the wall time is the host gap."""
    on_device = device_type == "cuda"
    totals: dict[str, float] = {}
    named: dict[str, float] = {}
    for event in events:
        if on_device:
            if not _on_device(event):
                continue
            micros = getattr(event, "self_device_time_total", None)
            if micros is None:
                micros = getattr(event, "self_cuda_time_total", 0.0)
        else:
            micros = event.self_cpu_time_total
        if not micros or micros <= 0:
            continue
        label = category(event.key)
        totals[label] = totals.get(label, 0.0) + micros / 1e6
        named[event.key] = named.get(event.key, 0.0) + micros / 1e6
    wall = max(wall_s, sum(totals.values())) if not on_device else wall_s
    if on_device:
        totals["host gap"] = max(0.0, wall - sum(totals.values()))
    ordered = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    heaviest = sorted(named.items(), key=lambda kv: -kv[1])[:top]
    return {
        "basis": "device time per kernel, host gap = wall - device" if on_device else "self CPU time per operator",
        "steps": steps, "wall_ms_per_step": 1e3 * wall / steps,
        "categories": {k: {"ms_per_step": 1e3 * v / steps, "share": v / wall if wall else 0.0} for k, v in ordered.items()},
        "top": [{"name": k, "category": category(k), "ms_per_step": 1e3 * v / steps, "share": v / wall if wall else 0.0}
                for k, v in heaviest],
    }
