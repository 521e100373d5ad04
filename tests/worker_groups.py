"""Which tests share a pytest-xdist worker (`--dist loadgroup`). The tests that use the Slurm cluster on this
machine (marked slurm, or taking the slurm_cluster fixture, as the faults injected into the controller do) share
one: there is one cluster, with fixed ports and folders, and a worker that ends its session stops it. Every
other test stays with the tests of its module, so that what a module makes once for all its tests (the
trainer runs, the smoke run whose files several tests read) is made once, not once on each worker.
tests/integration/test_worker_groups.py checks that xdist honours it."""

from __future__ import annotations

import pytest

#: the marker of the tests that share the machine's one Slurm cluster
ONE_WORKER = ("slurm",)
#: the xdist group they are put in
GROUP = "machine"


def one_worker(items: list[pytest.Item]) -> None:
    """Put the tests that use the Slurm cluster into one xdist group, and every other test into its module's."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ONE_WORKER) or "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(GROUP))
        else:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
