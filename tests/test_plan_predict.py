"""`bench plan predict ROWS.yaml` (and `bench plan --predict`, `bench plan --model`): layouts and models a
user states outright, as when checking a published figure; what the planner does not model is answered
with the reason, never ignored."""

import json
import textwrap

import pytest

from nlp_bench.app.planning import JSON_KEYS

LLAMA_MAPPING = {"num-layers": 32, "hidden-size": 4096, "num-attention-heads": 32, "num-query-groups": 8,
                 "ffn-hidden-size": 14336, "seq-length": 8192, "vocab-size": 128256, "swiglu": True,
                 "untie-embeddings-and-output-weights": True, "disable-bias-linear": True,
                 "normalization": "RMSNorm", "position-embedding-type": "rope", "rotary-base": 500000}


def _rows(tmp_path, rows, name="rows.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps({"rows": rows}))  # JSON is YAML
    return path


def _json(out):
    assert out.exit_code in (0, 1), out.output
    return {r["id"]: r for r in json.loads(out.output)}


def test_stated_rows_are_predicted_or_refused_with_the_reason(bench, tmp_path):
    rows = [
        {"id": "llama-gqa", "model": LLAMA_MAPPING, "system": "h100-8", "gpus": 64, "tp": 2, "pp": 2, "mbs": 1,
         "global_batch_size": 128, "recompute": "selective", "sequence_parallel": True,
         "distributed_optimizer": True},
        {"id": "cp", "model": "llama3-70b", "system": "h100-8", "nodes": 8, "tp": 8, "pp": 4, "cp": 2, "mbs": 1,
         "global_batch_size": 64},
        {"id": "fp8", "model": "llama3-8b", "system": "h100-8", "gpus": 8, "tp": 2, "mbs": 1,
         "global_batch_size": 64, "precision": "fp8"},
        {"id": "uneven", "model": "llama3.1-405b", "system": "h100-8", "nodes": 64, "tp": 8, "pp": 16,
         "mbs": 1, "global_batch_size": 2048, "decoder_first_pipeline_num_layers": 7,
         "decoder_last_pipeline_num_layers": 7},
        {"id": "batch", "model": "gpt-13b", "system": "juwels-booster", "nodes": 8, "tp": 2, "pp": 4, "mbs": 3,
         "global_batch_size": 10},
    ]
    out = bench("plan", "predict", str(_rows(tmp_path, rows)), "--json")
    assert out.exit_code == 0, out.output
    found = _json(out)
    assert list(found) == [r["id"] for r in rows]
    for row in found.values():
        assert set(JSON_KEYS) | {"id", "model", "system"} == set(row)
    gqa = found["llama-gqa"]
    assert gqa["tokens_per_s"] > 0 and gqa["dp"] == 16 and gqa["gas"] == 8 and gqa["reason"] == ""
    assert gqa["model"] == "custom-8.0b" and gqa["system"] == "h100-8"
    assert gqa["tokens_per_s_low"] < gqa["tokens_per_s"] < gqa["tokens_per_s_high"]
    # no H100, no sequence of 8192 and no grouped-query model in the corpus: said, not hidden
    assert gqa["extrapolated"] is True
    outside = " | ".join(gqa["outside_corpus"])
    for needle in ("device H100-SXM-80GB not in the corpus", "sequence 8192 outside",
                   "grouped-query attention (8 groups for 32 heads) not in the corpus"):
        assert needle in outside, outside
    assert found["cp"]["tokens_per_s"] is None and found["cp"]["reason"] == "not modelled yet: context parallelism (cp 2)"
    assert found["fp8"]["reason"] == "not modelled yet: FP8"
    assert "uneven pipeline stages" in found["uneven"]["reason"] and found["uneven"]["memory_gib"] is None
    assert found["batch"]["reason"] == "the global batch 10 is not a multiple of dp 4 x mbs 3"
    text = bench("plan", "--predict", str(_rows(tmp_path, rows)))
    assert text.exit_code == 0 and "cp: not modelled yet: context parallelism (cp 2)" in text.output
    assert "llama-gqa" in text.output and "custom-8.0b" in text.output


def test_a_stated_layout_is_predicted_as_the_tag_with_the_same_layout_is(bench, tmp_path):
    """The same model, system, layout and switches give the same figures whichever way they are stated."""
    tag = json.loads(bench("plan", "--tag", "175", "--nodes", "96", "--tp", "8", "--pp", "8", "--mbs", "1", "--vp",
                           "1", "--recompute", "selective", "--json", "--top", "1").output)[0]
    row = {"id": "175", "model": "gpt-175b", "system": "juwels-booster", "gpus": 384, "tp": 8, "pp": 8, "mbs": 1,
           "global_batch_size": 96, "recompute": "selective", "sequence_parallel": True,
           "distributed_optimizer": True}
    stated = _json(bench("plan", "predict", str(_rows(tmp_path, [row])), "--json"))["175"]
    # the tag's rope changes neither memory nor time, so the stated learned-position preset plans the same
    for key in ("tokens_per_s", "tokens_per_s_low", "tokens_per_s_high", "dp", "gas", "fits", "extrapolated"):
        assert stated[key] == tag[key], key
    assert stated["memory_gib"] == pytest.approx(tag["memory_gib"], rel=0.01)


@pytest.mark.parametrize("row,needle", [
    ({"model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8}, "every row needs an id"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 12, "global_batch_size": 8},
     "gpus 12 is not a whole number of h100-8's 8-device nodes"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "nodes": 1, "global_batch_size": 8},
     "give exactly one of gpus and nodes"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8, "tensor": 2},
     "unknown key(s) tensor"),
    ({"id": "a", "model": {"num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 64,
                           "vocab-size": 100, "heads": 4}, "system": "h100-8", "gpus": 8, "global_batch_size": 8},
     "unknown model flag(s) heads"),
    ({"id": "a", "model": {"num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "num-query-groups": 3,
                           "seq-length": 64, "vocab-size": 100}, "system": "h100-8", "gpus": 8, "global_batch_size": 8},
     "4 attention heads do not split into 3 query groups"),
    ({"id": "a", "model": "gpt-13b", "system": "nowhere/else.yaml", "gpus": 8, "global_batch_size": 8},
     "system profile nowhere/else.yaml not found"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8, "precision": "fp4"},
     "precision must be one of bf16, fp16, fp8"),
])
def test_a_faulty_row_is_one_line_naming_the_file_and_the_row(tmp_path, row, needle):
    from conftest import run_bench

    path = _rows(tmp_path, [row])
    proc = run_bench("--results-dir", str(tmp_path / "r"), "plan", "predict", str(path), cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and needle in lines[0], lines[0]


def test_a_system_profile_file_outside_the_project(bench, tmp_path):
    from nlp_bench.spec.systems import systems_dir

    mine = tmp_path / "my-h100.yaml"
    mine.write_text((systems_dir() / "h100-8.yaml").read_text().replace("name: h100-8", "name: my-h100"))
    row = {"id": "mine", "model": "llama3-8b", "system": str(mine), "gpus": 8, "tp": 2, "mbs": 1,
           "global_batch_size": 64, "recompute": "selective"}
    found = _json(bench("plan", "predict", str(_rows(tmp_path, [row])), "--json"))["mine"]
    assert found["system"] == "my-h100" and found["tokens_per_s"] > 0


def test_bench_plan_model_plans_a_shape_that_has_no_tag_under_its_own_name(bench, tmp_path):
    """A 181B shape planned on the 175 tag's system and batch is named by its size, not the tag's preset."""
    shape = tmp_path / "model.yaml"
    shape.write_text(textwrap.dedent("""\
        num-layers: 80
        hidden-size: 13824
        num-attention-heads: 96
        seq-length: 2048
        vocab-size: 50257
    """))
    out = bench("plan", "--tag", "175", "--model", str(shape), "--top", "2")
    assert out.exit_code == 0, out.output
    assert out.output.startswith("custom-184.") and "gpt-175b" not in out.output
    preset = bench("plan", "--tag", "175", "--model", "gpt-13b", "--top", "1")
    assert preset.exit_code == 0 and preset.output.startswith("gpt-13b on juwels-booster")
    wrong = bench("plan", "--tag", "175", "--model", "gpt-99b")
    assert wrong.exit_code == 2 and "neither a model preset" in wrong.output
