"""A local job outlives the bench that started it (SIGKILLed: a closed laptop lid, an OOM killer, a lost
ssh session): its results folder's lock stays with the job, and a later `bench cancel` tells a job that
ended from one that runs, whatever the job left behind in its session.

Jobs run the stand-in jobscript (tests/fixtures/stub_jobscript.sbatch.j2: a gate file the test opens), except the watchdog test,
which runs the real jobscript with a stand-in torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BENCH, STUB, job, run_bench, start, until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _gone(pid: int) -> bool:
    return _state(pid) in (None, "Z")


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _orphan(tmp_path: Path) -> tuple[Path, int]:
    """`bench run` whose job has started, then the bench SIGKILLed: the point folder and its job's pid."""
    bench = start("run", "--tag", "smoke", cwd=tmp_path)
    until(lambda: list(tmp_path.glob("results/nlp/*/*/ran.pids")), "the job to start")
    folder = next(tmp_path.glob("results/nlp/*/*/ran.pids")).parent
    until(lambda: job(folder).job_id is not None, "the job's id to be recorded")
    bench.kill()
    bench.communicate(timeout=30)
    return folder, int(job(folder).job_id)


def test_a_second_bench_waits_for_the_orphaned_job_of_a_killed_bench(tmp_path, stub_site, gate, monkeypatch):
    """The lock that keeps two local jobs of one results folder apart belongs to the job: the second bench
    says it waits, naming the orphan, and starts its job only once the orphan has ended; both are recorded
    as they ran."""
    timeline = tmp_path / "timeline"
    monkeypatch.setenv("NLP_BENCH_TEST_TIMELINE", str(timeline))
    first, pid = _orphan(tmp_path)
    said = tmp_path / "two.out"
    try:
        with said.open("w") as out:
            two = subprocess.Popen([str(BENCH), "run", "--tag", "smoke"], cwd=tmp_path, stdout=out,
                                   stderr=subprocess.PIPE, text=True,
                                   env={k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"})
        waiting = "waiting, the local jobs of "
        until(lambda: waiting in said.read_text() or len(list(tmp_path.glob("results/nlp/*/*/ran.pids"))) > 1,
              "the second bench to wait, or its job to start")
        assert len(list(tmp_path.glob("results/nlp/*/*/ran.pids"))) == 1, "the second job ran beside the orphan"
        line = next(x for x in said.read_text().splitlines() if waiting in x)
        assert f"local job {pid} " in line, line
        assert not _gone(pid), "the orphan ended before the gate opened"
    finally:
        gate.touch()
    _, err = two.communicate(timeout=60)
    assert two.returncode == 0, said.read_text() + err
    second = next(p.parent for p in tmp_path.glob("results/nlp/*/*/ran.pids") if p.parent != first)
    events = [line.split() for line in timeline.read_text().splitlines()]
    assert [(kind, where) for kind, _, where in events] == [("start", str(first)), ("end", str(first)),
                                                            ("start", str(second)), ("end", str(second))], events
    assert float(events[1][1]) <= float(events[2][1]), events
    until(lambda: _gone(pid), "the orphan to end")
    assert run_bench("status", first.parent.name, cwd=tmp_path).returncode == 0
    for folder in (first, second):
        info = job(folder)
        assert (info.number, info.state, info.exit_code) == (1, "COMPLETED", 0), folder


@pytest.fixture
def leaving_site(stub_site: Path) -> Path:
    """The stand-in jobscript that leaves a process in its session when it ends (as the real jobscript's
    watchdog left its `sleep`), its pid in leftover.pid."""
    template = stub_site / "slurm" / "templates" / "jobscript.sbatch.j2"
    text = STUB.read_text()
    assert text.count('echo "{{ exit_line }}"') == 1
    template.write_text(text.replace('echo "{{ exit_line }}"',
                                     'sleep 300 </dev/null >/dev/null 2>&1 &\necho $! > leftover.pid\n'
                                     'echo "{{ exit_line }}"'))
    return stub_site


def test_a_cancel_after_the_job_ended_records_how_it_ended(tmp_path, leaving_site, gate):
    """The bench is killed, its job then completes while state.json still says RUNNING, and a process the
    job left in its session lives on: `bench cancel` records COMPLETED from the job's exit line, says the
    job had already ended, and stops what it left behind."""
    folder, pid = _orphan(tmp_path)
    gate.touch()
    # ended, and reaped (by init, a moment later): its id is free, as when the cancel came 4 s later
    until(lambda: _state(pid) is None and (folder / "leftover.pid").is_file()
          and (folder / "leftover.pid").read_text().endswith("\n"), "the job to end")
    leftover = int((folder / "leftover.pid").read_text())
    try:
        assert not _gone(leftover) and leftover in _session(pid)
        assert job(folder).state == "RUNNING"
        cancel = run_bench("cancel", folder.parent.name, cwd=tmp_path)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert "already ended (COMPLETED)" in cancel.stdout, cancel.stdout
        info = job(folder)
        assert (info.state, info.exit_code, info.failure_class) == ("COMPLETED", 0, None)
        assert json.loads((folder / "state.json").read_text())["attempts"][-1].get("cancel_requested") is None
        assert _gone(leftover), "what the ended job left in its session still runs"
    finally:
        if not _gone(leftover):
            os.kill(leftover, signal.SIGKILL)


#: the stand-in torchrun: once the watchdog sleeps between its looks (a `sleep` in the job's session), one
#: iteration line, and the training ends (or, with TORCHRUN_STAYS set, stays, its pid in torchrun.pid)
TORCHRUN = """#!{python}
import os, pathlib, time
def watchdog_sleeps():
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if text[text.index("(") + 1:text.rindex(")")] == "sleep" and int(text.rsplit(")", 1)[1].split()[3]) == os.getsid(0):
            return True
until = time.monotonic() + 20
while not watchdog_sleeps() and time.monotonic() < until:
    time.sleep(0.02)
print("[default0]: iteration 1/ 1 | lm loss: 1.0E+01 |", flush=True)
if os.environ.get("TORCHRUN_STAYS"):
    pathlib.Path("torchrun.pid.tmp").write_text(str(os.getpid()))
    os.rename("torchrun.pid.tmp", "torchrun.pid")
    time.sleep(120)
"""


def _real_job(tmp_path: Path, **env: str) -> tuple[Path, subprocess.Popen]:
    """The smoke point's real jobscript, started as the local executor starts it (its own session) with the
    stand-in torchrun."""
    assert run_bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path).returncode == 0
    folder = next(tmp_path.glob("results/nlp/*/*/jobscript.sbatch")).parent
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "torchrun").write_text(TORCHRUN.format(python=sys.executable))
    (tools / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", **env}
    with (folder / "job.out").open("wb") as out:
        return folder, subprocess.Popen(["bash", "jobscript.sbatch"], cwd=folder, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def test_the_jobscript_watchdog_ends_with_its_job(tmp_path, monkeypatch):
    """The real jobscript, its training a stand-in torchrun that logs one iteration and exits once the
    watchdog sleeps: when the script has ended, nothing of it (the watchdog, its `sleep`) is left in its
    session."""
    monkeypatch.delenv("NLP_BENCH_HANG_TIMEOUT", raising=False)  # the template's own: 10 s between looks
    folder, script = _real_job(tmp_path)
    try:
        assert script.wait(timeout=30) == 0, (folder / "job.out").read_text()
        assert "training exited with code 0" in (folder / "job.out").read_text()
        assert _session(script.pid) == [], "the watchdog (or its sleep) outlived its job"
    finally:
        for pid in _session(script.pid):
            os.kill(pid, signal.SIGKILL)


def test_the_jobscript_watchdog_ends_once_its_job_shell_is_killed(tmp_path):
    """The job's shell SIGKILLed (an OOM killer) with its training: the watchdog, which no TERM reaches,
    sees its shell gone at its next look and ends."""
    folder, script = _real_job(tmp_path, NLP_BENCH_HANG_TIMEOUT="30", TORCHRUN_STAYS="1")  # a look a second
    try:
        until(lambda: (folder / "torchrun.pid").is_file(), "the training to run", timeout=30)
        os.kill(int((folder / "torchrun.pid").read_text()), signal.SIGKILL)
        os.kill(script.pid, signal.SIGKILL)
        script.wait(timeout=10)
        until(lambda: _session(script.pid) == [], "the watchdog to end", timeout=10)
    finally:
        for pid in _session(script.pid):
            os.kill(pid, signal.SIGKILL)
