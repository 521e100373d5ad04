"""`bench doctor`: what a first run on a site needs, checked one line each before a job waits in the queue
for an hour only to fail in its first second (no sbatch, a misspelt partition, an environment without torch,
data that is not there, GPUs the job cannot see)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nlp_bench.errors import SpecError
from nlp_bench.launch.executor import Executor, executor_for, job_environment
from nlp_bench.launch.launcher import launcher_for
from nlp_bench.launch.slurm import SlurmExecutor
from nlp_bench.launch.slurm_inventory import Inventory, SlurmUnavailable, read_inventory, run_command, run_on_node
from nlp_bench.launch.slurm_said import one_line
from nlp_bench.spec.benchmark import Point
from nlp_bench.spec.megatron.checkout import read_checkout
from nlp_bench.spec.megatron.target import for_megatron, table_note
from nlp_bench.spec.systems import System
from nlp_bench.spec.trainers import MEGATRON_LM, megatron_checkout

OK, WARN, FAIL = "ok", "warn", "FAIL"
#: what a shipped profile holds where a site must put its own value
PLACEHOLDERS = ("CHANGE_ME", "FILL IN", "FILL_IN")
#: files the tags name that ship with nlp-bench (benchmark/data/): a site copies them into its data folder
SHIPPED = ("gpt2-vocab.json", "gpt2-merges.txt")
#: what the jobscript needs of the environment its set-up lines give it (it starts torchrun from PATH)
ENV_CHECK = ('command -v torchrun >/dev/null || { echo "torchrun not on PATH"; exit 1; }; '
             'python3 -c "import nlp_bench, torch; print(\'nlp-bench\', nlp_bench.__version__, \'torch\', torch.__version__)"')
GPU_CHECK = ('echo "node $(hostname -s)"; '
             'nvidia-smi -L 2>/dev/null | grep -c "^GPU" | sed "s/^/nvidia-smi GPUs /"; '
             'python3 -c "import torch; print(\'torch devices\', torch.cuda.device_count())"')
#: the same for the native neuron backend: the NeuronCores torch sees, and whether the process group exists
NEURON_CHECK = ('echo "node $(hostname -s)"; '
                'python3 -c "import torch, torch_neuronx, torch.distributed as d; '
                'print(\'neuron backend\', d.is_backend_available(\'neuron\')); '
                'print(\'torch devices\', torch.accelerator.device_count())"')


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | FAIL
    detail: str


def _with_setup(system: System, command: str) -> str:
    return "; ".join([*system.env_setup, command]) if system.env_setup else command


def doctor(point: Point, on_node: bool = False) -> list[Check]:
    """Every check for the point's system (the tag's files, the profile's Slurm settings); the job on a
    compute node only when asked (it waits in the queue like any job)."""
    system = point.system
    launcher_for(system)  # a name no launcher answers to is refused, as the run would refuse it
    executor = executor_for(system)
    checks: list[Check] = _placeholders(point)
    inventory = _slurm_checks(system, checks) if isinstance(executor, SlurmExecutor) else None
    if not isinstance(executor, SlurmExecutor):
        checks.append(_elsewhere("scheduler", executor, "runs on this machine, no Slurm needed"))
    checks += [_activation(system), _environment(system), *_native_neuron(system)]
    if point.trainer == MEGATRON_LM:
        checks += _megatron(point)
    checks += _data_files(point)
    if on_node:
        checks.append(_on_node(system, point, inventory))
    return checks


def site_checks(point: Point) -> list[Check]:
    """What this machine can tell, in a moment, of what the jobscript needs from the site profile: no
    placeholder left, the environment its set-up lines activate, the data folder and the tag's files, and
    what it cannot tell of a native Neuron backend. A run refuses to submit while one fails; a warning is
    said either way."""
    return [*_placeholders(point), _activation(point.system), *_data_files(point), *_native_neuron(point.system)]


#: where --distributed-backend neuron runs: TorchNeuron, the native PyTorch backend (Neuron 2.33, public beta)
NATIVE_NEURON = "TorchNeuron (torch-neuronx 2.13 or later, Neuron 2.33+, trn2/trn3)"


def _native_neuron(system: System) -> list[Check]:
    """A profile on the native `neuron` backend: whether bench's own environment has TorchNeuron (read from the
    package's metadata: bench imports no torch). Where it does not, which is the usual login node and every
    machine of this project, nothing of the device, its process group or the trainer on them is checked
    before the job runs, and the check says so."""
    if system.backend != "neuron":
        return []
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        found = version("torch-neuronx")
    except PackageNotFoundError:
        found = None
    if found is not None and Version(found) >= Version("2.13"):
        return [Check("backend", OK, f"torch-neuronx {found} (TorchNeuron) where bench runs")]
    have = f"torch-neuronx {found}, the torch-xla based one," if found else "no torch-neuronx"
    return [Check("backend", WARN, f"not checked here: profile {system.name} trains on the native neuron backend, "
                                   f"which needs {NATIVE_NEURON}; bench's environment has {have} so the neuron "
                                   "device, its process group and the trainer on them run first in the job "
                                   f"(bench doctor --system {system.name} --on-node checks them on a node)")]


def _placeholders(point: Point) -> list[Check]:
    system, where = point.system, f"slurm/systems/{point.system.name}.yaml"
    values = {**{f"sbatch.{k}": v for k, v in {**system.sbatch, **point.sbatch}.items()},
              **{f"env.{k}": v for k, v in system.env.items()}, "data_dir": system.data_dir,
              **{f"env_setup[{i}]": line for i, line in enumerate(system.env_setup)}}
    found = [Check("placeholders", FAIL, f"{key} of profile {system.name} is still {marker} (edit {where}"
                   + (f", or pass --{key.split('.', 1)[1]} VALUE" if key.startswith("sbatch.") else "") + ")")
             for key, value in values.items() for marker in PLACEHOLDERS if marker in str(value or "")]
    return found or [Check("placeholders", OK, f"none left in profile {system.name}")]


def _expand(word: str) -> str:
    """A shell word of the set-up lines as the job's shell expands it (variables, defaults, ~); Python's
    expansion of variables and ~ where no bash is on PATH."""
    try:
        proc = subprocess.run(["bash", "-c", f"printf %s {word}"], env=job_environment(), capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return os.path.expanduser(os.path.expandvars(word))
    return proc.stdout


def _activation(system: System) -> Check:
    """The environment the set-up lines activate (`source .../bin/activate`) exists here: the same file
    system the compute nodes mount, on the clusters bench knows."""
    for index, line in enumerate(system.env_setup):
        found = re.fullmatch(r"\s*(?:source|\.)\s+(\S+)\s*", line)
        if found is None:
            continue
        path = _expand(found.group(1))
        if not Path(path).is_file():
            return Check("environment", FAIL, f"env_setup[{index}] of profile {system.name} sources {path or line}, "
                                              "which does not exist (install nlp-bench there, set the variable it "
                                              "reads, or edit env_setup)")
        return Check("environment", OK, f"env_setup activates {path}")
    return Check("environment", OK, "the profile activates nothing: jobs find bench's own environment on PATH")


def _elsewhere(name: str, executor: Executor, here: str) -> Check:
    """What the doctor says of an executor other than Slurm's: it runs on this machine, or it queues jobs on a
    scheduler the doctor has no checks for."""
    if executor.queues:
        return Check(name, WARN, f"executor {executor.name}: not checked (the doctor knows only Slurm's commands)")
    return Check(name, OK, f"executor {executor.name}: {here}")


def _slurm_checks(system: System, checks: list[Check]) -> Inventory | None:
    missing = [tool for tool in ("sbatch", "srun", "scontrol") if shutil.which(tool) is None]
    if missing:
        checks.append(Check("slurm commands", FAIL, f"{', '.join(missing)} not on PATH (load the site's Slurm module)"))
        return None
    checks.append(Check("slurm commands", OK, f"sbatch, srun and scontrol found ({shutil.which('sbatch')})"))
    try:
        inventory = read_inventory()
    except SlurmUnavailable as exc:
        checks.append(Check("slurm controller", FAIL, str(exc)))
        return None
    checks.append(Check("slurm controller", OK, f"cluster {inventory.cluster or '?'} answers (Slurm {inventory.version})"))
    name = system.partition
    partition = inventory.partition(name) if name else inventory.default_partition()
    if partition is None:
        known = ", ".join(p.name for p in inventory.partitions) or "none"
        checks.append(Check("partition", FAIL, f"partition {name!r} of profile {system.name} does not exist "
                                               f"here; partitions: {known}"))
        return inventory
    up = partition.state.upper() == "UP"
    checks.append(Check("partition", OK if up else FAIL,
                        f"{partition.name}{'' if name else ' (the default; the profile names none)'}: state "
                        f"{partition.state}, {partition.total_nodes} nodes, time limit {partition.max_time}"))
    nodes = inventory.nodes_of(partition.name)
    if system.max_nodes and system.max_nodes > len(nodes):
        checks.append(Check("nodes", WARN, f"max_nodes {system.max_nodes} but partition {partition.name} has "
                                           f"{len(nodes)}"))
    gpus = _requested_gpus(system)
    if gpus:
        fewest = min((n.gpus for n in nodes), default=0)
        checks.append(Check("gpus per node", OK if fewest >= gpus else FAIL,
                            f"the profile requests {gpus} per node; the partition's nodes have {fewest} or more"))
    checks.append(_account(system, partition.allow_accounts))
    return inventory


def _requested_gpus(system: System) -> int:
    for key in ("gpus-per-node", "gres"):
        value = str(system.sbatch.get(key, ""))
        digits = value.rsplit(":", 1)[-1]
        if digits.isdigit():
            return int(digits)
    return 0


def _account(system: System, allowed: str) -> Check:
    account = str(system.sbatch.get("account", "") or "")
    if not account:
        return Check("account", OK, "none set: jobs use your default account")
    if account == "CHANGE_ME":
        return Check("account", FAIL, f"sbatch.account in {system.name}'s profile is still CHANGE_ME")
    if allowed not in ("ALL", "") and account not in allowed.split(","):
        return Check("account", FAIL, f"{account} may not use partition {system.partition} (AllowAccounts={allowed})")
    if shutil.which("sacctmgr") is None:
        return Check("account", WARN, f"{account}: cannot check (no sacctmgr here)")
    proc = run_command(["sacctmgr", "-n", "-P", "show", "account", account, "format=Account"], 30)
    if proc.returncode != 0:
        return Check("account", WARN, f"{account}: cannot check (sacctmgr: {one_line(proc.stderr, 120)})")
    if account.lower() not in proc.stdout.lower().split():
        return Check("account", FAIL, f"account {account!r} of profile {system.name} does not exist in Slurm's accounting")
    return Check("account", OK, f"{account} exists")


def _environment(system: System) -> Check:
    """The profile's set-up lines, then torchrun and an import of nlp_bench and torch, in a fresh shell that
    stops at the first line that fails (a set-up line that fails is no environment, whatever python3 finds)."""
    proc = run_command(["bash", "-c", "set -e; " + _with_setup(system, ENV_CHECK)], 300)
    where = "the profile's env_setup" if system.env_setup else "the environment bench hands its jobs"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode != 0:
        said = lines[-1] if lines else f"exit {proc.returncode}"
        fix = ("run the doctor on a login node of the site, where its modules load, or edit env_setup"
               if system.env_setup else "install nlp-bench and torch in the environment bench runs from")
        return Check("python environment", FAIL, f"{where}: {said} ({fix})")
    return Check("python environment", OK, f"{where}: {lines[-1] if lines else ''}")


def _megatron(point: Point) -> list[Check]:
    """--trainer megatron-lm: the checkout the jobscript will run, its version and commit, and the point's
    flags as that version takes them (translated where it renamed one, checked against its flag table)."""
    try:
        checkout = read_checkout(megatron_checkout(point.system.megatron_lm_repo, point.system.name))
    except SpecError as exc:
        return [Check("megatron-lm", FAIL, str(exc))]
    found = [Check("megatron-lm", OK, f"{checkout.label} at {checkout.path}")]
    try:
        made = for_megatron(point, checkout)
    except SpecError as exc:
        return [*found, Check("megatron-lm flags", FAIL, str(exc))]
    info = made.megatron_lm or {}
    translated = info.get("translated") or []
    said = (f"every flag of tag {point.tag}'s jobscript is in benchmark/megatron-lm/flags/{info.get('flag_table')}"
            + (f"; translated for it: {', '.join('--' + f for f in translated)}" if translated else ""))
    note = table_note(made)
    return [*found, Check("megatron-lm flags", WARN if note else OK, f"{said}; {note}" if note else said)]


def _data_files(point: Point) -> list[Check]:
    """The files the tag's training arguments name, with NLP_BENCH_DATA as the jobscript sets it."""
    flags = point.train
    data_dir = os.environ.get("NLP_BENCH_DATA")
    if data_dir is None:
        unset = [v for v in re.findall(r"\$\{?(\w+)", point.system.data_dir or "") if v not in os.environ]
        if unset and any("NLP_BENCH_DATA" in str(v) for v in flags.values()):
            return [Check("data folder", FAIL, f"data_dir of profile {point.system.name} ({point.system.data_dir}) reads "
                                               f"${unset[0]}, which is not set here (set it, or NLP_BENCH_DATA, or edit "
                                               "data_dir)")]
        data_dir = os.path.expandvars(os.path.expanduser(point.system.data_dir))
    wanted = []
    for flag in ("vocab-file", "merge-file"):
        if flags.get(flag):
            wanted.append((flag, str(flags[flag])))
    if flags.get("data-path") and not flags.get("mock-data"):
        prefix = str(flags["data-path"]).split()[-1]
        wanted += [("data-path", prefix + ".bin"), ("data-path", prefix + ".idx")]
    if not wanted:
        return [Check("data files", OK, f"tag {point.tag} uses mock data: no files needed")]
    checks = []
    for flag, raw in wanted:
        path = Path(raw.replace("${NLP_BENCH_DATA}", data_dir).replace("$NLP_BENCH_DATA", data_dir))
        fix = (f"copy it from benchmark/data/{path.name}" if path.name in SHIPPED
               else "bench data preprocess writes it")
        checks.append(Check(f"data {flag}", OK if path.is_file() else FAIL,
                            f"{path}" + ("" if path.is_file() else f" is missing ({fix})")))
    return checks


def _on_node(system: System, point: Point, inventory: Inventory | None) -> Check:
    """A one-minute job: the environment and the devices as a compute node sees them."""
    executor = executor_for(system)
    if not isinstance(executor, SlurmExecutor):
        return _elsewhere("compute node", executor, "this machine is the compute node (checked above)")
    if inventory is None or (system.partition and inventory.partition(system.partition) is None):
        return Check("compute node", FAIL, "no job started: fix the Slurm checks above first")
    gpus = _requested_gpus(system)
    account = str(system.sbatch.get("account", "") or "") or None
    probe = NEURON_CHECK if system.backend == "neuron" else GPU_CHECK
    ok, output = run_on_node(_with_setup(system, probe), system.partition or inventory.default_partition().name,
                             account, gpus)
    lines = output.splitlines()
    if not ok:
        return Check("compute node", FAIL, f"the one-minute job failed: {lines[-1] if lines else 'no output'}")
    seen = {key: value for key, _, value in (line.rpartition(" ") for line in lines)}
    node = next((line.split()[1] for line in lines if line.startswith("node ")), "?")
    devices = int(seen.get("torch devices", "0") or 0)
    if system.device == "cuda":
        status = OK if devices >= system.devices_per_node else FAIL
        return Check("compute node", status, f"{node}: torch sees {devices} GPU(s), the profile runs "
                                             f"{system.devices_per_node} ranks per node")
    if system.backend == "neuron":
        backend = seen.get("neuron backend") == "True"
        status = OK if backend and devices >= system.devices_per_node else FAIL
        return Check("compute node", status, f"{node}: torch sees {devices} NeuronCore(s) (the profile runs "
                                             f"{system.devices_per_node} ranks per node), the neuron process-group "
                                             f"backend {'is' if backend else 'is not'} there")
    return Check("compute node", OK, f"{node}: the environment imports torch; ranks run on CPUs "
                                     f"({seen.get('nvidia-smi GPUs', '0')} GPUs named by nvidia-smi)")

