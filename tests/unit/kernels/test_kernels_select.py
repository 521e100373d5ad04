"""Which implementation the fused ops use, how the trainer reports it, and that the Triton path and
Megatron's switches train the same model as the torch path."""

from __future__ import annotations

import pytest
import torch

from nlp_bench import kernels
from nlp_bench.kernels import norm_settings, select


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(select.KERNELS_ENV, raising=False)
    select.backend.cache_clear()
    yield monkeypatch
    select.backend.cache_clear()
    select.configure()

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the choice on a machine without a GPU")
def test_without_a_gpu_every_op_is_torch(fresh_choice):
    assert select.backend()[0] == "torch"
    assert all(kernels.implementation(op) == "torch" for op in select.OPS)
    x = torch.randn(3, 8)
    torch.testing.assert_close(kernels.layer_norm(x, None, None), torch.nn.functional.layer_norm(x, (8,)))

def test_the_environment_forces_or_is_refused(fresh_choice):
    fresh_choice.setenv(select.KERNELS_ENV, "torch")
    assert select.backend() == ("torch", f"{select.KERNELS_ENV}=torch")
    select.backend.cache_clear()
    fresh_choice.setenv(select.KERNELS_ENV, "cuda")
    with pytest.raises(kernels.KernelChoiceError, match="use triton or torch"):
        select.backend()
    if not torch.cuda.is_available():
        select.backend.cache_clear()
        fresh_choice.setenv(select.KERNELS_ENV, "triton")
        with pytest.raises(kernels.KernelChoiceError, match="NLP_BENCH_KERNELS=triton but"):
            select.backend()

def test_switches_turn_single_ops_off_and_say_so(fresh_choice):
    kernels.configure({"bias_gelu": "--no-bias-gelu-fusion"})
    assert kernels.implementation("bias_gelu") == "torch"
    assert "bias_gelu=torch (--no-bias-gelu-fusion)" in kernels.describe()
    with pytest.raises(kernels.KernelChoiceError, match="unknown fused op"):
        kernels.configure(["softmax"])

@pytest.fixture
def launch_settings(monkeypatch):
    """norm_settings' tables, restored after the test."""
    monkeypatch.setattr(norm_settings, "LAUNCH", dict(norm_settings.LAUNCH))
    monkeypatch.setattr(norm_settings, "LAUNCH_BY_WIDTH", {})
    monkeypatch.delenv(norm_settings.NORM_LAUNCH_ENV, raising=False)
    yield monkeypatch
    monkeypatch.delenv(norm_settings.NORM_LAUNCH_ENV, raising=False)
    select.configure()

def test_norm_launch_overrides_take_what_norm_launch_py_prints(launch_settings):
    """The form benchmark/perf/norm_launch.py prints (WIDTH:KEY=INTEGER) and plain KEY=INTEGER items: a
    width goes to LAUNCH_BY_WIDTH, warps 0 is the default, prefetch is a flag."""
    norm_settings.override("4096:forward_warps=32,4096:forward_prefetch=1,12288:forward_chunk=2048,"
                           "12288:backward_warps=0, backward_per_processor=2")
    assert norm_settings.LAUNCH["backward_per_processor"] == 2
    assert norm_settings.settings(4096)["forward_warps"] == 32 and norm_settings.settings(4096)["forward_prefetch"] is True
    assert norm_settings.settings(5120)["forward_chunk"] == 2048 and norm_settings.settings(5120)["backward_warps"] is None
    assert norm_settings.settings(12289)["forward_chunk"] == 0

@pytest.mark.parametrize("text, message", [
    ("forward_chunk=3", "forward_chunk must be a power of two"),
    ("backward_rows=0", "backward_rows must be a power of two"),
    ("4096:forward_prefetch=2", "forward_prefetch must be 0 or 1"),
    ("forward_per_processor=0", "at least 1"),
    ("forward_warps=12", "forward_warps must be a power of two"),
    ("forward_warps=-8", "is not \\[WIDTH:\\]KEY=INTEGER"),
    ("fast=1", "is not \\[WIDTH:\\]KEY=INTEGER with KEY one of forward_warps"),
    ("0:forward_rows=2", "is not"),
    ("x:forward_rows=2", "is not"),
])
def test_a_bad_norm_launch_override_says_which_item_and_changes_nothing(launch_settings, text, message):
    before = dict(norm_settings.LAUNCH)
    with pytest.raises(ValueError, match=message):
        norm_settings.override(f"forward_rows=2,{text}")
    assert norm_settings.LAUNCH == before and norm_settings.LAUNCH_BY_WIDTH == {}

def test_the_environment_sets_the_norm_launch_and_the_log_says_so(launch_settings):
    launch_settings.setenv(norm_settings.NORM_LAUNCH_ENV, "12288:forward_chunk=2048")
    kernels.configure()
    assert norm_settings.settings(12288)["forward_chunk"] == 2048
    if select.backend()[0] == "triton":
        assert f"{norm_settings.NORM_LAUNCH_ENV}=12288:forward_chunk=2048" in kernels.describe()
    launch_settings.setenv(norm_settings.NORM_LAUNCH_ENV, "forward_chunk=100")
    with pytest.raises(kernels.KernelChoiceError, match=f"{norm_settings.NORM_LAUNCH_ENV}: 'forward_chunk=100'"):
        kernels.configure()

@pytest.mark.parametrize("decoupled", [True, False])
def test_fused_adam_torch_path_matches_torch_optimizers(decoupled):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = kernels.FusedAdam(ours, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, adam_w_mode=decoupled,
                            use_triton=False)
    ref = (torch.optim.AdamW if decoupled else torch.optim.Adam)(theirs, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=False):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs, strict=False):
        torch.testing.assert_close(a, b)

def test_fused_adam_keeps_fp32_masters_for_half_parameters():
    p = torch.nn.Parameter(torch.full((4,), 1.0, dtype=torch.bfloat16))
    opt = kernels.FusedAdam([p], lr=1e-4, use_triton=False)
    for _ in range(3):  # each step moves the weight by ~1e-4: below bf16's resolution at 1.0
        p.grad = torch.ones_like(p)
        opt.step()
    master = opt.state[p]["master"]
    assert master.dtype == torch.float32 and master[0].item() == pytest.approx(1.0 - 3e-4, rel=1e-5)
    assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), master.to(torch.bfloat16))
