"""A throw-away Slurm cluster of two emulated nodes with fake GPUs on this machine: what the `local-slurm` system
profile (slurm/systems/local-slurm.yaml) submits to, and what the tests marked `slurm` run on (tests/slurm_lab.py).

    sudo python3 slurm/local_cluster.py start    # start it (or find it running); prints its nodes
    sudo python3 slurm/local_cluster.py status   # whether the controller answers, and the nodes' states
    sudo python3 slurm/local_cluster.py stop     # cancel its jobs and stop its daemons (munge stays up)

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (`.ci/run` installs them). Without
systemd the daemons are started by hand. Debian's Slurm is built with MULTIPLE_SLURMD, so node1 and node2
are two slurmd processes on this one host, each with its own loopback address, port, spool and log; they
advertise more CPUs than the machine has (config_overrides) so that a failure test's sleeping jobs can
run side by side. Their GPUs are character devices that behave like /dev/null: enough for Slurm to
schedule `--gpus-per-node`, while the trainer runs on the CPU. Where slurmdbd and MariaDB are installed
(`apt-get install slurmdbd mariadb-server`, as `.ci/run` does) the cluster keeps accounting, so `sacct`
answers as on a production cluster; without them sacct fails and the executor falls back to squeue and
scontrol, which keep finished jobs for an hour. A node whose slurmd stops answering is declared down after
SlurmdTimeout (10 s), and its jobs end NODE_FAIL rather than being requeued.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
RUN = Path("/run/nlp-bench-slurm")
PARTITION = "debug"
NODES = ("node1", "node2")
CPUS_PER_NODE = 8
GPUS_PER_NODE = 2
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


def _gone(pid: int, seconds: float) -> bool:
    """Whether process `pid` ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


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


def accounting() -> bool:
    """Whether this machine can keep Slurm accounting (slurmdbd backed by MariaDB)."""
    return all(shutil.which(b) for b in ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb-admin", "mariadb"))


DBD_CONF = Path("/etc/slurm/slurmdbd.conf")


def _start_accounting() -> None:
    """MariaDB on its socket only, then slurmdbd on port 6819; both before slurmctld, which registers with them."""
    mysql_run = Path("/run/mysqld")
    mysql_run.mkdir(parents=True, exist_ok=True)
    shutil.chown(mysql_run, "mysql", "mysql")
    if not _alive(mysql_run / "mysqld.pid"):
        if not Path("/var/lib/mysql/mysql").is_dir():
            _sh("mariadb-install-db", "--user=mysql", "--datadir=/var/lib/mysql")
        subprocess.Popen(["mariadbd", "--user=mysql", "--skip-networking", f"--pid-file={mysql_run}/mysqld.pid",
                          f"--log-error={RUN}/mariadb.err"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    _wait(lambda: _sh("mariadb-admin", "ping", check=False).returncode == 0, "MariaDB")
    _sh("mariadb", "-e", "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'nlpbench'; "
                         "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';")
    conf = "\n".join([
        "AuthType=auth/munge", "DbdHost=localhost", "DbdPort=6819", "SlurmUser=root",
        f"PidFile={RUN}/slurmdbd.pid", f"LogFile={RUN}/slurmdbd.log", "StorageType=accounting_storage/mysql",
        "StorageHost=localhost", "StorageUser=slurm", "StoragePass=nlpbench", "StorageLoc=slurm_acct_db",
    ]) + "\n"
    if not DBD_CONF.is_file() or DBD_CONF.read_text() != conf:
        DBD_CONF.write_text(conf)
    os.chmod(DBD_CONF, 0o600)  # slurmdbd refuses a configuration others can read
    if not _alive(RUN / "slurmdbd.pid"):
        _sh("slurmdbd")

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", 6819)) == 0

    _wait(listening, "slurmdbd")


def _config(host: str) -> str:
    memory = int(dict(kv.split("=", 1) for kv in _sh("slurmd", "-C").stdout.split("\n")[0].split())["RealMemory"])
    nodes = [f"NodeName={name} NodeHostname={host} NodeAddr={_address(name)} Port={17000 + i} "
             f"CPUs={CPUS_PER_NODE} RealMemory={memory // (2 * len(NODES))} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
             for i, name in enumerate(NODES, 1)]
    return "\n".join([
        "# written by nlp-bench tests/slurm_lab.py",
        "ClusterName=nlpbench", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", "SlurmctldPort=6817",
        f"StateSaveLocation={RUN}/state", f"SlurmdSpoolDir={RUN}/spool/%n", f"SlurmctldPidFile={RUN}/slurmctld.pid",
        f"SlurmdPidFile={RUN}/slurmd-%n.pid", f"SlurmctldLogFile={RUN}/slurmctld.log", f"SlurmdLogFile={RUN}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0", "EnforcePartLimits=ALL", "ReturnToService=2",
        *(["JobAcctGatherType=jobacct_gather/linux", "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost", "AccountingStoragePort=6819", "AccountingStorageTRES=gres/gpu"]
          if accounting() else
          ["JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none"]),
        "MinJobAge=3600", "KillWait=5", "SlurmdTimeout=10", "JobRequeue=0",
        "SlurmdParameters=config_overrides", "GresTypes=gpu", *nodes,
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"


def _address(node: str) -> str:
    return f"127.0.1.{NODES.index(node) + 1}"


def _gres_conf() -> str:
    devices = RUN / "fakegpu"
    devices.mkdir(parents=True, exist_ok=True)
    for i in range(GPUS_PER_NODE):
        device = devices / f"nvidia{i}"
        if not device.is_char_device():
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return f"Name=gpu File={devices}/nvidia[0-{GPUS_PER_NODE - 1}]\n"


def _resolvable(host: str) -> None:
    """Node names go into SLURM_JOB_NODELIST and from there into MASTER_ADDR: they must resolve."""
    wanted = {host: "127.0.0.1", **{name: _address(name) for name in NODES}}
    missing = []
    for name, address in wanted.items():
        try:
            socket.gethostbyname(name)
        except OSError:
            missing.append(f"{address} {name}\n")
    if missing:
        with open("/etc/hosts", "a") as fh:
            fh.writelines(missing)


def start_slurmd(node: str) -> None:
    """Start one node's slurmd (again, after a test stopped it) and wait for the node to be usable."""
    if not _alive(RUN / f"slurmd-{node}.pid"):
        (RUN / "spool" / node).mkdir(parents=True, exist_ok=True)
        _sh("slurmd", "-N", node)

    def usable() -> bool:
        state = _sh("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip()
        if "drain" in state or state.startswith("down"):
            _sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        return state in ("idle", "mixed", "allocated")

    _wait(usable, f"node {node} to become idle")


def start() -> list[str]:
    """Start (or reuse) the cluster; returns the node names."""
    host = socket.gethostname().split(".")[0]
    _resolvable(host)
    (RUN / "state").mkdir(parents=True, exist_ok=True)
    _start_munge()
    conf, gres = _config(host), _gres_conf()
    gres_path = CONF.parent / "gres.conf"
    if not CONF.is_file() or CONF.read_text() != conf or not gres_path.is_file() or gres_path.read_text() != gres:
        stop()
        CONF.parent.mkdir(parents=True, exist_ok=True)
        CONF.write_text(conf)
        gres_path.write_text(gres)
    if accounting():
        _start_accounting()
    if not _alive(RUN / "slurmctld.pid"):
        _sh("slurmctld")
    _wait(lambda: _sh("scontrol", "ping", check=False).returncode == 0, "slurmctld")
    for node in NODES:
        start_slurmd(node)
    return list(NODES)


def stop() -> None:
    """Cancel every job and stop the Slurm daemons this module started (munge stays up)."""
    if _alive(RUN / "slurmctld.pid"):
        _sh("scancel", "--full", "--user=root", check=False)
    for pidfile in [*RUN.glob("slurmd-*.pid"), RUN / "slurmctld.pid", RUN / "slurmdbd.pid"]:
        if _alive(pidfile):
            pid = int(pidfile.read_text())
            # a controller a test paused (SIGSTOP) and never resumed would hold SIGTERM until continued, and
            # one left running without its pid file would answer the next session's tests in its place
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
            if not _gone(pid, 15):
                os.kill(pid, signal.SIGKILL)
                _gone(pid, 5)
        pidfile.unlink(missing_ok=True)


def status() -> str:
    """The controller's answer to a ping and the nodes' states, as Slurm's own commands say them."""
    ping = _sh("scontrol", "ping", check=False)
    nodes = _sh("sinfo", "-h", "-N", "-o", "%N %T", check=False) if ping.returncode == 0 else None
    said = (ping.stdout or ping.stderr).strip()
    return said + ("\n" + nodes.stdout.strip() if nodes is not None and nodes.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The emulated Slurm cluster the local-slurm profile submits to.")
    parser.add_argument("action", choices=("start", "stop", "status"))
    action = parser.parse_args(argv).action
    why = unavailable()
    if why is not None:
        print(f"local_cluster: {why}", file=sys.stderr)
        return 2
    try:
        if action == "start":
            nodes = start()
            print(f"local Slurm cluster up: partition {PARTITION}, nodes {', '.join(nodes)} ({GPUS_PER_NODE} fake "
                  "GPUs each); check it with `bench doctor --system local-slurm`")
        elif action == "stop":
            stop()
            print("local Slurm cluster stopped")
        else:
            print(status())
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # a daemon that would not start: its words
        said = getattr(exc, "stderr", None) or str(exc)
        print(f"local_cluster: {action} failed: {' '.join(str(said).split())} (logs in {RUN})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
