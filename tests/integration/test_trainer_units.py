"""Single-process checks of the trainer's pieces (no process group needed).

The runs of the trainer start once, together, from one launcher (`runs`); each test reads its own."""


import pytest
from trainer_harness import Launch, launch_all, records, succeeded, trainer

BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "3", "--mock-data", "--vocab-size", "100",
        "--eval-iters", "0"]

#: WORLD_SIZE=2 with no second rank: a trainer that got as far as the rendezvous would hang
ALONE_IN_TWO = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}

BAD_LAYOUTS = {
    "sp-without-tp": (["--sequence-parallel"], "sequence parallelism (--sequence-parallel) needs tp > 1"),
    "pp-layers": (["--pipeline-model-parallel-size", "2", "--num-layers", "3"],
                  "pp 2 must divide the number of layers 3 (--pipeline-model-parallel-size, --num-layers)"),
    "global-batch": (["--global-batch-size", "3"],
                     "the global batch 3 must be a multiple of mbs x dp = 2 x 2 (--global-batch-size, "
                     "--micro-batch-size)"),
    "tp-world": (["--tensor-model-parallel-size", "3"], "tp x pp = 3 must divide the 2 ranks"),
    "vp-without-pp": (["--num-layers-per-virtual-pipeline-stage", "1"],
                      "interleaving (--num-layers-per-virtual-pipeline-stage) needs pp > 1"),
    "one-chunk": (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2",
                   "--num-layers", "4"],
                  "the interleaved schedule needs at least 2 model chunks per rank "
                  "(layers / (pp x --num-layers-per-virtual-pipeline-stage) > 1)"),
    "warm-up": (["--lr-warmup-iters", "3"],
                "learning-rate schedule: lr decay length 3 must exceed the warm-up 3 (see --lr-warmup-*, "
                "--lr-decay-*, --train-*)"),
}

@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    return tmp_path_factory.mktemp("profile")

@pytest.fixture(scope="module")
def runs(profiled):
    gloo = [*BASE, "--distributed-backend", "gloo"]
    return launch_all({
        **{name: Launch(1, [*gloo, *extra], ALONE_IN_TWO) for name, (extra, _) in BAD_LAYOUTS.items()},
        "bf16 and fp16": Launch(1, [*gloo, "--bf16", "--fp16"]),
        # Megatron's --profile --use-pytorch-profiler over iterations 2 and 3
        "profile": Launch(1, [*gloo, "--train-iters", "5", "--log-interval", "1", "--profile",
                              "--use-pytorch-profiler", "--profile-step-start", "2", "--profile-step-end", "4",
                              "--tensorboard-dir", str(profiled)]),
    })

@pytest.mark.parametrize("layout", BAD_LAYOUTS)
def test_bad_layout_stops_before_any_process_group(runs, layout):
    proc = runs[layout]
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"nlp_bench.train: error: {BAD_LAYOUTS[layout][1]}"

def test_trainer_usage_error_is_one_line_exit_2(runs):
    proc = runs["bf16 and fp16"]
    assert proc.returncode == 2
    assert proc.stderr.strip() == "nlp_bench.train: error: --bf16 and --fp16 exclude each other"

def test_trainer_runs_as_one_process_without_torchrun():
    proc = trainer(*BASE, "--distributed-backend", "gloo", "--log-interval", "1", timeout=120)
    assert [r.iteration for r in records(proc)] == [1, 2, 3]
    assert "world 1 = tp 1 x pp 1 x dp 1" in proc.stdout

def test_profile_splits_the_step_time_by_category(runs, profiled):
    """Megatron's --profile --use-pytorch-profiler: a trace and the time per category of the profiled steps."""
    import json

    proc = succeeded(runs["profile"])
    assert "profile of iterations 2-3 (self CPU time per operator)" in proc.stdout
    summary = json.loads((profiled / "profile_rank0.json").read_text())
    shares = {name: value["share"] for name, value in summary["categories"].items()}
    assert summary["steps"] == 2 and "gemm" in shares and "optimizer" in shares
    assert 0.2 < sum(shares.values()) <= 1.0 + 1e-9 and shares["gemm"] > 0
    assert json.loads((profiled / "trace_rank0.json").read_text())["traceEvents"]
