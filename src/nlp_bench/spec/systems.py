"""System profiles: the site layer in slurm/systems/<name>.yaml that a rendered jobscript needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench.errors import SpecError, unknown
from nlp_bench.paths import slurm_dir
from nlp_bench.spec.yamlio import check_keys, load_yaml

_KEYS = {
    "name", "description", "device", "device_name", "devices_per_node", "device_memory_gib", "peak_tflops",
    "backend", "launcher", "executor", "max_nodes", "sbatch", "env_setup", "env", "master_addr_suffix",
    "master_port", "data_dir",
}
_REQUIRED = {"name", "device", "devices_per_node", "backend", "launcher", "executor"}


@dataclass(frozen=True)
class System:
    """One site's machine: devices, launch style, #SBATCH defaults, environment set-up."""

    name: str
    description: str
    device: str  # cuda | cpu | xla
    devices_per_node: int
    backend: str  # nccl | gloo | xla
    launcher: str  # srun (one task per node) | direct (this shell is the only node)
    executor: str  # slurm | local
    device_name: str = ""
    device_memory_gib: float | None = None
    peak_tflops: float | None = None  # dense bf16 per device, for MFU
    max_nodes: int | None = None
    sbatch: dict[str, Any] = field(default_factory=dict)
    env_setup: list[str] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    master_addr_suffix: str = ""
    master_port: int = 6000
    data_dir: str = ""

    @property
    def partition(self) -> str:
        return str(self.sbatch.get("partition", ""))


def systems_dir() -> Path:
    return slurm_dir() / "systems"


def known_systems() -> list[str]:
    return sorted(p.stem for p in systems_dir().glob("*.yaml"))


def load_system(name: str) -> System:
    """A system profile by name (the file slurm/systems/<name>.yaml)."""
    path = systems_dir() / f"{name}.yaml"
    if not path.is_file():
        raise SpecError(unknown("system", name, known_systems()))
    data = load_yaml(path, "system profile")
    check_keys(data, _KEYS, str(path))
    missing = _REQUIRED - set(data)
    if missing:
        raise SpecError(f"{path}: missing key(s) {', '.join(sorted(missing))}")
    if data["name"] != name:
        raise SpecError(f"{path}: name {data['name']!r} does not match the file name {name!r}")
    if data["launcher"] not in ("srun", "direct"):
        raise SpecError(f"{path}: launcher must be srun or direct, got {data['launcher']!r}")
    if data["executor"] not in ("slurm", "local"):
        raise SpecError(f"{path}: executor must be slurm or local, got {data['executor']!r}")
    if data["backend"] not in ("nccl", "gloo", "xla"):
        raise SpecError(f"{path}: backend must be nccl, gloo or xla, got {data['backend']!r}")
    data.setdefault("description", "")
    for key in ("sbatch", "env"):
        if not isinstance(data.get(key) or {}, dict):
            raise SpecError(f"{path}: {key} must be a mapping")
    return System(**{k: v for k, v in data.items() if v is not None})
