"""Checkpoints in per-rank shards, resumable exactly: model, optimizer, loss scale, schedule position,
random state; the data position follows from the iteration (samples are addressed by global index).

Layout (Megatron's names where it has them):

    SAVE/latest_checkpointed_iteration.txt
    SAVE/iter_0000005/mp_rank_TT_PPP/model_rng.pt        one per (tp, pp) rank, written by dp rank 0
    SAVE/iter_0000005/mp_rank_TT_PPP/optim_dpDDD.pt       optimizer shard of each dp rank (distributed
                                                          optimizer), or of dp rank 0 alone

    SAVE/iter_0000005/experts_PPP_epEEE_etpTTT.pt       with expert parallelism or expert tp beyond the dense
                                                          shards: each expert shard's weights and optimizer
                                                          slice, written by its first copy (expert dp rank 0)

A different data-parallel size on load is handled by joining the saved optimizer shards and cutting
them anew; tensor- and pipeline-parallel sizes, ep and expert tp must match.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nlp_bench.train.args import UsageError
from nlp_bench.train.optimizer import FlatAdam
from nlp_bench.train.process_groups import ProcessGroups
from nlp_bench.train.rng import ParallelRNG

LATEST = "latest_checkpointed_iteration.txt"


def _rank_dir(root: Path, iteration: int, groups: ProcessGroups) -> Path:
    return root / f"iter_{iteration:07d}" / f"mp_rank_{groups.tp_rank:02d}_{groups.pp_rank:03d}"


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_shards(root: str, iteration: int, step: int, shape: dict[str, Any], groups: ProcessGroups,
                stage: torch.nn.Module, optimizer: FlatAdam, rng: ParallelRNG) -> Path:
    """Write this rank's shards; `shape` holds the flags a loading run must agree on (config.CHECKPOINT_SHAPE)."""
    folder = _rank_dir(Path(root), iteration, groups)
    folder.mkdir(parents=True, exist_ok=True)
    if groups.dp_rank == 0:
        _atomic_save({
            "iteration": iteration, "step": step, "shape": shape,
            "dp": groups.dp, "distributed_optimizer": optimizer.shards > 1, "model": stage.state_dict(),
            "rng": {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
                    **rng.saved()},
        }, folder / "model_rng.pt")
    if optimizer.shards > 1 or groups.dp_rank == 0:
        _atomic_save(optimizer.state(), folder / f"optim_dp{groups.dp_rank:03d}.pt")
    experts = _expert_file(folder.parent, groups, optimizer)
    if experts is not None and groups.experts.edp_rank == 0:
        state, part = optimizer.state(), optimizer.buffer.expert_range
        _atomic_save({"model": {name: p.detach().clone() for name, p in stage.named_parameters()
                                if getattr(p, "expert_parallel", False)},
                      **{key: state[key][part].clone() for key in _FLAT}}, experts)
    dist.barrier(group=groups.host)  # gloo's: torch-xla's barrier returns at once
    if groups.rank == 0:
        (Path(root) / LATEST).write_text(f"{iteration}\n")
    dist.barrier(group=groups.host)  # gloo's: torch-xla's barrier returns at once
    return folder.parent


#: the optimizer's flat tensors, laid out like its shard (FlatAdam.state)
_FLAT = ("master", "exp_avg", "exp_avg_sq")


def _expert_file(folder: Path, groups: ProcessGroups, optimizer: FlatAdam) -> Path | None:
    """Where this rank's expert shard is kept; None where its experts are held like the dense weights."""
    part = optimizer.buffer.expert_range
    if groups.experts is None or part.start == part.stop:
        return None
    return folder / f"experts_{groups.pp_rank:03d}_ep{groups.experts.ep_rank:03d}_etp{groups.experts.etp_rank:03d}.pt"


def _with_experts(shards: list[dict], path: Path, stage: torch.nn.Module, optimizer: FlatAdam) -> list[dict]:
    """The optimizer's saved state with this rank's expert shard in place of the one dp rank 0 saved (the
    experts are not the dense replicas' to share); the shard's weights loaded into the model."""
    if not path.is_file():
        raise UsageError(f"checkpoint {path.parent} has no {path.name} (saved with another expert layout?)")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    stage.load_state_dict(saved["model"], strict=False)
    merged, part = dict(shards[0]), optimizer.buffer.expert_range
    for key in _FLAT:
        merged[key] = merged[key].clone()
        merged[key][part] = saved[key]
    return [merged]


def _before_recorded(shape: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint from before a field was recorded was saved with: every head its own group, biases,
    Megatron's rotary base (the norm was not recorded: a mismatch shows in the weights' names)."""
    return {"num_query_groups": shape.get("num_attention_heads"), "add_bias_linear": True, "rotary_base": 10000}


def latest(root: str) -> int | None:
    marker = Path(root) / LATEST
    if not marker.is_file():
        return None
    try:
        return int(marker.read_text().strip())
    except ValueError:
        raise UsageError(f"{marker} does not hold an iteration number") from None


def restore_latest(root: str, shape: dict[str, Any], groups: ProcessGroups, stage: torch.nn.Module,
                   optimizer: FlatAdam, rng: ParallelRNG) -> tuple[int, int]:
    """(iteration, schedule step) of the newest checkpoint under root, restored into the run."""
    iteration = latest(root)
    if iteration is None:
        return 0, 0
    folder = _rank_dir(Path(root), iteration, groups)
    path = folder / "model_rng.pt"
    if not path.is_file():
        raise UsageError(f"checkpoint {folder.parent} has no shard for tp rank {groups.tp_rank}, pp rank {groups.pp_rank} "
                         f"(saved with another tensor/pipeline layout?)")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    kept = {**_before_recorded(saved["shape"]), **saved["shape"]}
    mismatched = [f"--{k.replace('_', '-')} {kept[k]} (now {value})"
                  for k, value in shape.items() if k in kept and kept[k] != value]
    if mismatched:
        raise UsageError(f"checkpoint {folder.parent} was saved with " + ", ".join(mismatched))
    try:
        stage.load_state_dict(saved["model"])
    except RuntimeError as exc:  # weights of another model (a setting an older checkpoint did not record)
        first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
        raise UsageError(f"checkpoint {folder.parent} holds another model's weights: {first}") from None
    torch.set_rng_state(saved["rng"]["cpu"])
    try:
        rng.restore(saved["rng"])
    except ValueError as exc:
        raise UsageError(f"checkpoint {folder.parent} cannot resume on {rng.device.type}: {exc}") from None
    if saved["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["rng"]["cuda"])
    files = sorted(folder.glob("optim_dp*.pt"))
    shards = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    experts = _expert_file(folder.parent, groups, optimizer)
    optimizer.load_state(shards if experts is None else _with_experts(shards, experts, stage, optimizer))
    return saved["iteration"], saved["step"]
