"""The MoE tags through the commands a user types: `bench run --dry-run` writes the expert layout into the
jobscript and takes --ep/--etp as it takes --tp/--pp; `bench rules check` says in one line why it judges no MoE
tag and what checks one instead."""

from __future__ import annotations

from nlp_bench.launch.script_args import jobscript_args


def _error(out) -> str:
    lines = [line for line in out.output.splitlines() if line.startswith("bench: error:")]
    assert out.exit_code == 2 and len(lines) == 1, out.output
    return lines[0]


def test_a_dry_run_of_smoke_moe_writes_expert_parallelism_2(bench, results):
    out = bench("run", "--tag", "smoke-moe", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/moe-tiny_n1_tp1_pp1_ep2_mbs2_gas2/jobscript.sbatch")
    argv = jobscript_args(script.read_text(), str(script))
    assert argv[argv.index("--expert-model-parallel-size") + 1] == "2"
    assert argv[argv.index("--num-experts") + 1] == "4" and "--expert-tensor-parallel-size" not in argv


def test_bench_run_takes_ep_and_etp_as_it_takes_tp(bench, results):
    out = bench("run", "--tag", "smoke-moe", "--system", "local-slurm", "--ep", "4", "--etp", "1", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/moe-tiny_n2_tp1_pp1_ep4_etp1_mbs2_gas2/jobscript.sbatch")
    argv = jobscript_args(script.read_text(), str(script))
    assert argv[argv.index("--expert-model-parallel-size") + 1] == "4"
    assert argv[argv.index("--expert-tensor-parallel-size") + 1] == "1"
    said = _error(bench("run", "--tag", "smoke-moe", "--ep", "3", "--dry-run"))
    assert "impossible layout for moe-tiny: expert tp 1 x ep 3 x pp 1 does not divide the 2 devices" in said
    assert "ep 3 must divide the 4 experts (--num-experts, --expert-model-parallel-size)" in said


def test_rules_check_of_an_moe_tag_says_what_it_judges_and_what_checks_the_tag(bench):
    said = _error(bench("rules", "check", "--tag", "mixtral-8x7b", "--trainer", "megatron-lm"))
    assert said.startswith("bench: error: tag mixtral-8x7b has no submission rules: only a tag with `rules:` in ")
    assert "nlp.yaml is judged (13, 175); `bench run --tag mixtral-8x7b --trainer megatron-lm --dry-run` checks " \
           "its layout and its Megatron-LM flags" in said
    assert bench("run", "--tag", "mixtral-8x7b", "--trainer", "megatron-lm", "--dry-run").exit_code == 0
