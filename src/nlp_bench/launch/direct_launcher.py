"""`launcher: direct`: the job's shell is the only node and starts torchrun itself (a workstation, or a
one-node job of a scheduler that needs no srun)."""

from __future__ import annotations

from nlp_bench.launch.launcher import register_launcher
from nlp_bench.spec.systems import System


@register_launcher
class DirectLauncher:
    name = "direct"
    start = ""
    stop = 'kill -TERM "$launcher_pid" 2>/dev/null'

    def rendezvous(self, system: System) -> str:
        return "export MASTER_ADDR=localhost"
