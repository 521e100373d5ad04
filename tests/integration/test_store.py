"""The run store: atomic records, runs created whole, ordered by its own counter, attempts, locks."""

import json
import os
import subprocess
import sys

import pytest

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.store import locks, runs
from nlp_bench.store.files import StoreError
from nlp_bench.store.point_folder import PointDir


def _new_run(root, point, command=("bench", "run")):
    def write(folder):
        PointDir(folder / point.id).write_point(point.to_dict(), "#!/bin/bash\n")

    return runs.create_run(root, "nlp", "smoke", "local", [point.id], write, list(command))

def test_run_layout_and_lookup(tmp_path):
    point = load_benchmark().point("smoke")
    run = _new_run(tmp_path, point)
    folder = run.path / point.id
    assert run.point_dirs() == [folder]
    assert json.loads((folder / "point.json").read_text())["layout"]["tp"] == 2
    assert os.access(folder / "jobscript.sbatch", os.X_OK)
    record = run.record()
    assert record.benchmark == "nlp" and record.points == (point.id,) and record.versions["nlp-bench"]
    assert record.sequence == 1 and run.id.endswith(run.id[-6:]) and "Z-" in run.id  # UTC, said so
    later = _new_run(tmp_path, point)
    assert later.record().sequence == 2
    assert runs.find_run(tmp_path, None) == later
    assert runs.find_run(tmp_path, run.id) == run
    assert runs.find_run(tmp_path, str(run.path)) == run
    with pytest.raises(StoreError, match="2 runs"):
        runs.find_run(tmp_path, run.id[:8])
    assert not list(tmp_path.glob("nlp/.creating-*")), "nothing half-written is left"

def test_a_lock_is_held_against_other_processes_and_dropped_when_its_holder_dies(tmp_path):
    """The second process is refused at once, naming the holder; a killed holder leaves no lock behind."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from nlp_bench.store import locks\n"
        f"with locks.hold(Path({str(tmp_path / 'x.lock')!r}), 'x'):\n"
        "    print('held', flush=True); time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(locks.Busy, match=f"bench pid {holder.pid}"):
            with locks.hold(tmp_path / "x.lock", "x"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with locks.hold(tmp_path / "x.lock", "x"):
        pass

def _other_process_can_lock(path) -> bool:
    probe = subprocess.run([sys.executable, "-c", (
        "import sys; from pathlib import Path; from nlp_bench.store import locks\n"
        f"try:\n    with locks.hold(Path({str(path)!r}), 'x'):\n        print('free')\n"
        "except locks.Busy:\n    print('busy')\n")], capture_output=True, text=True, timeout=60)
    return probe.stdout.strip() == "free"

def test_a_nested_hold_keeps_the_lock(tmp_path):
    """POSIX locks belong to the process: had the inner hold closed its own descriptor, the outer lock would
    be gone while the outer block still runs."""
    path = tmp_path / "x.lock"
    with locks.hold(path, "x"):
        with locks.hold(path, "x"):
            pass
        assert not _other_process_can_lock(path)
    assert _other_process_can_lock(path)
