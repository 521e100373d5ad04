"""Megatron-LM as sites run it, in processes of its own: Megatron-LM's OWN parse_args() and validate_args() on
the rendered arguments of each snapshot (unpacked, where they lie: docs/testing.md), git to make checkouts whose
version and commit are read, and bash to run the jobscript's checkout lines."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from megatron_snapshots import NEEDS, megatron_point

from nlp_bench.app.megatron_flags import own_parser_command
from nlp_bench.errors import SpecError
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args
from nlp_bench.spec.megatron.checkout import Checkout, read_checkout
from nlp_bench.spec.megatron.tables import read_table, table_for


def _world_size(point) -> int:
    return point.layout.nodes * point.layout.devices_per_node

@pytest.fixture(scope="module")
def own_check():
    """Megatron-LM's parse_args and validate_args on a point's arguments, in the environment the jobscript
    exports: one `serve` process a checkout answers every check of the module (its import is 10 s of CPU)."""
    servers: dict[Path, subprocess.Popen] = {}

    def check(snapshot: Path, point, argv: list[str]) -> subprocess.CompletedProcess:
        if snapshot not in servers:
            servers[snapshot] = subprocess.Popen(own_parser_command(sys.executable, "serve", str(snapshot)),
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.DEVNULL, text=True)
        server = servers[snapshot]
        request = {"argv": argv, "world_size": _world_size(point), "env": {k: str(v) for k, v in point.env.items()}}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        assert line, f"Megatron-LM's parser of {snapshot} stopped (exit {server.poll()})"
        reply = json.loads(line)
        if reply["ok"]:
            return subprocess.CompletedProcess(argv, 0, json.dumps(reply["answer"]) + "\n", "")
        return subprocess.CompletedProcess(argv, 2, "", reply["error"])

    yield check
    for server in servers.values():
        server.stdin.close()
        server.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["13", "175"])
def test_megatron_lms_own_parser_accepts_the_rendered_arguments(snapshot, tag, bench, results, monkeypatch,
                                                                  own_check):
    """`bench run --tag T --trainer megatron-lm --dry-run` with MEGATRON_LM_REPO at the snapshot: the jobscript's
    arguments pass that Megatron-LM's own parse_args and validate_args, and `bench rules check` of the run
    says valid submission, naming the translations where the version needed them."""
    checkout = read_checkout(snapshot)
    missing = [m for m in ("torch", *NEEDS[checkout.version]) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"Megatron-LM {checkout.version}'s parser needs {', '.join(missing)} (pip install them)")
    monkeypatch.setenv("MEGATRON_LM_REPO", str(snapshot))
    out = bench("run", "--tag", tag, "--trainer", "megatron-lm", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/*_megatron-lm/jobscript.sbatch")
    point = megatron_point(tag, checkout)
    assert json.loads((script.parent / "point.json").read_text())["megatron_lm"] == point.megatron_lm
    argv = jobscript_args(script.read_text(), str(script))
    done = own_check(snapshot, point, argv)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["world_size"] == _world_size(point) and answer["data_parallel_size"] == point.layout.dp
    # and the arguments are still the reference's by the rules, translations read back
    out = bench("rules", "check")
    assert out.exit_code == 0 and "verdict: valid submission" in out.output, out.output
    assert f"for Megatron-LM {checkout.version} (commit unknown)" in out.output
    if checkout.version == "0.20.0":
        assert "--log-batch-size-to-tensorboard" not in argv and "--use-flash-attn" not in argv
        assert argv[argv.index("--attention-backend") + 1] == "flash"
        assert "    --log-batch-size-to-tensorboard -> (dropped): the batch size is logged to TensorBoard always" \
            in out.output
        assert "    --use-flash-attn -> --attention-backend flash: " in out.output
    else:
        assert "--log-batch-size-to-tensorboard" in argv and "--use-flash-attn" in argv
        assert "read as the reference's own" not in out.output

def test_megatron_lms_own_parser_refuses_what_it_does_not_have(unpacked, own_check):
    """The check would catch the break the issue found: the reference's arguments, untranslated, on 0.20."""
    snapshot = unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz")
    point = megatron_point("13", None)  # the reference's flags as they are
    argv = jobscript_args(render_jobscript(point), point.id)
    done = own_check(snapshot, point, argv)
    assert done.returncode == 2 and "unrecognized arguments: --log-batch-size-to-tensorboard" in done.stderr

def test_a_checkouts_version_and_commit(tmp_path):
    repo = tmp_path / "Megatron-LM"
    (repo / "megatron" / "core").mkdir(parents=True)
    (repo / "megatron" / "core" / "package_info.py").write_text(
        "MAJOR = 0\nMINOR = 12\nPATCH = 1\nPRE_RELEASE = 'rc2'\nVERSION = (MAJOR, MINOR)\n")
    found = read_checkout(repo)
    assert (found.version, found.commit) == ("0.12.1rc2", None)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    found = read_checkout(repo)
    assert found.commit and len(found.commit) == 40 and found.contains(found.commit) is True
    (repo / "megatron" / "core" / "package_info.py").write_text("nothing here\n")
    with pytest.raises(SpecError, match="package_info.py: no MAJOR"):
        read_checkout(repo)

STAND_IN = ROOT / "tests" / "fixtures" / "megatron_lm"

def _claiming(tmp_path: Path, version: tuple[int, int, int, str]) -> Path:
    """A copy of the stand-in checkout that claims another version."""
    import shutil

    copy = tmp_path / "Megatron-LM"
    shutil.copytree(STAND_IN, copy)
    major, minor, patch, pre = version
    (copy / "megatron" / "core" / "package_info.py").write_text(
        f"MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = '{pre}'\n")
    return copy

def test_the_jobscript_warns_when_the_checkout_it_finds_is_another_version(tmp_path):
    point = megatron_point("smoke", read_checkout(STAND_IN))
    text = render_jobscript(point)
    block = text[text.index("# The trainer is Megatron-LM's"):text.index("# Rendezvous")]
    assert "were made for Megatron-LM 0.20.0 (flags checked against benchmark/megatron-lm/flags/0.20.0.tsv)" in block
    for repo, warned in ((STAND_IN, False), (_claiming(tmp_path, (0, 19, 0, "")), True)):
        done = subprocess.run(["bash", "-c", f"set -u\n{block}\necho \"found $MEGATRON_LM_VERSION\""],
                              env={**os.environ, "MEGATRON_LM_REPO": str(repo)}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == ("found 0.19.0" if warned else "found 0.20.0")
        assert ("the arguments were made for Megatron-LM 0.20.0, but" in done.stderr) is warned, done.stderr

def test_a_checkout_path_is_one_word_in_the_jobscript_whatever_it_holds(tmp_path):
    """The path the flags were made for is written quoted: a folder named with $( ) runs nothing."""
    import shutil

    odd = tmp_path / "q$(touch${IFS}HACKED) a}b"
    shutil.copytree(STAND_IN, odd)
    text = render_jobscript(megatron_point("smoke", read_checkout(odd)))
    block = text[text.index("# The trainer is Megatron-LM's"):text.index("# Rendezvous")]
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_LM_REPO"}
    done = subprocess.run(["bash", "-c", f"{block}\necho \"$MEGATRON_LM_REPO $MEGATRON_LM_VERSION\""], env=env,
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"{odd} 0.20.0", done.stderr
    assert not (tmp_path / "HACKED").exists()

def test_the_rules_judge_a_job_by_the_megatron_lm_it_ran_on(bench, results, monkeypatch):
    """Arguments made for 0.20 (no --log-batch-size-to-tensorboard) that ran on the reference's 0.4.0rc0 did
    not log the batch size: not the reference's run, whatever they were made for."""
    monkeypatch.setenv("MEGATRON_LM_REPO", str(STAND_IN))
    assert bench("run", "--tag", "175", "--trainer", "megatron-lm", "--dry-run").exit_code == 0
    (script,) = results.glob("nlp/*/*_megatron-lm/jobscript.sbatch")
    (script.parent / "train.args").write_text("\n".join(jobscript_args(script.read_text(), "here")) + "\n")
    for ran_on, valid in (("0.20.0", True), ("0.4.0rc0", False), ("not a version", True)):
        (script.parent / "provenance.env").write_text(f"MEGATRON_LM_VERSION={ran_on}\n")
        out = bench("rules", "check")
        assert (out.exit_code == 0) is valid, out.output
        if not valid:
            assert "for Megatron-LM 0.4.0rc0, as it ran (the arguments were made for 0.20.0)" in out.output
            assert "--log-batch-size-to-tensorboard" in out.output and "--use-flash-attn" in out.output

def test_a_checkout_between_releases_has_a_change_where_its_git_history_holds_the_commit(tmp_path):
    from nlp_bench.spec.megatron.translations import Translation

    repo = tmp_path / "Megatron-LM"
    (repo / "megatron" / "core").mkdir(parents=True)
    (repo / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = 9\nPATCH = 0\nPRE_RELEASE = 'rc0'\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the change"], check=True)
    change = read_checkout(repo).commit
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "later"], check=True)
    later = Translation("some-flag", "0.9.0", change, "2024-07-26", "gone", {})
    elsewhere = Translation("some-flag", "0.9.0", "0" * 40, "2024-07-26", "gone", {})
    checkout = read_checkout(repo)
    assert checkout.version == "0.9.0rc0" and checkout.commit != change
    assert later.applies_to(checkout) and not elsewhere.applies_to(checkout)
    assert elsewhere.applies_to(Checkout(repo, "0.9.0", None))  # a release has it, by cherry-pick or not

@pytest.mark.slow
@pytest.mark.parametrize("tag", ["llama3-8b", "llama3-70b"])
def test_megatron_lms_own_parser_accepts_the_llama_arguments(unpacked, tag, bench, results, monkeypatch, own_check):
    """The Llama tags' arguments (grouped-query attention, SwiGLU, RMSNorm, rope base, untied, no biases, mock
    data with the NullTokenizer) pass Megatron-LM 0.20's own parse_args and validate_args, and Megatron-LM's
    parsed model is the preset's."""
    snapshot = unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("Megatron-LM's parser needs torch")
    monkeypatch.setenv("MEGATRON_LM_REPO", str(snapshot))
    out = bench("run", "--tag", tag, "--trainer", "megatron-lm", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/*_megatron-lm/jobscript.sbatch")
    argv = jobscript_args(script.read_text(), str(script))
    point = megatron_point(tag, read_checkout(snapshot))
    done = own_check(snapshot, point, argv)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["data_parallel_size"] == point.layout.dp
    for flag in ("--group-query-attention", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"):
        assert flag in argv
    model = point.model
    assert argv[argv.index("--num-query-groups") + 1] == str(model.num_query_groups)
    assert argv[argv.index("--rotary-base") + 1] == "500000"
    assert argv[argv.index("--normalization") + 1] == "RMSNorm"

@pytest.mark.slow
def test_the_one_gpu_tag_runs_megatron_lm_without_apex_or_transformer_engine(unpacked, bench, results, monkeypatch,
                                                                             own_check):
    """gpu-small on local-gpu (the grid that put the two trainers side by side on an H100): Megatron-LM gets
    the local layers and none of the fusions that need Apex's kernels, its own parser accepts the arguments,
    and the built-in trainer's point gets none of those flags."""
    snapshot = unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("Megatron-LM's parser needs torch")
    monkeypatch.setenv("MEGATRON_LM_REPO", str(snapshot))
    out = bench("sweep", str(ROOT / "benchmark" / "grids" / "trainers-1gpu.yaml"), "--dry-run")
    assert out.exit_code == 0, out.output
    (megatron,) = results.glob("nlp/*/*_megatron-lm/jobscript.sbatch")
    (builtin,) = [p for p in results.glob("nlp/*/*/jobscript.sbatch") if p != megatron]
    argv = jobscript_args(megatron.read_text(), str(megatron))
    local = ["--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm"]
    assert argv[argv.index("--transformer-impl") + 1] == "local" and all(flag in argv for flag in local)
    assert not {"--transformer-impl", *local} & set(jobscript_args(builtin.read_text(), str(builtin)))
    point = megatron_point("gpu-small", read_checkout(snapshot))
    done = own_check(snapshot, point, argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["world_size"] == 1


def test_the_kept_flag_tables_are_what_the_snapshots_own_parsers_define(snapshot, tmp_path):
    checkout = read_checkout(snapshot)
    missing = [m for m in ("torch", *NEEDS[checkout.version]) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"Megatron-LM {checkout.version}'s parser needs {', '.join(missing)}")
    from nlp_bench.app.megatron_flags import write_flag_table

    kept = table_for(checkout.version)[0]
    fresh = read_table(write_flag_table(snapshot, None, kept.commit, None, tmp_path))
    assert fresh.version == kept.version == checkout.version and fresh.flags == kept.flags
