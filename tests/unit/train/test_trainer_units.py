"""Single-process checks of the trainer's pieces (no process group needed).

The runs of the trainer start once, together, from one launcher (`runs`); each test reads its own."""

import math

import pytest
import torch
import torch.nn.functional as F

from nlp_bench.kernels import vocab_parallel_cross_entropy
from nlp_bench.spec.layout import grid_rank
from nlp_bench.train.args import UsageError, parse_args
from nlp_bench.train.batches import MockData
from nlp_bench.train.lr_schedule import LRSchedule
from nlp_bench.train.model import apply_rope, rope_tables
from nlp_bench.train.optimizer import LossScaler

BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "3", "--mock-data", "--vocab-size", "100",
        "--eval-iters", "0"]

def test_vocab_parallel_cross_entropy_matches_torch_on_one_rank():
    torch.manual_seed(0)
    logits = torch.randn(5, 3, 37, dtype=torch.float64, requires_grad=True)
    target = torch.randint(37, (5, 3))
    ours = vocab_parallel_cross_entropy(logits, target, 0, None)
    ref = F.cross_entropy(logits.reshape(-1, 37), target.reshape(-1), reduction="none").view(5, 3)
    assert torch.allclose(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.square().sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), logits)
    assert torch.allclose(g_ours, g_ref)

def test_megatron_lr_schedule_in_samples():
    s = LRSchedule(1e-4, 1e-5, warmup=216320, decay=300_000_000, style="cosine")
    assert s.at(0) == 0.0
    assert f"{s.at(960):.3E}" == "4.438E-07"  # the JUPITER benchmark README's 175B log, iteration 10
    assert s.at(216320) == pytest.approx(1e-4)
    assert s.at(300_000_000) == pytest.approx(1e-5) and s.at(400_000_000) == 1e-5
    mid = 216320 + (300_000_000 - 216320) / 2
    assert s.at(int(mid)) == pytest.approx(5.5e-5, rel=1e-4)
    lin = LRSchedule(1.0, 0.0, warmup=0, decay=10, style="linear")
    assert [lin.at(i) for i in (0, 5, 10)] == [1.0, 0.5, 0.0]

def test_rank_order_is_tp_fastest():
    # tp=2, dp=2, pp=2: ranks 0,1 share tp group; 0,2 share dp; 0,4 share pp
    assert [grid_rank(t, 0, 0, 2, 2) for t in range(2)] == [0, 1]
    assert [grid_rank(0, d, 0, 2, 2) for d in range(2)] == [0, 2]
    assert [grid_rank(0, 0, p, 2, 2) for p in range(2)] == [0, 4]

def test_mock_data_is_addressed_by_sample():
    data = MockData(100, 16, seed=3)
    tokens, labels = data.batch(10, 4)
    assert tokens.shape == labels.shape == (4, 16)
    assert torch.equal(tokens[2], data.batch(12, 1)[0][0])
    assert torch.equal(tokens[:, 1:], labels[:, :-1])
    assert int(tokens.max()) < 100

def test_rope_preserves_norm_and_relative_position():
    cos, sin = rope_tables(8, 4)
    x = torch.randn(1, 1, 8, 4)
    assert torch.allclose(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-6)
    q, k = torch.randn(4), torch.randn(4)
    def dot(i, j):
        qi = apply_rope(q.expand(1, 1, 8, 4), cos, sin)[0, 0, i]
        kj = apply_rope(k.expand(1, 1, 8, 4), cos, sin)[0, 0, j]
        return float(qi @ kj)
    assert math.isclose(dot(3, 1), dot(6, 4), rel_tol=1e-5)

@pytest.mark.parametrize("extra,needle", [
    (["--data-path", "x"], "give either --mock-data or --data-path PREFIX"),
    (["--train-samples", "10"], "exactly one of --train-iters and --train-samples"),
    (["--seq-length", "4096", "--max-position-embeddings", "2048"], "exceeds --max-position-embeddings"),
])
def test_refused_flags(extra, needle):
    with pytest.raises(UsageError, match=needle):
        parse_args(BASE + extra)

@pytest.mark.parametrize("extra,needle", [
    (["--bf16", "--fp16"], "exclude each other"),
    (["--recompute-method", "uniform"], "go with --recompute-granularity full"),
])
def test_refused_flag_combinations(extra, needle):
    from nlp_bench.train.config import build_config

    with pytest.raises(UsageError, match=needle):
        build_config(parse_args(BASE + extra), world=1)

def test_recompute_activations_means_selective():
    from nlp_bench.train.config import build_config

    selective = build_config(parse_args(BASE + ["--recompute-activations"]), world=1)
    assert selective.switches.recompute == selective.model.recompute == "selective"
    full = build_config(parse_args(BASE + ["--recompute-granularity", "full"]), world=1).model
    assert (full.recompute, full.recompute_method, full.recompute_num_layers) == ("full", "uniform", 1)

def test_the_trainer_reads_its_flags_as_the_planner_and_the_sweep_do():
    """The namespace under Megatron's names: a switch that turns a fused op off is true where given."""
    from nlp_bench.spec.switches import decode
    from nlp_bench.train.args import flag_values

    found = flag_values(parse_args(BASE + ["--no-bias-gelu-fusion", "--bf16", "--sequence-parallel"]))
    assert found["no-bias-gelu-fusion"] is True and found["no-cross-entropy-loss-fusion"] is False
    on = decode(found)
    assert (on.precision, on.sequence_parallel, on.unfused) == ("bf16", True, {"bias_gelu": "--no-bias-gelu-fusion"})

def test_loss_scaler_follows_megatron():
    s = LossScaler(scale=1024.0, window=3, hysteresis=2, min_scale=256.0)
    s.update(True)
    assert s.scale == 1024.0  # the first overflow only uses up hysteresis
    s.update(True)
    assert s.scale == 512.0
    s.update(True)
    assert s.scale == 256.0
    s.update(True)
    assert s.scale == 256.0  # never below the minimum
    for _ in range(3):
        s.update(False)
    assert s.scale == 512.0  # doubled after a clean window

def test_fp32_gradients_accumulate_in_the_flat_buffer(tmp_path):
    """The optimizer's speed rests on autograd adding into views of one buffer; check it really does."""
    import torch.distributed as dist

    from nlp_bench.train.grad_buffer import GradBuffer
    from nlp_bench.train.optimizer import FlatAdam
    from nlp_bench.train.process_groups import build_process_groups

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        groups = build_process_groups(1, 1)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        grads = GradBuffer(model, groups, shards=1)
        opt = FlatAdam(grads, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, clip_grad=0.0, scaler=None)
        buffer = (grads.main_grad.data_ptr(), grads.main_grad.data_ptr() + grads.main_grad.numel() * 4)
        for _ in range(2):  # two micro-batches accumulate
            model(torch.randn(5, 4)).square().sum().backward()
        for p in model.parameters():
            assert buffer[0] <= p.grad.data_ptr() < buffer[1]
            assert buffer[0] <= p.main_grad.data_ptr() < buffer[1]
        before = [p.detach().clone() for p in model.parameters()]
        skipped, norm = opt.step(1e-2)
        assert not skipped and norm > 0
        assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=False))
    finally:
        dist.destroy_process_group()

def test_the_model_shape_has_one_list_of_names():
    """ModelSpec's shape fields are what the sweep varies and what the trainer's GPTConfig is built from."""
    from dataclasses import fields

    from nlp_bench.spec.models import SHAPE
    from nlp_bench.sweep.grid import MODEL
    from nlp_bench.train.config import GPTConfig

    assert SHAPE == MODEL == ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
                              "max_position_embeddings")
    assert set(SHAPE) <= {f.name for f in fields(GPTConfig)}

@pytest.mark.parametrize("extra,needle", [
    (["--profile"], "add --use-pytorch-profiler"),
    (["--profile", "--use-pytorch-profiler", "--profile-step-start", "3", "--profile-step-end", "3"],
     "below --profile-step-end"),
])
def test_refused_profile_flags(extra, needle):
    with pytest.raises(UsageError, match=needle):
        parse_args(BASE + extra)

@pytest.mark.parametrize("name,label", [
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "gemm"), ("aten::addmm", "gemm"),
    ("flash_fwd_kernel", "attention"), ("triton_layer_norm_fwd", "norm/elementwise"),
    ("multi_tensor_apply_kernel", "optimizer"), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("cross_entropy_fwd_kernel", "loss"), ("cudaStreamSynchronize", "other"),
])
def test_profile_categories(name, label):
    from nlp_bench.train.profiling import category

    assert category(name) == label

def test_nccl_runs_keep_a_cpu_backend_for_the_scalar_collectives(monkeypatch):
    """The interval loss sums, inf checks and validation loss are CPU tensors: under NCCL alone their first
    all-reduce over dp, tp or pp > 1 fails ("No backend type associated with device type cpu"); the trainer
    asks for gloo beside NCCL so they go over gloo."""
    import torch
    import torch.distributed as dist

    from nlp_bench.train import trainer

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: seen.setdefault("backend", backend))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "1")
    device = trainer.init_distributed("nccl")
    assert device == torch.device("cuda", 1)
    assert set(seen["backend"].split(",")) == {"cpu:gloo", "cuda:nccl"}
    seen.clear()
    assert trainer.init_distributed("gloo") == torch.device("cpu") and seen["backend"] == "gloo"

def _tokenizer_json(folder, words: int) -> None:
    """A small word-level tokenizer.json made with the tokenizers library, as a site's would be."""
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(words)}
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(folder / "tokenizer.json"))

def test_huggingface_tokenizer_gives_the_vocabulary(tmp_path):
    _tokenizer_json(tmp_path, 321)
    rest = [a for a in BASE if a not in ("--vocab-size", "100")]
    args = parse_args([*rest, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path)])
    assert args.vocab_size == 321
    args = parse_args([*rest, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                       str(tmp_path / "tokenizer.json")])
    assert args.vocab_size == 321
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    for model, words in ((None, "needs --tokenizer-model"), (tmp_path / "none", "not found"),
                         (tmp_path / "broken", "is not a tokenizer.json")):
        extra = [] if model is None else ["--tokenizer-model", str(model)]
        with pytest.raises(UsageError, match=words):
            parse_args([*rest, "--tokenizer-type", "HuggingFaceTokenizer", *extra])

@pytest.mark.parametrize("flags,words", [
    (["--group-query-attention", "--num-query-groups", "3"], "--num-query-groups 3 must divide --num-attention-heads 4"),
    (["--group-query-attention", "--num-query-groups", "0"], "--num-query-groups 0 must divide"),
    (["--rotary-base", "0"], "--rotary-base must be at least 1"),
])
def test_bad_attention_flags_are_one_line(flags, words):
    with pytest.raises(UsageError, match=words):
        parse_args([*BASE, *flags])

def test_without_group_query_attention_every_head_is_its_own_group():
    assert parse_args([*BASE, "--num-query-groups", "2"]).num_query_groups == 4
    assert parse_args([*BASE, "--group-query-attention", "--num-query-groups", "2"]).num_query_groups == 2

def test_a_gpu_profile_counts_each_kernels_time_once():
    """Under the kineto profiler a CPU operator (aten::mm) carries the device time of the kernel it launched,
    and the kernel has its own event: the split counted both, so the GEMMs took twice their time and the
    host gap vanished. Step markers (user annotations) span kernels and are not one."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from nlp_bench.train.profiling import summarise_profile

    def event(key, device, micros, annotation=False):
        return SimpleNamespace(key=key, device_type=device, self_device_time_total=micros,
                               self_cpu_time_total=5.0, is_user_annotation=annotation, is_legacy=False)

    events = [event("aten::mm", DeviceType.CPU, 600.0), event("sm90_xmma_gemm_bf16_tn", DeviceType.CUDA, 600.0),
              event("flash_fwd_kernel", DeviceType.CUDA, 200.0), event("ProfilerStep#3", DeviceType.CUDA, 990.0, True)]
    found = summarise_profile(events, wall_s=0.001, steps=1, device_type="cuda")
    shares = {k: round(v["ms_per_step"], 6) for k, v in found["categories"].items()}
    assert shares == {"gemm": 0.6, "attention": 0.2, "host gap": 0.2}
    assert [t["name"] for t in found["top"]] == ["sm90_xmma_gemm_bf16_tn", "flash_fwd_kernel"]
