"""What a live Slurm says about itself: partitions, nodes, Gres, CPUs, memory, time limits; and a short job
on one compute node to see what the node itself sees. `bench system detect` and `bench doctor` read it.

Node and partition records come from `scontrol show node|partition -o` (one record per line). Their values
may hold spaces (OS=Linux 6.1.0 #1 SMP ..., Reason=...), so a record is split before each ` Key=` rather
than at every space.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from nlp_bench.errors import BenchError
from nlp_bench.launch.executor import job_environment
from nlp_bench.launch.slurm_said import one_line, unauthenticated

Runner = Callable[[list[str], float], subprocess.CompletedProcess]


class SlurmUnavailable(BenchError):
    """No Slurm here to read, or it does not answer."""


def run_command(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """A command as a job bench starts would run it (bench's own environment first on PATH)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=job_environment())


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as a dict."""
    parts = re.split(r"\s+(?=[A-Za-z][A-Za-z0-9_/:.]*=)", line.strip())
    return dict(part.split("=", 1) for part in parts if "=" in part)


def parse_gres(text: str) -> tuple[int, str | None]:
    """GPUs per node and their type from a Gres string: gpu:4, gpu:a100:4(S:0-1), gpu:h100:8,nic:1."""
    count, kind = 0, None
    for entry in re.split(r",(?![^(]*\))", text or ""):
        fields = re.sub(r"\(.*\)", "", entry).split(":")
        if fields[0] != "gpu" or len(fields) < 2:
            continue
        if fields[-1].isdigit():
            count += int(fields[-1])
            if len(fields) >= 3:
                kind = kind or fields[1]
        else:
            kind, count = kind or fields[1], count + 1
    return count, kind


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    sockets: int
    memory_mib: int
    gpus: int
    gpu_type: str | None
    features: tuple[str, ...]
    state: str
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    nodes: str  # as Slurm writes the list: node[1-2]
    total_nodes: int
    max_time: str
    state: str
    default: bool
    allow_accounts: str


@dataclass(frozen=True)
class Inventory:
    cluster: str
    version: str
    partitions: tuple[SlurmPartition, ...]
    nodes: tuple[SlurmNode, ...]

    def partition(self, name: str) -> SlurmPartition | None:
        return next((p for p in self.partitions if p.name == name), None)

    def default_partition(self) -> SlurmPartition | None:
        return next((p for p in self.partitions if p.default), self.partitions[0] if self.partitions else None)

    def nodes_of(self, partition: str) -> list[SlurmNode]:
        return [n for n in self.nodes if partition in n.partitions]


def _int(value: str | None, default: int = 0) -> int:
    match = re.match(r"\d+", value or "")
    return int(match.group()) if match else default


def _node(record: dict[str, str]) -> SlurmNode:
    gpus, kind = parse_gres(record.get("Gres", ""))
    features = tuple(f for f in re.split(r"[,&|]", record.get("AvailableFeatures", "")) if f and f != "(null)")
    return SlurmNode(name=record["NodeName"], cpus=_int(record.get("CPUTot")),
                     sockets=_int(record.get("Sockets"), 1) * _int(record.get("Boards"), 1),
                     memory_mib=_int(record.get("RealMemory")), gpus=gpus, gpu_type=kind, features=features,
                     state=record.get("State", "").lower(),
                     partitions=tuple(p for p in record.get("Partitions", "").split(",") if p))


def _partition(record: dict[str, str]) -> SlurmPartition:
    return SlurmPartition(name=record["PartitionName"], nodes=record.get("Nodes", ""),
                          total_nodes=_int(record.get("TotalNodes")), max_time=record.get("MaxTime", "UNLIMITED"),
                          state=record.get("State", ""), default=record.get("Default") == "YES",
                          allow_accounts=record.get("AllowAccounts", "ALL"))


def _ask(runner: Runner | None, argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise SlurmUnavailable(f"{argv[0]} is not on PATH: no Slurm client here (load the site's Slurm module)")
    try:
        proc = (runner or run_command)(argv, 30)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"`{shlex.join(argv)}` did not answer in 30 s: is slurmctld up?") from None
    if proc.returncode != 0:
        said = proc.stderr or proc.stdout
        refused = unauthenticated(said)
        if refused is not None:
            raise SlurmUnavailable(f"`{shlex.join(argv)}`: Slurm did not answer: {refused}")
        raise SlurmUnavailable(f"`{shlex.join(argv)}` failed: {one_line(said) or f'exit {proc.returncode}'}")
    return proc.stdout


def read_inventory(runner: Runner | None = None) -> Inventory:
    """The partitions and nodes the controller knows, as this user may see them."""
    config = {}
    for line in _ask(runner, ["scontrol", "show", "config"]).splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    partitions = [_partition(parse_record(line))
                  for line in _ask(runner, ["scontrol", "show", "partition", "-o"]).splitlines() if line.strip()]
    nodes = [_node(parse_record(line))
             for line in _ask(runner, ["scontrol", "show", "node", "-o"]).splitlines() if line.strip()]
    return Inventory(cluster=config.get("ClusterName", ""), version=config.get("SLURM_VERSION", ""),
                     partitions=tuple(partitions), nodes=tuple(nodes))


def run_on_node(command: str, partition: str, account: str | None = None, gpus: int = 0, minutes: int = 1,
                timeout: float = 180, runner: Runner | None = None) -> tuple[bool, str]:
    """Run a shell command on one compute node of the partition through srun (a short job; GPUs requested
    as a training job would request them, or the node's cgroup hides them). Returns (ok, output)."""
    argv = ["srun", f"--partition={partition}", "--nodes=1", "--ntasks=1", f"--time={minutes}",
            "--job-name=nlp-bench-probe", f"--immediate={int(timeout)}"]
    if account:
        argv.append(f"--account={account}")
    if gpus:
        argv.append(f"--gpus-per-node={gpus}")
    argv += ["bash", "-c", command]
    try:
        proc = (runner or run_command)(argv, timeout + 30)
    except subprocess.TimeoutExpired:
        return False, f"no answer from a node of {partition} within {timeout:.0f} s"
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()
