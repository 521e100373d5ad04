"""`launcher: srun`: one task per node of the Slurm allocation, each running torchrun for its node's ranks;
the allocation's first node hosts the rendezvous."""

from __future__ import annotations

from nlp_bench.launch.launcher import register_launcher
from nlp_bench.spec.systems import System


@register_launcher
class SrunLauncher:
    name = "srun"
    start = ("srun --ntasks-per-node=1 ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} "
             "--kill-on-bad-exit=1 \\\n    ")
    #: the job's own steps end with it, on every node
    stop = 'scancel "$SLURM_JOB_ID"'

    def rendezvous(self, system: System) -> str:
        return ('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
                f'export MASTER_ADDR="${{MASTER_ADDR}}{system.master_addr_suffix}"')
