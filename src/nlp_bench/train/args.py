"""Command-line flags under Megatron-LM's names, so a Megatron user's jobscript reads the same.

What the trainer cannot honour (pipeline parallelism on xla, weighted data blends, contradictory flags) is refused
with one clear line rather than ignored: a benchmark number must never come from a run that silently
dropped a setting.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """A flag combination the trainer cannot run; main() prints it as one line and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse prints the usage and then the error; a job log wants the one line that says what is wrong."""

    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m nlp_bench.train", description=__doc__, allow_abbrev=False)
    for add in (_model_flags, _moe_flags, _fusion_flags, _parallel_flags, _optimizer_flags, _data_flags, _run_flags):
        add(p.add_argument)
    return p


def _model_flags(a) -> None:
    a("--num-layers", type=int, required=True)
    a("--hidden-size", type=int, required=True)
    a("--num-attention-heads", type=int, required=True)
    a("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden size")
    a("--seq-length", type=int, required=True)
    a("--max-position-embeddings", type=int, default=None)
    a("--position-embedding-type", choices=("learned_absolute", "rope"), default="learned_absolute")
    a("--rotary-base", type=int, default=10000, help="base of the rotary embedding's frequencies")
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1, help="key/value heads with --group-query-attention")
    a("--disable-bias-linear", dest="add_bias_linear", action="store_false", help="linear layers without biases")
    a("--init-method-std", type=float, default=0.02)
    a("--hidden-dropout", type=float, default=0.1)
    a("--attention-dropout", type=float, default=0.1)
    a("--layernorm-epsilon", type=float, default=1e-5)
    a("--make-vocab-size-divisible-by", type=int, default=128)
    a("--use-flash-attn", action="store_true")
    a("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    a("--swiglu", action="store_true")
    a("--untie-embeddings-and-output-weights", action="store_true")
    # activation recompute (spec.switches says what each combination means)
    a("--recompute-activations", action="store_true")
    a("--recompute-granularity", choices=("selective", "full"), default=None)
    a("--recompute-method", choices=("uniform", "block"), default=None)
    a("--recompute-num-layers", type=int, default=None)


def _moe_flags(a) -> None:
    """Mixture of experts, under Megatron-LM core_v0.20.0's names and defaults (train/moe.py)."""
    a("--num-experts", type=int, default=None, help="routed experts per MoE layer (none: a dense model)")
    a("--moe-router-topk", type=int, default=2)
    a("--moe-ffn-hidden-size", type=int, default=None, help="each expert's FFN size (default --ffn-hidden-size)")
    a("--moe-shared-expert-intermediate-size", type=int, default=None, help="FFN size of the shared experts")
    a("--moe-layer-freq", type=moe_layer_freq, default=1,
      help='N: every Nth layer is MoE (layer 0 first); or a pattern such as "([0]+[1]*3)*2", 1 for MoE')
    a("--moe-router-score-function", choices=("softmax", "sigmoid"), default="softmax")
    a("--moe-router-load-balancing-type", choices=("aux_loss", "none"), default="aux_loss")
    a("--moe-aux-loss-coeff", type=float, default=0.0)
    a("--moe-expert-capacity-factor", type=float, default=None, help="none: dropless")
    a("--moe-token-drop-policy", choices=("probs", "position"), default="probs")
    a("--moe-grouped-gemm", action="store_true", help="accepted: the experts always run as one batched GEMM here")
    a("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"), default="allgather",
      help="accepted: on one expert-parallel rank every dispatcher is the same local permutation")
    a("--expert-model-parallel-size", type=int, default=1)
    a("--expert-tensor-parallel-size", type=int, default=None, help="default --tensor-model-parallel-size")


def moe_layer_freq(text: str) -> int | list[int]:
    """Megatron's --moe-layer-freq: an int, or a list expression of 0/1 built from lists, + and * (read
    without eval)."""
    import ast

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(text)

    try:
        out = value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor a list pattern") from None
    if isinstance(out, list) and not all(v in (0, 1) for v in out):
        raise argparse.ArgumentTypeError(f"{text!r}: a pattern holds only 0 (dense) and 1 (MoE)")
    return out


def moe_layers(freq: int | list[int], num_layers: int) -> list[bool]:
    """Which layers are MoE, as Megatron reads --moe-layer-freq."""
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(num_layers)]
    return [bool(v) for v in freq]


def _check_moe(args: argparse.Namespace) -> None:
    """The MoE flags on their own; what this first slice of the trainer cannot run is refused by name."""
    moe_only = [f for f, v in (("--moe-ffn-hidden-size", args.moe_ffn_hidden_size),
                               ("--moe-shared-expert-intermediate-size", args.moe_shared_expert_intermediate_size),
                               ("--moe-expert-capacity-factor", args.moe_expert_capacity_factor)) if v is not None]
    if args.num_experts is None:
        if moe_only:
            raise UsageError(f"{moe_only[0]} needs --num-experts")
        return
    for flag in ("expert_model_parallel_size", "expert_tensor_parallel_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    if args.distributed_backend in ("xla", "neuron"):
        raise UsageError(f"--num-experts with --distributed-backend {args.distributed_backend} is not built yet")
    if not 1 <= args.moe_router_topk <= args.num_experts:
        raise UsageError(f"--moe-router-topk {args.moe_router_topk} must be between 1 and --num-experts "
                         f"{args.num_experts}")
    if args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    if args.moe_ffn_hidden_size % args.expert_tensor_parallel_size:
        raise UsageError(f"--expert-tensor-parallel-size {args.expert_tensor_parallel_size} must divide each "
                         f"expert's FFN size {args.moe_ffn_hidden_size} (--moe-ffn-hidden-size)")
    if isinstance(args.moe_layer_freq, list) and len(args.moe_layer_freq) != args.num_layers:
        raise UsageError(f"--moe-layer-freq: the pattern has {len(args.moe_layer_freq)} layers, --num-layers is "
                         f"{args.num_layers}")
    if isinstance(args.moe_layer_freq, int) and args.moe_layer_freq < 1:
        raise UsageError("--moe-layer-freq must be at least 1")
    if args.moe_expert_capacity_factor is not None and args.moe_expert_capacity_factor <= 0:
        raise UsageError("--moe-expert-capacity-factor must be above 0")
    if args.moe_router_load_balancing_type == "none":
        args.moe_aux_loss_coeff = 0.0


def _fusion_flags(a) -> None:
    """Fused ops (nlp_bench.kernels; NLP_BENCH_KERNELS=torch turns all of them off)."""
    a("--no-bias-gelu-fusion", dest="bias_gelu_fusion", action="store_false")
    a("--no-bias-swiglu-fusion", dest="bias_swiglu_fusion", action="store_false")
    a("--no-masked-softmax-fusion", dest="masked_softmax_fusion", action="store_false",
      help="attention as explicit matmul, causal mask and softmax instead of scaled_dot_product_attention")
    a("--no-persist-layer-norm", dest="persist_layer_norm", action="store_false",
      help="one program per row in the Triton norm kernels instead of persistent programs")
    a("--cross-entropy-loss-fusion", action="store_true", default=True, help="the default here")
    a("--no-cross-entropy-loss-fusion", dest="cross_entropy_loss_fusion", action="store_false")
    a("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion", action="store_false",
      help="accepted: weight gradients always reach the fp32 buffer by a hook, which is this path")


def _parallel_flags(a) -> None:
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    a("--sequence-parallel", action="store_true")
    a("--use-distributed-optimizer", action="store_true")
    a("--ddp-bucket-size", type=int, default=None,
      help="elements per data-parallel gradient bucket (default max(40M, 1M x dp), as Megatron)")
    # neuron: native PyTorch on Trainium (TorchNeuron's device and process group), beside xla (torch-xla)
    a("--distributed-backend", choices=("nccl", "gloo", "xla", "neuron"), default="nccl")
    a("--micro-batch-size", type=int, required=True)
    a("--global-batch-size", type=int, default=None)


def _optimizer_flags(a) -> None:
    """The optimiser, the learning-rate schedule and the precision (the fp16 loss-scale knobs are accepted:
    inert while fp16 is off, as in Megatron)."""
    a("--optimizer", choices=("adam",), default="adam")
    a("--lr", type=float, required=True)
    a("--min-lr", type=float, default=0.0)
    a("--lr-decay-style", choices=("constant", "linear", "cosine"), default="linear")
    a("--lr-decay-iters", type=int, default=None)
    a("--lr-decay-samples", type=int, default=None)
    a("--lr-warmup-iters", type=int, default=0)
    a("--lr-warmup-samples", type=int, default=0)
    a("--lr-warmup-fraction", type=float, default=None)
    a("--weight-decay", type=float, default=0.01)
    a("--adam-beta1", type=float, default=0.9)
    a("--adam-beta2", type=float, default=0.999)
    a("--adam-eps", type=float, default=1e-8)
    a("--clip-grad", type=float, default=1.0)
    a("--bf16", action="store_true")
    a("--fp16", action="store_true")
    a("--initial-loss-scale", type=float, default=2.0 ** 32)
    a("--loss-scale-window", type=int, default=1000)
    a("--hysteresis", type=int, default=2)
    a("--min-loss-scale", type=float, default=1.0)


def _data_flags(a) -> None:
    a("--mock-data", action="store_true")
    a("--data-path", nargs="*", default=None)
    a("--split", default="969,30,1")
    a("--vocab-size", type=int, default=None, help="vocabulary size for --mock-data without a vocab file")
    a("--vocab-file", default=None)
    a("--merge-file", default=None)
    a("--tokenizer-type", choices=("GPT2BPETokenizer", "HuggingFaceTokenizer", "NullTokenizer"),
      default="GPT2BPETokenizer")
    a("--tokenizer-model", default=None, help="HuggingFaceTokenizer: a tokenizer.json, or a folder holding one")


def _run_flags(a) -> None:
    """Length of training, logging, checkpoints, profiling, reproducibility."""
    a("--train-iters", type=int, default=None)
    a("--train-samples", type=int, default=None)
    a("--log-interval", type=int, default=100)
    a("--eval-interval", type=int, default=1000, help="evaluate on the validation split every this many iterations")
    a("--eval-iters", type=int, default=100, help="global batches per evaluation (0: no evaluation)")
    a("--tensorboard-dir", default=None)
    a("--mlperf-log", default=None, metavar="FILE",
      help="also write the run as MLPerf logging events (:::MLLOG lines) to FILE, for MLPerf tooling")
    a("--tensorboard-queue-size", type=int, default=1000, help="events the writer holds before it writes them")
    a("--log-timers-to-tensorboard", action="store_true", help="also write the iteration time")
    a("--log-batch-size-to-tensorboard", action="store_true", help="also write the global batch size")
    a("--log-validation-ppl-to-tensorboard", action="store_true", help="also write the validation perplexity")
    a("--profile", action="store_true", help="profile iterations --profile-step-start..--profile-step-end - 1")
    a("--use-pytorch-profiler", action="store_true", help="with --profile: the torch profiler (the only one here)")
    a("--profile-step-start", type=int, default=10)
    a("--profile-step-end", type=int, default=12)
    a("--profile-ranks", type=int, nargs="+", default=[0])
    a("--save", default=None)
    a("--load", default=None)
    a("--save-interval", type=int, default=None)
    a("--exit-interval", type=int, default=None, help="stop (saving first, with --save) after this iteration")
    a("--exit-duration-in-mins", type=float, default=None, help="stop (saving first) after this much training")
    a("--exit-signal-handler", action="store_true",
      help="on SIGTERM or SIGUSR2 (the JUPITER jobs' signal 12), save if --save is given, log and exit cleanly")
    a("--seed", type=int, default=1234)
    # test hook: make every gradient of this iteration infinite (exercises fp16 overflow handling)
    a("--inject-inf-grad-at-iteration", type=int, default=None, help=argparse.SUPPRESS)


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags under Megatron's names (without the dashes), as spec.switches reads them: a switch
    that turns something off (--no-bias-gelu-fusion) is true where it was given."""
    out = {}
    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest)
        turns_off = action.nargs == 0 and action.const is False
        out[action.option_strings[0].lstrip("-")] = (value is False) if turns_off else value
    return out


def huggingface_vocab_size(model: str | None) -> int:
    """The vocabulary of a HuggingFace tokenizer (tokenizer.json, or the folder that holds it), special tokens
    included, as Megatron-LM's HuggingFaceTokenizer counts it."""
    if not model:
        raise UsageError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a tokenizer.json or its folder)")
    path = Path(model)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UsageError(f"--tokenizer-model: {path} not found")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # the library raises its own exception type for any unreadable file
        raise UsageError(f"--tokenizer-model: {path} is not a tokenizer.json ({exc})") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed flags with Megatron's derived defaults filled in, each checked on its own; what combinations
    mean, and which of them cannot run, config.build_config says."""
    args = build_parser().parse_args(argv)
    if args.distributed_backend == "xla" and args.pipeline_model_parallel_size > 1:
        raise UsageError("pipeline parallelism is not available with --distributed-backend xla (as in the Neuron "
                         "reference); use tensor and data parallelism")
    if args.mock_data == bool(args.data_path):
        raise UsageError("give either --mock-data or --data-path PREFIX")
    if args.data_path and len(args.data_path) != 1:
        raise UsageError("--data-path takes one dataset prefix (weighted blends are not implemented)")
    if args.save_interval is not None and not args.save:
        raise UsageError("--save-interval needs --save DIR")
    if args.profile and not args.use_pytorch_profiler:
        raise UsageError("--profile without --use-pytorch-profiler means an nsys capture range, which this trainer "
                         "does not open; add --use-pytorch-profiler (or run it under nsys without --profile)")
    if args.profile and not 0 < args.profile_step_start < args.profile_step_end:
        raise UsageError("--profile-step-start must be at least 1 and below --profile-step-end")
    if args.tensorboard_queue_size < 1:
        raise UsageError("--tensorboard-queue-size must be at least 1")
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.seq_length > args.max_position_embeddings:
        raise UsageError(f"--seq-length {args.seq_length} exceeds --max-position-embeddings {args.max_position_embeddings}")
    _check_moe(args)
    if (args.train_iters is None) == (args.train_samples is None):
        raise UsageError("give exactly one of --train-iters and --train-samples")
    if args.tokenizer_type == "GPT2BPETokenizer" and args.vocab_file:
        path = Path(args.vocab_file)
        if not path.is_file():
            raise UsageError(f"--vocab-file {path} not found")
        args.vocab_size = len(json.loads(path.read_text()))
    elif args.tokenizer_type == "HuggingFaceTokenizer":
        args.vocab_size = huggingface_vocab_size(args.tokenizer_model)
    elif args.vocab_size is None:
        raise UsageError("give --vocab-file (GPT2BPETokenizer), --tokenizer-model (HuggingFaceTokenizer) or "
                         "--vocab-size (NullTokenizer, mock data)")
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    elif args.num_query_groups < 1 or args.num_attention_heads % args.num_query_groups:
        raise UsageError(f"--num-query-groups {args.num_query_groups} must divide --num-attention-heads "
                         f"{args.num_attention_heads}")
    if args.rotary_base < 1:
        raise UsageError("--rotary-base must be at least 1")
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                 "tensor_model_parallel_size", "log_interval", "vocab_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    return args
