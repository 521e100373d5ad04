"""The planner in-process: Megatron's memory formulas, calibration on the published reference rows, the command.

Memory figures below were computed by hand (the arithmetic is in the comments) from Megatron-LM's
theoretical memory model, megatron/training/theoretical_memory_usage.py (weights and optimizer: 18 bytes
per parameter, 6 + 12/dp with the distributed optimizer; activations: the first stage's s·b·h·(18 + 4·ffn/h)
bytes per layer for L layers, plus the embedding's input and dropout for pp micro-batches, plus the output
layer when pp = 1, all divided by tp), and Table 2 of Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", MLSys 2023 (per layer: s·b·h·(10 + 24/t) without sequence
parallelism, plus 5·a·s²·b/t when the attention matrix is stored).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from nlp_bench.app import planning
from nlp_bench.cli import cli
from nlp_bench.plan import memory, ranking
from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.switches import FP8_PARAM_GATHER_NEEDS


def test_megatron_memory_175b_reference_layout():
    m, c = get_model("gpt-175b"), Candidate.of(96, 4, 8, 8, 1, 16)
    vocab = pad_vocab(m.vocab_size, 8)
    assert vocab == 51200
    # transformer: 96 x (12 x 12288^2 + 4 x 12288) + 2 x 12288 = 173,950,918,656; embedding 12288 x 51200
    # = 629,145,600; first stage: (173,950,918,656 / 8 + 629,145,600) / 8 = 2,796,626,304 parameters
    assert memory.parameters_on_most_loaded_shard(m, vocab, c) == pytest.approx(2_796_626_304)
    # distributed optimizer over dp 6: 6 + 12/6 = 8 bytes each
    assert memory.footprint(m, vocab, c).weights_and_optimizer == pytest.approx(22_373_010_432)
    # 34 x 2048 x 12288 = 855,638,016 per layer, x 96 = 82,141,249,536; + 8 x 2048 x 8 = 131,072;
    # + 2048 x 12288 x 8 = 201,326,592; / tp 8 = 10,292,838,400
    assert memory.activation_bytes(m, vocab, c) == pytest.approx(10_292_838_400)

def test_megatron_memory_13b_reference_layout():
    m, c = get_model("gpt-13b"), Candidate.of(8, 4, 2, 4, 1, 256, precision="fp16")
    vocab = pad_vocab(m.vocab_size, 2)
    assert vocab == 50432
    # 40 x (12 x 5120^2 + 4 x 5120) + 2 x 5120 = 12,583,741,440; embedding 5120 x 50432 = 258,211,840;
    # (12,583,741,440 / 4 + 258,211,840) / 2 = 1,702,073,600 parameters; x (2 + 2 + 12/4) bytes: with fp16 the
    # reference's Megatron accumulates gradients in fp16 (bf16 alone forces --accumulate-allreduce-grads-in-fp32)
    assert memory.footprint(m, vocab, c).weights_and_optimizer == pytest.approx(11_914_515_200)
    # 34 x 2048 x 5120 x 40 = 14,260,633,600; + 65,536 + 41,943,040; / 2 = 7,151,321,088
    assert memory.activation_bytes(m, vocab, c) == pytest.approx(7_151_321_088)

def test_megatron_memory_single_stage_adds_the_output_layer():
    m, c = get_model("gpt-1.3b"), Candidate.of(1, 8, 1, 1, 4, 1, distributed_optimizer=False, recompute="none")
    vocab = pad_vocab(m.vocab_size, 1)
    assert vocab == 50304
    # 24 x (12 x 2048^2 + 4 x 2048) + 2 x 2048 + 2048 x 50304 = 1,311,182,848 parameters x 18 bytes
    assert memory.footprint(m, vocab, c).weights_and_optimizer == pytest.approx(23_601_291_264)
    # flash attention: no s^2 term even without recompute. 34 x 2048 x 4 x 2048 x 24 = 13,690,208,256;
    # + 8 x 2048 x 4 = 65,536; + 2048 x 4 x 2048 = 16,777,216; output layer and loss:
    # 2048 x 4 x 2048 x 4 x (1 + 50304 / 2048) = 1,715,470,336; total 15,422,521,344
    assert memory.activation_bytes(m, vocab, c) == pytest.approx(15_422_521_344)

def test_korthikanti_per_layer_cases():
    m = get_model("gpt-13b")  # s 2048, h 5120, a 32
    sbh = 2048 * 5120
    plain = Candidate.of(8, 4, 4, 1, 1, 1, sequence_parallel=False, recompute="none", flash_attention=False)
    # no sequence parallelism, attention matrix stored: sbh (10 + 24/4) + 5 x 32 x 2048^2 / 4 = 335,544,320
    assert memory.layer_activation_bytes(m, plain) == pytest.approx(335_544_320)
    # selective recompute drops the s^2 term: sbh x 16
    assert memory.layer_activation_bytes(m, Candidate.of(8, 4, 4, 1, 1, 1, sequence_parallel=False)) == 16 * sbh
    # full recompute keeps the layer input, split over tp under sequence parallelism: 2 sbh / 4
    assert memory.layer_activation_bytes(m, Candidate.of(8, 4, 4, 1, 1, 1, recompute="full")) == 2 * sbh / 4

def test_calibrated_on_the_two_reference_rows_the_planner_predicts_both(tmp_path):
    fits = planning.calibrate_and_store(tmp_path, ["reference"])
    result, checks = fits["juwels-booster"]
    assert len(checks) == 2
    # physical efficiencies only: none above 1
    assert 0 < result.efficiency.gemm <= 1 and 0 < result.efficiency.network <= 1 and 0 < result.efficiency.memory <= 1
    # issue 16 asks for 5%; the two rows pin no GEMM curve (the 13B's wider GEMMs ran slower per FLOP than
    # the 175B's), so the fit says its curve is flat and frees the network efficiency in its place (kept at
    # the corpus fit's, the 13B row came out 5.9% fast once the corpus held 50 rows)
    for label, predicted, measured in checks:
        assert predicted == pytest.approx(measured, rel=0.05), label
    assert result.pinned[0].split(":")[0] == "gemm_half = 8" and "network" in result.free
    assert all(line.split(":")[0] in ("gemm_half = 8", "network = 1") for line in result.pinned)
    # the stored fit is what later plans use: the tags' own layouts come back at the measured speed
    for tag, measured in (("13", 60777.68), ("175", 36055.39)):
        out = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), "plan", "--tag", tag, "--json",
                                       "--tp", "8" if tag == "175" else "2", "--pp", "8" if tag == "175" else "4",
                                       "--vp", "1", "--mbs", "1", "--recompute", "selective"])
        assert out.exit_code == 0, out.output
        rows = [r for r in json.loads(out.output) if r["fits"] and r["distributed_optimizer"]]
        assert rows[0]["calibrated"] is True
        assert rows[0]["tokens_per_s"] == pytest.approx(measured, rel=0.05)

def test_json_keys_are_the_documented_contract(tmp_path):
    out = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), "plan", "--tag", "175", "--json", "--top", "3"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert rows and all(tuple(r) == planning.JSON_KEYS for r in rows)
    assert all(r["calibrated"] is False for r in rows)
    fits = [r for r in rows if r["fits"]]
    assert fits == sorted(fits, key=lambda r: -r["tokens_per_s"])
    assert all(r["global_batch_size"] == 96 and r["time_to_report_s"] == pytest.approx(2e7 / r["tokens_per_s"], rel=1e-3)
               for r in fits)
    assert any(not r["fits"] and "GiB per device" in r["reason"] for r in rows)

def test_pinned_axes_and_the_target_search(tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["--results-dir", str(tmp_path), "plan", "--tag", "175", "--json", "--tp", "4",
                              "--pp", "8", "--pp", "16"])
    rows = json.loads(out.output)
    assert rows and {r["tp"] for r in rows} == {4} and {r["pp"] for r in rows} <= {8, 16}
    planning.calibrate_and_store(tmp_path, ["reference"])
    out = runner.invoke(cli, ["--results-dir", str(tmp_path), "plan", "target", "560", "--tag", "175",
                              "--system", "juwels-booster"])
    assert out.exit_code == 0, out.output
    assert "fewest nodes for time_to_report <= 560 s:" in out.output and "calibrated on this system's measured runs" in out.output
    out = runner.invoke(cli, ["--results-dir", str(tmp_path), "plan", "target", "560", "--tag", "175", "--json"])
    (best,) = json.loads(out.output)
    assert best["fits"] and best["time_to_report_s"] <= 560 and best["nodes"] <= 96

@pytest.mark.parametrize("argv,message", [
    (["plan", "--calibrate"], "--calibrate needs RUN ids or `reference`"),
    (["plan", "somerun"], "RUN arguments go with --calibrate"),
    (["plan", "--tag", "175", "--tp", "0"], "--tp"),
])
def test_bad_requests_are_one_line(tmp_path, argv, message):
    out = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), *argv])
    assert out.exit_code == 2
    assert message in out.output and len(out.output.strip().splitlines()) == 1

@pytest.mark.parametrize("old,new,note", [
    (["plan", "--validate", "--json"], ["plan", "validate", "--json"],
     "bench: note: `bench plan --validate` is now spelled `bench plan validate`"),
    (["plan", "--tag", "175", "--target-seconds", "560", "--json"], ["plan", "target", "560", "--tag", "175", "--json"],
     "bench: note: `bench plan --target-seconds S` is now spelled `bench plan target S`"),
])
def test_the_old_spellings_of_the_plan_modes_still_work_and_say_the_new_one(tmp_path, old, new, note):
    runner = CliRunner()
    then = runner.invoke(cli, ["--results-dir", str(tmp_path), *old])
    now = runner.invoke(cli, ["--results-dir", str(tmp_path), *new])
    assert then.exit_code == now.exit_code == 0, then.output + now.output
    assert then.stderr.strip() == note and now.stderr == ""
    assert json.loads(then.stdout) == json.loads(now.stdout)

def test_a_system_without_the_figures_is_refused_in_words():
    from dataclasses import replace

    from nlp_bench.plan import timing
    from nlp_bench.spec.systems import load_system

    bare = replace(load_system("local"), peak_tflops=None, matmul_tflops=None, inter_node_gbps=None)
    with pytest.raises(timing.NotPlannable, match="system 'local' has no peak_tflops or matmul_tflops, inter_node_gbps"):
        ranking.predict(get_model("gpt-tiny"), bare, Candidate.of(1, 2, 1, 1, 1, 1), timing.Efficiency())

def test_candidate_rules():
    m = get_model("gpt-175b")
    assert Candidate.of(96, 4, 8, 8, 1, 16).problems(m) == []
    assert "must divide the number of layers 96" in " ".join(Candidate.of(96, 4, 8, 5, 1, 16).problems(m))
    assert "interleaved schedule needs the micro-batches per iteration (12) to be a multiple of pp 8" in " ".join(
        Candidate.of(96, 4, 8, 8, 1, 12, vp=2).problems(m))
    assert "interleaving" in " ".join(Candidate.of(96, 4, 8, 8, 1, 16, vp=5).problems(m))

def test_trainium_profiles_are_planned_without_pipeline_parallelism(tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["--results-dir", str(tmp_path), "plan", "--system", "trn1", "--tag", "175", "--json"])
    assert out.exit_code == 1, out.output  # nothing fits: said, and not a success
    rows = json.loads(out.output)
    # 175B without pipeline parallelism does not fit a 16 GiB NeuronCore: said with memory and speed
    assert rows and all(r["pp"] == 1 and not r["fits"] and "16 GiB available" in r["reason"] for r in rows)
    assert all(r["memory_gib"] > 16 and r["tokens_per_s"] > 0 for r in rows)
    out = runner.invoke(cli, ["--results-dir", str(tmp_path), "plan", "--system", "trn1", "--tag", "13", "--json"])
    best = json.loads(out.output)[0]
    assert best["fits"] and best["pp"] == 1 and best["memory_gib"] <= 16 and best["global_batch_size"] == 1024
    out = runner.invoke(cli, ["--results-dir", str(tmp_path), "plan", "--system", "trn1", "--tag", "13", "--pp", "2",
                              "--json"])
    rows = json.loads(out.output)
    # predicted (memory and speed), never offered: pipeline parallelism on xla is not the built-in trainer's
    assert rows and all(not r["fits"] and r["tokens_per_s"] > 0 for r in rows)
    assert all("no pipeline parallelism on xla" in r["reason"] or "GiB available" in r["reason"] for r in rows)
    assert any("no pipeline parallelism on xla" in r["reason"] for r in rows)

@pytest.mark.parametrize("pins,reason", [
    (["--tp", "7"], "tp 7 x pp 1 = 7 does not divide the 384 devices of 96 node(s) into whole replicas"),
    (["--nodes", "80"], "the global batch 96 is no multiple of dp"),
])
def test_a_space_without_a_layout_says_why_and_fails(tmp_path, pins, reason):
    """`bench plan --tp 7` and `--nodes 80` printed "no layout fits and runs", exit 0, with no reason."""
    out = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), "plan", "--tag", "175", *pins])
    assert out.exit_code == 2 and "no layout of gpt-175b on juwels-booster in this space" in out.output
    assert reason in out.output and len(out.output.strip().splitlines()) == 1

def test_full_recompute_runs_the_layers_forward_again_not_the_output_layers():
    from nlp_bench import flops
    from nlp_bench.plan import timing

    m = get_model("gpt-13b")
    vocab = pad_vocab(m.vocab_size, 2)
    c = Candidate.of(8, 4, 2, 4, 1, 16, recompute="full")
    model_flops = flops.megatron_model_flops(m.flops_shape(c.layout.global_batch_size, vocab))
    logits = 6.0 * c.layout.global_batch_size * m.seq_length * m.hidden_size * vocab
    # Megatron checkpoints the transformer layers; the output layer's forward is not repeated
    assert timing.hardware_flops(m, vocab, c) == pytest.approx(model_flops + (model_flops - logits) / 3)

@pytest.mark.parametrize("recompute, forward_again", [("none", 0), ("selective", 1), ("full", 1)])
def test_unfused_attention_executes_the_whole_causal_score_matrix(recompute, forward_again):
    """Megatron's count halves the attention core for the causal mask, as a fused kernel skips the masked
    blocks; unfused attention (baddbmm, then the masked softmax, then bmm with the values: Megatron before
    flash attention, Megatron-DeepSpeed) multiplies the whole score matrix. The planner charged the unfused
    runs the halved count."""

    from nlp_bench.plan import timing

    m = get_model("gpt-13b")
    vocab = pad_vocab(m.vocab_size, 2)
    fused = Candidate.of(8, 4, 2, 4, 1, 16, recompute=recompute, flash_attention=True)
    unfused = fused.changed(flash_attention=False)
    b, s, h, n = fused.layout.global_batch_size, m.seq_length, m.hidden_size, m.num_layers
    masked_half = 2.0 * b * s * s * h * n  # forward: scores and their product with the values, half of them
    assert timing.hardware_flops(m, vocab, unfused) - timing.hardware_flops(m, vocab, fused) == \
        pytest.approx(masked_half * (3 + forward_again))

def test_selective_recompute_writes_the_unfused_attention_scores_once_more():
    """Selective recompute keeps no score-sized tensors (the scores' softmax, dropout mask and output), so the
    backward writes them again before it reads them: one pass more over them than without recompute, as full
    recompute makes one more over every activation. With flash attention there are none to write."""
    from nlp_bench.plan import timing
    from nlp_bench.spec.systems import load_system

    m, system = get_model("gpt-13b"), load_system("juwels-booster")
    vocab = pad_vocab(m.vocab_size, 2)
    c = Candidate.of(8, 4, 2, 4, 1, 16, flash_attention=False)
    none, selective = (timing.work(m, vocab, c.changed(recompute=r), system) for r in ("none", "selective"))
    scores = 5 * m.num_attention_heads * m.seq_length ** 2 * c.layout.mbs / c.layout.tp  # bytes a layer, Korthikanti et al.
    assert selective.elementwise_bytes - none.elementwise_bytes == pytest.approx(m.num_layers / c.layout.pp * scores)
    fused = c.changed(flash_attention=True)
    assert timing.work(m, vocab, fused.changed(recompute="selective"), system).elementwise_bytes == \
        timing.work(m, vocab, fused.changed(recompute="none"), system).elementwise_bytes

def test_the_pipeline_bubble_runs_at_the_other_stages_pace_not_the_slowest():
    """1F1B's steady state waits for the slowest stage (here the last, which runs the output layer too), but
    the fill and drain pass each micro-batch through every other stage once: the bubble is timed at their
    mean pace (the old model charged the output layer in every bubble slot)."""
    from nlp_bench.plan import timing
    from nlp_bench.spec.systems import load_system

    m, system = get_model("gpt-13b"), load_system("juwels-booster")
    vocab = pad_vocab(m.vocab_size, 2)
    c = Candidate.of(8, 4, 2, 4, 1, 16, first_stage_layers=4, last_stage_layers=12)
    w = timing.work(m, vocab, c, system)
    logits = 6.0 * c.layout.mbs * m.seq_length * m.hidden_size * vocab / c.layout.tp
    per_layer = (w.flops - logits) / 12
    assert w.bubble == 3
    assert w.bubble_flops == pytest.approx((4 + 12 + 12) * per_layer / 3 / w.flops)
    assert w.bubble_layers == pytest.approx((4 + 12 + 12) / 3 / 12)
    eff = timing.Efficiency()
    paced = timing.timed(w, eff).iteration_s
    at_the_slowest = timing.timed(replace(w, bubble_flops=1.0, bubble_layers=1.0), eff).iteration_s
    assert at_the_slowest > paced
    # (the attention core at the layer GEMMs' rate, so that the stage's FLOPs run at one rate)
    even = replace(timing.work(m, vocab, Candidate.of(8, 4, 2, 4, 1, 16), system), attention_flops=0.0)
    curve = eff.gemm * even.side / (even.side + eff.gemm_half)
    # with even stages the others differ from the last by the output layer alone
    assert even.bubble_layers == 1.0
    gap = timing.timed(replace(even, bubble_flops=1.0), eff).iteration_s - timing.timed(even, eff).iteration_s
    assert gap == pytest.approx(even.bubble * logits / (even.matmul * curve))
    # a last stage of the output layer alone (a large vocabulary) is the slowest: timed, not a division by zero
    wide = replace(m, num_layers=6, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048, vocab_size=256000)
    alone = Candidate.of(1, 4, 1, 4, 1, 16, first_stage_layers=2, last_stage_layers=0)
    assert not alone.problems(wide)
    lone = timing.work(wide, pad_vocab(wide.vocab_size, 1), alone, system)
    assert lone.bubble_layers == 1.0 and 0 < lone.bubble_flops < 1

@pytest.mark.parametrize("precision, per_weight", [("bf16", 2 + 4 + 4), ("fp16", 2 + 2 + 2)])
def test_unfused_gradient_accumulation_adds_a_read_modify_write_of_the_main_gradients(precision, per_weight):
    """Without --gradient-accumulation-fusion each micro-batch's weight gradient is written in 16 bits and added
    into the main gradients (fp32 with bf16, 16-bit with fp16, as Megatron keeps them) by a separate pass."""
    from nlp_bench.plan import timing
    from nlp_bench.spec.systems import load_system

    m, system = get_model("gpt-13b"), load_system("juwels-booster")
    vocab = pad_vocab(m.vocab_size, 2)
    fused = Candidate.of(8, 4, 2, 4, 1, 16, precision=precision)
    unfused = Candidate.of(8, 4, 2, 4, 1, 16, precision=precision, gradient_accumulation_fusion=False)
    extra = timing.work(m, vocab, unfused, system).elementwise_bytes - timing.work(m, vocab, fused, system).elementwise_bytes
    assert extra == pytest.approx(memory.parameters_on_most_loaded_shard(m, vocab, fused) * per_weight)
    eff = timing.Efficiency()
    assert timing.estimate(m, vocab, unfused, system, eff).iteration_s > timing.estimate(m, vocab, fused, system, eff).iteration_s

def test_the_flag_that_turns_gradient_accumulation_fusion_off_reaches_the_plan():
    from nlp_bench.plan import points
    from nlp_bench.spec.switches import decode

    assert decode({}).gradient_accumulation_fusion and not decode({"no-gradient-accumulation-fusion": True}).gradient_accumulation_fusion
    layout = {"nodes": 8, "devices_per_node": 4, "tp": 2, "pp": 4, "mbs": 1, "gas": 16}
    m = get_model("gpt-13b")
    assert points.candidate(layout, {}, m).switches.gradient_accumulation_fusion
    assert not points.candidate(layout, {"no-gradient-accumulation-fusion": True}, m).switches.gradient_accumulation_fusion

@pytest.mark.parametrize("precision, per_shard_weight, per_weight", [
    ("bf16", 4 + 28 + 6, 4),  # norm read, Adam, fp32 -> bf16 copy; fp32 main gradients zeroed
    ("fp16", 6 + 8 + 4 + 28 + 6, 2),  # and fp16's copy to fp32 and unscale; 16-bit main gradients zeroed
])
def test_the_optimizer_step_streams_each_pass_megatron_runs(precision, per_shard_weight, per_weight):
    from nlp_bench.plan import timing
    from nlp_bench.spec.systems import load_system

    m, system = get_model("gpt-13b"), load_system("juwels-booster")
    vocab = pad_vocab(m.vocab_size, 2)
    c = Candidate.of(8, 4, 2, 4, 1, 16, precision=precision, distributed_optimizer=True)
    params = memory.parameters_on_most_loaded_shard(m, vocab, c)
    assert timing.work(m, vocab, c, system).optimizer_bytes == pytest.approx(
        params / c.layout.dp * per_shard_weight + params * per_weight)

def test_without_the_asynchronous_all_reduce_the_backward_waits_for_two_more_collectives():
    from nlp_bench.plan import timing
    from nlp_bench.spec.switches import decode
    from nlp_bench.spec.systems import load_system

    m, system = get_model("gpt-175b"), load_system("selene")
    vocab = pad_vocab(m.vocab_size, 8)
    for recompute, waited in (("full", 4), ("selective", 2)):
        on = Candidate.of(16, 8, 8, 16, 1, 8, recompute=recompute, sequence_parallel=False)
        off = Candidate.of(16, 8, 8, 16, 1, 8, recompute=recompute, sequence_parallel=False, async_tp_allreduce=False)
        tp_on, tp_off = (timing.work(m, vocab, c, system).tp_bytes for c in (on, off))
        assert tp_off / tp_on == pytest.approx((waited + 2) / waited)
    # under sequence parallelism the flag changes nothing: Megatron turns it off and overlaps its own way
    sp = Candidate.of(16, 8, 8, 16, 1, 8)
    assert timing.work(m, vocab, sp, system).tp_bytes == timing.work(m, vocab, sp.changed(async_tp_allreduce=False), system).tp_bytes
    assert not decode({"no-async-tensor-model-parallel-allreduce": True}).async_tp_allreduce and decode({}).async_tp_allreduce

def _h100_175b():
    from nlp_bench.spec.systems import load_system

    return get_model("gpt-175b"), load_system("h100-8")

def test_with_interleaving_the_data_parallel_collectives_hide_behind_the_chunks_in_turn():
    """With vp chunks each chunk's gradients are reduced as its last backward runs; the chunks' last backwards
    come pp chunk-steps apart and the network serves their shares in turn, so the first share can hide behind
    ((vp - 1) pp + 1) / vp micro-batches of backward, the last only behind its own chunk's step (one micro-batch
    without interleaving: the old model's window for every schedule). The parameter gather likewise before the
    chunks' first forwards."""
    from nlp_bench.plan import timing

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    eff = timing.Efficiency()
    base = Candidate.of(64, 8, 4, 8, 1, 16, overlap_grad_reduce=True, overlap_param_gather=True, overlap_p2p_comm=False)
    for vp in (1, 4, 12):
        w = timing.work(m, vocab, base.changed(vp=vp), system)
        compute = timing.timed(replace(w, reduce_bytes=0.0, gather_bytes=0.0), eff).compute_s
        for scale in (0.05, 0.5, 3.0):  # a reduce shorter than one chunk's step, between, beyond every window
            sized = replace(w, reduce_bytes=w.reduce_bytes * scale, gather_bytes=w.gather_bytes * scale)
            est = timing.timed(sized, eff)
            bandwidth = sized.dp_bandwidth * eff.network
            reduce = sized.reduce_bytes / bandwidth + sized.reduce_steps * sized.latency
            gather = sized.gather_bytes / bandwidth + sized.gather_steps * sized.latency
            expected = 0.0
            for total, per_micro_batch in ((reduce, compute * 2 / 3), (gather, compute / 3)):
                first = total / vp - per_micro_batch / vp
                last = total - ((vp - 1) * 8 + 1) * per_micro_batch / vp
                expected += max(0.0, first, last)
            assert est.dp_exposed_s == pytest.approx(expected)
    late = base.changed(vp=12)
    assert timing.estimate(m, vocab, late, system, eff).dp_exposed_s < \
        timing.estimate(m, vocab, late.changed(vp=1), system, eff).dp_exposed_s

def test_stages_and_data_parallel_groups_lie_where_megatron_numbers_its_ranks():
    """Megatron numbers ranks tp first and pp last: a stage's next stage lies world/pp ranks on, so with dp > 1
    a pipeline that would fit one node still sends across nodes, while a stage's data-parallel group stays
    inside a node whenever tp x cp x dp devices fit one."""
    from nlp_bench.plan import timing
    from nlp_bench.spec.systems import load_system

    m, system = get_model("gpt-13b"), load_system("h100-8")
    vocab = pad_vocab(m.vocab_size, 2)
    inter = system.inter_node_gbps * 1e9
    one_node = timing.work(m, vocab, Candidate.of(1, 8, 2, 2, 1, 8), system)  # dp 2: the job fits a node
    assert one_node.p2p_bandwidth == timing._within_node(system, 2)
    two_nodes = timing.work(m, vocab, Candidate.of(2, 8, 2, 2, 1, 8), system)  # dp 4: stage 1 is the second node
    assert two_nodes.p2p_bandwidth == inter / 8
    assert two_nodes.dp_bandwidth == timing._within_node(system, 4)  # tp 2 x dp 4 devices: one node a stage
    spread = timing.work(m, vocab, Candidate.of(4, 8, 2, 2, 1, 8), system)  # dp 8: a stage spans two nodes
    assert spread.dp_bandwidth == inter / 8

def test_overlapped_pipeline_sends_cost_only_what_outlasts_a_chunk():
    """With interleaving Megatron sends the forward's activations behind a chunk's backward and the backward's
    gradients behind a forward: each send costs only what outlasts that chunk."""
    from nlp_bench.plan import timing
    from nlp_bench.spec.switches import decode

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    eff = timing.Efficiency()
    waited_work = timing.work(m, vocab, Candidate.of(64, 8, 4, 8, 1, 16, vp=12, overlap_p2p_comm=False), system)
    first = timing.timed(waited_work, eff)
    chunk, one = (first.compute_s + first.tp_s) / 12, first.p2p_s / 2
    assert one < chunk / 3
    # sends shorter than either chunk, between a forward's and a backward's, longer than both
    for scale in (1.0, chunk / 2 / one, 3 * chunk / one):
        waited = timing.timed(replace(waited_work, p2p_bytes=waited_work.p2p_bytes * scale), eff)
        hidden = timing.timed(replace(waited_work, p2p_bytes=waited_work.p2p_bytes * scale, overlap_p2p=True), eff)
        chunk = (waited.compute_s + waited.tp_s) / 12
        one = waited.p2p_s / 2
        assert hidden.p2p_s == pytest.approx(max(0.0, one - chunk * 2 / 3) + max(0.0, one - chunk / 3))
        assert hidden.iteration_s <= waited.iteration_s
    assert 0 < hidden.p2p_s < waited.p2p_s  # the largest sends outlast both chunks, by less than their whole
    c = Candidate.of(64, 8, 4, 8, 1, 16, vp=12)
    assert timing.work(m, vocab, c, system).overlap_p2p and not timing.work(m, vocab, c.changed(vp=1), system).overlap_p2p
    assert not timing.work(m, vocab, c.changed(overlap_p2p_comm=False), system).overlap_p2p
    # a point's flags are the reference's (Megatron-LM 0.4.0rc0), where the overlap is an opt-in
    assert decode({"overlap-p2p-communication": True}).overlap_p2p_comm and not decode({}).overlap_p2p_comm
    assert not decode({"no-overlap-p2p-communication": True}).overlap_p2p_comm

def test_gradients_reduced_in_bf16_move_half_the_bytes():
    from nlp_bench.plan import timing
    from nlp_bench.spec.switches import decode

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    c = Candidate.of(64, 8, 4, 8, 1, 16)
    fp32, bf16 = (timing.work(m, vocab, x, system) for x in (c, c.changed(grad_reduce_in_bf16=True)))
    assert bf16.reduce_bytes == pytest.approx(fp32.reduce_bytes / 2)
    assert bf16.gather_bytes == fp32.gather_bytes  # the weights are gathered in 16 bits either way
    assert decode({"grad-reduce-in-bf16": True}).grad_reduce_in_bf16 and not decode({}).grad_reduce_in_bf16

def test_tensor_parallel_overlap_runs_the_gemms_it_hides_behind_in_tp_chunks():
    """Userbuffers pipeline the forward GEMMs' collectives, and the projection's and fc2's input-gradient
    all-gathers, with their GEMMs in tp chunks: the collectives are hidden, but those GEMMs run on mbs·s/tp
    tokens at a time, slower per FLOP (for GPT, 1/3 + 1/3 · 5/12 of the linear FLOPs; the forward again with
    full recompute)."""
    from nlp_bench.plan import timing

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    eff = timing.Efficiency()
    c = Candidate.of(64, 8, 4, 8, 1, 16, precision="fp8", flash_attention=False)
    # the attention core at the layers' side, so that the BF16 FLOPs run on one curve
    w = replace(timing.work(m, vocab, c.changed(tp_comm_overlap=True), system), core_flops=0.0)
    assert w.chunk_side == min(m.hidden_size / 4, m.seq_length / 4)
    assert w.chunked_flops == pytest.approx(w.fp8_flops * (1 + 5 / 12) / 3)  # FP8 runs the linear layers' FLOPs
    full = timing.work(m, vocab, c.changed(tp_comm_overlap=True, recompute="full"), system)
    assert full.chunked_flops == pytest.approx(full.fp8_flops * (2 + 5 / 12) / 4)
    half8 = eff.gemm_half * 287 / 118
    curve8, chunk8 = (eff.gemm * d / (d + half8) for d in (w.side, w.chunk_side))
    curve = eff.gemm * w.side / (w.side + eff.gemm_half)
    expected = (w.flops - w.fp8_flops) / (w.matmul * curve) + (w.fp8_flops - w.chunked_flops) / (w.fp8_matmul * curve8) \
        + w.chunked_flops / (w.fp8_matmul * chunk8) + w.elementwise_bytes / (w.memory_bandwidth * eff.memory)
    assert timing.timed(w, eff).compute_s == pytest.approx(expected)
    plain, overlapped = (timing.estimate(m, vocab, x, system, eff) for x in (c, c.changed(tp_comm_overlap=True)))
    assert overlapped.compute_s > plain.compute_s and overlapped.tp_s < plain.tp_s
    assert timing.work(m, vocab, c.changed(tp_comm_overlap=True, sequence_parallel=False), system).chunked_flops == 0

def test_fp8_gemms_need_wider_sides_to_reach_their_rate():
    """Measured on an H100 and an H200, an FP8 GEMM reaches half its (twice as fast) rate at a side 287/118
    times wider than a BF16 one: FP8's gain shrinks on narrow GEMMs, as MLPerf's tp 4 chunks show."""
    from nlp_bench.plan import timing

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    eff = timing.Efficiency()
    w = replace(timing.work(m, vocab, Candidate.of(64, 8, 4, 8, 1, 16, precision="fp8", flash_attention=False), system),
                core_flops=0.0)  # the attention core at the layers' side, so that the BF16 FLOPs run on one curve
    curve = eff.gemm * w.side / (w.side + eff.gemm_half)
    curve8 = eff.gemm * w.side / (w.side + eff.gemm_half * 287 / 118)
    expected = (w.flops - w.fp8_flops) / (w.matmul * curve) + w.fp8_flops / (w.fp8_matmul * curve8) + \
        w.elementwise_bytes / (w.memory_bandwidth * eff.memory)
    assert timing.timed(w, eff).compute_s == pytest.approx(expected)

@pytest.mark.parametrize("vp, gas", [(1, 16), (2, 8), (4, 16), (12, 8), (12, 32)])
@pytest.mark.parametrize("overlap", [False, True])
def test_the_pipeline_terms_match_a_replay_of_megatrons_schedule(vp, gas, overlap):
    """The steady state, the bubble and the sends against a step-by-step replay of Megatron's 1F1B schedule
    (tests/pipeline_schedule.py) on stages of equal work. Overlapped sends hide behind the steps, but the first
    micro-batch's forward and backward still wait for each of their 2 (pp·vp - 1) sends through every chunk,
    and with as many micro-batches as stages (vp 2 and 12 at gas 8) the warm-up's and the cool-down's are
    waited for too: exact while a send is shorter than a chunk's forward, a little over beyond. Waited sends
    delay every step; the closed form charges a pair every step, where the last stage's last chunk and the
    first stage's first chunk have nothing to send: a little over, never under."""
    from pipeline_schedule import makespan

    from nlp_bench.plan import timing

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    eff = timing.Efficiency()
    c = Candidate.of(64, 8, 4, 8, 1, gas, vp=vp, overlap_p2p_comm=overlap, flash_attention=False)
    w = replace(timing.work(m, vocab, c, system), tp_bytes=0.0, tp_steps=0, reduce_bytes=0.0, reduce_steps=0,
                gather_bytes=0.0, gather_steps=0, optimizer_bytes=0.0, bubble_flops=1.0, bubble_layers=1.0)
    assert w.overlap_p2p == (overlap and vp > 1)
    step = timing.timed(w, eff).compute_s / vp
    one = w.p2p_bytes / (w.p2p_bandwidth * eff.network) + w.latency
    assert one < step / 3 / 4  # MLPerf's sends: a fraction of a chunk's forward
    for scale in (1.0, 4.0, 1.5 * step / 3 / one):  # the last: a send 1.5 times a chunk's forward
        send = one * scale
        est = timing.timed(replace(w, p2p_bytes=w.p2p_bytes * scale, latency=w.latency * scale), eff)
        replay = makespan(8, vp, gas, step / 3, step * 2 / 3, send, waited_sends=not w.overlap_p2p)
        if w.overlap_p2p and send < step / 3:
            assert est.iteration_s == pytest.approx(replay, rel=1e-9)
        else:  # within 1% while sends are short, a few percent where one outlasts a chunk's forward
            assert replay <= est.iteration_s <= replay * (1.01 if send < step / 3 else 1.04)
        assert est.iteration_s == pytest.approx(gas * timing.timed(w, eff).compute_s * (1 + 7 / vp / gas) + est.sends_s)

def test_fp8_casts_each_weight_once_an_iteration():
    """Transformer Engine casts a weight to FP8 at the iteration's first micro-batch and reuses the cast: a
    read in 16 bits and two FP8 writes (as is and transposed) per linear weight of the stage, once."""
    from nlp_bench.plan import timing

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    eff = timing.Efficiency()
    c = Candidate.of(64, 8, 4, 8, 1, 16, precision="fp8")
    w = timing.work(m, vocab, c, system)
    h, f = m.hidden_size, m.ffn_hidden_size
    assert w.weight_cast_bytes == pytest.approx(12 * (4 * h * h + 2 * h * f) / 4 * 4)  # 12 layers a stage
    assert timing.work(m, vocab, c.changed(precision="bf16"), system).weight_cast_bytes == 0
    for gas in (16, 64):
        sized = replace(w, micro_batches=gas)
        without = timing.timed(replace(sized, weight_cast_bytes=0.0), eff).iteration_s
        assert timing.timed(sized, eff).iteration_s - without == \
            pytest.approx(w.weight_cast_bytes / (w.memory_bandwidth * eff.memory))

@pytest.mark.parametrize("precision, bf16_reduce, grad", [("bf16", False, 4), ("bf16", True, 2), ("fp16", False, 2)])
def test_the_gradient_buffer_holds_what_megatron_accumulates_in(precision, bf16_reduce, grad):
    """Megatron accumulates gradients in fp32 with bf16, in the weights' 16 bits with fp16 (unless
    --accumulate-allreduce-grads-in-fp32) and with --grad-reduce-in-bf16: the buffer the memory holds and
    the reduce moves are the same bytes."""
    from nlp_bench.plan import timing

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    c = Candidate.of(64, 8, 4, 8, 1, 16, precision=precision, grad_reduce_in_bf16=bf16_reduce, distributed_optimizer=False)
    assert memory.bytes_per_parameter(c) == 2 + grad + 12
    w = timing.work(m, vocab, c, system)
    params = memory.parameters_on_most_loaded_shard(m, vocab, c)
    assert w.reduce_bytes == pytest.approx(2 * 15 / 16 * params * grad)  # a ring all-reduce over dp 16

def test_fp8_param_gather_keeps_and_gathers_the_linear_weights_in_one_byte():
    """Transformer Engine keeps each linear weight's FP8 cast as is and transposed beside its 16 bits (2 bytes
    more); --fp8-param-gather (NeMo's fp8_params) keeps the weight itself in FP8 and its transpose (the 16
    bits' worth), gathers it in one byte, writes one from the optimizer, and casts only the transpose each
    iteration. GPT-3 175B at tp 4, pp 8: 12 layers of 12 x 12288^2 / 4 = 452,984,832 linear weights a stage."""
    from nlp_bench.plan import timing
    from nlp_bench.spec.switches import decode

    m, system = _h100_175b()
    vocab = pad_vocab(m.vocab_size, 4)
    c = Candidate.of(64, 8, 4, 8, 1, 16, precision="fp8")
    kept = c.changed(fp8_param_gather=True)
    linear = 12 * 452_984_832
    plain, fp8 = (timing.work(m, vocab, x, system) for x in (c, kept))
    assert plain.gather_bytes - fp8.gather_bytes == pytest.approx(15 / 16 * linear)  # dp 16, a byte less each
    assert fp8.weight_cast_bytes == pytest.approx(2 * linear) and plain.weight_cast_bytes == pytest.approx(4 * linear)
    assert plain.optimizer_bytes - fp8.optimizer_bytes == pytest.approx(linear / 16)  # the shard's weights written
    bf16 = memory.footprint(m, vocab, c.changed(precision="bf16")).weights_and_optimizer
    assert memory.footprint(m, vocab, c).weights_and_optimizer - bf16 == pytest.approx(10_871_635_968)
    assert memory.footprint(m, vocab, kept).weights_and_optimizer == pytest.approx(bf16)
    assert decode({"fp8-param-gather": True}).fp8_param_gather and not decode({}).fp8_param_gather
    # Megatron refuses it without FP8 or the distributed optimizer: so does every path into the planner
    for wrong in (kept.changed(precision="bf16"), kept.changed(distributed_optimizer=False)):
        assert wrong.problems(m) == [FP8_PARAM_GATHER_NEEDS]

def test_fp8_is_bf16_training_and_the_overlap_flags_of_a_point_reach_the_plan():
    """--fp8-format with fp16 training is not the planner's fp8 (as before the one vocabulary); a point's
    --tp-comm-overlap reaches the plan (it was read from rows files only)."""
    from nlp_bench.plan.points import candidate

    m = get_model("gpt-175b")
    layout = {"nodes": 64, "devices_per_node": 8, "tp": 4, "pp": 8, "mbs": 1, "gas": 16}
    fp16 = candidate(layout, {"fp16": True, "fp8-format": "hybrid"}, m).switches
    assert not fp16.fp8 and fp16.compute_precision == "fp16"
    on = candidate(layout, {"bf16": True, "sequence-parallel": True, "tp-comm-overlap": True}, m).switches
    assert on.tp_comm_overlap and on.problems() == []
    assert candidate(layout, {"bf16": True, "tp-comm-overlap": True}, m).switches.problems() == [
        "tp_comm_overlap needs sequence_parallel (Megatron-LM refuses it without)"]


@pytest.mark.parametrize("given, needle", [
    ({"precision": "fp32"}, "precision must be one of bf16, fp16, fp8"),
    ({"precision": "fp16", "fp8_format": "e4m3"}, "fp8_format goes with bf16 training (precision fp8), not fp16"),
    ({"recompute": "maybe"}, "recompute must be one of none, selective, full"),
    ({"sequence_parallel": "yes"}, "sequence_parallel must be true or false"),
    ({"fp8_param_gather": True}, "fp8_param_gather needs precision fp8 and the distributed optimizer"),
])
def test_stated_settings_are_checked_in_one_line_naming_the_place(given, needle):
    from nlp_bench.errors import SpecError
    from nlp_bench.plan.candidate import STATED_START
    from nlp_bench.spec.switches import SETTING_KEYS, read_settings

    with pytest.raises(SpecError, match="^" + re.escape(f"rows.yaml row 3: {needle}")):
        read_settings(given, STATED_START, "rows.yaml row 3")
    # what the planner does not model is no key a row may give
    assert "masked_softmax_fusion" not in SETTING_KEYS and "recompute_method" not in SETTING_KEYS
    assert read_settings({"precision": "fp8"}, STATED_START, "x").compute_precision == "fp8"


def test_a_corpus_row_is_checked_as_a_rows_file_is(tmp_path):
    from nlp_bench.errors import PlanError
    from nlp_bench.plan.corpus import corpus_path, load_corpus

    text = corpus_path().read_text()
    first = text.index("    layout: {")
    rest = text[first + len("    layout: {"):].replace("    flash_attention: true\n", "    flash_attention: false\n", 1)
    (tmp_path / "cp.yaml").write_text(text[:first] + "    layout: {cp: 2, " + rest)
    with pytest.raises(PlanError, match="needs flash attention"):
        load_corpus(tmp_path / "cp.yaml")
    (tmp_path / "odd.yaml").write_text(text[:first] + "    layout: {colour: 2, " + text[first + len("    layout: {"):])
    with pytest.raises(PlanError, match="unknown layout key"):
        load_corpus(tmp_path / "odd.yaml")


def test_a_points_fp8_flags_plan_fp8_and_its_weights_in_fp8():
    """A point's Megatron flags reach the planner's FP8: --bf16 with --fp8-format times the linear layers in
    FP8, and --fp8-param-gather keeps their weights in FP8 only there, with the distributed optimizer."""
    from nlp_bench.plan.points import candidate

    m = get_model("gpt-175b")
    layout = {"nodes": 64, "devices_per_node": 8, "tp": 4, "pp": 8, "mbs": 1, "gas": 16}
    flags = {"bf16": True, "fp8-format": "hybrid", "fp8-param-gather": True, "use-distributed-optimizer": True}
    c = candidate(layout, flags, m)
    assert c.switches.fp8 and c.switches.fp8_param_gather and c.switches.problems() == []
    assert candidate(layout, {**flags, "fp8-format": None}, m).switches.problems() == [FP8_PARAM_GATHER_NEEDS]
    assert candidate(layout, {"bf16": True}, m).switches.precision == "bf16"
