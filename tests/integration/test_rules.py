"""The benchmark run as its rules define it: the 13 and 175 tags pass exactly the reference's training
arguments with either trainer, Megatron-LM is a launch target, `bench rules check` finds every deviation
in what a job ran, and a run exports as a submission bundle."""


import re
import shutil

import pytest
from conftest import ROOT

from nlp_bench.errors import ResultError
from nlp_bench.launch.script_args import jobscript_args
from nlp_bench.spec.rules import load_rules

STAND_IN = ROOT / "tests" / "fixtures" / "megatron_lm"

def test_the_rules_file_follows_the_jube_definition_where_the_sbatch_script_disagrees():
    text = (ROOT / "benchmark" / "rules" / "jupiter.yaml").read_text()
    assert "126_953_125" in text and "128_953_125" in text  # the disagreement is stated
    want = load_rules("jupiter").tag("175")
    assert want.args["lr-decay-samples"] == "128_953_125" and want.args["bf16"] is True and want.args["fp16"] is None

def test_run_and_sweep_take_the_trainer(bench, results, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_LM_REPO", str(STAND_IN))  # claims 0.20.0, which has --mock-data for smoke
    out = bench("run", "--tag", "175", "--trainer", "megatron-lm", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/gpt-175b_*_megatron-lm/jobscript.sbatch")
    assert "pretrain_gpt.py" in script.read_text()
    grid = tmp_path / "both.yaml"
    grid.write_text("tag: smoke\nsystem: local-slurm\nmatrix:\n  trainer: [builtin, megatron-lm]\n")
    out = bench("sweep", str(grid), "--dry-run")
    assert out.exit_code == 0, out.output
    names = sorted(p.parent.name for p in results.glob("nlp/*/gpt-tiny_*/point.json"))
    assert names == ["gpt-tiny_n2_tp2_pp1_mbs2_gas2", "gpt-tiny_n2_tp2_pp1_mbs2_gas2_megatron-lm"]
    out = bench("sweep", str(grid), "--dry-run", "--trainer", "builtin")
    assert out.exit_code == 2 and "trainer axis" in out.output

@pytest.mark.parametrize("edit,flag,expected,found", [
    (("--bf16", "--fp16"), "--bf16/--fp16", "--bf16", "--fp16"),
    (("--lr 0.0001", "--lr 0.0003"), "--lr", "1e-4", "0.0003"),
    (("    --eval-iters 5\n", ""), "--eval-iters", "5", "(absent)"),
    (("    --split 7,3,1\n", "    --split 7,3,1\n    --mock-data\n"), "--mock-data", "(absent)", "(switch)"),
])
def test_rules_check_reads_the_jobscript_as_edited(bench, results, edit, flag, expected, found):
    assert bench("run", "--tag", "175", "--dry-run").exit_code == 0
    (script,) = results.glob("nlp/*/*/jobscript.sbatch")
    text = script.read_text()
    assert edit[0] in text
    script.write_text(text.replace(edit[0], edit[1], 1))
    out = bench("rules", "check")
    assert out.exit_code == 1, out.output
    assert re.search(rf"{re.escape(flag)}\s+expected {re.escape(expected)}, found {re.escape(found)}", out.output), out.output
    assert "not a submission (1 deviations)" in out.output

def test_rules_check_prefers_the_arguments_the_job_ran(bench, results):
    assert bench("run", "--tag", "175", "--dry-run").exit_code == 0
    (script,) = results.glob("nlp/*/*/jobscript.sbatch")
    ran = jobscript_args(script.read_text(), "x")
    (script.parent / "train.args").write_text("\n".join(w.replace("0.0001", "0.0002") for w in ran) + "\n")
    out = bench("rules", "check")
    assert out.exit_code == 1 and "train.args (as the job ran)" in out.output and "found 0.0002" in out.output

def test_submission_bundle_is_written_and_read_back(bench, results, tmp_path):
    from nlp_bench.app.submission import read_submission

    assert bench("run", "--tag", "175", "--dry-run").exit_code == 0
    (point,) = results.glob("nlp/*/*/")
    (point / "job.out").write_text(
        "nlp-bench trainer: torch 2.11.0 (CUDA 13.0, NCCL 2.27.3), backend nccl, device cuda, 8 threads per rank, bf16\n"
        + "".join(f" iteration {i:8d}/ 3125000 | consumed samples: {i * 96:12d} | elapsed time per iteration (s): 5.3000 |"
                  f" learning rate: 1.000E-04 | global batch size:    96 | lm loss: 7.0E+00 | loss scale: 1.0 |"
                  f" grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 |"
                  f" samples per second: 18.113 | TFLOPs: 150.00 |\n" for i in range(10, 60, 10)))
    (point / "train.args").write_text("\n".join(jobscript_args((point / "jobscript.sbatch").read_text(), "x")) + "\n")
    refused = bench("result", "export", "--format", "submission", "-o", str(tmp_path / "new" / "bundle"))
    assert refused.exit_code == 2 and "new does not exist" in refused.output and not (tmp_path / "new").exists()
    (tmp_path / "new").mkdir()
    out = bench("result", "export", "--format", "submission", "-o", str(tmp_path / "new" / "bundle"))
    assert out.exit_code == 0, out.output
    shutil.move(tmp_path / "new" / "bundle", tmp_path / "bundle")
    assert list((tmp_path / "new").iterdir()) == []  # nothing left beside it
    assert "valid submission" in out.output
    bundle = read_submission(tmp_path / "bundle")
    assert bundle["rules"]["valid"] and bundle["table"]["Tokens/sec"].iloc[0] == pytest.approx(96 * 2048 / 5.3)
    assert bundle["table"]["trainer"].iloc[0] == "builtin"
    (sw,) = bundle["provenance"]["points"]
    assert (sw["torch"], sw["cuda"], sw["nccl"], sw["trainer"]) == ("2.11.0", "13.0", "2.27.3", "builtin")
    assert bundle["provenance"]["versions"]["nlp-bench"]
    names = set(bundle["files"])
    for name in ("jobscript.sbatch", "train.args", "job.out", "point.json"):
        assert f"points/{point.name}/{name}" in names
    again = bench("result", "export", "--format", "submission", "-o", str(tmp_path / "bundle"))
    assert again.exit_code == 2 and "not an empty folder" in again.output  # never overwritten
    (tmp_path / "bundle" / "points" / point.name / "job.out").write_text("edited\n")
    with pytest.raises(ResultError, match="changed since the bundle was written"):
        read_submission(tmp_path / "bundle")

def test_the_stand_in_refuses_what_megatron_would(tmp_path):
    import subprocess
    import sys

    base = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--global-batch-size", "4",
            "--train-iters", "4", "--log-interval", "2"]
    ok = subprocess.run([sys.executable, str(STAND_IN / "pretrain_gpt.py"), *base], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.count("] iteration ") == 2
    bad = subprocess.run([sys.executable, str(STAND_IN / "pretrain_gpt.py"), *base, "--no-cross-entropy-loss-fusion"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--no-cross-entropy-loss-fusion" in bad.stderr
