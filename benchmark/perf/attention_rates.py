"""The rate causal attention runs at on a device, forward and backward, beside the GEMM rate: whether the
planner may time the attention core as it times GEMMs.

A causal kernel computes about half of the s x s score matrix. This prints two rates: on the FLOPs the
kernel executes (half the square, plus the diagonal blocks), and on the whole matrix (4·b·s²·h forward for
QKᵀ and AV, three times that with the backward: Megatron-LM's count before it halved the causal core), the
one the device table (spec/devices.py) keeps; the planner, whose count halves it as current Megatron-LM's
does, runs a kernel at half that rate.

    python benchmark/perf/attention_rates.py [--device cuda] [--seq 4096,8192,16384] [--heads 32]
        [--groups 8] [--head-dim 128] [--backends flash,cudnn,efficient,math] [--json OUT.json]

torch's scaled_dot_product_attention with one backend at a time (a backend that cannot run here is
reported and skipped); medians of `--repeats` timed forward + backward passes after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_rates import positive_ints  # noqa: E402
from gputime import median_seconds, save_json  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def whole_matrix_flops(batch: int, seq: int, heads: int, head_dim: int) -> float:
    """Forward and backward FLOPs of the attention core over the whole score matrix: 4·b·s²·(heads·d) forward
    (scores and the weighted sum), twice that backward."""
    return 3 * 4 * batch * seq * seq * heads * head_dim


def measure(backend: str, batch: int, seq: int, heads: int, groups: int, head_dim: int, device: torch.device,
            repeats: int) -> float:
    """Seconds of one causal forward and backward with `backend`."""
    dtype = torch.bfloat16
    q = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, groups, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, groups, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)
    gqa = {"enable_gqa": True} if groups != heads else {}

    def step() -> None:
        with sdpa_kernel([BACKENDS[backend]]):
            out = scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        out.backward(grad)

    return median_seconds(step, device, repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", type=positive_ints, default=[4096, 8192, 16384])
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per measurement: batch = tokens / seq")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backends", default="flash,cudnn,efficient")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if set(backends) - set(BACKENDS) or args.heads % args.groups:
        print(f"attention_rates: backends are {', '.join(BACKENDS)}; heads must be a multiple of groups",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# device {name}, torch {torch.__version__}, cuda {torch.version.cuda}, bf16, causal, "
          f"{args.heads} heads in {args.groups} groups of dim {args.head_dim}, repeats {args.repeats}")
    print("backend    seq  batch  ms   TFLOP/s executed  TFLOP/s whole matrix")
    found = {"device": name, "torch": torch.__version__, "rows": []}
    for backend in backends:
        for seq in args.seq:
            batch = max(1, args.tokens // seq)
            try:
                t = measure(backend, batch, seq, args.heads, args.groups, args.head_dim, device, args.repeats)
            except RuntimeError as exc:
                print(f"{backend:9} {seq:6}  skipped: {str(exc).splitlines()[0][:100]}")
                continue
            counted = whole_matrix_flops(batch, seq, args.heads, args.head_dim)
            executed = counted * (seq + 1) / (2 * seq)  # the lower triangle with its diagonal
            found["rows"].append({"backend": backend, "seq": seq, "batch": batch, "seconds": t,
                                  "tflops_executed": executed / t / 1e12, "tflops_whole_matrix": counted / t / 1e12})
            print(f"{backend:9} {seq:6} {batch:5} {t * 1e3:7.2f} {executed / t / 1e12:12.4g} {counted / t / 1e12:16.4g}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    save_json(args.json_out, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
