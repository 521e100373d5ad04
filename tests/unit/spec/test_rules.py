"""The benchmark run as its rules define it: the 13 and 175 tags pass exactly the reference's training
arguments with either trainer, Megatron-LM is a launch target, `bench rules check` finds every deviation
in what a job ran, and a run exports as a submission bundle."""

import json
import re

import pytest
from conftest import ROOT

from nlp_bench.errors import ResultError, SpecError
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args, jobscript_nodes
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.target import for_megatron
from nlp_bench.spec.megatron.translations import reference_table
from nlp_bench.spec.rules import load_rules, parse_argv


def _rendered(tag: str, trainer: str, system: str | None = None) -> tuple[str, list[str]]:
    text = render_jobscript(for_megatron(load_benchmark().point(tag, system, trainer=trainer), None))
    return text, jobscript_args(text, tag)

@pytest.mark.parametrize("trainer", ["builtin", "megatron-lm"])
@pytest.mark.parametrize("tag", ["13", "175"])
def test_rendered_training_arguments_are_the_reference_flag_by_flag(tag, trainer):
    rules = load_rules("jupiter")
    want = rules.tag(tag)
    text, argv = _rendered(tag, trainer)
    found = parse_argv(argv)
    for flag, expected in want.args.items():
        if expected is None:
            assert flag not in found or found[flag] == want.defaults.get(flag), flag
        elif expected == "path":
            assert isinstance(found.get(flag), str), flag
        elif expected is True:
            assert found.get(flag) is True, flag
        else:
            assert float(str(found[flag]).replace("_", "")) == float(expected.replace("_", "")) \
                if re.fullmatch(r"[0-9._e-]+", expected) else found[flag] == expected, (flag, expected, found.get(flag))
    free = {f for f in rules.free.values() if f}
    extra = set(found) - set(want.args) - free - set(want.defaults)
    assert extra == set(), extra
    ref = want.reference
    assert (found["tensor-model-parallel-size"], found["pipeline-model-parallel-size"], found["micro-batch-size"]) \
        == (str(ref["tp"]), str(ref["pp"]), str(ref["mbs"]))
    assert jobscript_nodes(text) == ref["nodes"]
    assert rules.check(tag, argv, ref["nodes"]).valid
    if trainer == "megatron-lm":  # every flag is one the reference's Megatron-LM has; the program is pretrain_gpt.py
        assert set(found) <= set(reference_table().flags)
        assert '"$MEGATRON_LM_REPO/pretrain_gpt.py" "$@"' in text and "-m nlp_bench.train" not in text

def test_the_builtin_trainer_honours_every_reference_argument(tmp_path):
    from nlp_bench.train.args import parse_args
    from nlp_bench.train.lr_schedule import from_args

    _, argv = _rendered("175", "builtin")
    data = ROOT / "benchmark" / "data"
    argv = [w.replace("$PROJECT/nlp-bench/data", str(data)) for w in argv]
    argv = [str(tmp_path / "ckpt") if w == "${CHECKPOINT_PATH}" else str(tmp_path / "tb") if w == "${TENSORBOARD_PATH}"
            else w for w in argv]
    args = parse_args(argv)
    assert (args.optimizer, args.lr_decay_samples, args.exit_duration_in_mins) == ("adam", 128_953_125, 1190)
    assert (args.save_interval, args.eval_interval, args.eval_iters, args.tensorboard_queue_size) == (1500, 1000, 5, 5)
    assert args.log_timers_to_tensorboard and args.log_batch_size_to_tensorboard and args.log_validation_ppl_to_tensorboard
    schedule, iterations, in_samples = from_args(args, 96)
    assert in_samples and iterations == 300_000_000 // 96
    assert schedule.decay == 128_953_125 and schedule.warmup == 216_320  # decays over lr-decay-samples
    assert schedule.at(128_953_125) == pytest.approx(1e-5) and schedule.at(200_000_000) == pytest.approx(1e-5)

def test_megatron_lm_refuses_a_flag_it_does_not_have(tmp_path):
    bench = load_benchmark()
    point = bench.point("smoke", trainer="megatron-lm", train={"no-cross-entropy-loss-fusion": True})
    current = Checkout(tmp_path, "0.20.0", None)
    with pytest.raises(SpecError, match=r"Megatron-LM 0.20.0 \(d98e8a64dd\) has no flag --no-cross-entropy-loss-fusion \("):
        for_megatron(point, current)
    with pytest.raises(SpecError, match=r"Megatron-LM 0.4.0rc0 \(f772743329\) has no flag --mock-data \("):
        for_megatron(bench.point("smoke", trainer="megatron-lm"), Checkout(tmp_path, "0.4.0rc0", None))  # before it
    bench.point("smoke", trainer="builtin", train={"no-cross-entropy-loss-fusion": True})  # the built-in one has it

def test_megatron_point_has_its_own_id_environment_and_provenance():
    bench = load_benchmark()
    builtin, megatron = bench.point("smoke", "local-slurm"), bench.point("smoke", "local-slurm", trainer="megatron-lm")
    assert megatron.id == builtin.id + "_megatron-lm"
    text = render_jobscript(megatron)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text and "MEGATRON_LM_COMMIT=" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render_jobscript(builtin)
    assert megatron.to_dict()["trainer"] == "megatron-lm"

def test_a_missing_pretrain_gpt_is_one_line_and_exit_2(bench, monkeypatch, tmp_path):
    monkeypatch.setenv("MEGATRON_LM_REPO", str(tmp_path / "no-megatron"))
    out = bench("run", "--tag", "smoke", "--trainer", "megatron-lm")
    assert out.exit_code == 2
    assert out.output.count("\n") == 1 and "pretrain_gpt.py not found" in out.output and "MEGATRON_LM_REPO" in out.output
    assert not (tmp_path / "results").exists()  # refused before a workspace is written

def test_rules_check_of_the_reference_tag_is_valid(bench):
    out = bench("rules", "check", "--tag", "175")
    assert out.exit_code == 0, out.output
    assert "verdict: valid submission" in out.output
    out = bench("rules", "check", "--tag", "13", "--trainer", "megatron-lm", "--json")
    assert out.exit_code == 0
    (entry,) = json.loads(out.output)
    assert entry["valid"] and entry["deviations"] == [] and entry["free"]["tp"] == {"reference": 2, "found": 2,
                                                                                     "changed": False}

def test_rules_check_reports_a_hidden_size_made_with_no_rules(bench, results, tmp_path):
    grid = tmp_path / "wide.yaml"
    grid.write_text('tag: "175"\nmatrix:\n  hidden_size: [8192]\n  num_attention_heads: [64]\n  tp: [4]\n')
    assert bench("sweep", str(grid), "--dry-run").exit_code == 2  # the rules fix the hidden size
    assert bench("sweep", str(grid), "--dry-run", "--no-rules", "--no-plan").exit_code == 0
    out = bench("rules", "check", "--json")
    assert out.exit_code == 1, out.output
    (entry,) = json.loads(out.output)
    assert {"flag": "--hidden-size", "expected": "12288", "found": "8192",
            "rule": "fixed by the rules: hidden_size"} in entry["deviations"]
    assert entry["free"]["tp"] == {"reference": 8, "found": 4, "changed": True}  # free: reported, allowed
    assert entry["verdict"] == f"not a submission ({len(entry['deviations'])} deviations)"

def test_rules_check_user_errors_exit_2(bench):
    assert bench("rules", "check", "--tag", "smoke").exit_code == 2
    assert bench("rules", "check", "--tag", "nope").exit_code == 2
    assert bench("rules", "check").exit_code == 2  # no run yet
    assert bench("rules", "check", "somerun", "--tag", "175").exit_code == 2

def test_compare_trainers_is_a_ratio_per_layout():
    from nlp_bench.analysis.side_by_side import pair_trainers

    base = {"model": "gpt-tiny", "system": "local-slurm", "Nodes": 2, "Tensor_Parallel": 2, "Pipeline_Parallel": 1,
            "MBS": 2, "GAS": 2, "state": "COMPLETED"}
    rows = [{**base, "trainer": "builtin", "Tokens/sec": 300.0}, {**base, "trainer": "megatron-lm", "Tokens/sec": 200.0},
            {**base, "GAS": 4, "trainer": "builtin", "Tokens/sec": 100.0}]
    (pair,) = pair_trainers(rows)
    assert pair["builtin/megatron-lm"] == pytest.approx(1.5) and pair["GAS"] == 2
    with pytest.raises(ResultError, match="both trainers"):
        pair_trainers(rows[:1])
