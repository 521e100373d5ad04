"""Megatron-LM versions in-process: the flag tables, the translations of reference flags a later version
removed or renamed and of defaults it changed, the tag made for a version without a checkout, and the model
FLOPs against the snapshot's own function (the snapshots unpacked, where they lie: docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from megatron_snapshots import megatron_point, megatrons_flops_function

from nlp_bench.errors import SpecError
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.tables import known_tables, read_table, table_for
from nlp_bench.spec.megatron.target import for_megatron
from nlp_bench.spec.megatron.translations import (
    default_changes,
    for_checkout,
    load_translations,
    reference_table,
    translate,
)
from nlp_bench.spec.rules import load_rules, parse_argv


def test_an_unknown_version_takes_the_nearest_table_and_says_so():
    assert [t.version for t in known_tables()] == ["0.4.0rc0", "0.20.0"]
    assert table_for("0.20.0") == (known_tables()[1], True)
    assert table_for("0.19.0")[0].version == "0.20.0" and table_for("0.19.0")[1] is False
    assert table_for("0.7.0")[0].version == "0.4.0rc0" and table_for("0.4.0")[0].version == "0.4.0rc0"
    assert table_for("1.2.0")[0].version == "0.20.0"
    point = megatron_point("175", Checkout(Path("/nowhere"), "0.19.0", None))
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
    point = megatron_point("13", None)
    argv = jobscript_args(render_jobscript(point), point.id)
    found = parse_argv(argv)
    assert found["use-flash-attn"] is True
    current = [w for w in argv if w not in ("--use-flash-attn", "--log-batch-size-to-tensorboard")]
    assert not rules.check("13", current, 8).valid  # without the translations: two flags missing
    verdict = rules.check("13", [*current, "--attention-backend", "flash"], 8, needed)
    assert verdict.valid and len(verdict.translations) == 2
    verdict = rules.check("13", [*current, "--attention-backend", "fused"], 8, needed)
    assert [d.flag for d in verdict.deviations] == ["--use-flash-attn"]  # fused is not the reference's flash

STAND_IN = ROOT / "tests" / "fixtures" / "megatron_lm"

def test_bench_rules_flags_refuses_in_one_line(bench, tmp_path):
    out = bench("rules", "flags", str(tmp_path))
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "cannot read Megatron-LM's version" in out.output
    out = bench("rules", "flags", str(STAND_IN))  # a Megatron-LM version, inside nlp-bench's repository: no commit
    assert out.exit_code == 2 and "is not a git checkout: say which commit it is with --commit" in out.output
    out = bench("rules", "flags", str(STAND_IN), "--commit", "abc1234", "--out", str(tmp_path))
    assert out.exit_code == 2 and out.output.count("\n") == 1, out.output
    assert "Megatron-LM's own parser failed (exit 1): cannot import Megatron-LM's arguments" in out.output
    out = bench("rules", "flags", "--diff", "0.4.0rc0", "0.20.0")
    assert out.exit_code == 0 and len(out.output.split()) == 23 and "--log-batch-size-to-tensorboard" in out.output.split()
    out = bench("rules", "flags", "--diff", "0.4.0rc0", "0.9.0")
    assert out.exit_code == 2 and "no flag table for Megatron-LM 0.9.0; kept: 0.4.0rc0, 0.20.0" in out.output

def test_a_damaged_flag_table_is_one_line_naming_it(tmp_path):
    path = tmp_path / "0.5.0.tsv"
    path.write_text("# version: 0.5.0\nname\tdest\ttype\tnargs\tchoices\tdefault\tdeprecated\nlr\tfloat\tnull\n")
    with pytest.raises(SpecError, match=r"0.5.0.tsv:3: not a flag table row \(3 columns, not 7\)"):
        read_table(path)
    path.write_text("lr\tlr\tfloat\tnull\tnull\tnull\tno\n")
    with pytest.raises(SpecError, match="no '# version:' line"):
        read_table(path)

def test_every_default_that_changed_since_the_reference_is_accounted_for():
    """A flag the reference leaves out takes the version's default: each default that differs between the
    reference's table and the newest one is named, with why, in translations.yaml."""
    old, new = reference_table(), known_tables()[-1]

    def defaults(table):
        out = {}
        for flag in table.flags.values():
            out.setdefault(flag.dest, flag.default)
        return out

    before, after = defaults(old), defaults(new)
    changed = {dest for dest in set(before) & set(after) if before[dest] != after[dest]}
    assert changed == set(default_changes()), (changed ^ set(default_changes()))

def test_a_version_between_the_tables_renders_the_reference_tags():
    """0.11 to 0.12 take the reference's table as the nearest, yet have --attention-backend: a flag a
    translation spells is not refused for being newer than the nearest table."""
    point = megatron_point("13", Checkout(Path("/x"), "0.11.0", None))
    assert point.train["attention-backend"] == "flash" and "use-flash-attn" not in point.train
    assert point.megatron_lm["flag_table"] == "0.4.0rc0.tsv" and not point.megatron_lm["flag_table_exact"]
    with pytest.raises(SpecError, match="has no flag --no-such-flag"):
        for_megatron(load_benchmark().point("13", trainer="megatron-lm", train={"no-such-flag": True}),
                     Checkout(Path("/x"), "0.11.0", None))

def test_a_named_checkout_that_cannot_be_read_is_an_error_even_for_a_dry_run(bench, monkeypatch, tmp_path):
    monkeypatch.setenv("MEGATRON_LM_REPO", str(tmp_path / "nowhere"))
    out = bench("run", "--tag", "175", "--trainer", "megatron-lm", "--dry-run")
    assert out.exit_code == 2 and "pretrain_gpt.py not found in" in out.output
    monkeypatch.delenv("MEGATRON_LM_REPO")  # the profile's checkout is not on this machine: the reference's flags
    out = bench("run", "--tag", "175", "--trainer", "megatron-lm", "--dry-run")
    assert out.exit_code == 0 and "no Megatron-LM checkout here: the arguments are the reference's" in out.output

def test_without_a_checkout_a_tag_is_made_for_the_oldest_kept_release_that_takes_its_flags():
    """The reference's 0.4.0rc0 has no mock data at all (no --mock-data, no mock dataset), so a dry run with no
    checkout once refused gpu-small's Megatron-LM point (benchmark/grids/trainers-1gpu.yaml) for a flag the
    Megatron-LM it is written for has. The reference's own tags stay made for the reference's version."""
    from nlp_bench.spec.megatron.target import table_note

    reference = megatron_point("175", None)
    assert reference.megatron_lm["flag_table"] == "0.4.0rc0.tsv" and reference.megatron_lm["translated"] == []
    assert "use-flash-attn" in reference.train and "the arguments are the reference's" in table_note(reference)
    small = megatron_point("gpu-small", None)
    made = small.megatron_lm
    assert (made["version"], made["flag_table"], made["flag_table_exact"]) == (None, "0.20.0.tsv", True)
    assert small.train["mock-data"] is True
    assert "0.4.0rc0 has no --mock-data: the arguments are made for Megatron-LM 0.20.0" in table_note(small)
    # the same arguments a 0.20.0 checkout gets, translations included
    for tag in ("gpu-small", "llama3-8b"):
        release = megatron_point(tag, Checkout(Path("/x"), "0.20.0", None))
        assert megatron_point(tag, None).train == release.train
    llama = megatron_point("llama3-8b", None)
    assert llama.train["attention-backend"] == "flash" and llama.megatron_lm["translated"] == ["use-flash-attn"]
    assert "0.4.0rc0 has no --mock-data, --rotary-base: the arguments" in table_note(llama)  # not the new spelling
    with pytest.raises(SpecError, match=r"no kept version takes these flags: 0.4.0rc0, 0.20.0; set MEGATRON_LM_REPO\)"
                                        r": Megatron-LM 0.20.0 \(d98e8a64dd\) has no flag --no-such-flag \("):
        for_megatron(load_benchmark().point("gpu-small", trainer="megatron-lm", train={"no-such-flag": True}), None)

def test_a_release_needs_the_translations_of_every_change_up_to_it():
    from nlp_bench.spec.megatron.translations import for_release

    assert for_release(reference_table().version) == []
    names = {t.flag for t in for_release("0.9.0")}
    assert "log-batch-size-to-tensorboard" in names and "use-flash-attn" not in names  # 0.11.0's
    assert {t.flag for t in for_release("0.20.0")} == set(load_translations())

@pytest.mark.parametrize("preset,tp", [("llama3-8b", 2), ("llama3-70b", 8), ("llama3.1-405b", 8), ("gpt-175b", 8)])
def test_model_flops_are_megatron_lms_own(unpacked, preset, tp):
    """flops.megatron_model_flops equals what Megatron-LM 0.20's own num_floating_point_operations computes."""
    from types import SimpleNamespace

    from nlp_bench import flops
    from nlp_bench.spec.models import get_model, pad_vocab

    class Args(SimpleNamespace):
        def __getattr__(self, name):  # every flag the dense path does not set is Megatron's None/False
            return None

    model = get_model(preset)
    vocab = pad_vocab(model.vocab_size, tp)
    args = Args(num_layers=model.num_layers, hidden_size=model.hidden_size,
                num_attention_heads=model.num_attention_heads, group_query_attention=model.num_query_groups is not None,
                num_query_groups=model.num_query_groups, kv_channels=model.head_dim,
                ffn_hidden_size=model.ffn_hidden_size, swiglu=model.swiglu, padded_vocab_size=vocab,
                seq_length=model.seq_length)
    theirs = megatrons_flops_function(unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz"))(args, 64)
    assert flops.megatron_model_flops(model.flops_shape(64, vocab)) == pytest.approx(theirs, rel=1e-12)
