"""The built-in trainer beside its peers on the same GPU, same model, same tokens per iteration, one session.

Peers, each in its own process, alternated (builtin, megatron-core, torch-compile, builtin, ...):
- builtin: `python -m nlp_bench.train` (fused ops, flash attention, bf16, mock data);
- builtin-mbs2x: the same with twice the micro-batch and half the accumulation steps (a fix to try, not a
  peer: the ratio column leaves it out of the best peer);
- megatron-core: megatron.core's GPTModel under its DistributedDataParallel and Megatron optimizer
  (Transformer Engine's layer spec where transformer_engine imports, else the local spec), mock tokens;
- torch-compile: a plain single-file GPT (nanoGPT style, bf16 autocast, SDPA attention, fused AdamW)
  under torch.compile (GPT shapes only: it has no grouped-query attention, SwiGLU or RMSNorm);
- torch-eager: the same plain GPT without compile (the peer the CPU test runs).

Every peer trains the same model (spec.models.ModelSpec) with the same micro-batch and global batch
(gradient accumulation), and reports the median tokens/s of its iterations after warm-up. MFU = Megatron
model FLOPs (nlp_bench.flops.megatron_model_flops: 6*B*s*(L*(h^2*(2 + 2g/n) + 2*h*ffn (3*h*ffn with SwiGLU))
+ h*V) + 6*B*s^2*h*L per iteration, no recompute term; an untied input embedding is a lookup, no FLOPs) / (iteration time x peak), the peak
being the dense BF16 figure of the device table (nlp_bench.spec.devices) for the GPU torch names; an
unknown GPU gets no MFU. The ratio column divides by the best peer that is not a builtin variant.

`--budget-s` skips a run that its peer's last run says would not end in time (a device lease is short),
and the JSON is rewritten after every run, so a run stopped from outside keeps what it measured.

    python benchmark/perf/gpu_side_by_side.py [--size 1.3b|4096|llama3-8b-4l] [--repeats 2] [--iters 12]
        [--peers builtin,megatron-core,torch-compile] [--json OUT.json] [--logs DIR] [--budget-s S]
    python benchmark/perf/gpu_side_by_side.py --device cpu --size tiny --peers builtin,torch-eager   # the test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

from nlp_bench.spec import models


def _resized(name: str, new: str, **changes) -> models.ModelSpec:
    return dataclasses.replace(models.PRESETS[name], name=new, nominal_billions=None, **changes)


#: model, micro-batch, global batch, recompute (the builtin's flag)
SIZES = {
    "1.3b": (models.PRESETS["gpt-1.3b"], 4, 16, None),
    # 12 layers of hidden 4096 (2.6B parameters): every peer's weights, gradients and Adam states fit in
    # 80 GB (24 such layers, 5B parameters, take ~90 GB at the 18 bytes per parameter of Megatron's
    # bf16 model + fp32 gradients, master weights and moments)
    "4096": (_resized("gpt-1.3b", "gpt-hidden-4096", num_layers=12, hidden_size=4096, num_attention_heads=32,
                      ffn_hidden_size=16384), 2, 16, "selective"),
    # Llama 3 8B's layer, sequence and vocabulary, four of its 32 layers: one GPU, no recompute
    "llama3-8b-4l": (_resized("llama3-8b", "llama3-8b-4-layers", num_layers=4), 1, 4, None),
    "tiny": (_resized("gpt-tiny", "tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, seq_length=64,
                      max_position_embeddings=64), 2, 4, None),
    "llama-tiny": (_resized("llama-tiny", "llama-tiny", seq_length=64, max_position_embeddings=64), 2, 4, None),
}
PEERS = ("builtin", "builtin-mbs2x", "megatron-core", "torch-compile", "torch-eager")
#: variants of our own trainer: shown, never the yardstick
OURS = ("builtin", "builtin-mbs2x")


def _padded(vocab: int) -> int:
    return (vocab + 127) // 128 * 128


def _is_plain_gpt(model: models.ModelSpec) -> bool:
    return (model.num_query_groups is None and not model.swiglu and model.normalization == "LayerNorm"
            and model.position_embedding_type == "learned_absolute" and not model.untie_embeddings
            and model.bias and model.ffn_hidden_size == 4 * model.hidden_size)


def _steady_median(times: list[float], tokens: int) -> float:
    from nlp_bench.analysis.metrics import warmup_count

    rates = [tokens / t for t in times]
    return statistics.median(rates[warmup_count(rates):])


def builtin_flags(size: str, iters: int, device: str, mbs_factor: int = 1) -> list[str]:
    model, mbs, gbs, recompute = SIZES[size]
    flags = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
             "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
             "--seq-length", str(model.seq_length), "--max-position-embeddings", str(model.max_position_embeddings),
             "--micro-batch-size", str(mbs * mbs_factor), "--global-batch-size", str(gbs),
             "--train-iters", str(iters), "--lr", "1e-4", "--mock-data", "--vocab-size", str(model.vocab_size),
             "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0"]
    for name, value in model.megatron_flags().items():
        flags += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    if device == "cuda":
        flags += ["--bf16", "--use-flash-attn", "--distributed-backend", "nccl"]
    else:
        flags += ["--distributed-backend", "gloo"]
    if recompute:
        flags += ["--recompute-activations", "--recompute-granularity", recompute]
    return flags


def run_builtin(size: str, iters: int, device: str, mbs_factor: int = 1, log: str | None = None) -> tuple[float, str]:
    from nlp_bench.analysis import metrics, parsers

    out = subprocess.run([sys.executable, "-m", "nlp_bench.train", *builtin_flags(size, iters, device, mbs_factor)],
                         capture_output=True, text=True, check=False)
    if log:
        with open(log, "w") as fh:
            fh.write(out.stdout + out.stderr)
    if out.returncode:
        raise RuntimeError(f"builtin failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    records = parsers.parse(out.stdout).records
    _, summary = metrics.steady_summary(records, seq_length=SIZES[size][0].seq_length)
    kernels = next((line.split("trainer: ", 1)[1] for line in out.stdout.splitlines() if "fused ops:" in line), "")
    return summary["tokens_per_s"]["median"], kernels


#: the line of a Python traceback that says what went wrong
_RAISED = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+(?:Error|Exception|Exit|Interrupt))(?::.*)?)$")


def _why(output: str) -> str:
    """The exception a failed worker ended with, else its last line: a warning printed at exit must not
    stand in for the error."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    raised = [m.group(1) for m in map(_RAISED.match, lines) if m]
    return raised[-1] if raised else (lines[-1] if lines else "no output")


def _worker(peer: str, size: str, iters: int, device: str, log: str | None = None) -> tuple[float, str]:
    proc = subprocess.run([sys.executable, __file__, "--worker", peer, "--size", size, "--iters", str(iters),
                           "--device", device], capture_output=True, text=True, check=False)
    if log:
        with open(log, "w") as fh:
            fh.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"{peer} failed (exit {proc.returncode}): {_why(proc.stderr or proc.stdout)}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["tokens_per_s"], result["note"]


def plain_worker(size: str, iters: int, device: str, compiled: bool) -> dict:
    """The plain GPT (plain_gpt.py): the yardstick, not our code."""
    import torch
    from plain_gpt import plain_gpt

    model_spec, mbs, gbs, _ = SIZES[size]
    if not _is_plain_gpt(model_spec):
        raise SystemExit(f"the plain GPT has no {model_spec.description()}")
    seq = model_spec.seq_length
    torch.manual_seed(0)
    model = plain_gpt(model_spec.num_layers, model_spec.hidden_size, model_spec.num_attention_heads, seq,
                      _padded(model_spec.vocab_size)).to(device)
    step_model = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=device == "cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    times = []
    for _ in range(iters):
        data = torch.randint(model_spec.vocab_size, (gbs, seq + 1), device=device)
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
    buffer) and its optimizer (fp32 master weights, bf16 model). The fusions Megatron-LM's defaults turn on
    and that need no compiled extension (bias + GeLU / SwiGLU, bias + dropout) are on; the fused softmax
    and gradient-accumulation kernels come from Apex, which a plain environment lacks. On CPU (`--device
    cpu`, the test) it initialises on the CPU over gloo, in fp32."""
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    model_spec, mbs, gbs, recompute = SIZES[size]
    seq, gpu = model_spec.seq_length, device == "cuda"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         world_size=1, rank=0)
    if gpu:
        torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    if gpu:
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    norm = model_spec.normalization
    try:
        import transformer_engine  # noqa: F401

        spec, which = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(), "Transformer Engine spec"
    except ImportError:
        spec, which = gpt_layer_specs.get_gpt_layer_local_spec(normalization=norm), "local spec (no Transformer Engine)"
    dtype = torch.bfloat16 if gpu else torch.float32
    config = TransformerConfig(
        num_layers=model_spec.num_layers, hidden_size=model_spec.hidden_size,
        num_attention_heads=model_spec.num_attention_heads, num_query_groups=model_spec.num_query_groups,
        ffn_hidden_size=model_spec.ffn_hidden_size, gated_linear_unit=model_spec.swiglu,
        activation_func=F.silu if model_spec.swiglu else F.gelu, normalization=norm,
        add_bias_linear=model_spec.bias, bias_activation_fusion=gpu, bias_dropout_fusion=gpu,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=gpu, params_dtype=dtype, pipeline_dtype=dtype,
        recompute_granularity=recompute, use_cpu_initialization=not gpu)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=_padded(model_spec.vocab_size),
                     max_sequence_length=seq, position_embedding_type=model_spec.position_embedding_type,
                     rotary_base=model_spec.rotary_base,
                     share_embeddings_and_output_weights=not model_spec.untie_embeddings).to(device)
    if not gpu:
        raise SystemExit("megatron-core built the model on the CPU; its gradient buffers and attention need a CUDA GPU")
    # as Megatron-LM's get_model does for --bf16: the whole module in bf16 (norms included), outputs in fp32
    from megatron.core.transformer.module import Float16Module

    model = Float16Module(config, model)
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                    module=model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, weight_decay=0.1, bf16=gpu,
                                                       clip_grad=1.0), [model])
    positions = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, -1)
    mask = torch.triu(torch.ones(seq, seq, device=device, dtype=torch.bool), diagonal=1)[None, None]
    times = []
    for _ in range(iters):
        data = torch.randint(model_spec.vocab_size, (gbs, seq + 1), device=device)
        _sync(device)
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        for chunk in data.split(mbs):
            loss = model(chunk[:, :-1], positions, mask, labels=chunk[:, 1:]).float().mean() / (gbs // mbs)
            loss.backward()
        model.finish_grad_sync()
        optimizer.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    torch.distributed.destroy_process_group()
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


def _table(size: str, device: str, peers: list[str], tokens: dict, notes: dict, failed: dict,
           skipped: dict) -> dict:
    """The rows so far: median tokens/s, MFU and the ratio to the best peer that is not ours."""
    from nlp_bench import flops

    model, _, gbs, _ = SIZES[size]
    model_flops = flops.megatron_model_flops(model.flops_shape(gbs, _padded(model.vocab_size)))
    peak, peak_note = _peak(device)
    rows = []
    for peer in peers:
        if not tokens[peer]:
            why = failed.get(peer) or skipped.get(peer) or "no result"
            rows.append({"peer": peer, "tokens_per_s": None, "mfu": None, "note": why})
            continue
        median = statistics.median(tokens[peer])
        seconds = gbs * model.seq_length / median
        mfu = flops.tflops_per_device(model_flops, seconds, 1) / peak if peak else None
        rows.append({"peer": peer, "tokens_per_s": median, "runs": tokens[peer], "mfu": mfu, "note": notes[peer]})
    others = [r["tokens_per_s"] for r in rows if r["peer"] not in OURS and r["tokens_per_s"]]
    best = max(others) if others else None
    for row in rows:
        value = row["tokens_per_s"]
        row["ratio_to_best_peer"] = value / best if value and best else None
    return {"size": size, "model": model.description(), "micro_batch": SIZES[size][1], "global_batch": gbs,
            "model_tflop_per_iteration": model_flops / 1e12, "device": device, "peak": peak_note, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="1.3b")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--peers", default="builtin,megatron-core,torch-compile")
    ap.add_argument("--json", dest="json_out", default=None, help="Also write the table as JSON here.")
    ap.add_argument("--logs", default=None, help="Keep each builtin run's log in this folder (energy, kernels).")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="Skip a run that its peer's last run says would end after this many seconds.")
    ap.add_argument("--worker", choices=PEERS, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.worker == "megatron-core":
            found = megatron_worker(args.size, args.iters, args.device)
        else:
            found = plain_worker(args.size, args.iters, args.device, args.worker == "torch-compile")
        print(json.dumps(found))
        return 0

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(PEERS)
    if unknown:
        ap.error(f"unknown peer(s) {', '.join(sorted(unknown))}; peers: {', '.join(PEERS)}")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    started = time.monotonic()
    tokens: dict[str, list[float]] = {p: [] for p in peers}
    notes: dict[str, str] = {}
    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}
    last_took: dict[str, float] = {}
    for repeat in range(args.repeats):
        for peer in peers:
            if peer in failed:
                continue
            if args.budget_s is not None and time.monotonic() - started + last_took.get(peer, 0.0) > args.budget_s:
                skipped[peer] = f"skipped repeat {repeat + 1}: over the {args.budget_s:.0f} s budget"
                print(f"{peer}: {skipped[peer]}", flush=True)
                continue
            began = time.monotonic()
            try:
                log = os.path.join(args.logs, f"{args.size}-{peer}-{repeat + 1}.log") if args.logs else None
                if peer in OURS:
                    value, note = run_builtin(args.size, args.iters, args.device, 2 if peer == "builtin-mbs2x" else 1,
                                              log)
                else:
                    value, note = _worker(peer, args.size, args.iters, args.device, log)
            except RuntimeError as exc:
                failed[peer] = str(exc).strip().splitlines()[-1]
                print(f"{peer}: failed: {failed[peer]}", flush=True)
                continue
            finally:
                last_took[peer] = time.monotonic() - began
            tokens[peer].append(value)
            notes[peer] = note
            print(f"repeat {repeat + 1} {peer:14} {value:12.1f} tokens/s  ({note}; {last_took[peer]:.0f} s)",
                  flush=True)
            if args.json_out:
                _write(args.json_out, _table(args.size, args.device, peers, tokens, notes, failed, skipped))
    table = _table(args.size, args.device, peers, tokens, notes, failed, skipped)
    print(f"\nmodel {args.size}: {table['model']}, seq {SIZES[args.size][0].seq_length}, micro-batch "
          f"{table['micro_batch']}, global batch {table['global_batch']}; {table['model_tflop_per_iteration']:.1f} "
          f"TFLOP per iteration (Megatron model FLOPs); {table['peak']}")
    print(f"{'peer':14} {'tokens/s':>12} {'MFU':>7} {'/ best peer':>11}  note")
    for row in table["rows"]:
        value, ratio = row["tokens_per_s"], row["ratio_to_best_peer"]
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        shown = "-" if ratio is None else f"{ratio:.3f}"
        print(f"{row['peer']:14} {value or 0:12.1f} {mfu:>7} {shown:>11}  {row['note']}")
    if args.json_out:
        _write(args.json_out, table)
    return 0


def _write(path: str, table: dict) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(table, fh, indent=2)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
