"""Shared fixtures: the repository root, a CLI runner, a throw-away results folder, an editable site copy; and
those that a unit file and its integration half both take: the Megatron-LM snapshots unpacked, the registries
restored, Triton's interpreter, the point.json reads counted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from worker_groups import one_worker

ROOT = Path(__file__).resolve().parent.parent
# pytest-xdist gives its workers COLUMNS=80 and LINES=24 (its own console's size); a bench a test starts must
# see what a script sees (no terminal, every column of a table), as in a run without workers
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)
DATA = Path(__file__).resolve().parent / "data"
#: the performance scripts a GPU session runs (benchmark/perf), which some tests run or import on CPU
PERF = ROOT / "benchmark" / "perf"
#: the folder of Megatron-LM source archives the tests that run Megatron-LM's own code read (third-party code,
#: not in the repository: docs/testing.md); None where MEGATRON_LM_ARCHIVES is not set
MEGATRON_ARCHIVES = Path(os.environ["MEGATRON_LM_ARCHIVES"]) if os.environ.get("MEGATRON_LM_ARCHIVES") else None
#: the Megatron-LM snapshots the version tests run on: archive -> what its megatron/core/package_info.py says
MEGATRON_SNAPSHOTS = {"megatron-lm-f772743-jupiter.tar.gz": "0.4.0rc0",
                      "megatron-lm-core_v0.20.0-d98e8a6.tar.gz": "0.20.0"}


def megatron_archive(name: str) -> Path:
    """One Megatron-LM source archive, or a skip that says what to set."""
    if MEGATRON_ARCHIVES is None:
        pytest.skip("MEGATRON_LM_ARCHIVES is not set (the folder of Megatron-LM source archives: docs/testing.md)")
    path = MEGATRON_ARCHIVES / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (MEGATRON_LM_ARCHIVES: docs/testing.md)")
    return path


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory):
    """Megatron-LM archive name -> the folder it is unpacked in, once per module (skipped where the archive
    is not here)."""
    import tarfile

    done: dict[str, Path] = {}

    def unpack(name: str) -> Path:
        archive = megatron_archive(name)
        if name not in done:
            folder = tmp_path_factory.mktemp("megatron")
            with tarfile.open(archive) as tar:
                tar.extractall(folder, filter="data")
            (done[name],) = folder.iterdir()
        return done[name]

    return unpack


@pytest.fixture(params=sorted(MEGATRON_SNAPSHOTS), ids=lambda name: MEGATRON_SNAPSHOTS[name])
def snapshot(request: pytest.FixtureRequest, unpacked) -> Path:
    """Each Megatron-LM snapshot of MEGATRON_SNAPSHOTS, unpacked: a test that takes it runs once a
    version."""
    return unpacked(request.param)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the project's site layer (benchmark/, slurm/, the reference results) that a test may edit,
    used through NLP_BENCH_ROOT."""
    root = tmp_path / "root"
    for part in ("benchmark", "slurm", "results/reference"):
        shutil.copytree(ROOT / part, root / part)
    monkeypatch.setenv("NLP_BENCH_ROOT", str(root))
    return root


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture
def bench(results: Path):
    """Invoke `bench` in-process against a temporary results folder; returns click's Result."""
    from nlp_bench.cli import cli

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["--results-dir", str(results), *args], catch_exceptions=False)

    return invoke


def shorten(root: Path, tag: str, iterations: int) -> None:
    """Train the tag of the site copy at `root` for `iterations` and evaluate never: for a test of the
    launch, the store or the report, whose checks need a finished run but not the shipped tag's 40 iterations
    and its two evaluations (most of a CPU run's time)."""
    nlp = root / "benchmark" / "nlp.yaml"
    text = nlp.read_text()
    start = text.index(f"\n  {tag}:\n")
    end = text.find("\n\n", start + 1)
    block = text[start:end]
    short = block.replace("      train-iters: 40\n", f"      train-iters: {iterations}\n", 1).replace(
        "      eval-iters: 2\n", "      eval-iters: 0\n", 1)
    assert short.count(f"train-iters: {iterations}\n") == 1 and "eval-iters: 0\n" in short, block
    nlp.write_text(text[:start] + short + text[end:])


def run_bench(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`bench` as a user runs it: a separate process, its own stdout/stderr and exit code."""
    exe = Path(sys.executable).parent / "bench"
    env = {k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"}
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def registries_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a test registers (an executor, a launcher, a log format) is forgotten after it; the shipped parts
    are all found first, so the copy a test edits holds them."""
    from nlp_bench.analysis.formats import FORMATS
    from nlp_bench.launch.executor import EXECUTORS
    from nlp_bench.launch.launcher import LAUNCHERS

    for registry in (EXECUTORS, LAUNCHERS, FORMATS):
        registry.names()
        monkeypatch.setattr(registry, "entries", dict(registry.entries))
        monkeypatch.setattr(registry, "aliases", dict(registry.aliases))


@pytest.fixture
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's interpreter for this test where there is no GPU (triton_interpreter.py says why per test)."""
    import torch

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def point_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the points whose point.json is read from now on (a stage should read each once at most)."""
    from nlp_bench.store.point_folder import PointDir

    reads = []
    real = PointDir.point

    def counted(self):
        reads.append(self.id)
        return real(self)

    monkeypatch.setattr(PointDir, "point", counted)
    return reads


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm controller + node on this machine; skipped (with the reason) where impossible."""
    import slurm_lab

    reason = slurm_lab.unavailable()
    if reason:
        pytest.skip(reason)
    node = slurm_lab.start()
    yield node
    slurm_lab.stop()


def record_job(folder: Path, state: str, executor: str = "slurm", **fields):
    """Record a job's state as its executor would (for tests that fake a job's life): a first call begins
    the point's attempt, later ones update it."""
    from nlp_bench.store.point_folder import PointDir

    point = PointDir(folder)
    if point.attempt() is None:
        return point.begin_attempt(executor, state=state, **fields)
    return point.update(state, **fields)


def job(folder: Path):
    """The point's current attempt (its job's state, ids, exit code, failure), as recorded."""
    from nlp_bench.store.point_folder import PointDir

    return PointDir(folder).attempt()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    one_worker(items)


# --- jobs of the stand-in jobscript (tests/fixtures/stub_jobscript.sbatch.j2), started by a real bench: the
# fault tests' ------------------------------------------------------------------------------------------

STUB = ROOT / "tests" / "fixtures" / "stub_jobscript.sbatch.j2"
BENCH = Path(sys.executable).parent / "bench"


@pytest.fixture
def stub_site(site: Path) -> Path:
    """The site layer with the stand-in jobscript template: `bench run` and `bench sweep` render it."""
    shutil.copy(STUB, site / "slurm" / "templates" / "jobscript.sbatch.j2")
    return site


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file whose creation lets every stand-in job go on."""
    path = tmp_path / "gate"
    monkeypatch.setenv("NLP_BENCH_TEST_GATE", str(path))
    return path


def start(*args: str, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"}
    return subprocess.Popen([str(BENCH), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    return out, err


def until(predicate, what: str, timeout: float = 120.0) -> None:
    """Wait for an event (a file, a line, a state) the test can see; fail after `timeout`. A folder that
    vanishes while the predicate looks (a run's `.creating-` folder renamed into place under a glob) is not
    the event yet."""
    deadline = time.monotonic() + timeout
    while not _seen(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _seen(predicate) -> bool:
    try:
        return bool(predicate())
    except FileNotFoundError:
        return False


def started(folder: Path, times: int = 1) -> bool:
    pids = folder / "ran.pids"
    return pids.is_file() and len(pids.read_text().split()) >= times


def one_line(proc: subprocess.CompletedProcess | tuple, *needles: str) -> str:
    """The single `bench: error:` line of a refused command (exit 2, no traceback), checked for needles. A
    progress bar that ran before the error may stand above it."""
    code, err = (proc.returncode, proc.stderr) if isinstance(proc, subprocess.CompletedProcess) else proc
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("bench: ")]
    assert len(lines) == 1 and lines[0].startswith("bench: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- full and read-only file systems -----------------------------------------------------------------

@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A small file system of its own at `path` (root only); skipped with the reason where it cannot be made."""
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'mount failed'}); run as root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(folder: Path) -> Path:
    """Fill the file system that holds `folder` to the last byte."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)
    with contextlib.suppress(OSError):
        for n in range(1000):  # the odd inode or page left: take them too
            (folder / f"filler{n}").write_bytes(b"\0" * 512)
    return filler


# --- the stand-in jobs' runs, locally and on the emulated Slurm cluster ------------------------------------

def csv_rows(text: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    return [dict(zip(lines[0].split(","), line.split(","), strict=False)) for line in lines[1:]]


def dry_points(tmp_path: Path, gas: list[int] | None = None, bench=None,
               system: str = "local") -> tuple[Path, list[Path]]:
    """A dry-run sweep of the smoke tag over gas on `system`: the run folder and its point folders."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return bench(*args) if bench is not None else run_bench(*args, cwd=tmp_path, timeout=120)

    if gas is None:
        proc = run("run", "--tag", "smoke", "--system", system, "--dry-run")
    else:
        (tmp_path / "g.yaml").write_text(f"tag: smoke\nsystem: {system}\nmatrix: {{gas: {gas}}}\n")
        proc = run("sweep", "g.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    run = max((p.parent for p in tmp_path.glob("results/nlp/*/run.json")), key=lambda p: p.stat().st_mtime_ns)
    return run, sorted(p for p in run.iterdir() if p.is_dir() and (p / "point.json").is_file())


@pytest.fixture
def on_slurm(slurm_cluster, stub_site, gate, tmp_path, monkeypatch):
    """The emulated cluster with the stand-in jobscript, short Slurm timeouts, and every job these tests
    leave behind cancelled and their gate opened at the end."""
    import slurm_lab

    monkeypatch.setenv("NLP_BENCH_SLURM_TIMEOUT", "3")
    monkeypatch.setenv("NLP_BENCH_CANCEL_CONFIRM", "20")
    yield slurm_lab
    gate.touch()
    os.kill(slurm_lab.controller_pid(), signal.SIGCONT)
    ids = [job_id for job_id, _ in slurm_lab.jobs_in(tmp_path)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def slurm_job_started(tmp_path: Path) -> Path:
    until(lambda: list(tmp_path.glob("results/nlp/*/*/ran.pids")), "the Slurm job to start")
    return next(tmp_path.glob("results/nlp/*/*/ran.pids")).parent
