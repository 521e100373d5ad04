"""Registers, spilled bytes and resident programs per multiprocessor of the Triton norm kernels for every
launch setting, compiled for an H100 (sm_90) on any machine: no GPU needed, only Triton's bundled ptxas
and cuobjdump. A kernel that spills or leaves the multiprocessor with few warps cannot stream rows at
memory speed, so this narrows what benchmark/perf/norm_launch.py has to time on a GPU.

    python benchmark/perf/norm_registers.py [--widths 4096,12288] [--warps 4,8,16,32] [--rows 1,2,4]
                                            [--prefetch 0,1] [--chunks 2048,4096] [--param-tiles 16x128,32x64]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

# H100 SXM (sm_90): registers and warps per multiprocessor, shared memory a block may use
REGISTERS, MAX_WARPS, SHARED = 65536, 64, 227 * 1024


def _resources(fn, signature: dict, constexprs: dict, warps: int) -> tuple[int, int, int]:
    """(registers per thread, spill stack bytes per thread, shared bytes) of fn compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**signature, **{k: "constexpr" for k in constexprs}}
    kernel = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps})
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return registers, stack, kernel.metadata.shared


def resident(registers: int, warps: int, shared: int) -> int:
    """Programs that fit on one multiprocessor at once (registers are allocated in units of 8 per thread)."""
    by_registers = REGISTERS // (-(-registers // 8) * 8 * warps * 32)
    return min(by_registers, MAX_WARPS // warps, SHARED // max(shared, 1))


#: the kernels' argument types: bf16 activations and parameters, fp32 statistics and partial sums
TYPES = {**dict.fromkeys("X W B Y DY DX".split(), "*bf16"), **dict.fromkeys("MEAN RSTD DW DB".split(), "*fp32"),
         **dict.fromkeys("stride_x stride_y stride_dy stride_dx M N".split(), "i32"), "eps": "fp32"}


def _signature(names: str) -> dict[str, str]:
    return {name: TYPES[name] for name in names.split()}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="4096,12288")
    ap.add_argument("--warps", default="4,8,16,32")
    ap.add_argument("--rows", default="1,2,4", help="rows per tile")
    ap.add_argument("--chunks", default="2048,4096", help="columns per chunk for the chunked kernels")
    ap.add_argument("--prefetch", default="0,1",
                    help="whole-row kernels without (0) and with (1) the next tile loaded ahead")
    ap.add_argument("--param-tiles", default="", help="also the parameter-gradient kernel at these ROWSxCOLUMNS tiles")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        from nlp_bench.kernels import norms
    except ImportError as exc:
        print(f"benchmark/perf/norm_registers.py needs triton: {exc}", file=sys.stderr)
        return 2
    forward = _signature("X W B Y MEAN RSTD stride_x stride_y M N eps")
    backward = _signature("X W DY DX MEAN RSTD DW DB stride_x stride_dy stride_dx M N")
    chunked_dx = {k: v for k, v in backward.items() if k not in ("DW", "DB")}
    print("kernel               width warps rows ahead chunk  registers  spill bytes/thread  shared B  programs/SM"
          "  warps/SM")
    for n in _ints(args.widths):
        block = 1 << (n - 1).bit_length()
        layouts = [(rows, 0, ahead) for rows in _ints(args.rows) for ahead in _ints(args.prefetch)]
        layouts += [(1, c, 0) for c in _ints(args.chunks) if 0 < c < n]
        for (rows, chunk, ahead), warps in itertools.product(layouts, _ints(args.warps)):
            flags = {"RMS": False, "HAS_W": True}
            if chunk:
                chunks = {"CHUNK": chunk}
                cases = [("forward", norms._norm_forward_chunked, forward, {**flags, "HAS_B": True, **chunks}),
                         ("backward dx", norms._norm_backward_chunked, chunked_dx, {**flags, **chunks})]
            else:
                tile = {**flags, "ROWS": rows, "PREFETCH": bool(ahead), "BLOCK": block}
                cases = [("forward", norms._norm_forward, forward, {**tile, "HAS_B": True}),
                         ("backward dx+partials", norms._norm_backward, backward,
                          {**tile, "HAS_B": True, "PARTIALS": True}),
                         ("backward dx", norms._norm_backward, backward, {**tile, "HAS_B": False, "PARTIALS": False})]
            for name, fn, signature, constexprs in cases:
                registers, stack, shared = _resources(fn, signature, constexprs, warps)
                programs = resident(registers, warps, shared)
                print(f"{name:20} {n:>5} {warps:>5} {rows:>4} {'yes' if ahead else 'no':>5} {chunk or '-':>5}"
                      f"  {registers:>9}  {stack:>18}"
                      f"  {shared:>8}  {programs:>11}  {programs * warps:>8}", flush=True)
    if args.param_tiles:
        print("\nparameter-gradient kernel (split backward), any width\n"
              "tile      warps  registers  spill bytes/thread  shared B  programs/SM  warps/SM")
        grads = _signature("X DY MEAN RSTD DW DB stride_x stride_dy M N")
        grads["ROWS_PER_PROGRAM"] = "i32"
        for shape, warps in itertools.product(args.param_tiles.split(","), _ints(args.warps)):
            tile, cols = (int(v) for v in shape.split("x"))
            constexprs = {"RMS": False, "HAS_B": True, "TILE_M": tile, "BLOCK_N": cols}
            registers, stack, shared = _resources(norms._norm_param_grads, grads, constexprs, warps)
            programs = resident(registers, warps, shared)
            print(f"{shape:9} {warps:>5}  {registers:>9}  {stack:>18}  {shared:>8}  {programs:>11}"
                  f"  {programs * warps:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
