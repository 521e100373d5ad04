"""The local executor runs a jobscript as a one-node Slurm job and records what happened."""

import os
import signal
import subprocess
import sys
import time

from conftest import job

from nlp_bench.launch.executor import wait
from nlp_bench.launch.local import LocalExecutor
from nlp_bench.store import states


def _point(tmp_path, body: str):
    folder = tmp_path / "p"
    folder.mkdir()
    script = folder / "jobscript.sbatch"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    return folder

def test_runs_with_slurm_variables_and_captures_output(tmp_path):
    folder = _point(tmp_path, 'echo "job=$SLURM_JOB_ID nodes=$SLURM_JOB_NUM_NODES node=$SLURM_NODEID port=$MASTER_PORT"\n'
                              'echo oops >&2\necho "nlp-bench: training exited with code 0"\n')
    ex = LocalExecutor()
    job_id = ex.submit(folder)
    assert wait(ex, folder, interval_s=0.05) == states.COMPLETED
    out = (folder / "job.out").read_text()
    assert f"job={job_id} nodes=1 node=0 port=" in out
    assert (folder / "job.err").read_text() == "oops\n"
    info = job(folder)
    assert info.executor == "local" and info.exit_code == 0 and info.failure_class is None
    assert [h["state"] for h in info.history] == ["SUBMITTING", "RUNNING", "COMPLETED"]

def test_failure_is_classified(tmp_path):
    folder = _point(tmp_path, 'echo "[default0]:RuntimeError: something broke" >&2\nexit 3\n')
    ex = LocalExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.05) == states.FAILED
    info = job(folder)
    assert info.exit_code == 3
    assert (info.failure_class, info.failure_detail) == ("python_exception", "RuntimeError: something broke")

def test_cancel_kills_the_whole_job(tmp_path):
    folder = _point(tmp_path, "sleep 300 &\nchild=$!\necho $child > child.pid\nwait $child\n")
    ex = LocalExecutor()
    ex.submit(folder)
    deadline = time.monotonic() + 10
    # the file exists a moment before its content does: wait for the whole pid
    while not ((folder / "child.pid").is_file() and (folder / "child.pid").read_text().endswith("\n")) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int((folder / "child.pid").read_text())
    ex.cancel(folder)
    assert job(folder).state == states.CANCELLED
    time.sleep(0.2)
    try:
        os.kill(child, 0)
        alive = open(f"/proc/{child}/stat").read().split(")")[-1].split()[0] != "Z"
    except ProcessLookupError:
        alive = False
    assert not alive, "the job's children must die with it"

def test_a_cancel_from_another_bench_is_recorded_as_such_whoever_sees_the_end_first(tmp_path):
    """`bench cancel` of a sweep's running job: the sweep's own bench saw the job's shell exit 143 on SIGTERM
    and recorded FAILED before the cancel could record CANCELLED (seen on a loaded machine)."""
    # the job's shell ends at once on SIGTERM; a child that ignores it keeps the canceller waiting for its tree
    # (its grace period, 15 s) until the test, having seen the owner record the end, kills that child
    folder = _point(tmp_path, "(trap '' TERM; exec sleep 300) &\necho $! > stubborn.pid\n"
                              "trap 'exit 143' TERM\nwhile :; do sleep 0.05; done\n")
    owner = LocalExecutor()  # the sweep's bench, which holds the job's process; `bench cancel` is another
    owner.submit(folder)
    proc = owner._children[job(folder).job_id]
    stubborn, until = folder / "stubborn.pid", time.monotonic() + 30
    while not (stubborn.is_file() and stubborn.read_text().endswith("\n")):  # the whole pid, not a part
        assert time.monotonic() < until, "the job never started its child"
        time.sleep(0.05)
    stopper = subprocess.Popen([sys.executable, "-c", "import sys; from nlp_bench.launch.local import LocalExecutor; "
                                "LocalExecutor().cancel(sys.argv[1])", str(folder)])
    try:
        proc.wait(timeout=30)  # the job's shell has ended; the canceller still waits for the stubborn child
        assert owner.poll(folder) == states.CANCELLED
    finally:
        os.kill(int(stubborn.read_text()), signal.SIGKILL)
        stopped = stopper.wait(timeout=60)
    assert stopped == 0
    info = job(folder)
    assert (info.state, info.exit_code, info.failure_class) == (states.CANCELLED, 143, "cancelled")
    assert [h["state"] for h in info.history][-1] == states.CANCELLED

def test_another_process_learns_the_outcome_from_the_log(tmp_path):
    folder = _point(tmp_path, 'echo "nlp-bench: training exited with code 1"\nexit 1\n')
    first = LocalExecutor()
    first.submit(folder)
    proc = first._children[job(folder).job_id]
    proc.wait()
    # a fresh executor (say, a later `bench` invocation) has no handle on the child
    assert LocalExecutor().poll(folder) == states.FAILED
    assert job(folder).exit_code == 1

def test_result_table_refreshes_a_job_whose_watcher_died(bench, results):
    """bench killed while its local job ran: the next `bench result table` learns how the job ended."""
    assert bench("run", "--tag", "smoke", "--dry-run").exit_code == 0
    folder = next(results.glob("nlp/*/*/"))
    (folder / "jobscript.sbatch").write_text("#!/bin/bash\necho 'nlp-bench: training exited with code 0'\n")
    ex = LocalExecutor()
    ex.submit(folder)
    ex._children[job(folder).job_id].wait()
    assert job(folder).state == states.RUNNING  # nobody watched it end
    out = bench("result", "table", "--format", "csv")
    assert out.exit_code == 0, out.output
    assert ",COMPLETED," in out.output
    assert job(folder).state == states.COMPLETED

def _smoke_with_fake_trainer(tmp_path, trainer: str, hang_timeout_s: int):
    """The real smoke jobscript, its torchrun replaced by a script that prints what a trainer would."""
    from nlp_bench.launch.render import render_jobscript
    from nlp_bench.spec.benchmark import load_benchmark

    folder = tmp_path / "p"
    folder.mkdir()
    script = render_jobscript(load_benchmark().point("smoke"), hang_timeout_s=hang_timeout_s)
    assert "exec torchrun " in script
    (folder / "jobscript.sbatch").write_text(script.replace("exec torchrun ", "exec ./fake-trainer "))
    fake = folder / "fake-trainer"
    fake.write_text("#!/bin/bash\necho $$ > trainer.pid\n" + trainer)
    fake.chmod(0o755)
    return folder

def _iteration(i: int) -> str:
    return (f'echo "[default1]: iteration {i:8d}/     100 | elapsed time per iteration (s): 0.5 | '
            f'global batch size:     8 | lm loss: 1.0E+01 |"\n')

def test_watchdog_ends_a_training_that_stops_printing(tmp_path):
    folder = _smoke_with_fake_trainer(tmp_path, _iteration(1) + _iteration(2) + "sleep 300\n", hang_timeout_s=2)
    ex = LocalExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.1) == states.FAILED
    info = job(folder)
    assert info.failure_class == "hang"
    assert info.failure_detail.startswith("nlp-bench: watchdog: no new iteration line for ")
    pid = int((folder / "trainer.pid").read_text())
    time.sleep(0.2)
    try:
        alive = open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        alive = False
    assert not alive, "the hung trainer must be gone"

def test_watchdog_leaves_a_progressing_training_alone(tmp_path):
    body = "".join(_iteration(i) + "sleep 0.5\n" for i in range(1, 9))  # 4 s of training, a line every 0.5 s
    folder = _smoke_with_fake_trainer(tmp_path, body, hang_timeout_s=2)
    ex = LocalExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.1) == states.COMPLETED
    assert "watchdog" not in (folder / "job.out").read_text()

def _chain_point(tmp_path, compile_body: str):
    folder = _point(tmp_path, 'echo "run sees $(cat compiled)"\n')
    (folder / "compile.sbatch").write_text("#!/bin/bash\n" + compile_body)
    return folder

def test_a_chain_runs_its_scripts_in_order_each_with_its_own_output(tmp_path):
    folder = _chain_point(tmp_path, "echo graphs > compiled\necho compiling\n")
    ex = LocalExecutor()
    job_id = ex.submit(folder, ("compile.sbatch", "jobscript.sbatch"))
    assert wait(ex, folder, interval_s=0.05) == states.COMPLETED
    assert (folder / "compile.out").read_text() == "compiling\n"
    assert (folder / "job.out").read_text() == "run sees graphs\n"
    assert job(folder).chain_job_ids == [job_id, job_id]

def test_a_failed_step_ends_the_chain(tmp_path):
    folder = _chain_point(tmp_path, "echo 'neuron compile failed' >&2\nexit 7\n")
    ex = LocalExecutor()
    ex.submit(folder, ("compile.sbatch", "jobscript.sbatch"))
    assert wait(ex, folder, interval_s=0.05) == states.FAILED
    assert job(folder).exit_code == 7
    assert (folder / "compile.err").read_text() == "neuron compile failed\n"
    assert "run sees" not in (folder / "job.out").read_text()

def test_the_local_executor_cannot_hold_a_job_for_others(tmp_path):
    import pytest

    from nlp_bench.errors import LaunchError

    with pytest.raises(LaunchError, match="cannot hold a job"):
        LocalExecutor().submit(_point(tmp_path, "true\n"), after=["12"])

def test_a_job_whose_bench_died_before_recording_it_is_still_followed(tmp_path):
    """bench killed between starting the job's shell and writing its id: the pid the shell wrote first, a live
    process working in the point's folder, is the job: it is followed and can be cancelled."""
    import subprocess

    from nlp_bench.store.point_folder import PointDir

    folder = _point(tmp_path, "sleep 300\n")
    PointDir(folder).begin_attempt("local")
    (folder / "submitted").mkdir()
    shell = subprocess.Popen(["bash", "-c", "echo $$ > submitted/job.pid; exec sleep 300"], cwd=folder,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (folder / "submitted" / "job.pid").read_text().strip() if (folder / "submitted" / "job.pid").is_file() \
                else time.monotonic() < deadline:
            time.sleep(0.05)
        ex = LocalExecutor()
        assert ex.poll(folder) == states.RUNNING and job(folder).job_id == str(shell.pid)
        assert ex.cancel(folder).confirmed
        assert job(folder).state == states.CANCELLED
    finally:
        shell.kill()
        shell.wait()

def test_a_job_of_another_host_is_neither_lost_nor_signalled_from_here(tmp_path):
    """Results on a shared file system: the job runs on another node; this one cannot see its process."""
    import subprocess

    from conftest import record_job

    from nlp_bench.launch.local import identity

    folder = _point(tmp_path, "true\n")
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        elsewhere = {**identity(stranger.pid), "host": "another-node"}
        record_job(folder, states.RUNNING, executor="local", job_id=str(stranger.pid), process=elsewhere)
        ex = LocalExecutor()
        assert ex.poll(folder) == states.RUNNING
        outcome = ex.cancel(folder)
        assert not outcome.confirmed and "runs on another-node" in outcome.detail
        assert stranger.poll() is None
        (folder / "job.out").write_text("nlp-bench: training exited with code 0 at 2026-11-24T10:00:00+00:00\n")
        assert ex.poll(folder) == states.COMPLETED, "its own last line says it ended"
    finally:
        stranger.kill()
        stranger.wait()

def test_a_job_hears_the_signals_its_bench_held_back_while_starting_it(tmp_path):
    folder = _point(tmp_path, "grep -E '^Sig(Blk|Ign)' /proc/$$/status\n")
    ex = LocalExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.05) == states.COMPLETED
    blocked = int((folder / "job.out").read_text().split("SigBlk:")[1].split()[0], 16)
    assert not blocked & (1 << 1 | 1 << 14), "SIGINT or SIGTERM blocked in the job"  # bits of signals 2 and 15
