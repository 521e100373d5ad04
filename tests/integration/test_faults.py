"""Faults a demanding Slurm user meets, each injected for real: processes killed mid-write, two benches on
one run, files damaged or gone, a full and a read-only file system (a tmpfs the test mounts), a controller
that hangs, accounting that stops. What must hold: nothing lost or mis-recorded, one line naming the file
and exit 2 where the user must act, no traceback, no hang (every process here runs under a timeout).

Jobs run the stand-in jobscript tests/fixtures/stub_jobscript.sbatch.j2: the real launch, store and
analysis, no trainer, and a gate file the test opens when it is ready, so every step waits on an event.

    pytest -m faults          # this module alone (the Slurm cases need the emulated cluster: -m "faults and slurm")
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    BENCH,
    csv_rows,
    dry_points,
    fill,
    finish,
    job,
    one_line,
    record_job,
    run_bench,
    slurm_job_started,
    start,
    started,
    tmpfs,
    until,
)

#: each test's bound: a fault that hangs bench fails its test, it does not hang CI
pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]



@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`bench` run in this process from tmp_path (fast: no interpreter to start), as a CompletedProcess. A
    traceback is not caught: it fails the test where it happens."""
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NLP_BENCH_RESULTS", raising=False)

    def invoke(*args: str) -> subprocess.CompletedProcess:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        return subprocess.CompletedProcess(["bench", *args], result.exit_code, result.stdout, result.stderr)

    return invoke


def measured(folder: Path, lines: int = 4, seconds: float = 0.5) -> None:
    """A finished job's log and state, as the trainer and the executor leave them."""
    gbs = json.loads((folder / "point.json").read_text())["layout"]["global_batch_size"]
    (folder / "job.out").write_text("".join(
        f"[default1]: iteration {i:8d}/      40 | elapsed time per iteration (s): {seconds:.4f} | "
        f"global batch size: {gbs:5d} | lm loss: 1.0E+01 |\n" for i in range(1, lines + 1)))
    record_job(folder, "COMPLETED", executor="local", job_id="1", exit_code=0)


def _two_measured(cwd: Path, bench) -> None:
    for _ in range(2):
        _, (folder,) = dry_points(cwd, bench=bench)
        measured(folder)
    assert bench("result", "table", "--all").returncode == 0  # makes both result.json


#: what a test starts from, made once per module by `made` (the records hold no absolute path, so a copy is
#: the same runs): a dry run of the smoke tag on `local`, and two measured runs with their result.json
STARTS = {"one dry run": lambda cwd, bench: dry_points(cwd, bench=bench), "two measured": _two_measured}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """`made(tmp_path, start)`: a copy of STARTS[start] in tmp_path/results, made in-process on first use, and
    its runs, oldest first, each with its point folders."""
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    kept: dict[str, Path] = {}

    def bench(*args: str) -> subprocess.CompletedProcess:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        return subprocess.CompletedProcess(["bench", *args], result.exit_code, result.stdout, result.stderr)

    def copy(tmp_path: Path, start: str) -> list[tuple[Path, list[Path]]]:
        if start not in kept:
            cwd = tmp_path_factory.mktemp("made")
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(cwd)
                patch.delenv("NLP_BENCH_RESULTS", raising=False)
                STARTS[start](cwd, bench)
            kept[start] = cwd / "results"
        shutil.copytree(kept[start], tmp_path / "results")
        runs = sorted((p.parent for p in tmp_path.glob("results/nlp/*/run.json")), key=lambda p: (p.stat().st_mtime_ns, p.name))
        return [(run, sorted(p for p in run.iterdir() if p.is_dir() and (p / "point.json").is_file())) for run in runs]

    return copy


# --- a run is created whole or not at all ------------------------------------------------------------

def test_a_dry_run_killed_while_writing_leaves_no_half_run(tmp_path):
    """Killed after a few hundred of 3,000 point folders: no run appears (its run.json would have promised
    3,000 points), and the next run clears what the killed one left."""
    values = ", ".join(str(g) for g in range(1, 3001))
    (tmp_path / "g.yaml").write_text(f"tag: smoke\nmatrix: {{gas: [{values}]}}\n")
    proc = start("sweep", "g.yaml", "--dry-run", "--max-points", "5000", cwd=tmp_path)
    until(lambda: len(list(tmp_path.glob("results/nlp/.creating-*/*/point.json"))) >= 100, "points being written")
    proc.kill()
    proc.wait(timeout=30)
    assert not list(tmp_path.glob("results/nlp/*/run.json"))
    for half in tmp_path.glob("results/nlp/.creating-*"):
        os.utime(half, (0, 0))  # as a later run finds it: untouched for long
    one_line(run_bench("status", cwd=tmp_path), "no runs under")
    one_line(run_bench("result", "table", cwd=tmp_path), "no runs under")
    assert run_bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path).returncode == 0
    assert not list(tmp_path.glob("results/nlp/.creating-*")), "the abandoned half-run is cleared"
    assert len(list(tmp_path.glob("results/nlp/*/run.json"))) == 1


# --- one launcher per point ------------------------------------------------------------------------

@pytest.mark.parametrize("first", ["sweep", "resume"])
def test_a_second_bench_on_a_running_run_never_runs_a_point_twice_nor_beside_another(tmp_path, stub_site, gate,
                                                                                     monkeypatch, first):
    """A sweep (or a resume) runs its first point; a resume started beside it leaves that point (running, or
    locked by its holder, whom it names) and waits, saying so, for the local job to end before it runs the
    next: every job ran once, in its own folder, and never two at a time (each would measure the other)."""
    timeline = tmp_path / "timeline"
    monkeypatch.setenv("NLP_BENCH_TEST_TIMELINE", str(timeline))
    run, points = dry_points(tmp_path, [1, 2, 3])
    one = start("sweep", "--resume", run.name, cwd=tmp_path) if first == "resume" else None
    if one is None:
        shutil.rmtree(run)
        one = start("sweep", "g.yaml", cwd=tmp_path)
        until(lambda: list(tmp_path.glob("results/nlp/*/run.json")), "the sweep's run")
        run = next(tmp_path.glob("results/nlp/*/run.json")).parent
        points = sorted(p for p in run.iterdir() if p.is_dir())
    until(lambda: started(points[0]), "the first point's job")
    said = tmp_path / "two.out"
    with said.open("w") as out:
        two = subprocess.Popen([str(BENCH), "sweep", "--resume", run.name], cwd=tmp_path, stdout=out,
                               stderr=subprocess.PIPE, text=True)
    until(lambda: "waiting, the local jobs of " in said.read_text(), "the second bench to wait its turn")
    assert not started(points[1]), "a second local job started beside the first"
    gate.touch()
    out_one, err_one = finish(one)
    _, err_two = finish(two)
    out_two = said.read_text()
    assert one.returncode == 0 and two.returncode == 0, err_one + err_two
    assert f"kept {points[0].name} (RUNNING)" in out_two or re.search(
        rf"{points[0].name}: skipped, point \S+ is in use by bench pid {one.pid} ", out_two), out_two
    for folder in points:
        assert len((folder / "ran.pids").read_text().split()) == 1, f"{folder.name} ran more than once"
        assert (job(folder).number, job(folder).state) == (1, "COMPLETED")
    events = [line.split()[:2] for line in timeline.read_text().splitlines()]
    assert [kind for kind, _ in events] == ["start", "end"] * 3, events
    assert all(float(a[1]) <= float(b[1]) for a, b in zip(events, events[1:], strict=False)), events
    rows = csv_rows(run_bench("result", "table", run.name, "--format", "csv", cwd=tmp_path).stdout)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3 and all(float(r["Tokens/sec"]) > 0 for r in rows)


def test_cancelling_a_local_sweep_stops_it(tmp_path, stub_site, gate):
    """`bench cancel RUN` while a local sweep runs its first point: that job ends, and the points not yet
    submitted are marked cancelled, so the sweep starts none of them."""
    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {gas: [1, 2, 3]}\n")
    sweep = start("sweep", "g.yaml", cwd=tmp_path)
    until(lambda: list(tmp_path.glob("results/nlp/*/*/ran.pids")), "the first job")
    run = next(tmp_path.glob("results/nlp/*/run.json")).parent
    cancel = run_bench("cancel", run.name, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert cancel.stdout.count("cancelled before it was submitted") == 2, cancel.stdout
    out, err = finish(sweep)
    points = sorted(p for p in run.iterdir() if p.is_dir())
    assert [job(p).state for p in points] == ["CANCELLED"] * 3, out + err
    assert [started(p) for p in points] == [True, False, False]
    again = run_bench("sweep", "--resume", run.name, "--dry-run", cwd=tmp_path)
    assert "3 point(s) to run again" in again.stdout, again.stdout


def test_a_jobscript_rewritten_while_its_job_runs_changes_neither_the_job_nor_its_record(tmp_path, stub_site, gate):
    proc = start("run", "--tag", "smoke", cwd=tmp_path)
    until(lambda: list(tmp_path.glob("results/nlp/*/*/ran.pids")), "the job to start")
    folder = next(tmp_path.glob("results/nlp/*/*/ran.pids")).parent
    original = (folder / "jobscript.sbatch").read_bytes()
    with (folder / "jobscript.sbatch").open("w") as fh:  # in place: the same file, shorter and different
        fh.write("#!/bin/bash\nexit 9\n")
    gate.touch()
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert job(folder).state == "COMPLETED" and job(folder).exit_code == 0
    result = json.loads((folder / "result.json").read_text())
    assert result["provenance"]["jobscript_sha256"] == hashlib.sha256(original).hexdigest()
    assert (folder / "submitted" / "jobscript.sbatch").read_bytes() == original


def test_a_reused_process_id_is_neither_followed_nor_signalled(tmp_path):
    """state.json says RUNNING with a pid that now belongs to another process (started later): `bench cancel`
    leaves that process alone, and `bench status` no longer shows the job as running."""
    from nlp_bench.launch.local import identity

    run, (folder,) = dry_points(tmp_path)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        earlier = {**identity(stranger.pid), "start_ticks": identity(stranger.pid)["start_ticks"] - 1}
        record_job(folder, "RUNNING", executor="local", job_id=str(stranger.pid), process=earlier)
        cancel = run_bench("cancel", run.name, cwd=tmp_path)
        assert cancel.returncode == 0 and "had already ended" in cancel.stdout, cancel.stdout + cancel.stderr
        assert stranger.poll() is None, "an unrelated process was signalled"
        status = run_bench("status", run.name, cwd=tmp_path)
        assert "RUNNING" not in status.stdout and "LOST" in status.stdout, status.stdout
        assert job(folder).failure_class == "lost"
    finally:
        stranger.kill()
        stranger.wait()


# --- what is recorded is what ran -----------------------------------------------------------------

def test_a_deleted_log_falls_back_to_the_kept_result_and_says_so(tmp_path, here, made):
    ((run, (folder,)),) = made(tmp_path, "one dry run")
    measured(folder)
    first = csv_rows(here("result", "table", "--format", "csv").stdout)[0]["Tokens/sec"]
    (folder / "job.out").unlink()
    table = here("result", "table", "--format", "csv")
    assert table.returncode == 0 and csv_rows(table.stdout)[0]["Tokens/sec"] == first != ""
    assert f"{folder.name}: job.out is gone; its figures come from result.json" in table.stderr


def test_a_log_that_grows_within_its_last_second_is_read_again(tmp_path, here, made):
    """A file system with one-second times: the log grows, its mtime does not change."""
    ((run, (folder,)),) = made(tmp_path, "one dry run")
    measured(folder, lines=2)
    log = folder / "job.out"
    before = log.stat()
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns // 10**9 * 10**9))
    rows = csv_rows(here("result", "table", "--format", "csv").stdout)
    assert rows[0]["Iterations"] == "2"
    stamp = log.stat().st_mtime_ns
    measured(folder, lines=6)
    os.utime(log, ns=(stamp, stamp))
    rows = csv_rows(here("result", "table", "--format", "csv").stdout)
    assert rows[0]["Iterations"] == "6"


# --- a damaged or stray file is one line, and the rest is shown -------------------------------------

def _wrong_field(raw: bytes) -> bytes:
    """Valid JSON, one field of the wrong kind or gone (a hand edit): what each record's readers need most."""
    data = json.loads(raw)
    if "attempts" in data:
        data["attempts"][0]["process"] = "x"
    elif "layout" in data:
        del data["layout"]
    elif "summary" in data:
        data["summary"]["tokens_per_s"] = "abc"
    else:
        data["points"] = "x"
    return json.dumps(data).encode()


DAMAGE = {
    "empty": lambda raw: b"",
    "truncated": lambda raw: raw[: len(raw) // 2],
    "garbled": lambda raw: b"\x00\xff\xfe" + raw[3:],
    "wrong shape": lambda raw: b"[1, 2, 3]\n",
    "a field of the wrong kind": _wrong_field,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("record", ["run.json", "point.json", "state.json", "result.json"])
def test_a_damaged_record_is_named_and_every_other_run_is_still_shown(tmp_path, here, record, damage, made):
    (good, (good_point,)), (bad, (bad_point,)) = made(tmp_path, "two measured")
    assert (good_point / "result.json").is_file() and (bad_point / "result.json").is_file()
    path = bad / record if record == "run.json" else bad_point / record
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    named = str(path.relative_to(tmp_path))  # as bench names it: relative to the results folder it was given
    everything = here("result", "table", "--all", "--format", "csv")
    assert everything.returncode == 0 and "Traceback" not in everything.stderr, everything.stderr
    shown = {r["run"] for r in csv_rows(everything.stdout)}
    assert good.name in shown
    if record == "result.json":  # only a cache of the log: made again, and said so
        assert bad.name in shown and named in everything.stderr and "made again" in everything.stderr
        return
    assert bad.name not in shown and named in everything.stderr, everything.stderr
    for command in (("result", "table", bad.name), ("status", bad.name), ("result", "export", bad.name, "--format",
                                                                          "csv", "-o", "x.csv")):
        proc = here(*command)
        if proc.returncode == 0:  # the run is readable, the point is not: shown as a warning that names it
            assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        else:
            one_line(proc, named)
    assert here("status", good.name).returncode == 0


def test_a_stray_run_json_is_listed_after_the_table(tmp_path, here, made):
    ((run, (folder,)),) = made(tmp_path, "one dry run")
    measured(folder)
    stray = tmp_path / "results" / "nlp" / "junk" / "run.json"
    stray.parent.mkdir()
    stray.write_text("{}")
    table = here("result", "table", "--all", "--format", "csv")
    assert table.returncode == 0 and len(csv_rows(table.stdout)) == 1, table.stderr
    assert f"{stray.relative_to(tmp_path)}: id must be str, found missing" in table.stderr
    assert here("status").returncode == 0  # the newest readable run


def test_a_point_whose_folder_is_gone_is_named_not_forgotten(tmp_path, here):
    run, points = dry_points(tmp_path, [1, 2], bench=here)
    measured(points[1])
    shutil.rmtree(points[0])
    status = here("status", run.name)
    assert status.returncode == 0 and "MISSING" in status.stdout and points[0].name in status.stdout, status.stdout
    table = here("result", "table", run.name, "--format", "csv")
    rows = {r["point"]: r["state"] for r in csv_rows(table.stdout)}
    assert rows == {points[0].name: "MISSING", points[1].name: "COMPLETED"}, table.stdout
    assert f"{points[0].name}: missing (run.json lists it" in table.stderr
    resume = here("sweep", "--resume", run.name, "--dry-run")
    assert resume.returncode == 1 and "0 point(s) to run again, 1 left" in resume.stdout, resume.stdout
    assert "it cannot be run again; start a new run for it" in resume.stderr


def test_a_machine_without_slurm_neither_loses_nor_forgets_a_slurm_job(tmp_path, here, monkeypatch, made):
    """`bench status` on a machine without the Slurm client (a laptop with the results synced): Slurm was not
    asked, so nothing is concluded: the job stays RUNNING, and the view says why."""
    from nlp_bench.launch import slurm

    ((run, (folder,)),) = made(tmp_path, "one dry run")
    record_job(folder, "RUNNING", job_id="4242", job_names=["nlp-bench-smoke"])
    monkeypatch.setattr(slurm.shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(slurm, "LOST_AFTER_S", 0.0)
    for _ in range(2):
        status = here("status", run.name)
        assert status.returncode == 0 and "RUNNING" in status.stdout, status.stdout
        assert "slurm did not answer (no Slurm client (scontrol) on this machine)" in status.stdout + status.stderr
    assert job(folder).state == "RUNNING"


def test_a_damaged_prediction_leaves_the_row_without_it(tmp_path, here, made):
    ((run, (folder,)),) = made(tmp_path, "one dry run")
    measured(folder)
    (folder / "prediction.json").write_text('{"tokens_per_s": "fast"}')
    table = here("result", "table", "--format", "csv")
    row = csv_rows(table.stdout)[0]
    assert table.returncode == 0 and row["Predicted_Tokens/sec"] == "" and float(row["Tokens/sec"]) > 0
    assert "prediction.json: tokens_per_s must be a number or null" in table.stderr


@pytest.mark.parametrize("command", [("status",), ("result", "table"), ("run", "--tag", "smoke", "--dry-run"),
                                     ("sweep", "--resume", "x")])
def test_a_results_folder_that_is_a_device_is_one_line(here, monkeypatch, command):
    monkeypatch.setenv("NLP_BENCH_RESULTS", "/dev/null")
    one_line(here(*command), "/dev/null")


def test_the_newest_run_is_the_last_made_whatever_the_time_zone(tmp_path):
    """A run made in a zone fourteen hours ahead, then one made in a zone twelve hours behind (a DST fall-back
    is the same, one hour): the second is the newest."""
    made = []
    for zone in ("UTC-14", "UTC+12"):
        env = {**{k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"}, "TZ": zone}
        proc = subprocess.run([str(BENCH), "run", "--tag", "smoke", "--dry-run"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        made.append(re.search(r"^run (\S+):", proc.stdout, re.M).group(1))
    status = run_bench("status", cwd=tmp_path)
    assert f"run {made[1]}" in status.stdout, (made, status.stdout)


# --- full and read-only file systems -----------------------------------------------------------------

def test_a_full_disk_writes_no_run_and_says_so(tmp_path):
    with tmpfs(tmp_path / "small", "512k") as small:
        (small / "results" / "nlp").mkdir(parents=True)
        fill(small)
        proc = run_bench("--results-dir", str(small / "results"), "run", "--tag", "smoke", "--dry-run", cwd=tmp_path)
        one_line(proc, "No space left on device", str(small / "results"))
        assert list((small / "results" / "nlp").iterdir()) == [], "nothing half-written is left"


def test_a_disk_that_fills_while_a_run_is_written_leaves_no_half_run(tmp_path):
    """300 point folders on a 1 MiB file system: it fills part way; nothing is left of the run."""
    with tmpfs(tmp_path / "small", "1m") as small:
        values = ", ".join(str(g) for g in range(1, 301))
        (tmp_path / "g.yaml").write_text(f"tag: smoke\nmatrix: {{gas: [{values}]}}\n")
        proc = run_bench("--results-dir", str(small / "results"), "sweep", "g.yaml", "--dry-run", cwd=tmp_path)
        one_line(proc, "No space left on device", "nothing was written")
        assert not any((small / "results" / "nlp").iterdir()), "nothing half-written is left"


def test_a_disk_that_fills_while_a_job_runs_loses_nothing(tmp_path, stub_site, gate):
    """The job completes; its state cannot be written: bench says so in one line and does not call the
    job failed; once there is room, `bench status` records it COMPLETED from the job's own last line."""
    with tmpfs(tmp_path / "small", "2m") as small:
        results = small / "results"
        proc = start("--results-dir", str(results), "run", "--tag", "smoke", cwd=tmp_path)
        until(lambda: list(results.glob("nlp/*/*/ran.pids")), "the job to start")
        folder = next(results.glob("nlp/*/*/ran.pids")).parent
        filler = fill(small)
        gate.touch()
        out, err = finish(proc)
        line = one_line((proc.returncode, err), "state.json", "No space left on device", "bench status")
        assert job(folder).state == "RUNNING", line  # not FAILED: the record waits for room
        filler.unlink()
        for extra in small.glob("filler*"):
            extra.unlink()
        status = run_bench("--results-dir", str(results), "status", cwd=tmp_path)
        assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr
        assert job(folder).exit_code == 0 and job(folder).times_from == "log"


def test_a_read_only_results_folder_is_still_shown(tmp_path):
    with tmpfs(tmp_path / "ro", "8m") as mounted:
        results = mounted / "results"
        proc = run_bench("--results-dir", str(results), "run", "--tag", "smoke", "--dry-run", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        folder = next(results.glob("nlp/*/*/point.json")).parent
        measured(folder)
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mounted)], capture_output=True, text=True)
        assert remount.returncode == 0, remount.stderr
        table = run_bench("--results-dir", str(results), "result", "table", "--all", "--format", "csv", cwd=tmp_path)
        assert table.returncode == 0 and float(csv_rows(table.stdout)[0]["Tokens/sec"]) > 0, table.stderr
        assert "Read-only file system (the result is shown, not kept)" in table.stderr
        one_line(run_bench("--results-dir", str(results), "run", "--tag", "smoke", "--dry-run", cwd=tmp_path),
                 "Read-only file system")


def test_a_run_folder_moved_while_its_job_runs(tmp_path, stub_site, gate):
    """The launcher loses the folder and says so in one line; the job goes on where the folder went, and
    `bench status` there records how it ended."""
    proc = start("run", "--tag", "smoke", cwd=tmp_path)
    until(lambda: list(tmp_path.glob("results/nlp/*/*/ran.pids")), "the job to start")
    run = next(tmp_path.glob("results/nlp/*/run.json")).parent
    elsewhere = tmp_path / "elsewhere" / "nlp"
    elsewhere.mkdir(parents=True)
    run.rename(elsewhere / run.name)
    gate.touch()
    out, err = finish(proc)
    one_line((proc.returncode, err), str(run.relative_to(tmp_path)), "is gone")
    status = run_bench("--results-dir", str(tmp_path / "elsewhere"), "status", cwd=tmp_path)
    assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr


# --- bad input files: one line, bounded time and memory --------------------------------------------------

def _bounded_bench(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """`bench` in a process that may map at most 1 GiB and run at most a minute: the loader used to build
    an alias bomb until it failed at 2.9 GB, which must fail this test, not the machine."""

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    env = {k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"}
    return subprocess.run([str(BENCH), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=bound)


BOMB = "\n".join(["train:", '  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
                 + [f"  {n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)])
THOUSAND = ", ".join(str(v) for v in range(1, 1001))
BAD_FILES = {
    "key twice": (b'tag: "13"\nmatrix:\n  tp: [1]\n  tp: [2]\n', r"key 'tp' appears twice \(lines 3 and 4\)"),
    "matrix twice": (b'tag: "13"\nmatrix: {tp: [1]}\nmatrix: {tp: [2]}\n', r"key 'matrix' appears twice \(lines 2 and 3\)"),
    "latin-1": (b'tag: "13"\n# 13B, r\xe9sum\xe9 of the grid\nmatrix: {tp: [1, 2]}\n',
                r"line 2: not UTF-8 text: byte 0xe9 at offset 18"),
    "alias bomb": (f'tag: "13"\nmatrix: {{tp: [1, 2]}}\n{BOMB}\n'.encode(),
                   r"line \d+: the alias \*[a-i] expands the document past 100 times its own size"),
    "benchmark is a folder": (b'benchmark: folder.yaml\ntag: "13"\nmatrix: {tp: [1, 2]}\n',
                              r"folder.yaml: cannot read the benchmark file: Is a directory"),
    "benchmark is a fifo": (b'benchmark: fifo.yaml\ntag: "13"\nmatrix: {tp: [1, 2]}\n',
                            r"fifo.yaml: not a regular file, so not a benchmark file"),
    "a trillion combinations": (
        f'tag: "13"\nmatrix:\n  tp: [{THOUSAND}]\n  pp: [{THOUSAND}]\n  mbs: [{THOUSAND}]\n  gas: [{THOUSAND}]\n'.encode(),
        r"spans 1,000,000,000,000 combinations \(tp 1,000 x pp 1,000 x mbs 1,000 x gas 1,000\), more than the "
        r"10,000,000 a sweep expands; narrow its lists or use zip$"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_grid_file_is_one_line_in_bounded_time_and_memory(tmp_path, case):
    text, message = BAD_FILES[case]
    (tmp_path / "folder.yaml").mkdir()
    os.mkfifo(tmp_path / "fifo.yaml")
    path = tmp_path / "grid.yaml"
    path.write_bytes(text)
    line = one_line(_bounded_bench("sweep", str(path), "--dry-run", cwd=tmp_path))
    assert re.search(message, line), line
    assert not (tmp_path / "results").exists()


# --- logs that used to take minutes or gigabytes -------------------------------------------------------

def test_crafted_and_huge_lines_parse_in_bounded_time(tmp_path):
    """Lines that regexes took quadratic time on (267 s for 150 KB), a single line of 100 MB (68 s, and its
    whole text in memory), and a job.out with a 37 KB line that made the result table take ten seconds:
    each command ends well inside its timeout and its 1 GiB of address space."""
    crafted = tmp_path / "crafted.log"
    crafted.write_text(" iteration 1/ 10 |" + " " * 150_000 + "x\n" + "iteration " * 15_000 + "\n"
                       + "LOG " * 40_000 + "\n" + "a: " * 50_000 + "\n"
                       + " iteration 2/ 10 | elapsed time per iteration (s): 0.5 | global batch size: 8 |\n")
    proc = _bounded_bench("parse", str(crafted), "--seq-length", "2048", "--json", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert [r["iteration"] for r in found["records"]] == [2] and found["skipped_long_lines"] >= 1
    huge = tmp_path / "huge.log"
    with huge.open("w") as fh:
        fh.write(" iteration 1/ 10 | elapsed time per iteration (s): 0.5 | global batch size: 8 |\n")
        for _ in range(100):
            fh.write("iteration : | " * 75_000)  # 100 lines' worth of 1 MB, all one line
        fh.write("\n")
    proc = _bounded_bench("parse", str(huge), "--seq-length", "2048", "--json", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["skipped_long_lines"] == 1, proc.stderr
    run, (folder,) = dry_points(tmp_path)
    measured(folder)
    with (folder / "job.out").open("a") as fh:
        fh.write("[default0]: " + "iteration " * 3_700 + "|\n")  # 37 KB of what a record line starts with
    table = _bounded_bench("result", "table", "--format", "csv", cwd=tmp_path, timeout=60)
    assert table.returncode == 0 and csv_rows(table.stdout)[0]["Iterations"] == "4", table.stderr


def test_parse_json_never_holds_infinity(tmp_path):
    """A 1e-320 ms interval made tokens/s infinite: it is no measurement (dropped as broken), and the JSON
    holds only finite numbers or null."""
    log = tmp_path / "tiny.log"
    log.write_text(" iteration        1/      10 | elapsed time per iteration (ms): 1e-320 | global batch size: 8 |\n"
                   " iteration        2/      10 | elapsed time per iteration (ms): 500.0 | global batch size: 8 |\n")
    proc = run_bench("parse", str(log), "--seq-length", "2048", "--json", cwd=tmp_path)

    def refuse(constant: str):
        raise AssertionError(f"{constant} in JSON output")

    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout, parse_constant=refuse)
    assert [r["iteration"] for r in found["records"]] == [2] and found["records"][0]["tokens_per_s"] == 8 * 2048 / 0.5


# --- on Slurm: the emulated cluster of tests/slurm_lab.py ---------------------------------------------------

def _processes(name: str, cwd: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name \
                    and Path(os.readlink(entry / "cwd")) == cwd.resolve():
                found.append(int(entry.name))
    return found


@pytest.mark.slurm
def test_a_submission_whose_answer_is_lost_is_found_not_repeated(on_slurm, tmp_path, monkeypatch):
    """The controller hangs while sbatch waits (it gives up; Slurm may queue the job all the same): bench
    asks Slurm for a job of the point's name in its folder before anything else, records what it finds,
    and a resume never submits the point a second time."""
    monkeypatch.setenv("NLP_BENCH_SBATCH_TIMEOUT", "4")
    monkeypatch.setenv("NLP_BENCH_SUBMIT_SETTLE", "8")
    run, (folder,) = dry_points(tmp_path, system="local-slurm")
    # the controller answers bench's ping, then hangs as sbatch is called: sbatch pauses it before it asks
    tools = tmp_path / "bin"
    tools.mkdir()
    pid, real = on_slurm.controller_pid(), shutil.which("sbatch")
    (tools / "sbatch").write_text(f'#!/bin/sh\nkill -STOP {pid}\nexec {real} "$@"\n')
    (tools / "sbatch").chmod(0o755)
    with monkeypatch.context() as patched:
        patched.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
        proc = start("run", "--resume", run.name, cwd=tmp_path)
    try:
        until(lambda: _processes("sbatch", folder), "sbatch to be waiting for the controller")
        until(lambda: not _processes("sbatch", folder), "sbatch to give up")
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = finish(proc)
    jobs = on_slurm.jobs_in(folder)
    attempt = job(folder)
    if jobs:  # Slurm queued it: bench found it
        assert proc.returncode == 0 and attempt.job_id == jobs[0][0] and len(jobs) == 1, out + err
    else:  # it did not: bench says so and leaves the point to run again
        one_line((proc.returncode, err), "nothing was queued")
        assert attempt.state == "TO_SUBMIT"
    again = run_bench("run", "--resume", run.name, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(on_slurm.jobs_in(folder)) == 1, "one job for the point, whatever happened to sbatch's answer"


@pytest.mark.slurm
def test_two_resumes_at_once_submit_each_point_once(on_slurm, tmp_path):
    run, points = dry_points(tmp_path, [1, 2, 4, 8], system="local-slurm")
    procs = [start("sweep", "--resume", run.name, cwd=tmp_path) for _ in range(2)]
    for proc in procs:
        out, err = finish(proc)
        assert proc.returncode == 0, out + err
    for folder in points:
        assert len(on_slurm.jobs_in(folder)) == 1, f"{folder.name}: {on_slurm.jobs_in(folder)}"
        assert job(folder).number == 1 and job(folder).job_id == on_slurm.jobs_in(folder)[0][0]
    cancel = run_bench("cancel", run.name, cwd=tmp_path)
    assert cancel.returncode == 0 and cancel.stdout.count(": cancelled (jobs ") == 4, cancel.stdout + cancel.stderr
    ending = {"CANCELLED", "COMPLETING"}  # squeue shows a cancelled job COMPLETING while its processes are killed
    assert {state for folder in points for _, state in on_slurm.jobs_in(folder)} <= ending


@pytest.mark.slurm
def test_a_cancel_slurm_does_not_confirm_is_reported_as_such(on_slurm, tmp_path):
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = slurm_job_started(tmp_path)
    run = folder.parent.name
    with on_slurm.controller_paused():
        refused = run_bench("cancel", run, cwd=tmp_path, timeout=120)
    assert refused.returncode == 1 and "cancel NOT confirmed" in refused.stderr, refused.stdout + refused.stderr
    assert job(folder).state in ("PENDING", "RUNNING"), "an unconfirmed cancel is not recorded as one"
    confirmed = run_bench("cancel", run, cwd=tmp_path)
    assert confirmed.returncode == 0 and ": cancelled (jobs " in confirmed.stdout, confirmed.stdout + confirmed.stderr
    assert job(folder).state == "CANCELLED" and on_slurm.jobs_in(folder)[0][1] in ("CANCELLED", "COMPLETING")


@pytest.mark.slurm
def test_a_chain_is_cancelled_whole(on_slurm, stub_site, tmp_path):
    """A compile job (running) and its run job (held): `bench cancel` ends both."""
    profile = (stub_site / "slurm" / "systems" / "local-slurm.yaml").read_text()
    (stub_site / "slurm" / "systems" / "local-slurm-chain.yaml").write_text(
        profile.replace("name: local-slurm", "name: local-slurm-chain") + "compile_command: stand-in\n")
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm-chain", cwd=tmp_path)
    assert proc.returncode == 0 and ", then run job " in proc.stdout, proc.stdout + proc.stderr
    folder = slurm_job_started(tmp_path)
    chain = job(folder).chain_job_ids
    assert len(chain) == 2
    cancel = run_bench("cancel", folder.parent.name, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    found = dict(on_slurm.jobs_in(folder))
    assert set(found) == set(chain) and set(found.values()) <= {"CANCELLED", "COMPLETING"}, found


@pytest.mark.slurm
def test_a_job_slurm_no_longer_knows_becomes_lost_and_watching_ends(on_slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("NLP_BENCH_LOST_AFTER", "0")
    run, (folder,) = dry_points(tmp_path, system="local-slurm")
    record_job(folder, "RUNNING", job_id="987654", job_names=["nlp-bench-smoke"])
    watch = run_bench("status", run.name, "--watch", "--interval", "0.2", cwd=tmp_path, timeout=60)
    assert watch.returncode == 0 and "LOST" in watch.stdout, watch.stdout + watch.stderr
    assert (job(folder).state, job(folder).failure_class) == ("LOST", "lost")
    rows = csv_rows(run_bench("result", "table", run.name, "--format", "csv", cwd=tmp_path).stdout)
    assert (rows[0]["state"], rows[0]["failure_class"]) == ("LOST", "lost")


def _slurm_times(job_id: str) -> float:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    found = dict(re.findall(r"(StartTime|EndTime)=(\S+)", shown))
    from datetime import datetime

    return (datetime.fromisoformat(found["EndTime"]) - datetime.fromisoformat(found["StartTime"])).total_seconds()


@pytest.mark.slurm
def test_job_times_come_from_slurm_and_each_attempt_keeps_its_own(on_slurm, tmp_path, gate, monkeypatch):
    """Nobody polls while the job runs: its time is still Slurm's. A failed attempt, then a resumed one:
    nothing of the first (failure, times) is shown beside the second."""
    monkeypatch.setenv("NLP_BENCH_TEST_EXIT", "3")
    run, (folder,) = dry_points(tmp_path, system="local-slurm")
    gate.touch()
    assert run_bench("run", "--resume", run.name, cwd=tmp_path).returncode == 0
    first = job(folder).job_id
    until(lambda: dict(on_slurm.jobs_in(folder)).get(first) == "FAILED", "the first attempt to fail")
    status = run_bench("status", run.name, cwd=tmp_path)
    assert "FAILED" in status.stdout and job(folder).times_from == "scheduler", status.stdout
    assert job(folder).job_time_s() == pytest.approx(_slurm_times(first), abs=1)
    monkeypatch.delenv("NLP_BENCH_TEST_EXIT")
    assert run_bench("run", "--resume", run.name, "--wait", cwd=tmp_path).returncode == 0
    second = job(folder)
    assert (second.number, second.state, second.failure_class, second.times_from) == (2, "COMPLETED", None, "scheduler")
    row = csv_rows(run_bench("result", "table", run.name, "--format", "csv", cwd=tmp_path).stdout)[0]
    assert row["failure_class"] == "" and float(row["Job_Time"]) == pytest.approx(_slurm_times(second.job_id), abs=1)
    assert "-" not in run_bench("status", run.name, cwd=tmp_path).stdout.split("COMPLETED", 1)[1].split()[1]


@pytest.mark.slurm
def test_a_jobscript_edited_while_its_job_waits_is_recorded_as_it_was_submitted(on_slurm, tmp_path):
    blocker = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 300", "-o", "/dev/null"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60).stdout.strip()
    run, (folder,) = dry_points(tmp_path, system="local-slurm")
    assert run_bench("run", "--resume", run.name, "--after", blocker, cwd=tmp_path).returncode == 0
    submitted = (folder / "jobscript.sbatch").read_bytes()
    (folder / "jobscript.sbatch").write_text("#!/bin/bash\necho edited after submission\n")
    held = subprocess.run(["scontrol", "write", "batch_script", job(folder).job_id, "-"], capture_output=True,
                          timeout=30).stdout
    digest = hashlib.sha256(submitted).hexdigest()
    assert held == submitted and job(folder).scripts_sha256["jobscript.sbatch"] == digest
    assert (folder / "submitted" / "jobscript.sbatch").read_bytes() == submitted
    subprocess.run(["scancel", blocker], capture_output=True, timeout=30)


@pytest.mark.slurm
def test_status_says_when_slurm_does_not_answer_and_does_not_wait_long(on_slurm, tmp_path):
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = slurm_job_started(tmp_path)
    # recorded RUNNING before the controller hangs (accounting may still say PENDING a moment after the start)
    until(lambda: "RUNNING" in run_bench("status", cwd=tmp_path).stdout and job(folder).state == "RUNNING",
          "the job to be recorded RUNNING")
    with on_slurm.accounting_stopped(), on_slurm.controller_paused():
        began = time.monotonic()
        status = run_bench("status", cwd=tmp_path, timeout=120)
        took = time.monotonic() - began
    assert status.returncode == 0 and "RUNNING" in status.stdout, status.stdout + status.stderr
    assert "slurm did not answer" in status.stdout + status.stderr, status.stdout + status.stderr
    assert took < 20, f"bench status took {took:.0f} s with the controller hung (its questions wait 3 s each)"
    assert job(folder).state == "RUNNING"
