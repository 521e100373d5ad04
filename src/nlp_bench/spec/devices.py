"""Known accelerators: the figures a system profile needs per device, each with its source.

`bench system detect` fills a new profile from this table when Slurm's Gres type, a node feature or
nvidia-smi names the device. Peaks are dense (no 2:4 sparsity) BF16 tensor-core figures, the ones an MFU
divides by; a vendor's headline figure is often the sparse one, twice as large. Where a figure is not in
the vendor's datasheet it is left out (None) and the profile asks the site to fill it in.

The matmul rates are measured, not quoted: the dense GEMM rate the device reaches on large random operands
(cuBLAS through torch), which the planner times matrix products against. No GEMM reaches the datasheet
peak, and devices miss it by different amounts (an A100 by about 17%, an H100 by about 24% in BF16 and 31%
in FP8), so a time model fitted on one device's runs carries to another only through the measured rate.
Where no measurement is at hand the figure is None and the planner assumes MATMUL_FRACTION of the peak.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """One device as Slurm schedules it (an MI250X appears as two GPUs, one per graphics compute die)."""

    key: str
    name: str  # the profile's device_name
    vendor: str  # nvidia | amd
    pattern: str  # regular expression over a normalised name (lower case, letters and digits only)
    peak_tflops: float  # dense BF16 per device
    memory_gib: float
    memory_bandwidth_gbps: float
    intra_node_gbps: float | None  # NVLink/Infinity Fabric, one direction per device; None where not stated
    source: str
    matmul_tflops: float | None = None  # measured dense BF16 GEMM rate (see above)
    matmul_fp8_tflops: float | None = None  # measured dense FP8 (E4M3) GEMM rate
    matmul_source: str = ""
    #: measured causal attention, forward and backward, in TFLOP/s on the count of the whole s x s score matrix
    #: (12·b·s²·h; Megatron-LM's count before it halved the causal core, and attention_rates.py's), by sequence
    #: length: (sequence, rate) pairs, rising; empty where nothing was measured
    attention_tflops: tuple[tuple[int, float], ...] = ()


#: The share of the datasheet peak a large GEMM is taken to reach where nothing was measured: the A100's,
#: H100's and H200's measured BF16 rates below lie at 0.83, 0.76 and 0.80 of it.
MATMUL_FRACTION = 0.8
#: The same for FP8: the H100's and H200's measured FP8 rates lie at 0.69 and 0.68 of the FP8 peak.
MATMUL_FP8_FRACTION = 0.7
_H100_MEASURED = ("measured on an H100 80GB HBM3 SXM (700 W) with benchmark/perf/gemm_rates.py, torch 2.11.0+cu130, "
                  "2026-11-26: the best of square GEMMs of side 4096, 8192 and 16384 on random operands (BF16 "
                  "750.5 at 16384, 748.2 at 8192; FP8 E4M3 by torch._scaled_mm 1375 at 16384); published "
                  "cuBLAS figures for the same part: BF16 795 at 8192 (P. Shankhdhar, fast.cu, 2024), FP8 1403 "
                  "(S. Bekman, ml-engineering, maximum achievable matmul FLOPS table, torch 2.7)")
_H200_MEASURED = ("measured on an H200 SXM 141GB (700 W) with benchmark/perf/gemm_rates.py, torch 2.11.0+cu130, "
                  "2026-11-26: the best of square GEMMs of side 4096, 8192 and 16384 on random operands (BF16 "
                  "795.9 at 8192, 746.3 at 16384; FP8 E4M3 by torch._scaled_mm 1349 at 16384); the same die as the "
                  "H100: their layer-shaped GEMMs agree within 2%, the best squares within 6%")
#: benchmark/perf/attention_rates.py, 2026-11-26, torch 2.11.0+cu130: torch's cuDNN attention (the fused
#: kernel Transformer Engine runs on Hopper), bf16, causal, 32 heads in 8 groups of dim 128, 16384 tokens
_H100_ATTENTION = ((2048, 639.1), (4096, 798.9), (8192, 894.6), (16384, 913.3), (32768, 960.6))
_H200_ATTENTION = ((2048, 663.3), (4096, 826.8), (8192, 908.4), (16384, 902.3), (32768, 936.5))
#: Dao 2023, "FlashAttention-2" (arXiv:2307.08691), Figure 4(d) (Dao-AILab/flash-attention,
#: assets/flash2_a100_fwd_bwd_benchmark.png): FlashAttention-2 on an A100 80GB SXM4, fp16, causal, head dimension
#: 128, 16 heads, 16k tokens a measurement, forward and backward. The figure counts 3.5 times a forward of half
#: the score matrix (7·b·s²·h), so its figures are scaled by 12/7 to the whole matrix's count. The A100 40GB has
#: the same SMs: attention runs from on-chip memory, so it is taken at the same rates. Like the H100's and
#: H200's, these are head dimension 128's rates; the planner uses them at every head dimension.
_A100_ATTENTION = tuple((seq, round(rate * 12 / 7, 1)) for seq, rate in
                        ((512, 99), (1024, 133), (2048, 155), (4096, 173), (8192, 182), (16384, 189)))
_A100_MEASURED = ("H. He, 'Strangely, matrix multiplications on GPUs run faster when given predictable data' "
                  "(2024): 258 TFLOP/s BF16 at 8192 cubed on random operands through torch and cuBLAS; S. Bekman, "
                  "ml-engineering, maximum achievable matmul FLOPS table: 271 at the best shape a search found")


DEVICES: tuple[Device, ...] = (
    Device("gh200", "GH200-96GB", "nvidia", r"gh200", 989, 96, 4000, 450,
           "NVIDIA GH200 Grace Hopper Superchip datasheet (H100 GPU, 96 GB HBM3 at 4 TB/s; NVLink 4 900 GB/s "
           "bidirectional); dense BF16 as for H100 SXM"),
    Device("h200", "H200-SXM-141GB", "nvidia", r"h200", 989, 141, 4800, 450,
           "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e at 4.8 TB/s, BF16 1979 TFLOP/s with "
           "sparsity, NVLink 900 GB/s bidirectional)", 795.9, 1349, _H200_MEASURED, _H200_ATTENTION),
    Device("h100-pcie", "H100-PCIe-80GB", "nvidia", r"h100.*pcie|h100pcie", 756, 80, 2000, None,
           "NVIDIA H100 Tensor Core GPU datasheet (PCIe: BF16 1513 TFLOP/s with sparsity, 80 GB HBM2e at 2 TB/s)"),
    Device("h100-nvl", "H100-NVL-94GB", "nvidia", r"h100.*nvl|h100nvl", 835, 94, 3900, None,
           "NVIDIA H100 Tensor Core GPU datasheet (NVL: BF16 1671 TFLOP/s with sparsity, 94 GB HBM3 at 3.9 TB/s)"),
    Device("h100", "H100-SXM-80GB", "nvidia", r"h100", 989, 80, 3350, 450,
           "NVIDIA H100 Tensor Core GPU datasheet (SXM: BF16 1979 TFLOP/s with sparsity, 80 GB HBM3 at "
           "3.35 TB/s, NVLink 900 GB/s bidirectional)", 750.5, 1375, _H100_MEASURED, _H100_ATTENTION),
    Device("a100-80", "A100-SXM4-80GB", "nvidia", r"a100.*80", 312, 80, 2039, 300,
           "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM: 2039 GB/s HBM2e; NVLink 600 GB/s bidirectional)",
           258, None, _A100_MEASURED, _A100_ATTENTION),
    Device("a100", "A100-SXM4-40GB", "nvidia", r"a100", 312, 40, 1555, 300,
           "NVIDIA A100 Tensor Core GPU datasheet (40 GB SXM: 1555 GB/s HBM2; NVLink 600 GB/s bidirectional)",
           258, None, _A100_MEASURED, _A100_ATTENTION),
    Device("v100", "V100-SXM2-32GB", "nvidia", r"v100", 125, 32, 900, 150,
           "NVIDIA V100 datasheet (SXM2: 125 TFLOP/s FP16 tensor, no BF16; 900 GB/s HBM2; NVLink 300 GB/s)"),
    Device("mi300a", "MI300A", "amd", r"mi300a", 980.6, 128, 5300, None,
           "AMD Instinct MI300A APU datasheet (BF16 980.6 TFLOP/s dense, 128 GB unified HBM3 at 5.3 TB/s)"),
    Device("mi300x", "MI300X", "amd", r"mi300x?", 1307.4, 192, 5300, None,
           "AMD Instinct MI300X datasheet (BF16 1307.4 TFLOP/s dense, 192 GB HBM3 at 5.3 TB/s)"),
    Device("mi250x", "MI250X-GCD", "amd", r"mi250x?", 191.5, 64, 1638, None,
           "AMD Instinct MI250X datasheet (per module: BF16 383 TFLOP/s, 128 GB HBM2e at 3.2 TB/s; Slurm and "
           "ROCm count its two dies as two GPUs, so half of each per GPU)"),
)


def normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.lru_cache(maxsize=256)  # the planner asks once per layout it times
def find_device(*names: str) -> Device | None:
    """The first known device any of the names (Gres type, node features, nvidia-smi's name) matches."""
    for name in names:
        text = normalise(name)
        if not text:
            continue
        for device in DEVICES:
            if re.search(device.pattern, text):
                return device
    return None
