"""The built-in trainer beside its peers on the same GPU, same model, same tokens per iteration, one session.

Peers, each in its own process, alternated (builtin, megatron-core, torch-compile, builtin, ...):
- builtin: `python -m nlp_bench.train` (fused ops, flash attention, bf16, mock data);
- megatron-core: megatron.core's GPTModel under its DistributedDataParallel and Megatron optimizer
  (Transformer Engine's layer spec where transformer_engine imports, else the local spec), mock tokens;
- torch-compile: a plain single-file GPT (nanoGPT style, bf16 autocast, SDPA attention, fused AdamW)
  under torch.compile;
- torch-eager: the same plain GPT without compile (the peer the CPU test runs).

Every peer trains the same shape with the same micro-batch and global batch (gradient accumulation), and
reports the median tokens/s of its iterations after warm-up. MFU = Megatron model FLOPs
(nlp_bench.flops.megatron_model_flops: 6*B*s*(L*(4h^2 + 2*h*ffn) + h*V) + 6*B*s^2*h*L per iteration, no
recompute term) / (iteration time x peak), the peak being the dense BF16 figure of the device table
(nlp_bench.spec.devices) for the GPU torch names; an unknown GPU gets no MFU. The ratio column divides by
the best peer other than builtin.

    python benchmark/perf/gpu_side_by_side.py [--size 1.3b|4096] [--repeats 2] [--iters 12]
        [--peers builtin,megatron-core,torch-compile] [--json OUT.json]
    python benchmark/perf/gpu_side_by_side.py --device cpu --size tiny --peers builtin,torch-eager   # the test
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

#: layers, hidden, heads, seq, micro-batch, global batch, recompute (the builtin's flag)
SIZES = {
    "1.3b": (24, 2048, 16, 2048, 4, 16, None),
    "4096": (24, 4096, 32, 2048, 2, 16, "selective"),  # ~5B: fills an 80 GB GPU with selective recompute
    "tiny": (2, 64, 4, 64, 2, 4, None),
}
VOCAB = 50257
PEERS = ("builtin", "megatron-core", "torch-compile", "torch-eager")


def _padded(vocab: int) -> int:
    return (vocab + 127) // 128 * 128


def _steady_median(times: list[float], tokens: int) -> float:
    from nlp_bench.analysis.metrics import warmup_count

    rates = [tokens / t for t in times]
    return statistics.median(rates[warmup_count(rates):])


def run_builtin(size: str, iters: int, device: str) -> tuple[float, str]:
    from nlp_bench.analysis import metrics, parsers

    layers, hidden, heads, seq, mbs, gbs, recompute = SIZES[size]
    flags = ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
             "--seq-length", str(seq), "--max-position-embeddings", str(seq), "--micro-batch-size", str(mbs),
             "--global-batch-size", str(gbs), "--train-iters", str(iters), "--lr", "1e-4", "--mock-data",
             "--vocab-size", str(VOCAB), "--log-interval", "1", "--eval-iters", "0",
             "--hidden-dropout", "0", "--attention-dropout", "0"]
    if device == "cuda":
        flags += ["--bf16", "--use-flash-attn", "--distributed-backend", "nccl"]
    else:
        flags += ["--distributed-backend", "gloo"]
    if recompute:
        flags += ["--recompute-activations", "--recompute-granularity", recompute]
    out = subprocess.run([sys.executable, "-m", "nlp_bench.train", *flags], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise RuntimeError(f"builtin failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    records = parsers.parse(out.stdout).records
    _, summary = metrics.steady_summary(records, seq_length=seq)
    kernels = next((line.split("trainer: ", 1)[1] for line in out.stdout.splitlines() if "fused ops:" in line), "")
    return summary["tokens_per_s"]["median"], kernels


def _worker(peer: str, size: str, iters: int, device: str) -> tuple[float, str]:
    proc = subprocess.run([sys.executable, __file__, "--worker", peer, "--size", size, "--iters", str(iters),
                           "--device", device], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{peer} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["tokens_per_s"], result["note"]


def plain_worker(size: str, iters: int, device: str, compiled: bool) -> dict:
    """The plain GPT (plain_gpt.py): the yardstick, not our code."""
    import torch
    from plain_gpt import plain_gpt

    layers, hidden, heads, seq, mbs, gbs, _ = SIZES[size]
    torch.manual_seed(0)
    model = plain_gpt(layers, hidden, heads, seq, _padded(VOCAB)).to(device)
    step_model = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=device == "cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    times = []
    for _ in range(iters):
        data = torch.randint(VOCAB, (gbs, seq + 1), device=device)
        _sync(device)
        t0 = time.perf_counter()
        for chunk in data.split(mbs):
            with autocast:
                loss = step_model(chunk[:, :-1], chunk[:, 1:]) / (gbs // mbs)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - t0)
    note = f"torch {torch.__version__}" + (", torch.compile" if compiled else ", eager")
    return {"tokens_per_s": _steady_median(times, gbs * seq), "note": note}


def megatron_worker(size: str, iters: int, device: str) -> dict:
    """megatron.core's GPTModel trained as Megatron-LM trains it on one GPU: its DDP wrapper (fp32 gradient
    buffer) and its optimizer (fp32 master weights, bf16 model)."""
    import torch
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    if device != "cuda":
        raise SystemExit("megatron-core needs a CUDA GPU")
    layers, hidden, heads, seq, mbs, gbs, recompute = SIZES[size]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    try:
        import transformer_engine  # noqa: F401

        spec, which = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(), "Transformer Engine spec"
    except ImportError:
        spec, which = gpt_layer_specs.get_gpt_layer_local_spec(), "local spec (no Transformer Engine)"
    config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               ffn_hidden_size=4 * hidden, hidden_dropout=0.0, attention_dropout=0.0, bf16=True,
                               params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
                               recompute_granularity=recompute)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=_padded(VOCAB), max_sequence_length=seq,
                     position_embedding_type="learned_absolute", share_embeddings_and_output_weights=True).cuda()
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                    module=model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, weight_decay=0.1, bf16=True,
                                                       clip_grad=1.0), [model])
    positions = torch.arange(seq, device="cuda").unsqueeze(0).expand(mbs, -1)
    mask = torch.triu(torch.ones(seq, seq, device="cuda", dtype=torch.bool), diagonal=1)[None, None]
    times = []
    for _ in range(iters):
        data = torch.randint(VOCAB, (gbs, seq + 1), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        for chunk in data.split(mbs):
            loss = model(chunk[:, :-1], positions, mask, labels=chunk[:, 1:]).float().mean() / (gbs // mbs)
            loss.backward()
        model.finish_grad_sync()
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    import megatron.core

    version = getattr(megatron.core, "__version__", "?")
    return {"tokens_per_s": _steady_median(times, gbs * seq), "note": f"megatron-core {version}, {which}"}


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _peak(device: str) -> tuple[float | None, str]:
    """The device table's dense BF16 peak for the GPU torch names; None (and why) for anything else."""
    if device != "cuda":
        return None, "no MFU on CPU (no peak in the device table)"
    import torch

    from nlp_bench.spec.devices import find_device

    name = torch.cuda.get_device_name()
    found = find_device(name)
    if found is None:
        return None, f"no MFU: {name} is not in the device table"
    return found.peak_tflops, f"{name}: {found.peak_tflops} TFLOP/s dense BF16 ({found.source})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="1.3b")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--peers", default="builtin,megatron-core,torch-compile")
    ap.add_argument("--json", dest="json_out", default=None, help="Also write the table as JSON here.")
    ap.add_argument("--worker", choices=PEERS, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.worker == "megatron-core":
            found = megatron_worker(args.size, args.iters, args.device)
        else:
            found = plain_worker(args.size, args.iters, args.device, args.worker == "torch-compile")
        print(json.dumps(found))
        return 0

    from nlp_bench import flops

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(PEERS)
    if unknown:
        ap.error(f"unknown peer(s) {', '.join(sorted(unknown))}; peers: {', '.join(PEERS)}")
    layers, hidden, heads, seq, mbs, gbs, _ = SIZES[args.size]
    shape = flops.Shape(global_batch=gbs, seq_length=seq, num_layers=layers, hidden=hidden,
                        vocab_padded=_padded(VOCAB), ffn_hidden=4 * hidden)
    model_flops = flops.megatron_model_flops(shape)
    peak, peak_note = _peak(args.device)
    tokens: dict[str, list[float]] = {p: [] for p in peers}
    notes: dict[str, str] = {}
    failed: dict[str, str] = {}
    for repeat in range(args.repeats):
        for peer in peers:
            if peer in failed:
                continue
            try:
                if peer == "builtin":
                    value, note = run_builtin(args.size, args.iters, args.device)
                else:
                    value, note = _worker(peer, args.size, args.iters, args.device)
            except RuntimeError as exc:
                failed[peer] = str(exc).strip().splitlines()[-1]
                print(f"{peer}: failed: {failed[peer]}", flush=True)
                continue
            tokens[peer].append(value)
            notes[peer] = note
            print(f"repeat {repeat + 1} {peer:14} {value:12.1f} tokens/s  ({note})", flush=True)
    rows = []
    for peer in peers:
        if not tokens[peer]:
            rows.append({"peer": peer, "tokens_per_s": None, "mfu": None, "note": failed.get(peer, "no result")})
            continue
        median = statistics.median(tokens[peer])
        seconds = gbs * seq / median
        mfu = flops.tflops_per_device(model_flops, seconds, 1) / peak if peak else None
        rows.append({"peer": peer, "tokens_per_s": median, "runs": tokens[peer], "mfu": mfu, "note": notes[peer]})
    others = [r["tokens_per_s"] for r in rows if r["peer"] != "builtin" and r["tokens_per_s"]]
    best = max(others) if others else None
    print(f"\nmodel {args.size}: {layers} layers, hidden {hidden}, {heads} heads, seq {seq}, micro-batch {mbs}, "
          f"global batch {gbs}; {model_flops / 1e12:.1f} TFLOP per iteration (Megatron model FLOPs); {peak_note}")
    print(f"{'peer':14} {'tokens/s':>12} {'MFU':>7} {'/ best peer':>11}  note")
    for row in rows:
        value = row["tokens_per_s"]
        ratio = value / best if value and best else None
        row["ratio_to_best_peer"] = ratio
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        shown = "-" if ratio is None else f"{ratio:.3f}"
        print(f"{row['peer']:14} {value or 0:12.1f} {mfu:>7} {shown:>11}  {row['note']}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"size": args.size, "device": args.device, "peak": peak_note, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
