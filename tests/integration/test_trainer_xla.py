"""The xla backend. The CPU stand-in (NLP_BENCH_XLA_CPU=1) trains exactly as the CPU path does with tensor and
data parallelism; what it cannot show (graphs, compiles, the xla process group's refusal of CPU tensors, the
device RNG, torch-xla's world) the tests marked `xla` check on the real torch-xla's CPU device (PJRT_DEVICE=CPU),
in a venv of their own (.ci/run builds it; see docs/testing.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from trainer_harness import Launch, launch_all, losses, torchrun, validation_losses

from nlp_bench.analysis.results import xla_counts
from nlp_bench.spec.switches import DOWNCAST_VARIABLES
from nlp_bench.train.xla import STAND_IN

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
         "--seq-length", "32", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1",
         "--lr-decay-style", "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "1000",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--global-batch-size", "8",
         "--eval-iters", "0"]

#: what a run's environment starts without: the stand-in and torch-xla's switches are set by the test that wants them
CLEAN = dict.fromkeys((STAND_IN, "PJRT_DEVICE", "XLA_ALWAYS_ALLREDUCE", *DOWNCAST_VARIABLES))

LAYOUTS = {"tp2": ["--tensor-model-parallel-size", "2", "--micro-batch-size", "8"], "dp2": ["--micro-batch-size", "4"]}

def train(nproc: int, backend: str, *flags: str, env: dict | None = None, iters: int = 5, model: list[str] = MODEL,
          entry: list[str] | None = None, launcher: list[str] = ()) -> subprocess.CompletedProcess:
    """Under the real torchrun: torch-xla's runtime starts in each rank's own process."""
    return torchrun(nproc, *model, "--train-iters", str(iters), "--distributed-backend", backend, *flags,
                    env={**CLEAN, **(env or {})}, entry=entry or (), launcher=launcher)

@pytest.fixture(scope="module")
def stand_in_runs():
    """Each layout on gloo and on the stand-in, started together from one launcher."""
    return launch_all({(layout, backend): Launch(2, [*MODEL, "--train-iters", "5", "--distributed-backend", backend,
                                                     *flags], {**CLEAN, **env})
                       for layout, flags in LAYOUTS.items()
                       for backend, env in (("gloo", {}), ("xla", {STAND_IN: "1"}))})

@pytest.fixture(scope="module")
def refusals():
    """The runs that must stop before training, started together from one launcher."""
    one = [*MODEL, "--distributed-backend", "xla", "--micro-batch-size", "8", "--train-iters", "2"]
    return launch_all({
        "pp2": Launch(1, [*MODEL, "--train-iters", "1", "--distributed-backend", "xla",
                          "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1"]),
        **{name: Launch(1, one, {STAND_IN: "1", name: "1"}) for name in DOWNCAST_VARIABLES}})

@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_stand_in_matches_the_cpu_path(stand_in_runs, layout):
    reference = losses(stand_in_runs[layout, "gloo"])
    proc = stand_in_runs[layout, "xla"]
    stand_in = losses(proc)
    assert len(reference) == 5 and len(set(reference)) == 5
    assert stand_in == pytest.approx(reference, rel=1e-5)
    assert "xla: CPU stand-in (NLP_BENCH_XLA_CPU=1), no graphs: 5 step ends over gloo" in proc.stdout

@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed here")
def test_without_torch_xla_the_backend_is_one_line():
    proc = train(1, "xla", "--micro-batch-size", "8", iters=2)
    assert proc.returncode != 0
    assert "nlp_bench.train: error: --distributed-backend xla needs torch_xla" in proc.stdout + proc.stderr

def test_xla_refuses_pipeline_parallelism_before_starting(refusals):
    proc = refusals["pp2"]
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nlp_bench.train: error: pipeline parallelism is not available with --distributed-backend xla (as in the "
        "Neuron reference); use tensor and data parallelism"]

@pytest.mark.parametrize("name", DOWNCAST_VARIABLES)
def test_the_old_bf16_switches_are_refused_in_one_line(refusals, name):
    """XLA_USE_BF16 / XLA_DOWNCAST_BF16 would store the fp32 master weights and Adam moments as bf16."""
    proc = refusals[name]
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"nlp_bench.train: error: {name}=1 is set: it stores fp32 master weights")
    assert " iteration " not in proc.stdout

needs_xla = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed")

#: small enough that XLA's CPU compiler takes seconds per graph on two cores
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--ffn-hidden-size", "64",
        "--seq-length", "16", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1", "--lr-decay-style",
        "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "256", "--seed", "7",
        "--global-batch-size", "4", "--micro-batch-size", "2", "--clip-grad", "1.0", "--weight-decay", "0.1"]

NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0"]

RUNNER = [str(ROOT / "tests" / "xla_metrics_run.py")]

def on_xla(tmp_path: Path, *flags: str, iters: int, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """The trainer on torch-xla's CPU device, and torch-xla's own metrics read in its process at the end."""
    metrics = tmp_path / f"metrics-{len(list(tmp_path.glob('metrics-*')))}.json"
    proc = train(1, "xla", *flags, model=TINY, iters=iters, entry=RUNNER,
                 env={"PJRT_DEVICE": "CPU", "NLP_BENCH_TEST_METRICS": str(metrics), **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(metrics.read_text())

@pytest.mark.xla
@needs_xla
def test_one_rank_on_xla_equals_gloo_in_one_graph_a_step(tmp_path):
    """The losses of the CPU path, and every step that compiled nothing ran one graph and read the host's
    numbers once, as torch-xla's metrics count them in the process."""
    iters = 6
    reference = losses(train(1, "gloo", *NO_DROPOUT, "--eval-iters", "0", model=TINY, iters=iters))
    proc, metrics = on_xla(tmp_path, *NO_DROPOUT, "--eval-iters", "0", iters=iters)
    assert losses(proc) == pytest.approx(reference, rel=1e-4)
    counts = xla_counts(proc.stdout)
    assert counts["graph_executions_per_step"] == 1 and counts["transfers_per_step"] == 1
    assert counts["steps"] == iters and counts["steps_without_compile"] >= 2
    # the trainer's totals are torch-xla's, and no step ran a second graph: one before the first step (the
    # gradient norm's mask), one a step
    assert (counts["graph_executions"], counts["compiles"]) == (metrics["executions"], metrics["compiles"])
    assert metrics["executions"] <= iters + 1

@pytest.mark.xla
@needs_xla
def test_forced_all_reduce_runs_a_step_an_evaluation_and_a_log_line(tmp_path):
    """XLA_ALWAYS_ALLREDUCE=1: every sum takes the multi-rank path on one process, where torch-xla's process
    group refuses a CPU tensor; the host's numbers (log and evaluation sums, stop flags) go over gloo."""
    flags = [*NO_DROPOUT, "--eval-iters", "1", "--eval-interval", "2", "--log-interval", "2"]
    reference = train(1, "gloo", *flags, model=TINY, iters=4)
    proc, metrics = on_xla(tmp_path, *flags, iters=4, env={"XLA_ALWAYS_ALLREDUCE": "1"})
    assert losses(proc) == pytest.approx(losses(reference), rel=1e-4)
    assert len(validation_losses(proc.stdout)) == 2
    assert validation_losses(proc.stdout) == pytest.approx(validation_losses(reference.stdout), rel=1e-4)
    assert metrics["counters"].get("xla::AllReduceInPlace", 0) > 0  # the gradients, norm and flag on the device

@pytest.mark.xla
@needs_xla
def test_a_world_torch_xla_and_the_launcher_disagree_on_is_refused_before_any_step(tmp_path):
    """torchrun starts two ranks; torch-xla's PJRT CPU client makes each a world of one."""
    proc = train(2, "xla", *NO_DROPOUT, "--tensor-model-parallel-size", "2", model=TINY, iters=2,
                 launcher=["--log-dir", str(tmp_path / "logs"), "--redirects", "3"], env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode != 0
    assert re.search(r"exitcode\s*: 2", proc.stderr)
    errors = sorted(tmp_path.glob("logs/*/attempt_0/*/stderr.log"))
    assert len(errors) == 2
    for error in errors:
        assert error.read_text().strip().splitlines() == [
            "nlp_bench.train: error: torch-xla's process group has 1 rank(s) but the launcher started 2 "
            "(WORLD_SIZE=2): each would train alone on its share of every batch; on PJRT_DEVICE=CPU torch-xla gives "
            "every process a world of its own (pytorch/xla#8063), so run one process there"]
    assert not any(" iteration " in out.read_text() for out in tmp_path.glob("logs/*/attempt_0/*/stdout.log"))

@pytest.mark.xla
@needs_xla
def test_dropout_on_xla_follows_the_seed(tmp_path):
    """The device's generator starts from --seed (a fresh torch-xla process starts from its own default),
    dropout draws from it, and the same seed gives the same run."""
    flags = ["--hidden-dropout", "0.2", "--attention-dropout", "0.2", "--eval-iters", "0"]
    (first, seeded), (second, _) = (on_xla(tmp_path, *flags, iters=3) for _ in range(2))
    other, reseeded = on_xla(tmp_path, *flags, "--seed", "8", iters=3)
    assert (seeded["device_seed_after_setup"], reseeded["device_seed_after_setup"]) == (7, 8)
    assert losses(first) == losses(second)
    assert losses(first) != losses(other)
    without = on_xla(tmp_path, *NO_DROPOUT, "--eval-iters", "0", iters=3)[0]
    assert losses(first)[1:] != pytest.approx(losses(without)[1:], rel=1e-3)  # dropout is on

@pytest.mark.xla
@needs_xla
@pytest.mark.parametrize("recompute", [["--recompute-granularity", "selective"],
                                       ["--recompute-granularity", "full", "--recompute-method", "uniform"]],
                         ids=["selective", "full"])
def test_recompute_with_dropout_on_xla_draws_the_forward_passes_masks_again(tmp_path, recompute):
    """torch's checkpoint cannot keep an xla device's generator; the recomputation must still draw the masks
    of the forward pass (the tensor-parallel stream's, for the attention core), so the run equals one that
    keeps its activations."""
    flags = ["--hidden-dropout", "0.2", "--attention-dropout", "0.2", "--eval-iters", "0"]
    kept = losses(on_xla(tmp_path, *flags, iters=3)[0])
    assert losses(on_xla(tmp_path, *flags, *recompute, iters=3)[0]) == pytest.approx(kept, rel=1e-6)

DEVICE_RNG = """
import torch, torch_xla
from torch.nn.functional import dropout
from nlp_bench.train.rng import ParallelRNG
from nlp_bench.train.xla import XlaRuntime

runtime, device = XlaRuntime(), torch_xla.device()
ones = torch.ones(64, device=device)
def masks(seed, tp_rank):
    runtime.seed(seed)
    rng = ParallelRNG(seed, tp_rank, device)
    before = dropout(ones, 0.5)
    with rng.fork():
        forked = dropout(ones, 0.5)
    after = dropout(ones, 0.5)
    runtime.sync()
    return [t.cpu().tolist() for t in (before, forked, after)]
a, b, c, d = masks(7, 0), masks(7, 0), masks(8, 0), masks(7, 1)
assert a == b, "the same seed draws the same masks"
assert a[0] != c[0], "another seed draws other masks"
assert a[1] != a[0] and a[1] != a[2], "the tensor-parallel stream is a stream of its own"
assert d[0] == a[0] and d[2] == a[2] and d[1] != a[1], "each tensor-parallel rank forks its own stream"
print("ok")
"""

@pytest.mark.xla
@needs_xla
def test_the_device_rng_is_seeded_and_forks_per_tensor_parallel_rank():
    """torch.manual_seed does not reach torch-xla's generator, and a fork must swap the device's stream."""
    proc = subprocess.run([sys.executable, "-c", DEVICE_RNG], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")

@pytest.mark.xla
@pytest.mark.slow
@needs_xla
def test_bench_runs_the_smoke_tag_on_the_local_xla_profile(tmp_path):
    """docs/trainium.md's smoke command on torch-xla's CPU device: the result keeps what the graphs cost."""
    import torch_xla
    from conftest import run_bench

    proc = run_bench("run", "--tag", "smoke", "--system", "local-xla", "--tp", "1", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (folder,) = [p.parent for p in tmp_path.glob("results/nlp/*/*/result.json")]
    result = json.loads((folder / "result.json").read_text())
    assert result["summary"]["iterations"] == 40
    counts = result["xla"]
    assert counts["graph_executions_per_step"] == 1 and counts["transfers_per_step"] == 1
    assert counts["compiles"] > 0 and counts["steps"] == 40
    assert result["provenance"]["packages"]["torch-xla"] == torch_xla.__version__
    assert result["provenance"]["environment"]["PJRT_DEVICE"] == "CPU"
    assert "XLA Graphs/step" in proc.stdout or "XLA_Graphs/step" in proc.stdout
