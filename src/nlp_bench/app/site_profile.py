"""`bench system detect`: a system profile written from the live Slurm, so a site starts from what its
cluster says about itself instead of a blank file.

Slurm knows the partition, its nodes, their CPUs, memory, Gres and the time limit; the device table
(spec/devices.py) adds the peak and bandwidths of a device Slurm or nvidia-smi names. What neither can
know (the network's bandwidth and latency, an unnamed device's peak, the site's module loads) is written
as null or a placeholder with a FILL IN comment: the profile loads and runs, and the planner says which
figure it misses.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nlp_bench.errors import SpecError, unknown
from nlp_bench.fsio import write_text_atomic
from nlp_bench.launch.slurm import SlurmExecutor
from nlp_bench.launch.slurm_inventory import Inventory, SlurmNode, read_inventory, run_on_node
from nlp_bench.launch.srun_launcher import SrunLauncher
from nlp_bench.spec.devices import Device, find_device
from nlp_bench.store.records import now_iso

FILL_IN = "FILL IN"
#: the figures a user may give `detect` (--set KEY=VALUE): what the planner and MFU read, and Slurm cannot tell
GIVEN_KEYS = ("peak_tflops", "matmul_tflops", "device_memory_gib", "memory_bandwidth_gbps", "intra_node_gbps",
              "inter_node_gbps", "link_latency_us")
#: a rank on CPUs, per core it uses: nominal figures good enough to plan a plumbing test (CPU ranks test the
#: launch and the trainer, not a site's speed), with where each comes from
CPU_CORE = {"peak_tflops": (0.1, "nominal fp32 of an AVX2 core (2 FMA x 8 lanes x 2 FLOPs x ~3 GHz), per core of a rank"),
            "intra_node_gbps": (2, "estimate for gloo over loopback TCP between ranks of one node"),
            "memory_bandwidth_gbps": (10, "estimate for one core's share of DDR4, per core of a rank")}
#: what a compute node reports to the probe: its name, its CPUs, and each GPU nvidia-smi can see
PROBE = ('echo "node $(hostname -s)"; echo "cpus $(nproc)"; '
         'if out=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null); then '
         'printf "%s\\n" "$out" | sed "s/^/gpu /"; fi')


@dataclass
class Probe:
    """What one compute node reported."""

    node: str = ""
    cpus: int | None = None
    gpus: list[tuple[str, float]] = field(default_factory=list)  # (name, memory GiB)
    error: str = ""


def parse_probe(ok: bool, output: str) -> Probe:
    probe = Probe()
    if not ok:
        probe.error = output.splitlines()[-1] if output else "the probe job failed"
        return probe
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "node":
            probe.node = rest.strip()
        elif kind == "cpus" and rest.strip().isdigit():
            probe.cpus = int(rest)
        elif kind == "gpu":
            name, _, mib = rest.rpartition(",")
            try:
                probe.gpus.append((name.strip(), round(float(mib) / 1024, 1)))
            except ValueError:
                continue
    return probe


@dataclass
class _Entry:
    key: str
    value: Any
    comment: str = ""


def _dump(entries: list[_Entry]) -> str:
    """Top-level keys in order, each with its comment: yaml.safe_dump writes the values, comments are ours."""
    lines = []
    for entry in entries:
        text = yaml.safe_dump({entry.key: entry.value}, sort_keys=False, default_flow_style=False, width=1000)
        first, *rest = text.rstrip("\n").split("\n")
        if entry.comment and not rest:
            lines.append(f"{first}  # {entry.comment}")
        else:
            if entry.comment:
                lines.append(f"# {entry.key}: {entry.comment}")
            lines += [first, *rest]
    return "\n".join(lines) + "\n"


def _environment_setup() -> tuple[list[str], str]:
    """The line that activates the Python environment this `bench` runs in, where it is a virtual one."""
    if sys.prefix != sys.base_prefix:
        return [f'source "{Path(sys.prefix) / "bin" / "activate"}"'], (
            "activates the environment `bench system detect` ran in; add the module loads your site needs")
    return [], f"{FILL_IN}: the module loads and the environment activation that give a job nlp-bench and torch"


def detect(name: str, partition: str | None = None, account: str | None = None, probe: bool = False,
           inventory: Inventory | None = None, given: dict[str, float] | None = None) -> tuple[str, list[str]]:
    """The profile's text and the names of the fields left to fill in; `given` fills figures Slurm cannot
    tell (the network's, above all) from what the user knows, so a detected profile can be planned at once."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise SpecError(f"system name {name!r}: use letters, digits, '.', '_' and '-'")
    inventory = inventory or read_inventory()
    chosen = inventory.partition(partition) if partition else inventory.default_partition()
    if chosen is None:
        raise SpecError(unknown("partition", partition or "", [p.name for p in inventory.partitions])
                        if partition else "this Slurm has no partition")
    nodes = inventory.nodes_of(chosen.name)
    if not nodes:
        raise SpecError(f"partition {chosen.name} has no nodes this user can see")
    typical = min(nodes, key=lambda n: (n.gpus, n.cpus, n.memory_mib))  # a profile must fit every node
    found = parse_probe(*run_on_node(PROBE, chosen.name, account, typical.gpus)) if probe else None
    if found is not None and found.error:
        raise SpecError(f"the probe job on partition {chosen.name} failed: {found.error}")
    return _profile(name, inventory, chosen.name, nodes, typical, account, found, given or {})


def parse_given(items: tuple[str, ...]) -> dict[str, float]:
    """--set KEY=VALUE words into figures, each a positive number of a key in GIVEN_KEYS."""
    given = {}
    for item in items:
        key, _, text = item.partition("=")
        if key not in GIVEN_KEYS:
            raise SpecError(unknown("--set key", key, GIVEN_KEYS))
        try:
            value = float(text)
        except ValueError:
            value = 0.0
        if not value > 0 or value == float("inf"):
            raise SpecError(f"--set {item}: give {key}=NUMBER, a positive number")
        given[key] = int(value) if value.is_integer() else value
    return given


def _apply_given(entries: list[_Entry], given: dict[str, float], sources: dict[str, str],
                 missing: list[str]) -> list[_Entry]:
    """The entries with each given figure in place of what detect wrote (or after the device's figures)."""
    out = [_Entry(e.key, given[e.key], "given with --set") if e.key in given else e for e in entries]
    for key in [k for k in GIVEN_KEYS if k in given and all(e.key != k for e in entries)]:
        out.append(_Entry(key, given[key], "given with --set"))
    for key in given:
        sources[key] = "given to `bench system detect --set`"
        if key in missing:
            missing.remove(key)
    return out


def _profile(name: str, inventory: Inventory, partition: str, nodes: list[SlurmNode], typical: SlurmNode,
             account: str | None, probe: Probe | None, given: dict[str, float]) -> tuple[str, list[str]]:
    missing: list[str] = []
    seen_gpus = [g for g, _ in probe.gpus] if probe else []
    device = find_device(*seen_gpus, typical.gpu_type or "", *typical.features)
    gpu_node = typical.gpus > 0
    real_gpus = gpu_node and not (probe is not None and not probe.gpus)
    memory_gib = round(typical.memory_mib / 1024, 1)
    if real_gpus:
        what = device.name if device else (seen_gpus[0] if seen_gpus else typical.gpu_type or "GPU (type not named by Slurm)")
        description = f"{typical.gpus} x {what} per node, {typical.cpus} CPUs, {memory_gib} GiB; partition {partition}"
    else:
        description = f"{typical.cpus} CPUs, {memory_gib} GiB per node, ranks on CPUs with gloo; partition {partition}"
    entries = [_Entry("name", name), _Entry("description", description)]
    sources: dict[str, str] = {}
    if real_gpus:
        entries += [_Entry("device", "cuda", "CUDA, or ROCm through torch's cuda device")]
        entries += _device_entries(device, probe, typical, sources, missing)
        entries += [_Entry("devices_per_node", typical.gpus, "from Slurm's Gres")]
        backend, env = "nccl", {"CUDA_DEVICE_MAX_CONNECTIONS": 1, "NCCL_ASYNC_ERROR_HANDLING": 1}
    else:
        ranks = typical.gpus or typical.sockets or 1
        why = ("Gres lists GPUs but nvidia-smi on " + (probe.node or "the node") + " found none: ranks on CPUs"
               if gpu_node else "one rank per socket")
        cores = min(typical.cpus, probe.cpus) if probe and probe.cpus else typical.cpus
        entries += [_Entry("device", "cpu"), _Entry("device_name", "cpu"), _Entry("devices_per_node", ranks, why)]
        threads = max(1, cores // ranks)
        for key, (per_core, source) in CPU_CORE.items():
            entries.append(_Entry(key, round(per_core * threads, 3), "estimate: replace it with a measurement"))
            sources[key] = source
        entries.append(_Entry("peak_precision", "fp32"))
        backend, env = "gloo", {"OMP_NUM_THREADS": threads}
    for key, what in (("inter_node_gbps", "GB/s one node injects into the network, all NICs, one direction"),
                      ("link_latency_us", "microseconds per collective step across nodes")):
        entries.append(_Entry(key, None, f"{FILL_IN}: {what} (the planner needs it)"))
        missing.append(key)
    entries = _apply_given(entries, given, sources, missing)
    if sources:
        entries.append(_Entry("sources", sources))
    sbatch: dict[str, Any] = {"partition": partition}
    if account:
        sbatch["account"] = account
    if gpu_node:
        sbatch["gpus-per-node"] = typical.gpus
    sbatch["cpus-per-task"] = typical.cpus
    setup, setup_note = _environment_setup()
    if not setup:
        missing.append("env_setup")
    entries += [
        _Entry("backend", backend), _Entry("launcher", SrunLauncher.name), _Entry("executor", SlurmExecutor.name),
        _Entry("max_nodes", len(nodes), f"nodes in partition {partition}"), _Entry("master_port", 29400),
        _Entry("sbatch", sbatch, "" if account else "add `account:` if your site requires one"),
        _Entry("env_setup", setup, setup_note), _Entry("env", env),
        _Entry("megatron_lm_env", {"CUDA_DEVICE_MAX_CONNECTIONS": 1}, "for --trainer megatron-lm"),
        _Entry("detected", _detected(inventory, partition, nodes, typical, probe),
               "what Slurm reported when this file was written (not read by the jobscript)"),
    ]
    header = (f"# Written by `bench system detect` at {now_iso()} from the live Slurm of cluster "
              f"{inventory.cluster or '?'} (Slurm {inventory.version or '?'}), partition {partition}.\n"
              f"# Values marked {FILL_IN} are what Slurm cannot tell; check the others too before a run counts.\n")
    return header + _dump(entries), missing


def _device_entries(device: Device | None, probe: Probe | None, node: SlurmNode, sources: dict[str, str],
                    missing: list[str]) -> list[_Entry]:
    if device is None:
        seen = probe.gpus[0] if probe and probe.gpus else None
        missing += ["device_name", "peak_tflops", "memory_bandwidth_gbps", "intra_node_gbps"]
        return [
            _Entry("device_name", seen[0] if seen else "", None if seen else f"{FILL_IN}: Slurm names no GPU type"),
            _Entry("device_memory_gib", seen[1] if seen else None, "from nvidia-smi" if seen else FILL_IN),
            _Entry("peak_tflops", None, f"{FILL_IN}: dense BF16 TFLOP/s per device from its datasheet; without "
                                        f"it no MFU is reported"),
            _Entry("memory_bandwidth_gbps", None, f"{FILL_IN}: device memory GB/s"),
            _Entry("intra_node_gbps", None, f"{FILL_IN}: GB/s one device sends to the others of its node"),
        ]
    named_by = "nvidia-smi" if probe and probe.gpus else f"Gres type {node.gpu_type}" if node.gpu_type else "node features"
    for key in ("peak_tflops", "device_memory_gib", "memory_bandwidth_gbps", "intra_node_gbps"):
        sources[key] = device.source
    entries = [_Entry("device_name", device.name, f"named by {named_by}"),
               _Entry("device_memory_gib", device.memory_gib),
               _Entry("peak_tflops", device.peak_tflops, "dense BF16 per device"),
               _Entry("memory_bandwidth_gbps", device.memory_bandwidth_gbps)]
    if device.intra_node_gbps is None:
        missing.append("intra_node_gbps")
        entries.append(_Entry("intra_node_gbps", None, f"{FILL_IN}: GB/s one device sends to the others of its node"))
    else:
        entries.append(_Entry("intra_node_gbps", device.intra_node_gbps, "one direction per device"))
    return entries


def _detected(inventory: Inventory, partition: str, nodes: list[SlurmNode], typical: SlurmNode,
              probe: Probe | None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "cluster": inventory.cluster, "slurm_version": inventory.version, "partition": partition,
        "nodes": [n.name for n in nodes], "cpus_per_node": typical.cpus,
        "memory_gib_per_node": round(typical.memory_mib / 1024, 1), "gpus_per_node": typical.gpus,
        "gpu_type": typical.gpu_type, "features": list(typical.features),
        "partitions": {p.name: {"nodes": p.total_nodes, "max_time": p.max_time, "state": p.state,
                                "default": p.default} for p in inventory.partitions},
    }
    if probe is not None:
        found["probe"] = {"node": probe.node, "cpus": probe.cpus,
                          "gpus": [{"name": n, "memory_gib": m} for n, m in probe.gpus]}
    return found


def write_profile(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
