"""`bench plan predict ROWS.yaml` (and `bench plan --predict`, `bench plan --model`): layouts and models a
user states outright, as when checking a published figure, with grouped-query attention, context
parallelism, FP8, uneven pipeline stages and tensor-parallel overlap; a row that cannot be laid out or timed
is answered with the reason, never ignored."""

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
        assert set(JSON_KEYS) | {"id", "model", "system"} == set(row) and "cp" in JSON_KEYS
    gqa = found["llama-gqa"]
    assert gqa["tokens_per_s"] > 0 and gqa["dp"] == 16 and gqa["gas"] == 8 and gqa["reason"] == ""
    assert gqa["model"] == "custom-8.0b" and gqa["system"] == "h100-8"
    assert gqa["tokens_per_s_low"] < gqa["tokens_per_s"] < gqa["tokens_per_s_high"]
    # sequence 8192 and grouped-query attention are in the corpus (Fujii et al.'s Llama-3.1-8B rows): inside
    assert gqa["extrapolated"] is False and gqa["outside_corpus"] == []
    # context parallelism, FP8 and uneven stages are modelled: each row is predicted, none is ignored
    assert found["cp"]["tokens_per_s"] > 0 and found["cp"]["cp"] == 2 and found["cp"]["dp"] == 1
    assert found["fp8"]["tokens_per_s"] > 0 and found["fp8"]["outside_corpus"] == []
    assert found["uneven"]["memory_gib"] > 0 and found["uneven"]["dp"] == 4
    assert found["batch"]["reason"] == "the global batch 10 is not a multiple of dp 4 x mbs 3"
    text = bench("plan", "--predict", str(_rows(tmp_path, rows)))
    assert text.exit_code == 0 and "batch: the global batch 10 is not a multiple of dp 4 x mbs 3" in text.output
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

def test_a_system_profile_file_outside_the_project(bench, tmp_path):
    from nlp_bench.spec.systems import systems_dir

    mine = tmp_path / "my-h100.yaml"
    mine.write_text((systems_dir() / "h100-8.yaml").read_text().replace("name: h100-8", "name: my-h100"))
    row = {"id": "mine", "model": "llama3-8b", "system": str(mine), "gpus": 8, "tp": 2, "mbs": 1,
           "global_batch_size": 64, "recompute": "selective"}
    # a relative path is the rows file's folder's, wherever bench runs
    relative = {**row, "id": "relative", "system": "my-h100.yaml"}
    found = _json(bench("plan", "predict", str(_rows(tmp_path, [row, relative])), "--json"))
    assert found["mine"]["system"] == "my-h100" and found["mine"]["tokens_per_s"] > 0
    assert found["relative"]["tokens_per_s"] == found["mine"]["tokens_per_s"]

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

def _predict(bench, tmp_path, rows):
    out = bench("plan", "predict", str(_rows(tmp_path, rows, f"rows-{len(rows)}-{rows[0]['id']}.yaml")), "--json")
    return _json(out)

BASE = {"model": "llama3-70b", "system": "h100-8", "nodes": 8, "tp": 8, "pp": 4, "mbs": 1, "global_batch_size": 64,
        "recompute": "selective", "sequence_parallel": True, "distributed_optimizer": True}

def test_context_parallelism_splits_the_sequence_and_pays_for_its_ring(bench, tmp_path):
    found = _predict(bench, tmp_path, [{**BASE, "id": "cp1"}, {**BASE, "id": "cp2", "cp": 2},
                                       {**BASE, "id": "cp4", "cp": 4, "nodes": 16},
                                       {**BASE, "id": "odd", "cp": 3, "nodes": 12}])
    cp1, cp2 = found["cp1"], found["cp2"]
    assert cp2["dp"] == cp1["dp"] // 2 and cp2["gas"] == 2 * cp1["gas"]
    # each rank holds half of every sequence's activations; the weights are the same
    assert cp2["memory_gib"] < cp1["memory_gib"] - 5
    # the same devices, the same work: within the ring's cost of each other
    assert 0.8 < cp2["tokens_per_s"] / cp1["tokens_per_s"] < 1.2
    assert found["odd"]["tokens_per_s"] is None and "2 x cp 3" in found["odd"]["reason"]
    # Megatron's unfused attention asserts cp 1: a row asking for both is refused, as Megatron would
    unfused = bench("plan", "predict", str(_rows(tmp_path, [{**BASE, "id": "unfused", "cp": 2, "flash_attention": False}],
                                                 "unfused.yaml")))
    assert unfused.exit_code == 2 and "row unfused: context parallelism (cp > 1) needs flash attention" in unfused.output
    # no published row has context parallelism: its predictions say so
    assert "context parallelism (cp 4) beyond the corpus's 2" in found["cp4"]["outside_corpus"]
    assert not any("context" in o for o in cp1["outside_corpus"] + cp2["outside_corpus"])

def test_fp8_runs_the_linear_layers_at_the_fp8_rate_where_the_system_has_one(bench, tmp_path):
    row = {"model": "llama3-8b", "system": "h100-8", "gpus": 8, "tp": 2, "mbs": 1, "global_batch_size": 64,
           "sequence_parallel": True, "distributed_optimizer": True}
    found = _predict(bench, tmp_path, [{**row, "id": "bf16"}, {**row, "id": "fp8", "precision": "fp8"},
                                       {**row, "id": "a100", "system": "selene", "precision": "fp8"}])
    ratio = found["fp8"]["tokens_per_s"] / found["bf16"]["tokens_per_s"]
    assert 1.1 < ratio < 2.0  # the attention core, element-wise work and communication stay as they were
    assert found["fp8"]["memory_gib"] > found["bf16"]["memory_gib"]  # the weights' 8-bit copies
    assert found["a100"]["tokens_per_s"] is None and "no peak_fp8_tflops" in found["a100"]["reason"]

def test_uneven_stages_plan_what_an_even_split_refuses_and_wait_for_the_fullest_stage(bench, tmp_path):
    big = {"model": "llama3.1-405b", "system": "h100-8", "nodes": 128, "tp": 8, "pp": 16, "mbs": 1,
           "global_batch_size": 512, "recompute": "full", "sequence_parallel": True, "distributed_optimizer": True}
    row = {**BASE, "model": "llama3-8b", "nodes": 2, "tp": 4, "global_batch_size": 32}
    found = _predict(bench, tmp_path, [
        {**big, "id": "even-405b"},
        {**big, "id": "uneven-405b", "decoder_first_pipeline_num_layers": 7, "decoder_last_pipeline_num_layers": 7},
        {**row, "id": "even-8b"},
        {**row, "id": "heavy-middle", "decoder_first_pipeline_num_layers": 6, "decoder_last_pipeline_num_layers": 6},
        {**row, "id": "bad", "decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 6}])
    assert "pp 16 must divide the number of layers 126" in found["even-405b"]["reason"]
    assert found["uneven-405b"]["tokens_per_s"] > 0
    # 32 layers as 6, 10, 10, 6: the middle stages (10 layers) set the pace, slower than 8 a stage
    assert found["heavy-middle"]["tokens_per_s"] < found["even-8b"]["tokens_per_s"]
    assert "do not split evenly over the other 2 stages" in found["bad"]["reason"]
    # the corpus holds uneven stages (DeepSeek-V3's 3 first, 2 last): no longer an extrapolation
    assert "uneven pipeline stages not in the corpus" not in found["heavy-middle"]["outside_corpus"]

def test_tensor_parallel_overlap_hides_collectives_behind_the_gemms(bench, tmp_path):
    row = {**BASE, "id": "plain"}
    found = _predict(bench, tmp_path, [row, {**row, "id": "overlap", "tp_comm_overlap": True}])
    assert found["overlap"]["tokens_per_s"] > found["plain"]["tokens_per_s"]
    assert found["overlap"]["memory_gib"] == found["plain"]["memory_gib"]
    # MLPerf's GPT-3 rows ran it, so the corpus covers it; a corpus without such a row flags it
    assert not any("tensor-parallel" in why for why in found["overlap"]["outside_corpus"])
    from dataclasses import replace

    from nlp_bench.plan import validation
    from nlp_bench.plan.explicit import read_row

    planned = read_row({**BASE, "id": "overlap", "tp_comm_overlap": True}, 1, "rows").planned
    without = replace(validation.corpus_trust(None).ranges, tp_overlap=False)
    assert "tensor-parallel communication overlap not in the corpus" in without.outside(
        planned.model, planned.system, planned.candidate, planned.model.vocab_size)

def test_unfused_gradient_accumulation_costs_a_pass_over_the_weight_gradients(bench, tmp_path):
    row = {**BASE, "id": "fused"}
    found = _predict(bench, tmp_path, [row, {**row, "id": "unfused", "gradient_accumulation_fusion": False}])
    assert found["unfused"]["tokens_per_s"] < found["fused"]["tokens_per_s"]
    assert found["unfused"]["memory_gib"] == found["fused"]["memory_gib"]

def test_rows_state_pipeline_send_overlap_and_the_gradients_dtype(bench, tmp_path):
    row = {**BASE, "id": "default", "vp": 4}
    found = _predict(bench, tmp_path, [row, {**row, "id": "waited", "overlap_p2p_comm": False},
                                       {**row, "id": "bf16", "grad_reduce_in_bf16": True}])
    # Megatron overlaps an interleaved pipeline's sends by default; without it they are waited for
    assert found["waited"]["tokens_per_s"] < found["default"]["tokens_per_s"]
    # half the bytes to reduce, nothing overlapped here (no --overlap-grad-reduce)
    assert found["bf16"]["tokens_per_s"] > found["default"]["tokens_per_s"]

def test_the_first_chunks_gather_behind_the_optimizer_step_is_a_row_key_and_hides_that_gather(bench, tmp_path):
    """A Megatron setting added in one place (spec.Switches) reaches the rows files, their help and the
    planner: the first chunk's gather starts behind the other chunks' optimizer steps."""
    row = {**BASE, "id": "overlapped", "vp": 4, "nodes": 64, "overlap_param_gather": True,
           "overlap_grad_reduce": True}
    found = _predict(bench, tmp_path, [row, {**row, "id": "with-step", "overlap_param_gather_with_optimizer_step": True}])
    assert found["with-step"]["tokens_per_s"] > found["overlapped"]["tokens_per_s"]
    assert found["with-step"]["memory_gib"] == found["overlapped"]["memory_gib"]
    for refused_row, needs in (({**BASE, "id": "alone", "vp": 4}, "needs overlap_param_gather and the distributed "
                                                                  "optimizer"),
                               ({**row, "id": "plain-1f1b", "vp": 1}, "needs interleaving (vp > 1)")):
        refused = bench("plan", "predict", str(_rows(tmp_path, [{**refused_row,
                                                                 "overlap_param_gather_with_optimizer_step": True}],
                                                     f"{refused_row['id']}.yaml")))
        assert refused.exit_code == 2 and needs in refused.output
    shown = bench("plan", "predict", "--help")
    assert "overlap_param_gather_with_optimizer_step: with interleaving" in shown.output
    assert "--overlap-param-gather-with-optimizer-step; default false" in shown.output

def test_predict_takes_no_option_the_rows_would_contradict(bench, tmp_path):
    out = bench("plan", "--predict", str(_rows(tmp_path, [{**BASE, "id": "a"}])), "--system", "selene")
    assert out.exit_code == 2 and "takes no other option but --json" in out.output

def test_uneven_stages_need_the_memory_of_one_stage_not_the_worst_of_each():
    """The first stage holds the most activations, the last the most weights (4 layers more and the output
    layer): the device that needs most is one of them, not their worst parts added (3.6 GiB too much for
    this Llama 3 70B layout before)."""
    from nlp_bench.plan import memory
    from nlp_bench.plan.candidate import Candidate
    from nlp_bench.spec.models import get_model, pad_vocab

    model = get_model("llama3-70b")
    c = Candidate.of(nodes=4, devices_per_node=8, tp=8, pp=4, mbs=1, gas=16, recompute="selective",
                  first_stage_layers=18, last_stage_layers=22)
    vocab = pad_vocab(model.vocab_size, c.layout.tp)
    found = memory.footprint(model, vocab, c)
    per_parameter = memory.bytes_per_parameter(c)
    worst_of_each = memory.parameters_on_most_loaded_shard(model, vocab, c) * per_parameter + \
        memory.activation_bytes(model, vocab, c)
    assert found.weights_and_optimizer + found.activations < worst_of_each - 2 * memory.GIB
