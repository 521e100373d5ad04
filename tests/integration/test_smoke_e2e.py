"""`bench run --tag smoke` end to end on this machine: render, run 2 gloo ranks, parse, report."""

import csv
import json

import pytest
from conftest import run_bench

from nlp_bench.analysis.results import RESULT_COLUMNS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("smoke")
    proc = run_bench("run", "--tag", "smoke", cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd, proc


def _row_cells(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if "COMPLETED" in line]
    assert len(lines) == 1, text
    return lines[0].split()


def test_workspace_files(smoke_run):
    cwd, _ = smoke_run
    points = list(cwd.glob("results/nlp/*/*/point.json"))
    assert len(points) == 1
    folder = points[0].parent
    for name in ("point.json", "jobscript.sbatch", "job.out", "state.json", "result.json"):
        assert (folder / name).is_file(), name
    assert (folder.parent / "run.json").is_file()
    from conftest import job

    assert (job(folder).state, job(folder).exit_code, job(folder).times_from) == ("COMPLETED", 0, "log")
    assert job(folder).job_time_s() > 0
    result = json.loads((folder / "result.json").read_text())
    assert result["summary"]["iterations"] == 40 and len(result["records"]) == 8
    assert "[default1]: iteration       40/      40" in (folder / "job.out").read_text()


def test_result_carries_provenance(smoke_run):
    import hashlib
    import subprocess

    import torch
    from conftest import ROOT

    cwd, _ = smoke_run
    folder = next(cwd.glob("results/nlp/*/*/"))
    prov = json.loads((folder / "result.json").read_text())["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert prov["git_commit"].startswith(head)
    assert prov["jobscript_sha256"] == hashlib.sha256((folder / "jobscript.sbatch").read_bytes()).hexdigest()
    assert prov["torch"] == torch.__version__ and prov["cuda"] is None  # a CPU run
    assert prov["environment"]["OMP_NUM_THREADS"] == "1" and prov["environment"]["MASTER_PORT"].isdigit()
    steady = json.loads((folder / "result.json").read_text())["steady"]
    assert steady["intervals"] == 8 and steady["tokens_per_s"]["ci95"][0] <= steady["tokens_per_s"]["mean"]


def test_row_has_throughput_and_time_to_report(smoke_run):
    cwd, proc = smoke_run
    result = json.loads(next(cwd.glob("results/nlp/*/*/result.json")).read_text())["summary"]
    assert result["tokens_per_s"] > 0 and result["time_to_report_s"] == pytest.approx(20e6 / result["tokens_per_s"])
    cells = _row_cells(proc.stdout)
    assert f"{result['tokens_per_s']:.2f}" in cells and f"{result['time_to_report_s']:.2f}" in cells


def test_result_table_prints_the_same_row(smoke_run):
    cwd, proc = smoke_run
    table = run_bench("result", "table", cwd=cwd)
    assert table.returncode == 0, table.stderr
    assert _row_cells(table.stdout) == _row_cells(proc.stdout)


def test_export_csv_has_the_design_columns(smoke_run):
    cwd, _ = smoke_run
    out = run_bench("result", "export", "--format", "csv", "-o", "x.csv", cwd=cwd)
    assert out.returncode == 0, out.stderr
    with (cwd / "x.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == RESULT_COLUMNS
    assert rows[0]["state"] == "COMPLETED" and float(rows[0]["Tokens/sec"]) > 0
    assert (rows[0]["Nodes"], rows[0]["Tensor_Parallel"], rows[0]["Pipeline_Parallel"], rows[0]["DP"]) == ("1", "2", "1", "1")
    for fmt in ("json", "md"):
        assert run_bench("result", "export", "--format", fmt, "-o", f"x.{fmt}", cwd=cwd).returncode == 0
    assert json.loads((cwd / "x.json").read_text())[0]["Batch_Size"] == 4


def test_interrupted_run_cancels_its_job_and_keeps_what_it_measured(tmp_path, site):
    """Ctrl-C once the first iteration line is in: the training is made long enough that it cannot finish
    first, however fast or slow the machine."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from conftest import job, run_bench

    nlp = site / "benchmark" / "nlp.yaml"
    nlp.write_text(nlp.read_text().replace("      train-iters: 40\n", "      train-iters: 1000000\n", 1))
    # Ctrl-C as a terminal delivers it, even where this test runs with SIGINT ignored (a shell's background job)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "bench"), "run", "--tag", "smoke"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        log = None
        while time.monotonic() < deadline and proc.poll() is None:  # wait for an iteration line, then press Ctrl-C
            logs = list(tmp_path.glob("results/nlp/*/*/job.out"))
            if logs and " iteration " in logs[0].read_text():
                log = logs[0]
                break
            time.sleep(0.2)
        assert log is not None, f"the smoke run never logged an iteration: {proc.communicate()}"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:  # a failed test leaves no training behind to load the machine (the job is a session of its own)
        proc.kill()
        for folder in tmp_path.glob("results/nlp/*/*/"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.killpg(int((folder / "submitted" / "job.pid").read_text().split()[0]), signal.SIGKILL)
    assert proc.returncode == 130 and "job cancelled" in err
    assert job(log.parent).state == "CANCELLED"
    pid = int(job(log.parent).job_id)
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(pid)], capture_output=True, text=True).stdout
    alive = [line for line in ps.splitlines() if line.split()[1][0] != "Z"]  # zombies are dead, just unreaped
    assert not alive, f"processes of the cancelled job are still running: {alive}"
    table = run_bench("result", "table", "--format", "csv", cwd=tmp_path)
    row = dict(zip(*(line.split(",") for line in table.stdout.splitlines()[:2]), strict=False))
    assert row["state"] == "CANCELLED" and row["failure_class"] == "cancelled" and float(row["Tokens/sec"]) > 0


def test_local_sweep_runs_every_point(tmp_path):
    from conftest import run_bench

    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {tp: [1, 2]}\ntrain: {train-iters: 6, log-interval: 2, "
                                     "eval-iters: 0}\n")
    proc = run_bench("sweep", "g.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = run_bench("result", "table", "--format", "csv", cwd=tmp_path)
    rows = [dict(zip(table.stdout.splitlines()[0].split(","), line.split(","), strict=False))
            for line in table.stdout.splitlines()[1:]]
    assert sorted(r["Tensor_Parallel"] for r in rows) == ["1", "2"]
    assert all(r["state"] == "COMPLETED" and float(r["Tokens/sec"]) > 0 and r["Iterations"] == "6" for r in rows)


def test_smoke_llama_trains_gqa_and_counts_its_flops(tmp_path, site):
    """`bench run --tag smoke-llama`: the tiny Llama (2 query groups for 4 heads) on 2 gloo ranks with tp 2; the
    row has tokens/s, and its TFLOP/s and MFU are Megatron-LM's model FLOPs with the query groups."""
    from conftest import shorten

    from nlp_bench import flops
    from nlp_bench.spec.models import get_model, pad_vocab

    shorten(site, "smoke-llama", 10)
    proc = run_bench("run", "--tag", "smoke-llama", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = tmp_path.glob("results/nlp/*/llama-tiny_n1_tp2_pp1_mbs2_gas2")
    log = (folder / "job.out").read_text()
    assert "4 heads in 2 query groups" in log and "TFLOPs in the log use the megatron-model convention" in log
    summary = json.loads((folder / "result.json").read_text())["summary"]
    assert summary["iterations"] == 10 and summary["tokens_per_s"] > 0
    assert summary["tflops_convention"] == flops.MEGATRON_MODEL
    model = get_model("llama-tiny")
    per_iteration = flops.megatron_model_flops(model.flops_shape(4, pad_vocab(model.vocab_size, 2)))
    achieved = flops.tflops_per_device(per_iteration, summary["mean_iteration_time_s"], 2)
    assert summary["mfu"] * summary["mfu_basis"]["peak_tflops"] == pytest.approx(achieved, rel=1e-9)
    # each logged interval's TFLOPs is the same formula over that interval's time (printed with two decimals)
    for record in json.loads((folder / "result.json").read_text())["records"]:
        own = flops.tflops_per_device(per_iteration, record["iteration_time_s"], 2)
        assert record["tflops_per_gpu"] == pytest.approx(own, abs=0.0051)
    assert "g/n" in summary["mfu_basis"]["formula"]
