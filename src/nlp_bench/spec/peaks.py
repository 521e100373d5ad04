"""Peaks per precision: what an MFU divides by and what the planner's GEMM rate scales, for the precision a run's
matrix products run in.

A device's tensor cores run each format at its own rate (an H100 doubles its BF16 rate in FP8; a B200 doubles
it again in NVFP4), so one peak for every run makes an FP8 run's MFU read up to twice what it is, above 100%
on a good run. A profile's `peaks:` block gives a dense figure (never the 2:4 sparse one a datasheet often
headlines) per precision with its source:

    peaks:
      bf16: {tflops: 2250, source: "..."}
      fp8: {tflops: 4500, source: "..."}

A profile without the block keeps what its `peak_tflops` (in `peak_precision`) and `peak_fp8_tflops` meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nlp_bench.errors import SpecError

#: the precisions a peak may be given for, widest first: fp8 is Transformer Engine's per-tensor or block
#: scaling at the FP8 rate, mxfp8 its MX recipe (32-element blocks with E8M0 scales, Blackwell's tensor cores),
#: nvfp4 its FP4 recipe
PEAK_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
#: how narrow each precision's operands are: a run never multiplies faster than the peak of its own width, and
#: formats of one width run at one rate (FP16 and BF16 on every tensor core; MXFP8's GEMMs at most at FP8's)
_SIXTEEN_BITS = 2
_WIDTH = {"fp32": 0, "tf32": 1, "fp16": _SIXTEEN_BITS, "bf16": _SIXTEEN_BITS, "fp8": 3, "mxfp8": 3, "nvfp4": 4}


@dataclass(frozen=True)
class Peak:
    """The dense peak an MFU of a run in `run_precision` divides by: the profile's figure for `precision`,
    which is the run's own or, where the profile has none, that of a format at least as narrow (a bound
    the run cannot pass, `note` says so)."""

    precision: str
    tflops: float
    source: str | None
    run_precision: str
    note: str | None = None


def read_peaks(data: dict[str, Any], path: Path, main_source: str | None) -> dict[str, Any]:
    """The profile's peaks as {precision: {"tflops", "source"}} and the single-peak keys they imply, checked:
    a `peaks:` block, else the old keys' figures (peak_tflops in peak_precision, peak_fp8_tflops). A figure in
    both places must agree."""
    block = data.get("peaks")
    if block is None:
        table = {}
        if data.get("peak_tflops") is not None:
            table[data.get("peak_precision", "bf16")] = {"tflops": data["peak_tflops"], "source": main_source}
        if data.get("peak_fp8_tflops") is not None:
            table["fp8"] = {"tflops": data["peak_fp8_tflops"], "source": (data.get("sources") or {}).get("peak_fp8_tflops")}
        return {"peaks": table}
    if not isinstance(block, dict) or not block:
        raise SpecError(f"{path}: peaks must map precisions ({', '.join(PEAK_PRECISIONS)}) to dense TFLOP/s")
    table = {}
    for precision, entry in block.items():
        if precision not in PEAK_PRECISIONS:
            raise SpecError(f"{path}: peaks: {precision!r} is not one of {', '.join(PEAK_PRECISIONS)}")
        tflops, source = (entry.get("tflops"), entry.get("source")) if isinstance(entry, dict) else (entry, None)
        if isinstance(entry, dict) and set(entry) - {"tflops", "source"}:
            raise SpecError(f"{path}: peaks.{precision} takes tflops and source, got {', '.join(map(str, entry))}")
        if isinstance(tflops, bool) or not isinstance(tflops, int | float) or tflops <= 0:
            raise SpecError(f"{path}: peaks.{precision} must be a positive number of TFLOP/s, got {tflops!r}")
        table[precision] = {"tflops": tflops, "source": None if source is None else str(source)}
    main = next((p for p in ("bf16", "fp16", "fp32", "tf32") if p in table), None)
    implied = {"peak_tflops": main and table[main]["tflops"], "peak_precision": main,
               "peak_fp8_tflops": table.get("fp8", {}).get("tflops")}
    for key, value in implied.items():
        if value is not None and data.get(key) is not None and data[key] != value:
            raise SpecError(f"{path}: {key} {data[key]!r} disagrees with the peaks block's {value!r}")
    return {"peaks": table, **{k: v for k, v in implied.items() if v is not None and data.get(k) is None}}


def choose_peak(table: dict[str, dict[str, Any]], run_precision: str, main: str | None = None) -> tuple[Peak | None, str | None]:
    """The peak a run whose GEMMs run in `run_precision` is measured against, or why there is none.

    The run's own precision's peak; else the lowest peak of a format at least as narrow (one the run cannot
    beat, so its MFU stays at most 100%: an fp16 run against the BF16 peak, MXFP8 against FP8, an fp32 run
    against BF16); else, for a 16-bit or wider run, the profile's single peak (`main`, what a profile of one
    peak always meant); never a wider format's peak for a narrower run (an FP8 run against BF16 reads double)."""
    if run_precision in table:
        entry = table[run_precision]
        return Peak(run_precision, entry["tflops"], entry["source"], run_precision), None
    width = _WIDTH.get(run_precision, 0)
    bounds = sorted((entry["tflops"], p) for p, entry in table.items() if _WIDTH[p] >= width)
    if bounds:
        tflops, precision = bounds[0]
        sixteen = {precision, run_precision} == {"fp16", "bf16"}  # one rate, which datasheets give as one figure
        return Peak(precision, tflops, table[precision]["source"], run_precision, None if sixteen else
                    f"the profile gives no {run_precision} peak: measured against its {precision} peak, which a "
                    f"{run_precision} run cannot pass"), None
    if main in table and width <= _SIXTEEN_BITS:
        entry = table[main]
        return Peak(main, entry["tflops"], entry["source"], run_precision,
                    f"the profile's one peak ({main}) for a {run_precision} run"), None
    return None, (f"the profile gives no {run_precision} peak (nor one of a narrower format), and its "
                  f"{'/'.join(table) or 'missing'} peak would overstate a {run_precision} run")
