"""A throw-away one-node Slurm cluster on this machine, for the tests marked `slurm`.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (`.ci/run` installs them). Without
systemd the daemons are started by hand; the node's CPUs and memory come from `slurmd -C` so that it
registers as valid. Finished jobs stay visible to squeue/scontrol for an hour (there is no accounting
database, so sacct answers with an error and the executor falls back).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
RUN = Path("/run/nlp-bench-slurm")
PARTITION = "debug"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def unavailable() -> str | None:
    """Why the cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60)


def _wait(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"local Slurm: timed out waiting for {what}")


def _alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text()), 0)
        return True
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False


def _start_munge() -> None:
    key = Path("/etc/munge/munge.key")
    for folder, mode in (("/etc/munge", 0o700), ("/var/lib/munge", 0o711), ("/var/log/munge", 0o700), ("/run/munge", 0o755)):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
        os.chmod(folder, mode)
    if not key.is_file() or key.stat().st_size == 0:
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, "munge", "munge")
    os.chmod(key, 0o400)
    if not _alive(Path("/run/munge/munged.pid")):
        _sh("runuser", "-u", "munge", "--", "/usr/sbin/munged")
    _wait(lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0, "munge")


def _config(host: str) -> str:
    hw = dict(kv.split("=", 1) for kv in _sh("slurmd", "-C").stdout.split("\n")[0].split())
    return "\n".join([
        "# written by nlp-bench tests/slurm_lab.py",
        "ClusterName=nlpbench", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", "SlurmctldPort=6817", "SlurmdPort=6818",
        f"StateSaveLocation={RUN}/state", f"SlurmdSpoolDir={RUN}/spool", f"SlurmctldPidFile={RUN}/slurmctld.pid",
        f"SlurmdPidFile={RUN}/slurmd.pid", f"SlurmctldLogFile={RUN}/slurmctld.log", f"SlurmdLogFile={RUN}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0", "EnforcePartLimits=ALL", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "MinJobAge=3600", "KillWait=5",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={hw['CPUs']} Boards={hw['Boards']} "
        f"SocketsPerBoard={hw['SocketsPerBoard']} CoresPerSocket={hw['CoresPerSocket']} "
        f"ThreadsPerCore={hw['ThreadsPerCore']} RealMemory={int(hw['RealMemory']) // 2} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"


def start() -> str:
    """Start (or reuse) the cluster; returns the node name."""
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        with open("/etc/hosts", "a") as fh:
            fh.write(f"127.0.0.1 {host}\n")
    for sub in ("state", "spool"):
        (RUN / sub).mkdir(parents=True, exist_ok=True)
    _start_munge()
    conf = _config(host)
    if not CONF.is_file() or CONF.read_text() != conf:
        stop()
        CONF.parent.mkdir(parents=True, exist_ok=True)
        CONF.write_text(conf)
    if not _alive(RUN / "slurmctld.pid"):
        _sh("slurmctld")
    _wait(lambda: _sh("scontrol", "ping", check=False).returncode == 0, "slurmctld")
    if not _alive(RUN / "slurmd.pid"):
        _sh("slurmd")

    def idle() -> bool:
        state = _sh("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
        if "drain" in state:
            _sh("scontrol", "update", f"NodeName={host}", "State=RESUME", check=False)
        return state in ("idle", "mixed", "allocated")

    _wait(idle, f"node {host} to become idle")
    return host


def stop() -> None:
    """Cancel every job and stop the Slurm daemons this module started (munge stays up)."""
    if _alive(RUN / "slurmctld.pid"):
        _sh("scancel", "--full", "--user=root", check=False)
    for name in ("slurmd", "slurmctld"):
        pidfile = RUN / f"{name}.pid"
        if _alive(pidfile):
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        pidfile.unlink(missing_ok=True)
