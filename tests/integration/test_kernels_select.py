"""Which implementation the fused ops use, how the trainer reports it, and that the Triton path and
Megatron's switches train the same model as the torch path."""

from __future__ import annotations

import pytest
import torch
from trainer_harness import Launch, launch_all, records, trainer

from nlp_bench.kernels import norm_settings, select

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--train-iters", "3", "--mock-data",
         "--vocab-size", "200", "--distributed-backend", "gloo", "--log-interval", "1", "--eval-iters", "0",
         "--hidden-dropout", "0", "--attention-dropout", "0"]

#: the Triton interpreter runs a kernel at Python speed (about 3 s a micro-batch of MODEL): one micro-batch an
#: iteration, and two iterations, so that the second's loss and gradients follow an update made on Triton's
TRITON_MODEL = [*MODEL, "--global-batch-size", "2", "--train-iters", "2"]

#: the trainer's runs choose their kernels from their flags and these variables alone
CLEAN = {"TRITON_INTERPRET": None, select.KERNELS_ENV: None, norm_settings.NORM_LAUNCH_ENV: None}

@pytest.fixture(scope="module")
def runs():
    """The module's runs of the trainer, started once, together, from one launcher."""
    return launch_all({
        "no bias-gelu fusion": Launch(1, [*MODEL, "--no-bias-gelu-fusion"], CLEAN),
        "kernels fast": Launch(1, MODEL, {**CLEAN, select.KERNELS_ENV: "fast"}),
        "norm rows 3": Launch(1, MODEL, {**CLEAN, norm_settings.NORM_LAUNCH_ENV: "forward_rows=3"}),
        "sdpa": Launch(1, [*MODEL, "--normalization", "RMSNorm"], CLEAN),
        "unfused": Launch(1, [*MODEL, "--normalization", "RMSNorm", "--no-masked-softmax-fusion"], CLEAN),
    })

def test_trainer_without_gpu_uses_torch_and_says_once(runs):
    proc = runs["no bias-gelu fusion"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if "fused ops:" in line]
    assert len(lines) == 1, lines
    for op in select.OPS:
        assert f"{op}=torch" in lines[0]
    if not torch.cuda.is_available():
        assert "[torch: no GPU]" in lines[0] or "[torch: Triton is not installed]" in lines[0]
    assert "bias_gelu=torch (--no-bias-gelu-fusion)" in lines[0]

def test_a_bad_kernel_choice_stops_the_trainer_with_one_line(runs):
    proc = runs["kernels fast"]
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"nlp_bench.train: error: {select.KERNELS_ENV}='fast' is not an implementation; use triton or torch"]
    proc = runs["norm rows 3"]
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"nlp_bench.train: error: {norm_settings.NORM_LAUNCH_ENV}: 'forward_rows=3': forward_rows must be a power of two"]

def test_unfused_attention_and_rmsnorm_train_like_the_fused_path(runs):
    losses = {name: [r.loss for r in records(runs[name])] for name in ("sdpa", "unfused")}
    assert len(losses["sdpa"]) == 3
    assert losses["unfused"] == pytest.approx(losses["sdpa"], rel=1e-5)
    assert "attention unfused (--no-masked-softmax-fusion)" in runs["unfused"].stdout

@pytest.mark.slow
@pytest.mark.parametrize("model", [(), ("--swiglu", "--normalization", "RMSNorm")], ids=["gelu-layernorm", "swiglu-rmsnorm"])
def test_trainer_on_the_triton_kernels_matches_torch(model):
    """The whole trainer with every op on the Triton kernels (the interpreter, without a GPU) against
    the torch path: the same losses and gradient norms, iteration by iteration."""
    pytest.importorskip("triton")
    runs = {}
    launch = "forward_chunk=16,backward_rows=2"  # launch settings from the environment reach the kernels
    for impl in ("torch", "triton"):
        env = {select.KERNELS_ENV: impl, norm_settings.NORM_LAUNCH_ENV: launch}
        proc = trainer(*TRITON_MODEL, *model, env={**CLEAN, **env, **({} if torch.cuda.is_available() else
                                                               {"TRITON_INTERPRET": "1"})}, ok=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"cross_entropy={impl}" in proc.stdout
        assert (f"{norm_settings.NORM_LAUNCH_ENV}={launch}" in proc.stdout) == (impl == "triton")
        runs[impl] = [(r.loss, r.grad_norm) for r in records(proc)]
    assert len(runs["torch"]) == 2
    for (loss_a, norm_a), (loss_b, norm_b) in zip(runs["torch"], runs["triton"], strict=True):
        assert loss_b == pytest.approx(loss_a, rel=1e-5) and norm_b == pytest.approx(norm_a, rel=1e-3)
