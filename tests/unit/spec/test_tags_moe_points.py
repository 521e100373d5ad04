"""Mixture-of-experts tags: ep and expert tp in a tag, its systems block and Benchmark.point; the point's id;
the expert flags as a derived part of the jobscript that both trainers' parsers read back; the Megatron-LM MoE
flags NVIDIA's recipes use; the published layouts of the big tags, each with its source; a Megatron-LM
without mixture of experts refused in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

from nlp_bench.errors import LayoutError, SpecError
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args, jobscript_layout
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.target import for_megatron
from nlp_bench.train.args import build_parser

#: tag -> nodes, tp, pp, ep, expert tp, vp, mbs, global batch, sequence: the layouts of the sources the tags
#: name (benchmark/nlp.yaml, each tag's comment)
PUBLISHED = {"mixtral-8x7b": (8, 1, 4, 8, 1, 8, 1, 256, 4096), "qwen3-30b-a3b": (2, 1, 1, 16, 1, 1, 1, 1024, 4096),
             "gpt-oss-20b": (2, 2, 4, 4, 1, 1, 1, 512, 4096), "deepseek-v3": (128, 2, 16, 64, 1, 1, 1, 8192, 4096)}


@pytest.fixture(scope="module")
def nlp():
    return load_benchmark()


def test_smoke_moe_is_expert_parallel_over_the_data_parallel_ranks(nlp):
    point = nlp.point("smoke-moe")
    lay = point.layout
    assert (lay.nodes, lay.tp, lay.pp, lay.dp, lay.ep, lay.expert_tp, lay.edp) == (1, 1, 1, 2, 2, 1, 1)
    assert point.id == "moe-tiny_n1_tp1_pp1_ep2_mbs2_gas2"
    assert "bf16" not in point.train and point.train["moe-aux-loss-coeff"] == 0.01 and point.system.backend == "gloo"
    on_slurm = nlp.point("smoke-moe", "local-slurm").layout
    assert (on_slurm.nodes, on_slurm.dp, on_slurm.ep, on_slurm.edp) == (2, 4, 2, 2)


def test_ep_and_etp_are_overridden_like_tp_and_named_in_the_id(nlp):
    assert nlp.point("smoke-moe", ep=1).id == "moe-tiny_n1_tp1_pp1_mbs2_gas2"
    assert nlp.point("smoke-moe", "local-slurm", ep=4, etp=1).id == "moe-tiny_n2_tp1_pp1_ep4_etp1_mbs2_gas2"
    assert "_ep4_etp1_" in nlp.point("gpt-oss-20b").id
    with pytest.raises(LayoutError, match="ep 3 must divide the 4 experts"):
        nlp.point("smoke-moe", "local-slurm", ep=3)
    with pytest.raises(LayoutError, match=r"expert tp 2 x ep 2 x pp 1 does not divide the 2 devices"):
        nlp.point("smoke-moe", etp=2)
    with pytest.raises(LayoutError, match=r"expert parallelism \(ep 2\) needs a model with experts"):
        nlp.point("smoke", ep=2)


def _benchmark(tmp_path: Path, tag: str) -> Path:
    path = tmp_path / "b.yaml"
    path.write_text(f"name: b\ntags:\n  t:\n    model: moe-tiny\n    system: local\n    nodes: 1\n{tag}")
    return path


def test_a_tag_gives_ep_per_system_but_never_as_a_train_flag(tmp_path):
    path = _benchmark(tmp_path, "    systems: {local-slurm: {nodes: 2, ep: 4, etp: 1}}\n    train: {lr: 0.1}\n")
    assert load_benchmark(str(path)).point("t", "local-slurm").id == "moe-tiny_n2_tp1_pp1_ep4_etp1_mbs1_gas1"
    for flag in ("expert-model-parallel-size", "expert-tensor-parallel-size"):
        path = _benchmark(tmp_path, f"    train: {{lr: 0.1, {flag}: 2}}\n")
        with pytest.raises(SpecError, match=f"train may not set {flag} \\(they follow from model and layout\\)"):
            load_benchmark(str(path)).point("t")


def test_the_jobscript_passes_the_expert_layout_and_both_parsers_read_it(nlp):
    point = nlp.point("gpt-oss-20b")
    text = render_jobscript(point)
    argv = jobscript_args(text, point.id)
    assert argv[argv.index("--expert-model-parallel-size") + 1] == "4"
    assert argv[argv.index("--expert-tensor-parallel-size") + 1] == "1"
    stated = jobscript_layout(text, point.id)
    assert stated["ep"] == (4, "--expert-model-parallel-size") and stated["etp"] == (1, "--expert-tensor-parallel-size")
    assert "ep 4 x expert tp 1 x expert dp 1" in text.splitlines()[3]
    smoke = nlp.point("smoke-moe")
    parsed = build_parser().parse_args(jobscript_args(render_jobscript(smoke), smoke.id))
    assert (parsed.expert_model_parallel_size, parsed.expert_tensor_parallel_size) == (2, None)
    dense = render_jobscript(nlp.point("smoke"))
    assert "expert" not in dense and "EP_SIZE" not in dense


def test_megatron_lm_points_of_moe_models_run_grouped_gemm_and_all_to_all(nlp):
    moe = nlp.point("mixtral-8x7b", trainer="megatron-lm").train
    assert moe["moe-grouped-gemm"] is True and moe["moe-token-dispatcher-type"] == "alltoall"
    for point in (nlp.point("mixtral-8x7b"), nlp.point("llama3-8b", trainer="megatron-lm")):
        assert not {"moe-grouped-gemm", "moe-token-dispatcher-type"} & set(point.train)
    # the built-in trainer reads the same flags
    parsed = build_parser().parse_args(["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
                                        "--seq-length", "8", "--micro-batch-size", "1", "--lr", "0.1",
                                        "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"])
    assert parsed.moe_grouped_gemm and parsed.moe_token_dispatcher_type == "alltoall"


@pytest.mark.parametrize("tag", PUBLISHED)
def test_each_big_tag_is_the_layout_of_its_published_source(nlp, tag):
    nodes, tp, pp, ep, etp, vp, mbs, gbs, seq = PUBLISHED[tag]
    point = nlp.point(tag)
    lay = point.layout
    assert (point.system.name, lay.nodes, lay.tp, lay.pp, lay.ep, lay.expert_tp, lay.vp, lay.mbs,
            lay.global_batch_size, point.model.seq_length) == ("h100-8", nodes, tp, pp, ep, etp, vp, mbs, gbs, seq)
    text = (ROOT / "benchmark" / "nlp.yaml").read_text()
    block = re.search(rf"\n  {re.escape(tag)}:\n(.*?)(?=\n  \S|\Z)", text, re.S)[1]
    assert "https://" in block and "GBS" in block, f"tag {tag} names no source of its layout"


def test_deepseek_v3s_uneven_stages_come_from_its_train_block(nlp):
    point = nlp.point("deepseek-v3")
    assert (point.layout.first_stage_layers, point.layout.last_stage_layers) == (3, 2)
    assert point.layout.stage_layers(61) == (3, 4.0, 2)
    assert point.train["decoder-first-pipeline-num-layers"] == 3


def test_the_built_in_trainer_is_marked_unable_where_the_model_needs_what_it_lacks(nlp):
    lacking = {tag: nlp.point(tag).unrunnable for tag in PUBLISHED}
    assert lacking["mixtral-8x7b"] is None
    assert "query/key layernorm" in lacking["qwen3-30b-a3b"]
    assert "attention sinks" in lacking["gpt-oss-20b"] and "sliding-window attention" in lacking["gpt-oss-20b"]
    assert "multi-head latent attention" in lacking["deepseek-v3"]
    assert all(nlp.point(tag, trainer="megatron-lm").unrunnable is None for tag in PUBLISHED)


def test_a_megatron_lm_without_mixture_of_experts_is_refused_in_one_line(nlp):
    point = nlp.point("mixtral-8x7b", trainer="megatron-lm")
    with pytest.raises(SpecError) as refused:
        for_megatron(point, Checkout(Path("/site/Megatron-LM"), "0.4.0rc0", None))
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith("tag 'mixtral-8x7b' on h100-8: Megatron-LM 0.4.0rc0 (f772743329) has no mixture of "
                           "experts as model mixtral-8x7b needs it (no --expert-model-parallel-size, ")
    assert "--moe-router-topk" in said and "use a Megatron-LM that has it (0.20.0; set MEGATRON_LM_REPO" in said
    assert "--num-experts" not in said  # that version has the flag (a switch MLP), not what the model needs
    assert for_megatron(point, Checkout(Path("/site/Megatron-LM"), "0.20.0", None)).megatron_lm["version"] == "0.20.0"


def test_the_layout_rules_read_the_experts_of_the_models_moe_spec():
    """The rules once looked for `num_experts` on the model itself, which has its experts in `moe`: every ep > 1
    was refused as a model without experts."""
    from nlp_bench.spec.layout import Layout, valid_layout
    from nlp_bench.spec.models import get_model

    assert valid_layout(get_model("moe-tiny"), Layout(1, 2, 1, 1, 1, 1, ep=2)).edp == 1
    with pytest.raises(LayoutError, match="ep 8 must divide the 4 experts"):
        valid_layout(get_model("moe-tiny"), Layout(4, 2, 1, 1, 1, 1, ep=8))
