"""User errors are one line and exit 2; `bench --help` stays light."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, run_bench


def _one_line_error(proc_or_result, *needles):
    text = proc_or_result.stderr if hasattr(proc_or_result, "stderr") else proc_or_result.output
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert lines[0].startswith("bench: error: "), text
    assert "Traceback" not in text
    for needle in needles:
        assert needle in lines[0], lines[0]

@pytest.mark.parametrize("args,needles", [
    (["run", "--tag", "17", "--dry-run"], ["unknown tag", "'17'", "known: 13, 175, deepseek-v3, gpt-oss-20b, gpu-small, "
                                                                 "llama3-70b, llama3-8b, mixtral-8x7b, qwen3-30b-a3b, smoke, smoke-llama, smoke-moe"]),
    (["run", "--tag", "13", "--tp", "3", "--dry-run"], ["impossible layout", "tp 3 must divide the number of attention heads 32"]),
    (["run", "--tag", "13", "--nodes", "3", "--dry-run"], ["tp x pp = 8 must divide the 12 devices"]),
    (["run", "--benchmark", "nosuch", "--dry-run"], ["benchmark file not found", "nosuch.yaml", "known benchmarks: nlp"]),
    (["run", "--benchmark", "/nonexistent/grid.yaml", "--dry-run"], ["benchmark file not found: /nonexistent/grid.yaml"]),
    (["run", "--tag", "13", "--system", "juwels", "--dry-run"], ["unknown system 'juwels'", "juwels-booster"]),
    (["result", "table"], ["no runs under"]),
    (["result", "table", "nosuchrun"], ["no runs under"]),
    (["run", "--nodes", "x"], ["Invalid value for '--nodes'", "(see 'bench run --help')"]),
    (["run", "--bogus"], ["No such option '--bogus'"]),
    (["result", "export", "-o", "x.csv"], ["Missing option '--format'", "csv, json, md"]),
    (["run", "--tag", "smoke", "--after", "12", "--dry-run"], ["--after needs an executor that holds jobs", "local runs points one after another"]),
    (["run", "--tag", "smoke", "--system", "local-slurm", "--after", "12;rm", "--dry-run"],
     ["--after takes job ids joined by ':'", "'12;rm'"]),
    (["run", "--resume", "x", "--tag", "13"], ["--resume reruns the run's own jobscripts", "--tag cannot apply"]),
    (["sweep", "--resume", "x", "--hang-timeout", "5"], ["--hang-timeout cannot apply"]),
    (["sweep"], ["give a GRID file, or --resume RUN"]),
])
def test_user_errors_exit_2_with_one_line(tmp_path, args, needles):
    proc = run_bench("--results-dir", str(tmp_path / "r"), *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, *needles)
    assert not list((tmp_path / "r").glob("*/*/*/jobscript.sbatch")), "an error must not leave a workspace behind"

def test_missing_sbatch_names_dry_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.cli", "--results-dir", str(tmp_path / "r"),
                           "run", "--tag", "13"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/nonexistent", "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, "sbatch not found", "--dry-run")
    assert not (tmp_path / "r").exists()

def test_help_does_not_import_torch():
    code = ("import sys, runpy; sys.argv = ['bench', '--help']\n"
            "from nlp_bench.cli import cli\n"
            "try:\n    cli.main(prog_name='bench')\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'pandas', 'matplotlib', 'jinja2') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "Commands:" in proc.stdout
    assert "HEAVY []" in proc.stdout, proc.stdout

def test_dry_run_and_table_do_not_import_torch(tmp_path):
    code = ("import sys\nfrom nlp_bench.cli import cli\n"
            f"for args in (['run', '--tag', '175', '--dry-run'], ['result', 'table']):\n"
            f"    try:\n        cli.main(['--results-dir', {str(tmp_path)!r}, *args], prog_name='bench')\n"
            "    except SystemExit as e:\n        assert not e.code, e.code\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "TORCH False" in proc.stdout, proc.stdout + proc.stderr

def test_bare_commands_show_their_help(tmp_path):
    for args in ([], ["result"]):
        proc = run_bench(*args, cwd=tmp_path)
        assert "Usage: bench" in proc.stderr + proc.stdout and "Commands:" in proc.stderr + proc.stdout, proc.stderr
        assert "bench: error" not in proc.stderr

def test_version():
    proc = run_bench("--version", cwd=ROOT)
    assert proc.returncode == 0 and "nlp-bench" in proc.stdout

def test_status_and_cancel_of_a_dry_run(tmp_path):
    assert run_bench("run", "--tag", "13", "--dry-run", cwd=tmp_path).returncode == 0
    run_id = next(tmp_path.glob("results/nlp/*")).name
    status = run_bench("status", cwd=tmp_path)
    assert status.returncode == 0 and "TO_SUBMIT" in status.stdout and "gpt-13b_n8_tp2_pp4_mbs1_gas256" in status.stdout
    cancelled = run_bench("cancel", run_id, cwd=tmp_path)
    assert cancelled.returncode == 0 and "cancelled before it was submitted" in cancelled.stdout, cancelled.stdout
    assert "nothing to cancel" in run_bench("cancel", run_id, cwd=tmp_path).stdout
    assert "would run again gpt-13b" in run_bench("run", "--resume", run_id, "--dry-run", cwd=tmp_path).stdout
    bad = run_bench("cancel", run_id, "nosuch", cwd=tmp_path)
    assert bad.returncode == 2
    _one_line_error(bad, "unknown point of run", "'nosuch'")

def test_parse_prints_the_documented_json(tmp_path):
    proc = run_bench("parse", str(ROOT / "tests" / "data" / "seed003_verification.log"), "--json",
                     "--seq-length", "2048", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["format"] == "megatron-jupiter"
    assert set(out["records"][0]) == {"iteration", "iteration_time_s", "global_batch_size", "seq_length",
                                      "tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu_percent", "loss"}
    assert out["warnings"] == {}
    summary = out["summary"]
    assert {"iterations", "warmup_excluded", "tokens_per_s", "tokens_per_s_all_intervals", "samples_per_s",
            "time_to_report_s"} <= set(summary)
    assert set(summary["tokens_per_s"]) == {"mean", "median", "std", "ci95"}
    pretty = run_bench("parse", str(ROOT / "tests" / "data" / "seed003_verification.log"), cwd=tmp_path)
    assert pretty.returncode == 0 and "excluded as warm-up" in pretty.stdout and "137.89" in pretty.stdout

@pytest.mark.parametrize("content,args,needles", [
    ("", [], ["empty.log: no iteration records in the log"]),
    ("NCCL INFO only noise\n", ["--format", "nxdt"], ["no nxdt iteration records"]),
    (None, [], ["log not found"]),
    ("x\n", ["--format", "csv"], ["unknown log format 'csv'"]),
])
def test_parse_errors_are_one_line(tmp_path, content, args, needles):
    log = tmp_path / "empty.log"
    if content is not None:
        log.write_text(content)
    proc = run_bench("parse", str(log), *args, cwd=tmp_path)
    assert proc.returncode == 2
    _one_line_error(proc, *needles)
