"""The Slurm executor: sbatch --parsable to submit; sacct, then squeue, then scontrol to watch."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch import states
from nlp_bench.launch.executor import job_environment
from nlp_bench.launch.outcome import finish
from nlp_bench.workspace import JOB_OUT, JOBSCRIPT


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LaunchError(f"{tool} not found: this machine has no Slurm client; use --dry-run to write the "
                          f"jobscript and submit it with sbatch where Slurm runs")
    return path


class SlurmExecutor:
    name = "slurm"
    queues = True
    holds_jobs = True

    def check_available(self) -> None:
        require("sbatch")

    def _sbatch(self, point_dir: Path, script: str, options: list[str]) -> str:
        proc = subprocess.run([require("sbatch"), "--parsable", *options, script], cwd=Path(point_dir),
                              env=job_environment(),
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise LaunchError(f"sbatch refused {Path(point_dir) / script}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout.strip().split(";")[0]

    def submit(self, point_dir: Path, chain: Sequence[str] = (JOBSCRIPT,), after: Sequence[str] = ()) -> str:
        """Each script of the chain held (afterok) until the one before it completed; a failed step cancels
        the rest (--kill-on-invalid-dep) instead of leaving them pending for ever. The jobs in `after` hold
        the first script only: the others wait on it anyway."""
        ids: list[str] = []
        for script in chain:
            held = [ids[-1]] if ids else list(after)
            options = [f"--dependency=afterok:{':'.join(held)}"] if held else []
            if ids:
                options.append("--kill-on-invalid-dep=yes")
            ids.append(self._sbatch(point_dir, script, options))
        states.record(point_dir, states.PENDING, executor=self.name, job_id=ids[-1], chain_job_ids=ids,
                      submitted=states.now_iso())
        return ids[-1]

    def poll(self, point_dir: Path) -> str:
        info = states.load(point_dir) or {}
        if info.get("state") in states.TERMINAL:
            return info["state"]
        job_id = info["job_id"]
        found = _sacct(job_id) or _squeue(job_id) or _scontrol(job_id) or _sentinel(Path(point_dir))
        if found is None:
            return info.get("state", states.UNKNOWN)
        state, exit_code = found
        if state in states.TERMINAL:
            energy = consumed_energy(job_id)
            return finish(point_dir, state, exit_code, **({"consumed_energy_j": energy} if energy else {}))["state"]
        if state != info.get("state"):
            extra = {"started": states.now_iso()} if state == states.RUNNING else {}
            states.record(point_dir, state, **extra)
        return state

    def cancel(self, point_dir: Path) -> None:
        info = states.load(point_dir) or {}
        if info.get("job_id") and info.get("state") not in states.TERMINAL:
            _run([require("scancel"), info["job_id"]])


def _sacct(job_id: str) -> tuple[str, int | None] | None:
    if shutil.which("sacct") is None:
        return None
    proc = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"])
    line = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not line:
        return None
    state, _, code = line.partition("|")
    return states.from_slurm(state), int(code.split(":")[0]) if code else None


def consumed_energy(job_id: str) -> float | None:
    """Joules the job's nodes used as Slurm's energy accounting counted them (sacct ConsumedEnergyRaw);
    None where the site does not collect it (the field is empty or 0)."""
    if shutil.which("sacct") is None:
        return None
    proc = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "ConsumedEnergyRaw"])
    lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    try:
        joules = float(lines[0]) if lines else 0.0
    except ValueError:
        return None
    return joules if joules > 0 else None


def _squeue(job_id: str) -> tuple[str, int | None] | None:
    proc = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"]) if shutil.which("squeue") else None
    if proc is None or proc.returncode != 0 or not proc.stdout.strip():
        return None
    state = states.from_slurm(proc.stdout.strip().splitlines()[0])
    if state in states.TERMINAL:
        return _scontrol(job_id) or (state, None)
    return state, None


def _scontrol(job_id: str) -> tuple[str, int | None] | None:
    proc = _run(["scontrol", "show", "job", job_id]) if shutil.which("scontrol") else None
    if proc is None or proc.returncode != 0:
        return None
    state = re.search(r"JobState=(\S+)", proc.stdout)
    code = re.search(r"ExitCode=(\d+):", proc.stdout)
    if not state:
        return None
    return states.from_slurm(state.group(1)), int(code.group(1)) if code else None


_EXITED = re.compile(rb"^nlp-bench: training exited with code (\d+)", re.M)


def _sentinel(point_dir: Path) -> tuple[str, int] | None:
    """The jobscript's own last word in job.out, for a job Slurm has forgotten (no accounting, and older
    than MinJobAge): it says how the training ended, if not why."""
    try:
        with (point_dir / JOB_OUT).open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            tail = fh.read()
    except FileNotFoundError:
        return None
    found = _EXITED.findall(tail)
    if not found:
        return None
    code = int(found[-1])
    return (states.COMPLETED if code == 0 else states.FAILED), code
