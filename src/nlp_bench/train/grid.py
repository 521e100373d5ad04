"""The process-group grid: every rank's tensor-, data- and pipeline-parallel coordinates and groups.

Ranks are laid out tp-fastest, then dp, then pp (as Megatron does), so a tensor-parallel group stays
inside a node and pipeline stages span nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass
class Grid:
    world: int
    rank: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    dp_rank: int
    pp_rank: int
    tp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None
    pp_group: dist.ProcessGroup | None

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def rank_of(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def build_grid(tp: int, pp: int) -> Grid:
    """Create all groups (every rank must create every group, in the same order) and keep its own."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % (tp * pp):
        raise ValueError(f"tp x pp = {tp * pp} does not divide the world size {world}")
    dp = world // (tp * pp)
    tp_rank, rest = rank % tp, rank // tp
    dp_rank, pp_rank = rest % dp, rest // dp
    mine: dict[str, dist.ProcessGroup | None] = {}
    for name, members in (
        ("tp", [[rank_of(t, d, p, tp, dp) for t in range(tp)] for p in range(pp) for d in range(dp)]),
        ("dp", [[rank_of(t, d, p, tp, dp) for d in range(dp)] for p in range(pp) for t in range(tp)]),
        ("pp", [[rank_of(t, d, p, tp, dp) for p in range(pp)] for d in range(dp) for t in range(tp)]),
    ):
        for ranks in members:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return Grid(world, rank, tp, pp, dp, tp_rank, dp_rank, pp_rank, mine["tp"], mine["dp"], mine["pp"])
