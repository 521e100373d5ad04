"""System profiles: the site layer in slurm/systems/<name>.yaml that a rendered jobscript needs."""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench.errors import SpecError, unknown
from nlp_bench.paths import slurm_dir
from nlp_bench.spec import peaks as peak_table
from nlp_bench.spec.switches import DOWNCAST_VARIABLES, PRECISIONS
from nlp_bench.spec.trainers import BUILTIN, check_trainer
from nlp_bench.spec.yamlio import check_keys, load_yaml

_KEYS = {
    "name", "description", "device", "device_name", "devices_per_node", "device_memory_gib", "peak_tflops",
    "backend", "launcher", "executor", "max_nodes", "sbatch", "env_setup", "env", "master_addr_suffix",
    "master_port", "data_dir", "intra_node_gbps", "intra_node_pair_gbps", "inter_node_gbps", "memory_bandwidth_gbps", "link_latency_us",
    "sources", "compile_command", "compile_cache", "compile_iters", "trainer", "megatron_lm_repo", "megatron_lm_env",
    "megatron_lm_train", "detected", "peak_precision", "peak_fp8_tflops", "matmul_tflops", "matmul_fp8_tflops",
    "precision", "neuron_cc_flags", "peaks",
}
_REQUIRED = {"name", "device", "devices_per_node", "backend", "launcher", "executor"}
#: the trainer's --distributed-backend: NCCL, gloo, torch-xla (trn1, trn2, trn3 through torch-neuronx's XLA), or
#: neuron (native PyTorch on trn2 and trn3, TorchNeuron)
BACKENDS = ("nccl", "gloo", "xla", "neuron")


@dataclass(frozen=True)
class System:
    """One site's machine: devices, launch style, #SBATCH defaults, environment set-up."""

    name: str
    description: str
    device: str  # cuda | cpu | xla
    devices_per_node: int
    backend: str  # nccl | gloo | xla
    # the names of a launcher and an executor registered in launch/ (nlp_bench.registry: spec may not import
    # launch, so launch refuses a name no part answers to)
    launcher: str
    executor: str
    device_name: str = ""
    device_memory_gib: float | None = None
    peak_tflops: float | None = None  # dense per device in peak_precision, for MFU
    peak_precision: str = "bf16"
    peak_fp8_tflops: float | None = None  # dense FP8 per device, where the device has FP8
    # dense TFLOP/s per precision, each with its source (spec/peaks.py): from the `peaks:` block, else the two above
    peaks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the dense GEMM rates the device was measured to reach (BF16, FP8), which the planner times matrix
    # products against; unset: the device table's measurement, else a share of the peak (matmul_rate)
    matmul_tflops: float | None = None
    matmul_fp8_tflops: float | None = None
    # what the planner's time model needs (each figure's source in `sources`)
    intra_node_gbps: float | None = None  # GB/s one device sends to the others of its node (one direction)
    # GB/s between two devices wired directly to each other (one direction), where no switch joins the node's
    # devices (a 4-GPU NVLink mesh): a group of k of them reaches (k - 1) times it; unset: every group reaches
    # intra_node_gbps, as through NVSwitch
    intra_node_pair_gbps: float | None = None
    inter_node_gbps: float | None = None  # GB/s one node injects into the network (all its NICs, one direction)
    memory_bandwidth_gbps: float | None = None  # device memory, GB/s
    link_latency_us: float | None = None  # per collective step across nodes
    sources: dict[str, str] = field(default_factory=dict)
    # ahead-of-time compilation (Neuron): each point becomes a compile job, then the run job after it
    compile_command: str = ""  # e.g. neuron_parallel_compile; empty: no compile job
    compile_cache: str = ""  # the persistent compiled-graph cache both jobs use
    compile_iters: int = 10  # iterations of the compile job's trial run
    # the precision training runs in on this device, whatever precision a tag asks for (spec.benchmark applies
    # it where a tag meets the system, so point.json, the planner and the jobscript agree); None: the tag's
    precision: str | None = None
    # the Neuron compiler's flags, exported as NEURON_CC_FLAGS by both the compile job and the run job (the
    # compile cache is keyed on them, so the two must agree); empty: not exported
    neuron_cc_flags: str = ""
    max_nodes: int | None = None
    sbatch: dict[str, Any] = field(default_factory=dict)
    env_setup: list[str] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    master_addr_suffix: str = ""
    master_port: int = 6000
    data_dir: str = ""
    # the trainer points run by default here, and what Megatron-LM needs when it is the trainer
    trainer: str = BUILTIN
    megatron_lm_repo: str = ""  # the checkout holding pretrain_gpt.py; $MEGATRON_LM_REPO overrides it
    megatron_lm_env: dict[str, Any] = field(default_factory=dict)  # added to env for Megatron-LM points
    megatron_lm_train: dict[str, Any] = field(default_factory=dict)  # flags added for Megatron-LM (e.g. transformer-impl)
    detected: dict[str, Any] = field(default_factory=dict)  # what `bench system detect` read from Slurm (a record)
    profile_path: str = ""  # the file the profile was read from, for messages (not a key of the file)

    @property
    def peak_source(self) -> str | None:
        """Where peak_tflops comes from: the profile's own source, else the device table's for the same
        device and figure; None where neither says."""
        if self.sources.get("peak_tflops"):
            return self.sources["peak_tflops"]
        if (self.peaks.get(self.peak_precision) or {}).get("source"):
            return self.peaks[self.peak_precision]["source"]
        from nlp_bench.spec.devices import find_device

        device = find_device(self.device_name) if self.device == "cuda" else None
        if device is not None and self.peak_tflops == device.peak_tflops:
            return f"{device.source} (device table)"
        return None

    @property
    def sourced_peaks(self) -> dict[str, dict[str, Any]]:
        """The peaks per precision, the main one's source filled in as peak_source finds it."""
        return {p: {**e, "source": e["source"] or (self.peak_source if p == self.peak_precision else None)}
                for p, e in self.peaks.items()}

    def peak(self, precision: str) -> tuple[peak_table.Peak | None, str | None]:
        """The dense peak a run whose GEMMs run in `precision` is measured against, or why there is none
        (peaks.choose_peak)."""
        return peak_table.choose_peak(self.sourced_peaks, precision, self.peak_precision)

    def _table_entry(self):
        """The device table's entry for this profile's device, where the profile's peak is the table's (a
        profile with another peak is another part or clock, whose measurements the table does not hold)."""
        from nlp_bench.spec import devices

        device = devices.find_device(self.device_name) if self.device == "cuda" else None
        return device if device is not None and self.peak_tflops in (None, device.peak_tflops) else None

    def matmul_rate(self, fp8: bool = False, precision: str | None = None) -> tuple[float | None, str]:
        """(TFLOP/s, where it comes from) of a large GEMM in 16 bits or FP8: the profile's measurement, the
        device table's (where the profile's peak is the table's: a profile with another peak is another part
        or clock), or where neither has one, devices.MATMUL_FRACTION (MATMUL_FP8_FRACTION) of the peak; None
        where the profile has no peak either. A `precision` narrower than FP8's recipes with a peak of its own
        (mxfp8, nvfp4 in a `peaks:` block) scales the FP8 rate by its peak over FP8's."""
        from nlp_bench.spec import devices

        if precision in ("mxfp8", "nvfp4") and precision in self.peaks:
            rate, source = self.matmul_rate(fp8=True)
            own, fp8_peak = self.peaks[precision]["tflops"], self.peak_fp8_tflops
            if rate is None or fp8_peak is None:
                rate, source = own * devices.MATMUL_FP8_FRACTION, f"{devices.MATMUL_FP8_FRACTION:g} of its peak assumed"
                return rate, f"no measured GEMM rate for {self.device_name or self.name} in {precision}: {source}"
            return rate * own / fp8_peak, f"{source}, times its {precision} peak over its fp8 peak"
        key = "matmul_fp8_tflops" if fp8 else "matmul_tflops"
        if getattr(self, key) is not None:
            return getattr(self, key), self.sources.get(key, f"the profile's {key}")
        device = self._table_entry()
        if device is not None and getattr(device, key) is not None:
            return getattr(device, key), f"{device.name}: {device.matmul_source} (device table)"
        peak = self.peak_fp8_tflops if fp8 else self.peak_tflops
        fraction = devices.MATMUL_FP8_FRACTION if fp8 else devices.MATMUL_FRACTION
        if peak is None:
            return None, ""
        return peak * fraction, f"no measured GEMM rate for {self.device_name or self.name}: {fraction:g} of its peak assumed"

    def attention_rate(self, seq: float) -> float | None:
        """TFLOP/s of a fused causal attention kernel over `seq` tokens on this device, on the whole score
        matrix's count (devices.Device.attention_tflops), interpolated in log2(seq) between the device table's
        measurements and held at their ends; None where the device has none (the planner then times the
        attention core as GEMMs)."""
        device = self._table_entry()
        points = device.attention_tflops if device is not None else ()
        if not points:
            return None
        if seq <= points[0][0]:
            return points[0][1]
        for (s0, r0), (s1, r1) in itertools.pairwise(points):
            if seq <= s1:
                return r0 + (r1 - r0) * math.log2(seq / s0) / math.log2(s1 / s0)
        return points[-1][1]

    @property
    def partition(self) -> str:
        return str(self.sbatch.get("partition", ""))


#: a launcher's or an executor's name
_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_SAFE = {
    # values the template writes verbatim: a $NAME may expand, nothing may run
    "data_dir": re.compile(r"[A-Za-z0-9_./~${}+,:@-]*"),
    "megatron_lm_repo": re.compile(r"[A-Za-z0-9_./~${}+,:@-]*"),
    "master_addr_suffix": re.compile(r"[A-Za-z0-9.-]*"),
    "compile_command": re.compile(r"[A-Za-z0-9_./-]*"),
    "compile_cache": re.compile(r"[A-Za-z0-9_./~${}+,:@-]*"),
    "name": re.compile(r"[A-Za-z0-9_.-]+"),
}


def _check_site_values(data: dict[str, Any], path: Path) -> None:
    for key, pattern in _SAFE.items():
        value = data.get(key)
        if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
            raise SpecError(f"{path}: {key} {value!r} holds characters a jobscript cannot take literally")
    for key, value in (data.get("sbatch") or {}).items():
        check_sbatch_option(key, value, str(path))
    for block in ("env", "megatron_lm_env"):
        for key in data.get(block) or {}:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
                raise SpecError(f"{path}: {block} name {key!r} is not a shell variable name")
            if key in DOWNCAST_VARIABLES:  # a profile's `precision: bf16` says it instead
                raise SpecError(f"{path}: {block} sets {key}, which Neuron no longer supports and torch-xla still "
                                f"honours by storing every fp32 tensor (master weights, Adam moments) as bf16; remove "
                                f"it and set `precision: bf16` (bf16 training with fp32 master weights)")
    flags = data.get("neuron_cc_flags") or ""
    if not isinstance(flags, str) or not flags.isprintable():
        raise SpecError(f"{path}: neuron_cc_flags must be one printable line of compiler flags, got {flags!r}")
    if flags and "NEURON_CC_FLAGS" in (data.get("env") or {}):
        raise SpecError(f"{path}: NEURON_CC_FLAGS is set twice (neuron_cc_flags and env); keep neuron_cc_flags")
    for key in data.get("megatron_lm_train") or {}:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(key)):
            raise SpecError(f"{path}: megatron_lm_train: {key!r} is not a Megatron flag name")
    check_trainer(data.get("trainer", BUILTIN), str(path))
    for key in ("master_port", "compile_iters"):
        if not isinstance(data.get(key, 1), int) or isinstance(data.get(key), bool) or data.get(key, 1) < 1:
            raise SpecError(f"{path}: {key} must be a positive number")


def check_sbatch_option(key: Any, value: Any, where: str) -> None:
    """An #SBATCH option must stay one comment line: a newline would start a line the shell runs."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", str(key)):
        raise SpecError(f"{where}: {key!r} is not an sbatch option name")
    if value is True:
        return  # a switch: #SBATCH --exclusive
    text = str(value)
    if not text or any(c in text for c in "\n\r\x00") or not text.isprintable():
        raise SpecError(f"{where}: sbatch {key} value {value!r} must be one printable line")


def systems_dir() -> Path:
    return slurm_dir() / "systems"


def known_systems() -> list[str]:
    return sorted(p.stem for p in systems_dir().glob("*.yaml"))


def load_system(name: str) -> System:
    """A system profile by name (the file slurm/systems/<name>.yaml); parsed once per version of the file,
    since a sweep asks for the same profile for every point."""
    path = systems_dir() / f"{name}.yaml"
    if not path.is_file():
        raise SpecError(unknown("system", name, known_systems()))
    return _parse_system(path, path.stat().st_mtime_ns, name)


def load_system_file(path: Path) -> System:
    """A system profile from a file anywhere (its name is the file's stem, as in slurm/systems/)."""
    if not path.is_file():
        raise SpecError(f"system profile {path} not found")
    return _parse_system(path, path.stat().st_mtime_ns, path.stem)


@functools.lru_cache(maxsize=64)
def _parse_system(path: Path, _mtime_ns: int, name: str) -> System:
    data = load_yaml(path, "system profile")
    check_keys(data, _KEYS, str(path))
    missing = _REQUIRED - set(data)
    if missing:
        raise SpecError(f"{path}: missing key(s) {', '.join(sorted(missing))}")
    if data["name"] != name:
        raise SpecError(f"{path}: name {data['name']!r} does not match the file name {name!r}")
    for key in ("launcher", "executor"):
        if not (isinstance(data[key], str) and _NAME.fullmatch(data[key])):
            raise SpecError(f"{path}: {key} must be the name of a registered {key}, got {data[key]!r}")
    if data.get("peak_precision", "bf16") not in ("bf16", "fp16", "fp32", "fp8"):
        raise SpecError(f"{path}: peak_precision must be bf16, fp16, fp32 or fp8, got {data['peak_precision']!r}")
    if data.get("precision") is not None and data["precision"] not in PRECISIONS:
        raise SpecError(f"{path}: precision must be one of {', '.join(PRECISIONS)}, got {data['precision']!r}")
    if data["backend"] not in BACKENDS:
        raise SpecError(f"{path}: backend must be {', '.join(BACKENDS)}, got {data['backend']!r}")
    for key in ("peak_tflops", "peak_fp8_tflops", "matmul_tflops", "matmul_fp8_tflops", "device_memory_gib",
                "intra_node_gbps", "intra_node_pair_gbps", "inter_node_gbps", "memory_bandwidth_gbps", "link_latency_us"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0
                                  or (value == 0 and key != "link_latency_us")):
            raise SpecError(f"{path}: {key} must be a positive number, got {value!r}")
    data.setdefault("description", "")
    for key in ("sbatch", "env", "sources", "megatron_lm_env", "megatron_lm_train", "detected"):
        if not isinstance(data.get(key) or {}, dict):
            raise SpecError(f"{path}: {key} must be a mapping")
    _check_site_values(data, path)
    data.update(peak_table.read_peaks(data, path, (data.get("sources") or {}).get("peak_tflops")))
    return System(**{k: v for k, v in data.items() if v is not None}, profile_path=str(path))
