"""The run store: atomic records, runs created whole, ordered by its own counter, attempts, locks."""

import json
import os
import shutil

import pytest

from nlp_bench.errors import BenchError
from nlp_bench.fsio import write_json_atomic, write_text_atomic
from nlp_bench.launch import failures
from nlp_bench.launch.slurm import from_slurm
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.store import runs, states
from nlp_bench.store.files import StoreError
from nlp_bench.store.point_folder import PointDir


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    write_json_atomic(target, {"a": 1})

    def boom(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"], "no temporary file left behind"

def test_written_files_respect_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "x", "y")
    finally:
        os.umask(old)
    assert (tmp_path / "x").stat().st_mode & 0o777 == 0o644

def test_json_never_holds_nan_or_infinity(tmp_path):
    write_json_atomic(tmp_path / "x.json", {"a": float("inf"), "b": [float("nan"), 1.5]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [None, 1.5]}

def _new_run(root, point, command=("bench", "run")):
    def write(folder):
        PointDir(folder / point.id).write_point(point.to_dict(), "#!/bin/bash\n")

    return runs.create_run(root, "nlp", "smoke", "local", [point.id], write, list(command))

def test_attempts_keep_their_own_history(tmp_path):
    point = PointDir(tmp_path)
    point.begin_attempt("slurm", job_id="1")
    point.update(states.PENDING)
    point.update(states.PENDING)
    point.update(states.FAILED, failure_class="python_exception")
    second = point.begin_attempt("slurm", job_id="2")
    point.update(states.RUNNING)
    record = point.state()
    assert [a.number for a in record.attempts] == [1, 2] and record.state == states.RUNNING
    assert [h["state"] for h in record.attempts[0].history] == ["SUBMITTING", "PENDING", "FAILED"]
    assert second.failure_class is None and record.current.failure_class is None, "a new attempt starts clean"

def test_an_old_state_json_reads_as_one_attempt(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({
        "state": "COMPLETED", "executor": "slurm", "job_id": "7", "exit_code": 0, "history": [{"state": "PENDING"}],
        "started": "2026-11-20T10:00:00+00:00", "finished": "2026-11-20T10:01:40+00:00"}))
    attempt = PointDir(tmp_path).attempt()
    assert (attempt.number, attempt.state, attempt.job_id, attempt.job_time_s()) == (1, "COMPLETED", "7", 100.0)

@pytest.mark.parametrize("raw,ours", [("COMPLETED", "COMPLETED"), ("CANCELLED by 0", "CANCELLED"), ("TO", "TIMEOUT"),
                                      ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("RUNNING", "RUNNING"), ("weird", "UNKNOWN")])
def test_slurm_states(raw, ours):
    assert from_slurm(raw) == ours

@pytest.mark.parametrize("state,code,text,cls", [
    ("COMPLETED", 0, "all good", None),
    ("FAILED", 1, "[default0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "out_of_memory"),
    ("FAILED", 1, "Traceback (most recent call last):\n  File x\n[default0]:ValueError: bad shape", "python_exception"),
    ("FAILED", 2, "nlp_bench.train: error: --bf16 is not implemented in this trainer yet", "usage"),
    ("TIMEOUT", None, "", "timeout"),
    ("FAILED", 3, "nothing useful", "nonzero_exit"),
    ("FAILED", 1, "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: x", "rendezvous"),
    ("LOST", None, "", "lost"),
])
def test_failure_classes(state, code, text, cls):
    assert failures.classify(state, code, text)[0] == cls

def test_the_newest_run_is_the_last_made_whatever_the_clock_says(bench, results, monkeypatch):
    """A run made after the clock stepped back (a DST fall-back read as local time, an NTP step, another TZ)
    is still the newest: the store's counter orders runs, not the time in their ids."""
    point = load_benchmark().point("smoke")
    monkeypatch.setattr(runs.time, "time_ns", lambda: 1_795_000_000 * 10**9)
    later_clock = _new_run(results, point)
    monkeypatch.setattr(runs.time, "time_ns", lambda: 1_795_000_000 * 10**9 - 3600 * 10**9)
    newest = _new_run(results, point)
    monkeypatch.undo()
    assert newest.id < later_clock.id, "the second run's id reads an hour earlier"
    assert runs.find_run(results, None) == newest
    PointDir(newest.path / point.id).begin_attempt("local", state=states.COMPLETED, job_id="1", exit_code=0)
    assert f"run {newest.id}" in bench("status").output
    table = bench("result", "table", "--format", "csv").output.splitlines()
    assert len(table) == 2 and f",{newest.id}," in table[1] and "COMPLETED" in table[1], table

def test_a_run_being_written_is_invisible_and_an_abandoned_one_is_cleared(tmp_path):
    point = load_benchmark().point("smoke")

    def write(folder):
        PointDir(folder / point.id).write_point(point.to_dict(), "#!/bin/bash\n")
        raise KeyboardInterrupt  # killed while writing

    with pytest.raises(KeyboardInterrupt):
        runs.create_run(tmp_path, "nlp", "smoke", "local", [point.id], write, ["bench"])
    assert not list((tmp_path / "nlp").iterdir()), "an interrupted run leaves nothing"
    abandoned = tmp_path / "nlp" / ".creating-x"
    abandoned.mkdir()
    young = _new_run(tmp_path, point)
    assert abandoned.exists(), "a folder this young may be a run its creator has not locked yet"
    os.utime(abandoned, (0, 0))
    _new_run(tmp_path, point)
    assert not abandoned.exists(), "the next run clears what a killed creator left"
    assert runs.find_run(tmp_path, None) != young

def test_a_damaged_record_is_one_line_naming_the_file(tmp_path):
    point = load_benchmark().point("smoke")
    run = _new_run(tmp_path, point)
    state = run.path / point.id / "state.json"
    for text, needle in [("", "empty"), ('{"attempts": [', "not valid JSON"), ("[1]", "expected a JSON object"),
                         ('{"attempts": [{"number": 1, "executor": "local"}]}', "attempt.state must be str"),
                         ('{"attempts": [{"number": 1, "executor": "x", "state": "DONE"}]}', "not a job state")]:
        state.write_text(text)
        with pytest.raises(StoreError, match=needle) as caught:
            PointDir(state.parent).state()
        assert str(state) in str(caught.value) and "\n" not in str(caught.value)
        assert isinstance(caught.value, BenchError)
    (run.path / point.id / "point.json").write_text('{"id": "x", "layout": {}}')
    with pytest.raises(StoreError, match="point.json: system must be str"):
        PointDir(state.parent).point()
    shutil.rmtree(run.path / point.id)
    assert [p.id for p in run.points()] == [point.id] and run.point_dirs() == []

def test_a_local_attempt_whose_bench_died_before_its_job_started_may_run_again(tmp_path):
    from nlp_bench.launch.local import LocalExecutor

    point = PointDir(tmp_path)
    point.begin_attempt("local")  # SUBMITTING, no job id: bench was killed right here
    assert LocalExecutor().poll(tmp_path) == states.LOST
    assert point.attempt().failure_class == "lost" and states.LOST in states.RERUNNABLE
