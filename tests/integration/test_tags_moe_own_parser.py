"""Every mixture-of-experts tag's rendered arguments for Megatron-LM (`bench run --trainer megatron-lm --dry-run`
with MEGATRON_LM_REPO at the snapshot) in Megatron-LM core_v0.20.0's OWN parse_args and validate_args, which
take the expert layout as the tag gives it; the reference's Megatron-LM (f7727433), which has no mixture of
experts, is refused by bench in one line, as its own parser refuses the arguments."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from nlp_bench.app.megatron_flags import own_parser_command
from nlp_bench.launch.script_args import jobscript_args
from nlp_bench.spec.benchmark import load_benchmark

MOE_TAGS = [tag for tag, spec in load_benchmark().tags.items() if spec["model"] in
            ("moe-tiny", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3")]
CURRENT, REFERENCE = "megatron-lm-core_v0.20.0-d98e8a6.tar.gz", "megatron-lm-f772743-jupiter.tar.gz"


@pytest.fixture(scope="module")
def own_parser(unpacked):
    """Megatron-LM's parse_args and validate_args of a snapshot, one `serve` process per snapshot."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("Megatron-LM's parser needs torch")
    servers: dict[str, subprocess.Popen] = {}

    def check(archive: str, argv: list[str], world_size: int, env: dict) -> dict:
        if archive not in servers:
            servers[archive] = subprocess.Popen(own_parser_command(sys.executable, "serve", str(unpacked(archive))),
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL, text=True)
        server = servers[archive]
        server.stdin.write(json.dumps({"argv": argv, "world_size": world_size, "env": env}) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        assert line, f"Megatron-LM's parser of {archive} stopped (exit {server.poll()})"
        return json.loads(line)

    yield check
    for server in servers.values():
        server.stdin.close()
        server.wait(timeout=60)


def _dry_run(bench, results, tag: str):
    out = bench("run", "--tag", tag, "--trainer", "megatron-lm", "--dry-run")
    (folder,) = results.glob("nlp/*/*_megatron-lm") if out.exit_code == 0 else [None]
    return out, folder


def test_the_moe_tags_are_every_moe_preset():
    assert sorted(MOE_TAGS) == ["deepseek-v3", "gpt-oss-20b", "mixtral-8x7b", "qwen3-30b-a3b", "smoke-moe"]


@pytest.mark.slow
@pytest.mark.parametrize("tag", MOE_TAGS)
def test_megatron_lm_0_20_accepts_every_moe_tag_as_it_is_laid_out(unpacked, own_parser, bench, results, monkeypatch,
                                                                 tag):
    monkeypatch.setenv("MEGATRON_LM_REPO", str(unpacked(CURRENT)))
    out, folder = _dry_run(bench, results, tag)
    assert out.exit_code == 0, out.output
    point = json.loads((folder / "point.json").read_text())
    argv = jobscript_args((folder / "jobscript.sbatch").read_text(), str(folder))
    assert argv[argv.index("--moe-token-dispatcher-type") + 1] == "alltoall" and "--moe-grouped-gemm" in argv
    lay = point["layout"]
    env = load_benchmark().point(tag, trainer="megatron-lm").env  # what the jobscript exports
    reply = own_parser(CURRENT, argv, lay["world"], {name: str(value) for name, value in env.items()})
    assert reply["ok"], reply.get("error", "")[-3000:]
    answer = reply["answer"]
    assert (answer["world_size"], answer["data_parallel_size"]) == (lay["world"], lay["dp"])
    assert (answer["expert_model_parallel_size"], answer["expert_tensor_parallel_size"]) == \
        (lay["ep"], lay["etp"] or lay["tp"])


@pytest.mark.slow
def test_the_reference_megatron_lm_refuses_an_moe_tag_in_one_line(unpacked, own_parser, bench, results,
                                                                   monkeypatch):
    monkeypatch.setenv("MEGATRON_LM_REPO", str(unpacked(REFERENCE)))
    out, _ = _dry_run(bench, results, "mixtral-8x7b")
    errors = [line for line in out.output.splitlines() if line.startswith("bench: error:")]
    assert out.exit_code == 2 and len(errors) == 1 and "Traceback" not in out.output, out.output
    lacking = ["--expert-model-parallel-size", "--moe-aux-loss-coeff", "--moe-ffn-hidden-size", "--moe-grouped-gemm",
               "--moe-router-topk", "--moe-token-dispatcher-type"]
    assert (f"Megatron-LM 0.4.0rc0 (f772743329) has no mixture of experts as model mixtral-8x7b needs it (no "
            f"{', '.join(lacking)}): use a Megatron-LM that has it (0.20.0; set MEGATRON_LM_REPO") in errors[0]
    # what bench says is what that Megatron-LM's own parser stops on: the arguments made for 0.20 are not its
    monkeypatch.setenv("MEGATRON_LM_REPO", str(unpacked(CURRENT)))
    out, folder = _dry_run(bench, results, "mixtral-8x7b")
    argv = jobscript_args((folder / "jobscript.sbatch").read_text(), str(folder))
    reply = own_parser(REFERENCE, argv, 64, {})
    assert not reply["ok"] and "unrecognized arguments:" in reply["error"], reply
    unrecognized = reply["error"].split("unrecognized arguments:", 1)[1].split()
    assert set(lacking) <= set(unrecognized), reply["error"]
