"""The Slurm executor and `bench` against a real Slurm (two emulated nodes, fake GPUs) that the tests'
own fixture starts: submission, states, failure classes, the watchdog, cancel and resume."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
from conftest import ROOT, job, megatron_archive, record_job, run_bench, shorten

from nlp_bench.launch.executor import wait
from nlp_bench.launch.slurm import SlurmExecutor
from nlp_bench.store import states

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
    assert job(folder).state == states.PENDING
    assert wait(ex, folder, interval_s=0.3) == states.COMPLETED
    info = job(folder)
    assert info.job_id == job_id and info.exit_code == 0 and info.failure_class is None
    assert re.search(rf"job {job_id} on node[12]\n", (folder / "job.out").read_text())


def test_failed_job_keeps_exit_code_and_class(slurm_cluster, tmp_path):
    folder = _point(tmp_path, 'echo "[default0]:ZeroDivisionError: division by zero" >&2\nexit 3\n')
    ex = SlurmExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.3) == states.FAILED
    info = job(folder)
    assert info.exit_code == 3 and info.failure_class == "python_exception"


def test_sacct_answers_where_accounting_works(slurm_cluster, tmp_path):
    import slurm_lab

    if not slurm_lab.accounting():
        pytest.skip("no slurmdbd/MariaDB here: the cluster runs without accounting")
    folder = _point(tmp_path, "exit 3\n")
    ex = SlurmExecutor()
    job_id = ex.submit(folder)
    deadline = time.monotonic() + 30
    while (found := ex._sacct(["-j", job_id, "-o", "State,ExitCode"])) != [["FAILED", "3:0"]] \
            and time.monotonic() < deadline:
        time.sleep(0.3)
    assert found == [["FAILED", "3:0"]]


def test_without_sacct_squeue_and_scontrol_answer(slurm_cluster, tmp_path, monkeypatch):
    import shutil

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "sacct" else which(name, *a, **k))
    folder = _point(tmp_path, 'echo "ValueError: no accounting needed" >&2\nexit 4\n')
    ex = SlurmExecutor()
    ex.submit(folder)
    assert wait(ex, folder, interval_s=0.3) == states.FAILED
    info = job(folder)
    assert (info.exit_code, info.failure_detail) == (4, "ValueError: no accounting needed")


def test_cancel(slurm_cluster, tmp_path):
    folder = _point(tmp_path, "sleep 300\n")
    ex = SlurmExecutor()
    ex.submit(folder)
    deadline = time.monotonic() + 30
    while ex.poll(folder) != states.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    outcome = ex.cancel(folder)
    assert outcome.confirmed, outcome.detail
    assert job(folder).state == states.CANCELLED and job(folder).failure_class == "cancelled"


def test_refused_submission_is_a_clear_error(slurm_cluster, tmp_path):
    from nlp_bench.errors import LaunchError

    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "jobscript.sbatch").write_text("#!/bin/bash\n#SBATCH --partition=nosuchpartition\ntrue\n")
    with pytest.raises(LaunchError, match="sbatch refused .*jobscript.sbatch: .*partition"):
        SlurmExecutor().submit(folder)


def test_dependency_holds_a_job_until_the_first_completes(slurm_cluster, tmp_path):
    first = _point(tmp_path, "sleep 5\n")
    second = tmp_path / "q"
    second.mkdir()
    (second / "jobscript.sbatch").write_text((first / "jobscript.sbatch").read_text().replace("sleep 5", "true"))
    ex = SlurmExecutor()
    first_id = ex.submit(first)
    second_id = ex.submit(second, after=[first_id])
    reason = subprocess.run(["squeue", "-h", "-j", second_id, "-o", "%T %r"], capture_output=True, text=True).stdout
    assert reason.strip() == "PENDING Dependency", reason
    assert wait(ex, second, interval_s=0.3) == states.COMPLETED

    def times(job_id: str) -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        return dict(re.findall(r"(StartTime|EndTime)=(\S+)", out))

    assert times(second_id)["StartTime"] >= times(first_id)["EndTime"]


def test_a_job_slurm_forgot_is_read_from_its_own_last_line(slurm_cluster, tmp_path):
    """No accounting and older than MinJobAge: squeue and scontrol no longer know the job."""
    folder = tmp_path / "p"
    folder.mkdir()
    record_job(folder, states.RUNNING, job_id="987654")
    (folder / "job.out").write_text("...\nnlp-bench: training exited with code 0 at 2026-11-22T10:00:00+00:00\n")
    assert SlurmExecutor().poll(folder) == states.COMPLETED


def _csv_rows(text: str) -> list[dict]:
    lines = text.splitlines()
    return [dict(zip(lines[0].split(","), line.split(","), strict=False)) for line in lines[1:]]


@pytest.mark.slow
def test_smoke_benchmark_across_both_nodes(slurm_cluster, site, tmp_path):
    """sbatch -> srun (one task per node) -> torchrun (c10d store on the first node) -> 4 trainer ranks (10
    iterations: the launch is what is checked)."""
    shorten(site, "smoke", 10)
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", "--wait", cwd=tmp_path)
    folder = next(tmp_path.glob("results/nlp/*/*/"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + (folder / "job.err").read_text()[-3000:]
    assert ": slurm job " in proc.stdout and "COMPLETED" in proc.stdout  # --wait prints the table at the end
    out = (folder / "job.out").read_text()
    assert " on node[1-2] started " in out and "world 4 = tp 2 x pp 1 x dp 2" in out
    shown = subprocess.run(["scontrol", "show", "job", job(folder).job_id], capture_output=True, text=True).stdout
    assert "TresPerNode=gres:gpu:2" in shown, shown  # the fake GPUs were allocated as a GPU job's would be
    status = run_bench("status", cwd=tmp_path)
    assert status.returncode == 0 and "COMPLETED" in status.stdout and "10/10" in status.stdout, status.stdout
    row, = _csv_rows(run_bench("result", "table", "--format", "csv", cwd=tmp_path).stdout)
    assert row["system"] == "local-slurm" and row["queue"] == "debug" and float(row["Tokens/sec"]) > 0
    assert (row["Nodes"], row["Tensor_Parallel"], row["DP"], row["Iterations"]) == ("2", "2", "2", "10")


@pytest.mark.slow
def test_smoke_sweep_runs_every_point(slurm_cluster, tmp_path):
    """The shipped smoke grid, its points trained 4 iterations instead of 10 (each a 4-rank launch, one after
    another): the rows need a finished run each, not its length."""
    shipped = (ROOT / "benchmark" / "grids" / "smoke.yaml").read_text()
    assert "  train-iters: 10\n" in shipped
    grid = tmp_path / "smoke.yaml"
    grid.write_text(shipped.replace("  train-iters: 10\n", "  train-iters: 4\n  lr-warmup-iters: 1\n"))
    proc = run_bench("sweep", str(grid), "--system", "local-slurm", "--wait", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _csv_rows(run_bench("result", "table", "--format", "csv", cwd=tmp_path).stdout)
    assert len(rows) == 4 and {r["state"] for r in rows} == {"COMPLETED"}
    assert {(r["Tensor_Parallel"], r["MBS"], r["GAS"]) for r in rows} == {("1", "1", "2"), ("1", "2", "1"),
                                                                       ("2", "1", "4"), ("2", "2", "2")}
    assert all(float(r["Tokens/sec"]) > 0 and r["Batch_Size"] == "8" for r in rows)


def test_status_and_cancel_of_a_running_job(slurm_cluster, tmp_path):
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", "--nodes", "1", cwd=tmp_path)
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
    assert cancelled.returncode == 0 and ": cancelled (jobs " in cancelled.stdout, cancelled.stdout + cancelled.stderr
    status = run_bench("status", run_id, cwd=tmp_path)
    assert "CANCELLED" in status.stdout, status.stdout
    again = run_bench("cancel", run_id, cwd=tmp_path)
    assert "nothing to cancel" in again.stdout


def test_resume_runs_only_what_did_not_complete(slurm_cluster, tmp_path):
    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {nodes: [1], tp: [1, 2]}\n"
                                     "train: {train-iters: 6, lr-warmup-iters: 2, log-interval: 2, eval-iters: 0}\n")
    dry = run_bench("sweep", "g.yaml", "--system", "local-slurm", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    run_dir = next(tmp_path.glob("results/nlp/*"))
    good, bad = sorted(run_dir.glob("*/jobscript.sbatch"))
    original = bad.read_text()
    bad.write_text(original.replace("set -uo pipefail", "set -uo pipefail\necho 'ValueError: broken on purpose' >&2; exit 3", 1))
    first = run_bench("sweep", "--resume", run_dir.name, "--wait", cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    assert job(good.parent).state == "COMPLETED"
    assert (job(bad.parent).state, job(bad.parent).failure_class) == ("FAILED", "python_exception")
    kept = (good.parent / "result.json").read_text()
    good_job = job(good.parent).job_id

    bad.write_text(original)  # repaired: resume must run only this point
    second = run_bench("sweep", "--resume", run_dir.name, "--wait", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 point(s) to run again" in second.stdout and f"kept {good.parent.name} (COMPLETED)" in second.stdout
    assert job(good.parent).job_id == good_job
    assert (good.parent / "result.json").read_text() == kept, "a finished result must never be overwritten"
    assert "broken on purpose" in (bad.parent / "job.err.1").read_text()
    second_attempt = job(bad.parent)
    assert (second_attempt.number, second_attempt.state, second_attempt.failure_class) == (2, "COMPLETED", None)


def _wait_for(predicate, what: str, timeout: float = 180.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _iterating(folder) -> bool:
    log = folder / "job.out"
    return log.is_file() and " iteration " in log.read_text()


def _trainer_ranks(job_id: str, local_rank: int) -> list[int]:
    """Pids of the trainer worker processes of a Slurm job with the given LOCAL_RANK."""
    found = []
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            environ = open(f"/proc/{proc}/environ", "rb").read().split(b"\0")
            cmdline = open(f"/proc/{proc}/cmdline", "rb").read()
        except OSError:
            continue
        if (f"SLURM_JOB_ID={job_id}".encode() in environ and f"LOCAL_RANK={local_rank}".encode() in environ
                and b"nlp_bench.train" in cmdline and b"torchrun" not in cmdline):
            found.append(int(proc))
    return found


@pytest.mark.slow
def test_failures_are_classified_and_resume_reruns_only_them(slurm_cluster, tmp_path):
    """One sweep, four points: one completes, one outlives a 1-minute limit (its ranks stopped once they
    train, and its watchdog off, so that it waits for the limit without using the CPUs), one hangs (a rank
    is stopped) and the watchdog ends it, one is cancelled. Each ends in its own state and class, the
    completed result is untouched, and --resume resubmits exactly the three others. The cluster runs two of
    these jobs at once: each point is acted on as soon as it trains."""
    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {nodes: [1], tp: [1, 2], mbs: [1, 2]}\n"
                                     "train: {train-iters: 100000, log-interval: 1, eval-iters: 0}\n")
    dry = run_bench("sweep", "g.yaml", "--system", "local-slurm", "--hang-timeout", "30", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    run_dir = next(tmp_path.glob("results/nlp/*"))
    good, timeout, hung, cancelled = sorted(p for p in run_dir.iterdir() if p.is_dir())
    for folder, old, new in ((good, "--train-iters 100000", "--train-iters 6"),
                             (timeout, "#SBATCH --time=00:10:00", "#SBATCH --time=00:01:00"),
                             (timeout, "NLP_BENCH_HANG_TIMEOUT:-30}", "NLP_BENCH_HANG_TIMEOUT:-0}")):
        script = folder / "jobscript.sbatch"
        assert old in script.read_text()
        script.write_text(script.read_text().replace(old, new))

    submitted = run_bench("sweep", "--resume", run_dir.name, cwd=tmp_path)
    assert submitted.returncode == 0 and "4 point(s) to run again" in submitted.stdout, submitted.stdout
    _wait_for(lambda: _iterating(timeout), "the time-limit point to train")
    idle = _trainer_ranks(job(timeout).job_id, local_rank=0) + _trainer_ranks(job(timeout).job_id, local_rank=1)
    assert len(idle) == 2, idle
    for pid in idle:
        os.kill(pid, signal.SIGSTOP)
    _wait_for(lambda: _iterating(hung), "the hang point to train")
    stopped = _trainer_ranks(job(hung).job_id, local_rank=1)
    assert len(stopped) == 1, stopped
    os.kill(stopped[0], signal.SIGSTOP)  # the other rank now waits for it forever, as in a real hang
    _wait_for(lambda: _iterating(cancelled), "the cancel point to train")
    cancel = run_bench("cancel", run_dir.name, cancelled.name, cwd=tmp_path)
    assert cancel.returncode == 0 and ": cancelled (jobs " in cancel.stdout, cancel.stdout + cancel.stderr

    def ended() -> bool:
        status = run_bench("status", run_dir.name, cwd=tmp_path)
        return status.stdout.count("RUNNING") + status.stdout.count("PENDING") == 0

    _wait_for(ended, "every point to end", timeout=240, every=3)
    final = {f.name: job(f) for f in (good, timeout, hung, cancelled)}
    got = {name: (s.state, s.failure_class) for name, s in final.items()}
    assert got == {good.name: ("COMPLETED", None), timeout.name: ("TIMEOUT", "timeout"),
                   hung.name: ("CANCELLED", "hang"), cancelled.name: ("CANCELLED", "cancelled")}, got
    assert "no new iteration line for " in final[hung.name].failure_detail
    assert "DUE TO TIME LIMIT" in final[timeout.name].failure_detail

    table = run_bench("result", "table", run_dir.name, "--format", "csv", cwd=tmp_path)
    rows = {r["point"]: r for r in _csv_rows(table.stdout)}
    assert rows[good.name]["Iterations"] == "6" and float(rows[good.name]["Tokens/sec"]) > 0
    kept = (good / "result.json").read_text()

    again = run_bench("sweep", "--resume", run_dir.name, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 point(s) to run again" in again.stdout and f"kept {good.name} (COMPLETED)" in again.stdout
    run_bench("cancel", run_dir.name, cwd=tmp_path)
    assert job(good).job_id == final[good.name].job_id
    assert (good / "result.json").read_text() == kept, "a finished result must never be overwritten"
    for folder in (timeout, hung, cancelled):
        assert (folder / "job.out.1").is_file(), "the failed attempt's log is kept beside the new one"


@pytest.mark.slow
def test_a_node_whose_slurmd_dies_ends_the_job_node_fail(slurm_cluster, tmp_path):
    import slurm_lab

    # long enough that the controller notices the silent node (SlurmdTimeout, ~25 s here) before it ends
    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {nodes: [2]}\n"
                                     "train: {train-iters: 100000, log-interval: 1, eval-iters: 0}\n")
    proc = run_bench("sweep", "g.yaml", "--system", "local-slurm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = next(tmp_path.glob("results/nlp/*")).name
    folder = next(tmp_path.glob("results/nlp/*/*/"))
    _wait_for(lambda: _iterating(folder), "the job to train")
    ranks = [pid for rank in (0, 1) for pid in _trainer_ranks(job(folder).job_id, local_rank=rank)]
    assert len(ranks) == 4, ranks
    for pid in ranks:  # a job that runs, not one that trains: the CPUs stay free while the controller notices
        os.kill(pid, signal.SIGSTOP)
    try:
        slurm_lab.kill_slurmd("node2")
        _wait_for(lambda: "NODE_FAIL" in run_bench("status", run_id, cwd=tmp_path).stdout,
                  "the controller to declare node2 down", timeout=120, every=2)
    finally:
        slurm_lab.start_slurmd("node2")
    info = job(folder)
    assert (info.state, info.failure_class) == ("NODE_FAIL", "node_failure"), info
    again = run_bench("sweep", "--resume", run_id, cwd=tmp_path)
    assert "1 point(s) to run again" in again.stdout, again.stdout + again.stderr
    run_bench("cancel", run_id, cwd=tmp_path)
    for pid in ranks:  # what the dead node's steps left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_compile_then_run_chain(slurm_cluster, tmp_path, monkeypatch):
    """A system that compiles ahead (as trn1/trn2): `bench run` submits the compile job, then the run job
    held until the compile job completed. The compile command is a stand-in that, like
    neuron_parallel_compile, runs the short trial training it wraps (after a pause, so order shows)."""
    root = tmp_path / "root"
    shutil.copytree(ROOT / "benchmark", root / "benchmark")
    shutil.copytree(ROOT / "slurm", root / "slurm")
    shorten(root, "smoke", 10)
    standin = tmp_path / "standin-compile"
    standin.write_text('#!/bin/bash\necho "compile stand-in: $1"\nsleep 3\nexec "$@"\n')
    standin.chmod(0o755)
    profile = (ROOT / "slurm" / "systems" / "local-slurm.yaml").read_text().replace("name: local-slurm",
                                                                                     "name: local-slurm-chain")
    profile += f"compile_command: {standin}\ncompile_cache: {tmp_path}/cache\ncompile_iters: 2\n"
    (root / "slurm" / "systems" / "local-slurm-chain.yaml").write_text(profile)
    monkeypatch.setenv("NLP_BENCH_ROOT", str(root))
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm-chain", "--wait", cwd=tmp_path)
    folder = next(tmp_path.glob("results/nlp/*/*/"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + (folder / "compile.err").read_text()[-2000:]
    assert ": slurm compile job " in proc.stdout and ", then run job " in proc.stdout
    state = job(folder)
    assert state.state == "COMPLETED" and state.chain_job_ids[0] != state.job_id
    compiled = (folder / "compile.out").read_text()
    assert "compile stand-in: torchrun" in compiled and "iteration        2/       2" in compiled
    assert "NEURON_COMPILE_CACHE_URL=" + f"{tmp_path}/cache" in (folder / "provenance.env").read_text()
    assert "iteration       10/      10" in (folder / "job.out").read_text()

    def times(job_id: str) -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        return dict(re.findall(r"(StartTime|EndTime)=(\S+)", out))

    assert times(state.job_id)["StartTime"] >= times(state.chain_job_ids[0])["EndTime"]


def test_megatron_lm_stand_in_through_slurm_beside_the_builtin_trainer(slurm_cluster, site, tmp_path, monkeypatch):
    """`--trainer megatron-lm` runs pretrain_gpt.py (the tests' stand-in, which refuses any flag Megatron-LM
    lacks) under the same sbatch/srun/torchrun launch; its Megatron-format log becomes a COMPLETED row, and a
    grid with a trainer axis puts it beside the built-in trainer as a ratio."""
    monkeypatch.setenv("MEGATRON_LM_REPO", str(ROOT / "tests" / "fixtures" / "megatron_lm"))
    shorten(site, "smoke", 10)
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", "--trainer", "megatron-lm", "--wait",
                     cwd=tmp_path)
    folder = next(tmp_path.glob("results/nlp/*/*_megatron-lm/"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + (folder / "job.err").read_text()[-3000:]
    row, = _csv_rows(run_bench("result", "table", "--format", "csv", cwd=tmp_path).stdout)
    assert (row["state"], row["trainer"], row["Iterations"]) == ("COMPLETED", "megatron-lm", "10")
    assert row["trainer_version"] == "0.20.0"  # the stand-in's claim; it lies inside nlp-bench's repository
    assert float(row["Tokens/sec"]) > 0
    assert "--mock-data" in (folder / "train.args").read_text().splitlines()
    assert "MEGATRON_LM_COMMIT=unknown" in (folder / "provenance.env").read_text()  # not nlp-bench's own commit
    assert "MEGATRON_LM_VERSION=0.20.0" in (folder / "provenance.env").read_text()  # what the stand-in claims
    made = json.loads((folder / "result.json").read_text())["provenance"]["megatron_lm"]
    assert (made["version"], made["made_for"], made["flag_table"]) == ("0.20.0", "0.20.0", "0.20.0.tsv")
    assert "warning: the arguments were made for" not in (folder / "job.err").read_text()
    grid = tmp_path / "both.yaml"
    grid.write_text("tag: smoke\nsystem: local-slurm\nmatrix:\n  trainer: [builtin, megatron-lm]\n"
                    "train: {train-iters: 10, eval-iters: 0}\n")  # the ratio needs two rows, not 40 iterations
    proc = run_bench("sweep", str(grid), "--wait", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = run_bench("result", "compare", "trainers", "--format", "csv", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (pair,) = _csv_rows(out.stdout)
    assert float(pair["builtin/megatron-lm"]) == pytest.approx(
        float(pair["builtin_Tokens/sec"]) / float(pair["megatron-lm_Tokens/sec"]))


@pytest.mark.slow
def test_doctor_names_the_wrong_partition_of_a_detected_profile(slurm_cluster, tmp_path, monkeypatch):
    """`bench system detect` on the emulated cluster (Gres says 2 GPUs per node), and a copy with a misspelt
    partition: the doctor fails it, naming the partition and those there are. A detected profile running the
    smoke benchmark (with --probe, which finds that nvidia-smi sees no GPU) is the README's walkthrough,
    tests/integration/test_readme_walkthrough.py."""
    root = tmp_path / "root"
    shutil.copytree(ROOT / "benchmark", root / "benchmark")
    shutil.copytree(ROOT / "slurm", root / "slurm")
    monkeypatch.setenv("NLP_BENCH_ROOT", str(root))
    profile = root / "slurm" / "systems" / "emulated.yaml"
    proc = run_bench("system", "detect", "-o", str(profile), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = profile.read_text()
    assert "partition: debug" in text and "gpus-per-node: 2" in text and "max_nodes: 2" in text
    (root / "slurm" / "systems" / "wrong.yaml").write_text(
        text.replace("name: emulated", "name: wrong").replace("partition: debug", "partition: debugg"))
    wrong = run_bench("doctor", "--system", "wrong", cwd=tmp_path)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    line, = [line for line in wrong.stdout.splitlines() if line.startswith("FAIL")]
    assert "partition 'debugg'" in line and "partitions: debug" in line


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_megatron_lm_set_up_as_the_reference_does_on_the_emulated_cluster(slurm_cluster, tmp_path, monkeypatch):
    """`bench setup megatron-lm` renders the reference's setup_venv and build steps as one job: on the emulated
    cluster it clones a local git repository made from the reference's Megatron-LM snapshot, checks out the
    commit and applies the patch from the site's copy of the reference; run again, it leaves the set-up as it
    is; the checkout then reports its version and commit, and a 175 point is rendered for it."""
    import tarfile

    archive = megatron_archive("megatron-lm-f772743-jupiter.tar.gz")
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(upstream, filter="data")
    (source,) = upstream.iterdir()
    _git("init", "-q", "-b", "main", cwd=source)
    _git("add", "-A", cwd=source)
    _git("commit", "-q", "-m", "snapshot", cwd=source)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True).stdout.strip()
    # the site's copy of the reference, with a patch of its own (the test's, in the reference's place)
    reference = tmp_path / "jubench-megatron-lm"
    (reference / "benchmark" / "aux").mkdir(parents=True)
    entry = source / "pretrain_gpt.py"
    entry.write_text(entry.read_text() + "\n# patched by the reference\n")
    diff = subprocess.run(["git", "diff"], cwd=source, capture_output=True, text=True, check=True).stdout
    _git("checkout", "--", ".", cwd=source)
    (reference / "benchmark" / "aux" / "add_tflops_logging.patch").write_text(diff)

    into = tmp_path / "site" / "Megatron-LM"
    work = tmp_path / "jobs"
    work.mkdir()
    out = run_bench("setup", "megatron-lm", "--reference", str(reference), "--commit", commit, "--system",
                    "local-slurm", "--into", str(into), "--url", str(source), "--packages", "", "--no-flash-attn",
                    "--apex", "", "--time", "00:05:00", "-o", str(work / "setup.sbatch"), cwd=work)
    assert out.returncode == 0, out.stderr
    for attempt in ("first", "again"):
        done = subprocess.run(["sbatch", "--wait", "setup.sbatch"], cwd=work, capture_output=True, text=True,
                              timeout=300)
        log = (work / "setup.out").read_text()
        assert done.returncode == 0, done.stderr + log
        if attempt == "first":
            assert f"checked out {commit} and applied add_tflops_logging.patch" in log
        else:
            assert "with the patch applied already" in log
    assert f"done: Megatron-LM 0.4.0rc0 at {commit} in {into}" in log
    assert (into / "pretrain_gpt.py").read_text().endswith("# patched by the reference\n")
    monkeypatch.setenv("MEGATRON_LM_REPO", str(into))
    doctor = run_bench("doctor", "--system", "local-slurm", "--trainer", "megatron-lm", cwd=work)
    assert f"ok    megatron-lm         Megatron-LM 0.4.0rc0 ({commit[:10]}, with local changes) at {into}" \
        in doctor.stdout, doctor.stdout
    # the smoke tag's mock data came after the reference's version: that, and only that, is what fails
    assert doctor.returncode == 1 and "1 check(s) failed: megatron-lm flags" in doctor.stdout + doctor.stderr
    assert "Megatron-LM 0.4.0rc0 (f772743329) has no flag --mock-data" in doctor.stdout
    # a checkout with changes of its own (not the patch) is not overwritten
    (into / "pretrain_gpt.py").write_text("mine\n")
    done = subprocess.run(["sbatch", "--wait", "setup.sbatch"], cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "has local changes; commit or stash them" in (work / "setup.out").read_text()
    assert (into / "pretrain_gpt.py").read_text() == "mine\n"
