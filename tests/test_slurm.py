"""The Slurm executor against a real slurmctld/slurmd started by the tests' own fixture."""

import json
import time

import pytest

from conftest import run_bench
from nlp_bench.launch import states
from nlp_bench.launch.executor import wait
from nlp_bench.launch.slurm import SlurmExecutor

pytestmark = pytest.mark.slurm


def _point(tmp_path, body: str):
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "jobscript.sbatch").write_text("#!/bin/bash\n#SBATCH --output=job.out\n#SBATCH --error=job.err\n"
                                             "#SBATCH --time=00:05:00\n" + body)
    return folder


def test_completed_job(slurm_cluster, tmp_path):
    folder = _point(tmp_path, 'echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"\n')
    ex = SlurmExecutor()
    job_id = ex.submit(folder)
    assert states.load(folder)["state"] == states.PENDING
    assert wait(ex, folder, interval_s=0.3) == states.COMPLETED
    info = states.load(folder)
    assert info["job_id"] == job_id and info["exit_code"] == 0 and info["failure_class"] is None
    assert f"job {job_id} on {slurm_cluster}" in (folder / "job.out").read_text()


def test_failed_job_keeps_exit_code_and_class(slurm_cluster, tmp_path):
    folder = _point(tmp_path, 'echo "[default0]:ZeroDivisionError: division by zero" >&2\nexit 3\n')
    ex = SlurmExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.3) == states.FAILED
    info = states.load(folder)
    assert info["exit_code"] == 3 and info["failure_class"] == "python_exception"


def test_cancel(slurm_cluster, tmp_path):
    folder = _point(tmp_path, "sleep 300\n")
    ex = SlurmExecutor()
    ex.submit(folder)
    deadline = time.monotonic() + 30
    while ex.poll(folder) != states.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    ex.cancel(folder)
    assert wait(ex, folder, interval_s=0.3) == states.CANCELLED
    assert states.load(folder)["failure_class"] == "cancelled"


def test_refused_submission_is_a_clear_error(slurm_cluster, tmp_path):
    from nlp_bench.errors import LaunchError

    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "jobscript.sbatch").write_text("#!/bin/bash\n#SBATCH --partition=nosuchpartition\ntrue\n")
    with pytest.raises(LaunchError, match="sbatch refused .*jobscript.sbatch: .*partition"):
        SlurmExecutor().submit(folder)


@pytest.mark.slow
def test_smoke_benchmark_through_slurm(slurm_cluster, tmp_path):
    """sbatch -> srun -> torchrun (c10d rendezvous on the first node) -> trainer -> parsed row."""
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", "--wait", cwd=tmp_path)
    folder = next(tmp_path.glob("results/nlp/*/*/"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + (folder / "job.err").read_text()[-3000:]
    assert ": Slurm job " in proc.stdout and "COMPLETED" in proc.stdout  # --wait prints the table at the end
    table = run_bench("result", "table", "--format", "csv", cwd=tmp_path)
    row = dict(zip(table.stdout.splitlines()[0].split(","), table.stdout.splitlines()[1].split(",")))
    assert row["system"] == "local-slurm" and row["queue"] == "debug" and float(row["Tokens/sec"]) > 0
    assert row["Iterations"] == "40"


def test_status_and_cancel_of_a_running_job(slurm_cluster, tmp_path):
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = next(tmp_path.glob("results/nlp/*")).name
    log = next(tmp_path.glob("results/nlp/*/*/")) / "job.out"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.is_file() and " iteration " in log.read_text()):
        time.sleep(0.5)
    status = run_bench("status", run_id, cwd=tmp_path)
    assert status.returncode == 0 and "RUNNING" in status.stdout, status.stdout + status.stderr
    assert "/40" in status.stdout  # the last iteration, out of the planned ones
    cancelled = run_bench("cancel", run_id, cwd=tmp_path)
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = run_bench("status", run_id, cwd=tmp_path)
        if "CANCELLED" in status.stdout:
            break
        time.sleep(1)
    assert "CANCELLED" in status.stdout, status.stdout
    again = run_bench("cancel", run_id, cwd=tmp_path)
    assert "nothing to cancel" in again.stdout


def test_resume_runs_only_what_did_not_complete(slurm_cluster, tmp_path):
    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {tp: [1, 2]}\n"
                                     "train: {train-iters: 6, lr-warmup-iters: 2, log-interval: 2, eval-iters: 0}\n")
    dry = run_bench("sweep", "g.yaml", "--system", "local-slurm", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    run_dir = next(tmp_path.glob("results/nlp/*"))
    good, bad = sorted(run_dir.glob("*/jobscript.sbatch"))
    original = bad.read_text()
    bad.write_text(original.replace("set -uo pipefail", "set -uo pipefail\necho 'ValueError: broken on purpose' >&2; exit 3", 1))
    first = run_bench("sweep", "--resume", run_dir.name, "--wait", cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    states = {p.parent.name: json.loads((p.parent / "state.json").read_text()) for p in (good, bad)}
    assert states[good.parent.name]["state"] == "COMPLETED"
    assert (states[bad.parent.name]["state"], states[bad.parent.name]["failure_class"]) == ("FAILED", "python_exception")
    kept = (good.parent / "result.json").read_text()
    good_job = states[good.parent.name]["job_id"]

    bad.write_text(original)  # repaired: resume must run only this point
    second = run_bench("sweep", "--resume", run_dir.name, "--wait", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 point(s) to run again" in second.stdout and f"kept {good.parent.name} (COMPLETED)" in second.stdout
    assert json.loads((good.parent / "state.json").read_text())["job_id"] == good_job
    assert (good.parent / "result.json").read_text() == kept, "a finished result must never be overwritten"
    assert "broken on purpose" in (bad.parent / "job.err.1").read_text()
    assert json.loads((bad.parent / "state.json").read_text())["state"] == "COMPLETED"
