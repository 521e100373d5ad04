import json
import os
import shutil

import pytest

from nlp_bench import workspace
from nlp_bench.errors import ResultError
from nlp_bench.fsio import write_json_atomic, write_text_atomic
from nlp_bench.launch import failures, states
from nlp_bench.spec.benchmark import load_benchmark


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


def test_run_layout_and_lookup(tmp_path):
    point = load_benchmark().point("smoke")
    run = workspace.create_run(tmp_path, "nlp", "smoke", "local", [point], ["bench", "run"])
    folder = workspace.write_point(run, point, "#!/bin/bash\n")
    assert folder == tmp_path / "nlp" / run.id / point.id
    assert json.loads((folder / "point.json").read_text())["layout"]["tp"] == 2
    assert os.access(folder / "jobscript.sbatch", os.X_OK)
    meta = run.meta()
    assert meta["benchmark"] == "nlp" and meta["points"] == [point.id] and meta["versions"]["nlp-bench"]
    later = workspace.create_run(tmp_path, "nlp", "smoke", "local", [point], [])
    assert later.id != run.id and later.id[:15] >= run.id[:15]  # distinct, and sortable by creation time
    assert workspace.find_run(tmp_path, None).id == max(run.id, later.id)
    assert workspace.find_run(tmp_path, run.id) == run
    assert workspace.find_run(tmp_path, str(run.path)) == run
    with pytest.raises(ResultError, match="2 runs"):
        workspace.find_run(tmp_path, run.id[:8])


def test_state_history(tmp_path):
    states.record(tmp_path, states.PENDING, job_id="1")
    states.record(tmp_path, states.PENDING)
    info = states.record(tmp_path, states.RUNNING)
    assert [h["state"] for h in info["history"]] == ["PENDING", "RUNNING"] and info["job_id"] == "1"


@pytest.mark.parametrize("raw,ours", [("COMPLETED", "COMPLETED"), ("CANCELLED by 0", "CANCELLED"), ("TO", "TIMEOUT"),
                                      ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("RUNNING", "RUNNING"), ("weird", "UNKNOWN")])
def test_slurm_states(raw, ours):
    assert states.from_slurm(raw) == ours


@pytest.mark.parametrize("state,code,text,cls", [
    ("COMPLETED", 0, "all good", None),
    ("FAILED", 1, "[default0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "out_of_memory"),
    ("FAILED", 1, "Traceback (most recent call last):\n  File x\n[default0]:ValueError: bad shape", "python_exception"),
    ("FAILED", 2, "nlp_bench.train: error: --bf16 is not implemented in this trainer yet", "usage"),
    ("TIMEOUT", None, "", "timeout"),
    ("FAILED", 3, "nothing useful", "nonzero_exit"),
    ("FAILED", 1, "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: x", "rendezvous"),
])
def test_failure_classes(state, code, text, cls):
    assert failures.classify(state, code, text)[0] == cls


def test_the_newest_run_is_the_last_made_even_within_one_second(tmp_path, bench, results, monkeypatch):
    """A dry run and a real run made in the same second: `bench status` and `bench result table` without a
    run name pick the one made later, whatever the random part of the ids (eight tries, fixed salts)."""
    point = load_benchmark().point("smoke")
    second = 1_795_000_000 * 10**9  # one wall-clock second, shared by both runs of every try
    for salt in range(8):
        monkeypatch.setattr(workspace.os, "urandom", lambda n, s=salt: bytes([s]) * n)
        monkeypatch.setattr(workspace.time, "time_ns", lambda: second + 200_000_000)
        dry = workspace.create_run(results, "nlp", "smoke", "local", [point], ["bench", "sweep", "--dry-run"])
        workspace.write_point(dry, point, "#!/bin/bash\n")
        monkeypatch.setattr(workspace.os, "urandom", lambda n, s=salt: bytes([s + 100]) * n)
        monkeypatch.setattr(workspace.time, "time_ns", lambda: second + 700_000_000)
        real = workspace.create_run(results, "nlp", "smoke", "local", [point], ["bench", "run"])
        states.record(workspace.write_point(real, point, "#!/bin/bash\n"), states.COMPLETED, executor="local",
                      job_id="1", exit_code=0)
        monkeypatch.undo()
        assert dry.id[:15] == real.id[:15], "both runs are stamped with the same second"
        assert workspace.find_run(results, None) == real, salt
        status = bench("status")
        assert f"run {real.id}" in status.output and "COMPLETED" in status.output, status.output
        table = bench("result", "table", "--format", "csv").output.splitlines()
        assert len(table) == 2 and f",{real.id}," in table[1] and "COMPLETED" in table[1], table
        for run in (dry, real):
            shutil.rmtree(run.path)
