"""Where a run lives and what its records say, against what runs: a run folder copied (`cp -r`) or moved while
its job runs, and a point.json edited by hand to a layout its jobscript does not run. Real benches, the real
local executor and the stand-in jobscript (tests/fixtures/stub_jobscript.sbatch.j2) held at its gate.

    pytest -m faults tests/integration/test_faults_place.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import STUB, finish, job, record_job, run_bench, start, started, until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


def refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The one `bench: error:` line of a command refused with exit 2 (no traceback), holding every needle."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("bench: error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stdout + proc.stderr
    assert all(needle in errors[0] for needle in needles), errors[0]
    return errors[0]


def _running_run(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """`bench run` of the smoke tag whose stand-in job waits at the gate: the bench, its run and point folder."""
    proc = start("run", "--tag", "smoke", cwd=tmp_path)
    until(lambda: list(tmp_path.glob("results/nlp/*/*/ran.pids")), "the job to start")
    folder = next(tmp_path.glob("results/nlp/*/*/ran.pids")).parent
    until(lambda: job(folder).process is not None, "the job's identity in state.json")
    return proc, folder.parent, folder


def _copy(run: Path, results: Path) -> Path:
    """The run folder copied as a user copies it, into another results folder."""
    (results / "nlp").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(run), str(results / "nlp")], check=True, timeout=60)
    return results / "nlp" / run.name


def test_a_copy_of_a_running_run_neither_cancels_nor_writes_the_original(tmp_path, stub_site, gate):
    """The copy refuses to cancel the original's job (one line naming both folders, exit 2), shows its row
    as a copy and keeps the state as copied; the original's record is untouched and its job ends clean."""
    proc, run, folder = _running_run(tmp_path)
    copy = _copy(run, tmp_path / "copied")
    kept = (folder / "state.json").read_bytes()
    at = ["--results-dir", str(tmp_path / "copied")]
    refused(run_bench(*at, "cancel", run.name, cwd=tmp_path), str(copy / folder.name), str(folder))
    status = run_bench(*at, "status", run.name, cwd=tmp_path)
    assert status.returncode == 0 and "RUNNING (copy)" in status.stdout, status.stdout + status.stderr
    assert f"is a copy of {folder}" in status.stderr, status.stderr
    table = run_bench(*at, "result", "table", run.name, "--format", "csv", cwd=tmp_path)
    assert table.returncode == 0 and ",RUNNING (copy)," in table.stdout, table.stdout + table.stderr
    assert (folder / "state.json").read_bytes() == kept, "the copy wrote into the original's record"
    assert job(folder).state == "RUNNING" and job(folder).cancel_requested is None
    gate.touch()
    _, err = finish(proc)
    assert proc.returncode == 0, err
    assert (job(folder).state, job(folder).exit_code) == ("COMPLETED", 0)
    later = run_bench(*at, "status", run.name, cwd=tmp_path)  # the job ended: the copy does not call it lost
    assert "RUNNING (copy)" in later.stdout and "LOST" not in later.stdout, later.stdout
    assert job(copy / folder.name).state == "RUNNING"


def test_a_moved_run_is_the_run_and_a_copy_of_it_is_not(tmp_path, stub_site, gate):
    """Renamed while its job runs (the old folder gone), the run is the same run: its status follows the job
    and records where it now lives, so a copy made of it afterwards is refused the cancel, naming the moved
    folder; the cancel in the moved folder stops the job."""
    proc, run, folder = _running_run(tmp_path)
    moved = tmp_path / "moved" / "nlp" / run.name
    moved.parent.mkdir(parents=True)
    run.rename(moved)
    status = run_bench("--results-dir", str(tmp_path / "moved"), "status", run.name, cwd=tmp_path)
    assert status.returncode == 0 and re.search(r"RUNNING(?! \(copy)", status.stdout), status.stdout + status.stderr
    copy = _copy(moved, tmp_path / "copied")
    refused(run_bench("--results-dir", str(tmp_path / "copied"), "cancel", run.name, cwd=tmp_path),
            str(copy / folder.name), str(moved / folder.name))
    assert job(moved / folder.name).state == "RUNNING"
    cancel = run_bench("--results-dir", str(tmp_path / "moved"), "cancel", run.name, cwd=tmp_path)
    assert cancel.returncode == 0 and "cancelled (job" in cancel.stdout, cancel.stdout + cancel.stderr
    assert job(moved / folder.name).state == "CANCELLED"
    finish(proc)


#: the stand-in jobscript with the layout a rendered one carries: the trainer's parallel flags from exports
_LAYOUT_LINES = """export TP_SIZE={{ lay.tp }}
export PP_SIZE={{ lay.pp }}
export GPUS_PER_NODE={{ lay.devices_per_node }}
TRAIN_ARGS=(
    --tensor-model-parallel-size "$TP_SIZE"
    --pipeline-model-parallel-size "$PP_SIZE"
    --micro-batch-size {{ lay.mbs }}
    --global-batch-size {{ lay.global_batch_size }}
)
"""


def _edit_layout(folder: Path, **layout: int) -> None:
    path = folder / "point.json"
    data = json.loads(path.read_text())
    data["layout"].update(layout)
    path.write_text(json.dumps(data, indent=2))


def test_a_point_json_that_is_not_its_jobscripts_layout_is_said_marked_and_not_run(tmp_path, stub_site, gate):
    """point.json edited to tp 3 (impossible on 2 ranks), then to tp 1, where the jobscript runs tp 2: status
    and the table mark the row and name both values and the file; --resume refuses to run it (one line,
    exit 2) until the jobscript runs that layout too. Once run, an edit is checked against the submitted copy."""
    template = stub_site / "slurm" / "templates" / "jobscript.sbatch.j2"
    template.write_text(STUB.read_text().replace('echo "{{ start_line }}"', _LAYOUT_LINES + 'echo "{{ start_line }}"'))
    assert run_bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path).returncode == 0
    folder = next(tmp_path.glob("results/nlp/*/*/point.json")).parent.relative_to(tmp_path)  # as bench names it
    run, script = folder.parent, folder / "jobscript.sbatch"
    assert "--tensor-model-parallel-size" in (tmp_path / script).read_text() and json.loads(
        (tmp_path / folder / "point.json").read_text())["layout"]["tp"] == 2
    gate.touch()
    for tp in (3, 1):
        _edit_layout(tmp_path / folder, tp=tp)
        said = f"layout.tp is {tp} but {script} runs 2 (--tensor-model-parallel-size)"
        status = run_bench("status", run.name, cwd=tmp_path)
        assert status.returncode == 0 and "TO_SUBMIT (mismatch)" in status.stdout, status.stdout + status.stderr
        assert f"bench: warning: {folder / 'point.json'} disagrees with its jobscript: {said}" in status.stderr
        table = run_bench("result", "table", run.name, "--format", "csv", cwd=tmp_path)
        assert table.returncode == 0 and ",TO_SUBMIT (mismatch)," in table.stdout, table.stdout
        assert said in table.stderr, table.stderr
        refused(run_bench("run", "--resume", run.name, cwd=tmp_path), str(folder / "point.json"), said)
        assert not started(tmp_path / folder) and job(tmp_path / folder) is None, "a disagreeing point was run"
    made_again = (tmp_path / script).read_text().replace("TP_SIZE=2", "TP_SIZE=1")  # the jobscript made for tp 1
    (tmp_path / script).write_text(made_again)
    again = run_bench("run", "--resume", run.name, cwd=tmp_path)
    assert again.returncode == 0 and started(tmp_path / folder), again.stdout + again.stderr
    assert job(tmp_path / folder).state == "COMPLETED"
    assert "mismatch" not in run_bench("status", run.name, cwd=tmp_path).stdout
    _edit_layout(tmp_path / folder, tp=2)
    table = run_bench("result", "table", run.name, "--format", "csv", cwd=tmp_path)
    assert ",COMPLETED (mismatch)," in table.stdout, table.stdout
    assert f"layout.tp is 2 but {folder / 'submitted' / 'jobscript.sbatch'} runs 1" in table.stderr, table.stderr
    _edit_layout(tmp_path / folder, tp=1)
    with (tmp_path / folder / "submitted" / "jobscript.sbatch").open("a") as frozen:  # the copy that ran, edited
        frozen.write("# edited\n")
    status = run_bench("status", run.name, cwd=tmp_path)
    assert "COMPLETED (mismatch)" in status.stdout, status.stdout
    assert "submitted/jobscript.sbatch is not the script submitted: its sha256" in status.stderr, status.stderr


def test_a_copy_of_a_run_whose_slurm_job_is_queued_neither_asks_slurm_nor_cancels(tmp_path, monkeypatch):
    """The same for a Slurm job: the copy's cancel is refused before scancel could be asked (a scancel here
    would record that it was called), and its status shows the state as copied without asking squeue."""
    assert run_bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path).returncode == 0
    folder = next(tmp_path.glob("results/nlp/*/*/point.json")).parent
    record_job(folder, "PENDING", executor="slurm", job_id="4242")
    copy = _copy(folder.parent, tmp_path / "copied")
    asked = tmp_path / "asked"
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("scancel", "squeue", "sacct", "sbatch", "scontrol"):
        (fake / tool).write_text(f"#!/bin/sh\necho {tool} >> {asked}\nexit 1\n")
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    at = ["--results-dir", str(tmp_path / "copied")]
    refused(run_bench(*at, "cancel", folder.parent.name, cwd=tmp_path), str(copy / folder.name), str(folder), "4242")
    status = run_bench(*at, "status", folder.parent.name, cwd=tmp_path)
    assert status.returncode == 0 and "PENDING (copy)" in status.stdout, status.stdout + status.stderr
    assert not asked.exists(), asked.read_text()
    assert job(folder).state == job(copy / folder.name).state == "PENDING"


def test_a_run_reached_by_another_path_is_the_run_not_a_copy(tmp_path):
    """A results folder reached through a link (a site's /scratch -> /gpfs/scratch) is the folder itself."""
    from nlp_bench.store.point_folder import PointDir

    assert run_bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path).returncode == 0
    folder = next(tmp_path.glob("results/nlp/*/*/point.json")).parent
    record_job(folder, "RUNNING", executor="slurm", job_id="7")
    (tmp_path / "linked").symlink_to(tmp_path / "results")
    assert PointDir(tmp_path / "linked" / folder.relative_to(tmp_path / "results")).copy_of() is None
    assert PointDir(_copy(folder.parent, tmp_path / "copied") / folder.name).copy_of() == folder


def test_a_rendered_jobscript_s_layout_is_what_point_json_is_checked_against(tmp_path):
    """The jobscript the project renders (its TRAIN_ARGS from exported variables): point.json edited to tp 3 is
    marked, and a resume (even a dry one) refuses it instead of running the 2-rank job as tp 3."""
    assert run_bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path).returncode == 0
    folder = next(tmp_path.glob("results/nlp/*/*/point.json")).parent
    _edit_layout(folder, tp=3, dp=2)
    table = run_bench("result", "table", "--format", "csv", cwd=tmp_path)
    assert ",TO_SUBMIT (mismatch)," in table.stdout, table.stdout + table.stderr
    assert "layout.tp is 3 but" in table.stderr and "runs 2 (--tensor-model-parallel-size); layout.dp is 2 but" \
        in table.stderr and "runs 1 (DP_SIZE)" in table.stderr, table.stderr
    refused(run_bench("run", "--resume", folder.parent.name, "--dry-run", cwd=tmp_path), "layout.tp is 3")
