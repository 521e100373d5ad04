"""Megatron-LM as sites run it: the version of a checkout, its flag table, the translations of reference flags
a later version removed or renamed, and the rendered 13 and 175 arguments accepted by Megatron-LM's OWN
parse_args() and validate_args() for both snapshots in ../shared/megatron-lm/ (unpacked; nothing launched)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT

from nlp_bench.app.megatron_flags import own_parser_command
from nlp_bench.errors import SpecError
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout, read_checkout
from nlp_bench.spec.megatron.tables import known_tables, read_table, reference_table, table_for
from nlp_bench.spec.megatron.target import for_megatron
from nlp_bench.spec.megatron.translations import for_checkout, load_translations, translate
from nlp_bench.spec.rules import load_rules, parse_argv

SNAPSHOTS = ROOT.parent / "shared" / "megatron-lm"
#: archive -> what its megatron/core/package_info.py says
ARCHIVES = {"megatron-lm-f772743-jupiter.tar.gz": "0.4.0rc0", "megatron-lm-core_v0.20.0-d98e8a6.tar.gz": "0.20.0"}
#: what each snapshot's own parser needs beyond torch (f7727433's imports its tokenizers at once)
NEEDS = {"0.4.0rc0": ("six", "regex"), "0.20.0": ()}


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    """archive name -> the folder it is unpacked in, once per module."""
    done: dict[str, Path] = {}

    def unpack(name: str) -> Path:
        archive = SNAPSHOTS / name
        if not archive.is_file():
            pytest.skip(f"{archive} is not here (the Megatron-LM snapshots live in ../shared/megatron-lm/)")
        if name not in done:
            folder = tmp_path_factory.mktemp("megatron")
            with tarfile.open(archive) as tar:
                tar.extractall(folder, filter="data")
            (done[name],) = folder.iterdir()
        return done[name]

    return unpack


@pytest.fixture(params=sorted(ARCHIVES), ids=lambda name: ARCHIVES[name])
def snapshot(request, unpacked) -> Path:
    return unpacked(request.param)


def _point(tag: str, checkout: Checkout | None):
    return for_megatron(load_benchmark().point(tag, trainer="megatron-lm"), checkout)


def _world_size(point) -> int:
    return point.layout.nodes * point.layout.devices_per_node


def _own_check(snapshot: Path, point, argv: list[str]) -> subprocess.CompletedProcess:
    """Megatron-LM's parse_args and validate_args on `argv`, in the environment the jobscript exports."""
    env = {**os.environ, **{k: str(v) for k, v in point.env.items()}}
    return subprocess.run(own_parser_command(sys.executable, "check", str(snapshot), "--world-size",
                                             str(_world_size(point)), "--", *argv),
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["13", "175"])
def test_megatron_lms_own_parser_accepts_the_rendered_arguments(snapshot, tag, bench, results, monkeypatch):
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
    point = _point(tag, checkout)
    assert json.loads((script.parent / "point.json").read_text())["megatron_lm"] == point.megatron_lm
    argv = jobscript_args(script.read_text(), str(script))
    done = _own_check(snapshot, point, argv)
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


def test_megatron_lms_own_parser_refuses_what_it_does_not_have(unpacked):
    """The check would catch the break the issue found: the reference's arguments, untranslated, on 0.20."""
    snapshot = unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz")
    point = _point("13", None)  # the reference's flags as they are
    argv = jobscript_args(render_jobscript(point), point.id)
    done = _own_check(snapshot, point, argv)
    assert done.returncode == 2 and "unrecognized arguments: --log-batch-size-to-tensorboard" in done.stderr


def test_the_kept_flag_tables_are_what_the_snapshots_own_parsers_define(snapshot, tmp_path):
    checkout = read_checkout(snapshot)
    missing = [m for m in ("torch", *NEEDS[checkout.version]) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"Megatron-LM {checkout.version}'s parser needs {', '.join(missing)}")
    from nlp_bench.app.megatron_flags import write_flag_table

    kept = table_for(checkout.version)[0]
    fresh = read_table(write_flag_table(snapshot, None, kept.commit, None, tmp_path))
    assert fresh.version == kept.version == checkout.version and fresh.flags == kept.flags


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


def test_an_unknown_version_takes_the_nearest_table_and_says_so():
    assert [t.version for t in known_tables()] == ["0.4.0rc0", "0.20.0"]
    assert table_for("0.20.0") == (known_tables()[1], True)
    assert table_for("0.19.0")[0].version == "0.20.0" and table_for("0.19.0")[1] is False
    assert table_for("0.7.0")[0].version == "0.4.0rc0" and table_for("0.4.0")[0].version == "0.4.0rc0"
    assert table_for("1.2.0")[0].version == "0.20.0"
    point = _point("175", Checkout(Path("/nowhere"), "0.19.0", None))
    from nlp_bench.spec.megatron.target import table_note

    assert "0.19.0 has no flag table here: checked against the nearest known, 0.20.0" in table_note(point)


def test_translations_follow_the_version_where_git_cannot_say():
    by_flag = load_translations()
    before, after = Checkout(Path("/x"), "0.8.0", None), Checkout(Path("/x"), "0.9.0", None)
    assert not by_flag["log-batch-size-to-tensorboard"].applies_to(before)
    assert by_flag["log-batch-size-to-tensorboard"].applies_to(after)
    assert not by_flag["use-flash-attn"].applies_to(after)  # --attention-backend came in 0.11.0
    rc = Checkout(Path("/x"), "0.4.0rc0", None)  # the reference itself needs none
    assert for_checkout(rc) == []
    flags = {"use-flash-attn": True, "local_rank": 3, "mmap-warmup": False, "lr": "1e-4"}
    out, used = translate(flags, for_checkout(Checkout(Path("/x"), "0.20.0", None)), "here")
    assert out == {"attention-backend": "flash", "local-rank": 3, "mmap-warmup": False, "lr": "1e-4"}
    assert [t.flag for t in used] == ["use-flash-attn", "local_rank"]
    explicit, _ = translate({"use-flash-attn": True, "attention-backend": "fused"}, used, "here")
    assert explicit == {"attention-backend": "fused"}  # a flag set outright wins over a translation's
    with pytest.raises(SpecError, match="--retro-add-retriever -> no equivalent: removed with Retro"):
        translate({"retro-add-retriever": True}, for_checkout(Checkout(Path("/x"), "0.16.0", None)), "here")


def test_every_flag_the_reference_version_lost_is_translated():
    """translations.yaml covers the whole difference of the two kept tables, and each translation's new
    spelling is a flag of the current table."""
    old, new = reference_table(), known_tables()[-1]
    gone = set(old.flags) - set(new.flags)
    translations = load_translations()
    assert gone <= set(translations), sorted(gone - set(translations))
    for t in translations.values():
        assert t.flag in old.flags
        assert all(name in new.flags for name in (t.becomes or {})), t.flag


def test_the_rules_read_a_translated_flag_back_only_where_it_says_the_same():
    rules, by_flag = load_rules("jupiter"), load_translations()
    needed = [by_flag["use-flash-attn"], by_flag["log-batch-size-to-tensorboard"]]
    point = _point("13", None)
    argv = jobscript_args(render_jobscript(point), point.id)
    found = parse_argv(argv)
    assert found["use-flash-attn"] is True
    current = [w for w in argv if w not in ("--use-flash-attn", "--log-batch-size-to-tensorboard")]
    assert not rules.check("13", current, 8).valid  # without the translations: two flags missing
    verdict = rules.check("13", [*current, "--attention-backend", "flash"], 8, needed)
    assert verdict.valid and len(verdict.translations) == 2
    verdict = rules.check("13", [*current, "--attention-backend", "fused"], 8, needed)
    assert [d.flag for d in verdict.deviations] == ["--use-flash-attn"]  # fused is not the reference's flash
