"""The process groups: every rank's tensor-, data- and pipeline-parallel coordinates and groups.

Ranks are laid out tp-fastest, then dp, then pp (as Megatron does), so a tensor-parallel group stays
inside a node and pipeline stages span nodes.

Numbers the host needs (a stop flag, the log's and the evaluation's loss sums) travel as CPU tensors. On
gloo, and on nccl started as "cpu:gloo,cuda:nccl", the ordinary groups carry them; torch-xla's process group
takes device tensors only, so on xla every rank also joins gloo twins of the world and of its dp group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from nlp_bench.spec.layout import data_parallel_size, expert_grid, grid_rank


@dataclass
class ExpertGroups:
    """This rank's place in the experts' grid (spec.layout.expert_grid): which experts it holds (ep rank),
    which slice of their matrices (expert tp rank), and the groups the dispatch and the gradients use."""

    ep: int
    etp: int
    ep_rank: int
    etp_rank: int
    #: which copy of its expert shard this rank holds (0 writes the shard into a checkpoint)
    edp_rank: int
    ep_group: dist.ProcessGroup | None
    etp_group: dist.ProcessGroup | None
    #: expert tp x ep: one whole copy of every expert (the dispatch agrees on its group size here)
    tp_ep_group: dist.ProcessGroup | None
    #: the ranks holding the same expert shard: the experts' gradients are summed over them
    edp_group: dist.ProcessGroup | None


@dataclass
class ProcessGroups:
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
    #: first and last stage of this rank's pipeline (tied embeddings); None without pipelining
    embedding_group: dist.ProcessGroup | None = None
    #: every rank, and this rank's dp group, for CPU tensors (see the module's docstring)
    host: dist.ProcessGroup | None = None
    host_dp: dist.ProcessGroup | None = None
    #: the experts' grid of an MoE model with expert parallelism or expert tp; None otherwise
    experts: ExpertGroups | None = None

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def next_rank(self) -> int:
        return grid_rank(self.tp_rank, self.dp_rank, (self.pp_rank + 1) % self.pp, self.tp, self.dp)

    @property
    def prev_rank(self) -> int:
        return grid_rank(self.tp_rank, self.dp_rank, (self.pp_rank - 1) % self.pp, self.tp, self.dp)




def build_process_groups(tp: int, pp: int, host_backend: str | None = None, ep: int = 1,
                         etp: int = 1) -> ProcessGroups:
    """Create all groups (every rank must create every group, in the same order) and keep its own;
    `host_backend` ("gloo" on xla) makes the groups for CPU tensors apart from the others. `ep` and `etp`
    above 1 add the experts' grid."""
    world, rank = dist.get_world_size(), dist.get_rank()  # the trainer checked the layout (spec.layout)
    dp = data_parallel_size(world, tp, pp)
    tp_rank, rest = rank % tp, rank // tp
    dp_rank, pp_rank = rest % dp, rest // dp
    families = {
        "tp": [[grid_rank(t, d, p, tp, dp) for t in range(tp)] for p in range(pp) for d in range(dp)],
        "dp": [[grid_rank(t, d, p, tp, dp) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "pp": [[grid_rank(t, d, p, tp, dp) for p in range(pp)] for d in range(dp) for t in range(tp)],
    }
    if pp > 1:
        families["embedding"] = [[ranks[0], ranks[-1]] for ranks in families["pp"]]
    if host_backend is not None:
        families["host_dp"] = families["dp"]
    mine: dict[str, dist.ProcessGroup | None] = {"embedding": None}
    for name, members in families.items():
        for ranks in members:
            group = dist.new_group(ranks, backend=host_backend if name.startswith("host") else None)
            if rank in ranks:
                mine[name] = group
    host = dist.group.WORLD if host_backend is None else dist.new_group(backend=host_backend)
    return ProcessGroups(world, rank, tp, pp, dp, tp_rank, dp_rank, pp_rank, mine["tp"], mine["dp"], mine["pp"],
                         mine["embedding"], host=host, host_dp=mine.get("host_dp", mine["dp"]),
                         experts=_expert_groups(world, rank, pp, ep, etp) if ep > 1 or etp > 1 else None)


def _expert_groups(world: int, rank: int, pp: int, ep: int, etp: int) -> ExpertGroups:
    mine: dict[str, tuple[list[int], dist.ProcessGroup]] = {}
    for name, members in expert_grid(world, pp, etp, ep).items():
        for ranks in members:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = ranks, group
    return ExpertGroups(ep, etp, mine["ep"][0].index(rank), mine["etp"][0].index(rank), mine["edp"][0].index(rank),
                        mine["ep"][1],
                        mine["etp"][1], mine["tp_ep"][1], mine["edp"][1])
