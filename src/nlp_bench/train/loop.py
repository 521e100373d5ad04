"""The training loop: set up the grid and model, run iterations, print Megatron's log line."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from argparse import Namespace

import torch
import torch.distributed as dist

from nlp_bench import flops
from nlp_bench.spec.models import pad_vocab
from nlp_bench.train import collectives
from nlp_bench.train.args import UsageError, parse_args
from nlp_bench.train.data import MockData
from nlp_bench.train.grid import Grid, build_grid
from nlp_bench.train.logline import iteration_line
from nlp_bench.train.model import GPT, GPTConfig
from nlp_bench.train.rng import ParallelRNG
from nlp_bench.train.schedule import from_args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str) -> torch.device:
    """Join the process group torchrun describes (or a group of one when run by hand)."""
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("--distributed-backend nccl needs CUDA GPUs; use --distributed-backend gloo on CPU")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend)
    return device


def check_layout(args: Namespace, grid: Grid) -> int:
    """Gradient-accumulation steps for this layout, or a UsageError saying what does not divide."""
    if args.num_attention_heads % grid.tp or args.ffn_hidden_size % grid.tp:
        raise UsageError(f"--tensor-model-parallel-size {grid.tp} must divide the heads ({args.num_attention_heads}) "
                         f"and the MLP width ({args.ffn_hidden_size})")
    if args.hidden_size % args.num_attention_heads:
        raise UsageError(f"--num-attention-heads {args.num_attention_heads} must divide --hidden-size {args.hidden_size}")
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * grid.dp
    per_step = args.micro_batch_size * grid.dp
    if args.global_batch_size % per_step:
        raise UsageError(f"--global-batch-size {args.global_batch_size} is not a multiple of micro batch x dp = {per_step}")
    return args.global_batch_size // per_step


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Megatron leaves biases and norm weights (all 1-D parameters) out of weight decay."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def grad_norm(model: torch.nn.Module, grid: Grid) -> float:
    """The global L2 norm: sharded gradients count on every tp rank, replicated ones once."""
    sq = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        if p.grad is not None and (getattr(p, "tensor_parallel", False) or grid.tp_rank == 0):
            sq += p.grad.detach().double().pow(2).sum().cpu()
    collectives.all_reduce(sq, grid.tp_group)
    return math.sqrt(sq.item())


def clip_(model: torch.nn.Module, norm: float, max_norm: float) -> None:
    if max_norm > 0 and norm > max_norm:
        coeff = max_norm / (norm + 1e-6)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(coeff)


def say(grid: Grid, text: str) -> None:
    if grid.rank == 0:
        print(f"nlp-bench trainer: {text}", flush=True)


def train(args: Namespace) -> int:
    device = init_distributed(args.distributed_backend)
    grid = build_grid(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    gas = check_layout(args, grid)
    gbs = args.global_batch_size
    torch.manual_seed(args.seed + 100 * grid.pp_rank)
    rng = ParallelRNG(args.seed, grid.tp_rank, device)
    vocab_padded = pad_vocab(args.vocab_size, grid.tp, args.make_vocab_size_divisible_by)
    cfg = GPTConfig(args.num_layers, args.hidden_size, args.num_attention_heads, args.ffn_hidden_size, args.seq_length,
                    args.max_position_embeddings, vocab_padded, args.position_embedding_type, args.init_method_std,
                    args.hidden_dropout, args.attention_dropout, args.layernorm_epsilon, args.use_flash_attn)
    model = GPT(cfg, grid, rng).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=0.0,
                                  betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps)
    schedule, iterations, in_samples = from_args(args, gbs)
    data = MockData(args.vocab_size, args.seq_length, args.seed)
    shape = flops.Shape(gbs, args.seq_length, args.num_layers, args.hidden_size, vocab_padded, args.ffn_hidden_size)
    flops_per_iter = flops.jupiter_flops(shape)
    local_params = sum(p.numel() for p in model.parameters())

    say(grid, f"torch {torch.__version__}, backend {args.distributed_backend}, device {device.type}, "
              f"{torch.get_num_threads()} threads per rank")
    say(grid, f"world {grid.world} = tp {grid.tp} x pp {grid.pp} x dp {grid.dp}; micro batch {args.micro_batch_size}, "
              f"{gas} accumulation steps, global batch {gbs}, sequence {args.seq_length}")
    say(grid, f"model {args.num_layers} layers, hidden {args.hidden_size}, {args.num_attention_heads} heads, "
              f"ffn {args.ffn_hidden_size}, vocab {args.vocab_size} padded to {vocab_padded}, "
              f"{local_params:,} parameters on rank 0, position embedding {args.position_embedding_type}")
    say(grid, f"TFLOPs in the log use the {flops.JUPITER} convention; training {iterations} iterations on mock data")

    step = 0
    interval_loss, interval_iters, interval_nan = 0.0, 0, 0
    t_start = t_interval = time.perf_counter()
    model.train()
    for iteration in range(1, iterations + 1):
        lr = schedule.at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        first = (iteration - 1) * gbs + grid.dp_rank * gas * args.micro_batch_size
        loss_sum = 0.0
        for micro in range(gas):
            tokens, labels = data.batch(first + micro * args.micro_batch_size, args.micro_batch_size)
            loss = model(tokens.to(device), labels.to(device))
            (loss / gas).backward()
            loss_sum += loss.item()
        collectives.all_reduce_mean_flat([p.grad for p in model.parameters() if p.grad is not None], grid.dp_group)
        norm = grad_norm(model, grid)
        clip_(model, norm, args.clip_grad)
        optimizer.step()
        step += gbs if in_samples else 1
        iter_loss = loss_sum / gas
        if math.isfinite(iter_loss):
            interval_loss += iter_loss
        else:
            interval_nan += 1
        interval_iters += 1

        if iteration % args.log_interval == 0 or iteration == iterations:
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            seconds = (now - t_interval) / interval_iters
            stats = torch.tensor([interval_loss, float(interval_iters - interval_nan)], dtype=torch.float64)
            collectives.all_reduce(stats, grid.dp_group)
            mean_loss = stats[0].item() / max(stats[1].item(), 1.0)
            if grid.rank == grid.world - 1:
                print(iteration_line(iteration=iteration, total=iterations, consumed=iteration * gbs, seconds=seconds,
                                     lr=schedule.at(step), global_batch=gbs, loss=mean_loss, loss_scale=1.0,
                                     grad_norm=norm, skipped=0, nan=interval_nan,
                                     tflops=flops.tflops_per_device(flops_per_iter, seconds, grid.world)), flush=True)
            interval_loss, interval_iters, interval_nan = 0.0, 0, 0
            t_interval = time.perf_counter()
    say(grid, f"finished {iterations} iterations in {time.perf_counter() - t_start:.1f} s")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return train(parse_args(argv))
    except UsageError as exc:
        print(f"nlp_bench.train: error: {exc}", file=sys.stderr, flush=True)
        return 2
