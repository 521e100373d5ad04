"""The committed reference jobscripts are exactly what `bench run --dry-run` renders today."""


import re

from nlp_bench.launch.render import render_jobscript, shell_value, train_flags
from nlp_bench.spec.benchmark import load_benchmark


def test_flag_rendering():
    assert train_flags({"a": True, "b": False, "c": None, "lr": 1e-4, "n": 3, "p": "${X}/y", "s": "a b"}) == [
        "--a", "--lr 0.0001", "--n 3", '--p "${X}"/y', "--s 'a b'"]
    assert shell_value(1.0e-8) == "1e-08"

def test_train_args_in_script_are_ones_the_trainer_knows():
    from nlp_bench.train.args import build_parser

    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    for tag in ("175", "13", "smoke"):
        script = render_jobscript(load_benchmark().point(tag))
        block = script.split("TRAIN_ARGS=(")[1].split("\n)")[0]
        for flag in re.findall(r"^\s+(--[a-z0-9-]+)", block, re.M):
            assert flag in known, f"tag {tag}: {flag} is not a trainer flag"

def test_xla_systems_refuse_pipeline_parallelism(bench):
    out = bench("run", "--tag", "175", "--system", "trn1", "--pp", "2", "--dry-run")
    assert out.exit_code == 2
    assert "pipeline parallelism (pp 2) is not available with the xla backend" in out.output

def test_a_resumed_run_does_not_submit_a_layout_kept_for_rendering(bench, results):
    out = bench("run", "--tag", "llama3-70b", "--system", "trn2", "--dry-run")
    assert out.exit_code == 0, out.output
    (run,) = results.glob("nlp/*/run.json")
    out = bench("run", "--resume", run.parent.name)
    assert "0 point(s) to run again" in out.output and "rendered and planned but not run here" in out.output
    assert out.exit_code == 1
