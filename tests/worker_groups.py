"""Which tests share one pytest-xdist worker: those that use the Slurm cluster on this machine (marked slurm,
or taking the slurm_cluster fixture, as the faults injected into the controller do). There is one cluster, with
fixed ports and folders, and a worker that ends its session stops it: two workers would clash. The rest spread
over the workers (`--dist loadgroup`). tests/integration/test_worker_groups.py checks that xdist honours it."""

from __future__ import annotations

import pytest

#: the marker of the tests that share the machine's one Slurm cluster
ONE_WORKER = ("slurm",)
#: the xdist group they are put in
GROUP = "machine"


def one_worker(items: list[pytest.Item]) -> None:
    """Put the tests that use the Slurm cluster into one xdist group."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ONE_WORKER) or "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(GROUP))
