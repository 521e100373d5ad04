"""Each fused op (nlp_bench.kernels, Triton) against torch eager and torch.compile of the same eager code:
forward + backward time (median of triton.testing.do_bench), called from Python and replayed from a CUDA
graph (GPU time alone), and the peak memory the op adds on top of its inputs, on one GPU. Ratios are
eager / triton (time) and triton / eager (memory), measured in one run.

    python benchmark/perf/kernels.py [--ops layer_norm,cross_entropy,...] [--no-compile]
                                     [--norm-launch 12288:forward_chunk=2048,backward_warps=16,...]

Shapes: LayerNorm and RMSNorm 8192 x {4096, 12288}; bias-GeLU 8192 x 16384; SwiGLU 8192 x 2*11008;
cross-entropy 8192 tokens x vocab 50304 (eager: F.cross_entropy on fp32 logits, as Megatron computes the
loss; the fused kernel in the trainer's mode, writing the gradient over the logits); FusedAdam over
the tensors of a 24-layer hidden-2048 GPT (1.3B parameters), fp32 master weights with bf16 model
weights, against torch.optim.AdamW(fused=True) on fp32 masters plus the bf16 copy. All bf16.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gputime import bench, graphed  # noqa: E402


def _peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _fwd_bwd(op, make_inputs):
    """A closure running op forward and backward on fresh leaves each call (inputs made outside timing)."""
    inputs = make_inputs()

    def run():
        leaves = [t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
                  for t in inputs]
        out = op(*leaves)
        out.backward(torch.ones_like(out))
    return run


def cases():
    from nlp_bench import kernels
    from nlp_bench.kernels import eager

    dev, bf16 = "cuda", torch.bfloat16

    def rand(*shape):
        return lambda: torch.randn(*shape, device=dev, dtype=bf16)

    for n in (4096, 12288):
        def mk(n=n):
            return [torch.randn(8192, n, device=dev, dtype=bf16), torch.ones(n, device=dev, dtype=bf16),
                                  torch.zeros(n, device=dev, dtype=bf16)]
        yield (f"layer_norm 8192x{n}", lambda x, w, b: kernels.layer_norm(x, w, b, 1e-5),
               lambda x, w, b: eager.eager_layer_norm(x, w, b, 1e-5), mk)
        def mk2(n=n):
            return [torch.randn(8192, n, device=dev, dtype=bf16), torch.ones(n, device=dev, dtype=bf16)]
        yield (f"rms_norm 8192x{n}", lambda x, w: kernels.rms_norm(x, w, 1e-5),
               lambda x, w: eager.eager_rms_norm(x, w, 1e-5), mk2)
    yield ("bias_gelu 8192x16384", kernels.bias_gelu, eager.eager_bias_gelu,
           lambda: [torch.randn(8192, 16384, device=dev, dtype=bf16), torch.randn(16384, device=dev, dtype=bf16)])
    yield ("swiglu 8192x22016", kernels.swiglu, eager.eager_swiglu, lambda: [rand(8192, 22016)()])
    target = torch.randint(0, 50304, (8192,), device=dev)
    yield ("cross_entropy 8192x50304",
           lambda x: kernels.vocab_parallel_cross_entropy(x, target, inplace_backward=True).mean(),
           lambda x: F.cross_entropy(x.float(), target),
           lambda: [torch.randn(8192, 50304, device=dev, dtype=bf16)])


def adam_case():
    from nlp_bench import kernels

    shapes = [(2048 * 3, 2048), (2048, 2048), (8192, 2048), (2048, 8192), (2048,), (2048,)] * 24 + [(50304, 2048)]
    model = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    for p in model:
        p.grad = torch.randn_like(p)
    ours = kernels.FusedAdam([torch.nn.Parameter(p) for p in model], lr=1e-4, weight_decay=0.1)
    for p, q in zip(ours.param_groups[0]["params"], model, strict=False):
        p.grad = q.grad
    masters = [torch.nn.Parameter(p.float()) for p in model]
    for m, p in zip(masters, model, strict=False):
        m.grad = p.grad.float()
    eager = torch.optim.AdamW(masters, lr=1e-4, weight_decay=0.1, fused=True)

    def eager_step():
        eager.step()
        torch._foreach_copy_(model, masters)  # the bf16 model copy Megatron writes after the step

    t_ours, t_eager = bench(ours.step), bench(eager_step)
    n = sum(p.numel() for p in model) / 1e6
    return f"FusedAdam {n:.0f}M params", t_eager, None, t_ours


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="", help="comma-separated name prefixes (default: all)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--norm-launch", default="", metavar="[WIDTH:]KEY=VALUE,...",
                    help="override nlp_bench.kernels.norm_settings.LAUNCH, for rows up to WIDTH wide where one is "
                         "given (norm_launch.py prints its fastest settings in this form; NLP_BENCH_NORM_LAUNCH "
                         "does the same in the trainer)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmark/perf/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from nlp_bench import kernels
    from nlp_bench.kernels import norm_settings

    try:
        norm_settings.override(args.norm_launch)
    except ValueError as exc:
        print(f"--norm-launch: {exc}", file=sys.stderr)
        return 2
    print(f"norm launch settings: {norm_settings.LAUNCH}, by width: {norm_settings.LAUNCH_BY_WIDTH}")

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {kernels.describe()}")
    print(f"{'op (fwd+bwd, bf16)':28} {'eager ms':>9} {'compile ms':>10} {'triton ms':>9} {'eager/triton':>12}"
          f" {'graphed: eager':>14} {'triton':>7} {'ratio':>6}"
          f" {'eager MiB':>10} {'triton MiB':>10} {'triton/eager mem':>16}")
    wanted = [w for w in args.ops.split(",") if w]
    for name, ours, eager, make in cases():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        run_ours, run_eager = _fwd_bwd(ours, make), _fwd_bwd(eager, make)
        t_ours, t_eager = bench(run_ours), bench(run_eager)
        t_comp = float("nan")
        if not args.no_compile:
            compiled = torch.compile(eager)
            run_comp = _fwd_bwd(compiled, make)
            t_comp = bench(run_comp)
        g_ours, g_eager = graphed(run_ours), graphed(run_eager)
        m_ours, m_eager = _peak_mib(run_ours), _peak_mib(run_eager)
        print(f"{name:28} {t_eager:9.3f} {t_comp:10.3f} {t_ours:9.3f} {t_eager / t_ours:12.2f}"
              f" {g_eager:14.3f} {g_ours:7.3f} {g_eager / g_ours:6.2f}"
              f" {m_eager:10.0f} {m_ours:10.0f} {m_ours / max(m_eager, 1e-9):16.2f}", flush=True)
    if not wanted or any("adam".startswith(w) or w.startswith("FusedAdam") for w in wanted):
        name, t_eager, _, t_ours = adam_case()
        print(f"{name:28} {t_eager:9.3f} {'':>10} {t_ours:9.3f} {t_eager / t_ours:12.2f}  (optimizer step only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
