"""Parts bench has never heard of, for the tests that check a registered part is accepted everywhere a
shipped one is: a site profile that names one, and a batch scheduler that registers itself."""

import re
from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch.executor import register_executor


def site_profile(site: Path, name: str, **changes: str) -> Path:
    """A copy of the shipped `local` profile under another name, with some keys changed."""
    text = (site / "slurm" / "systems" / "local.yaml").read_text().replace("name: local", f"name: {name}")
    for key, value in changes.items():
        text = re.sub(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
    path = site / "slurm" / "systems" / f"{name}.yaml"
    path.write_text(text)
    return path


def queue_executor() -> type:
    """Register `pbs-test`, a queueing executor whose scheduler is never available, and return its class."""

    @register_executor
    class QueueExecutor:
        """A batch scheduler bench has never heard of."""

        name = "pbs-test"
        queues = True
        holds_jobs = False
        silence = None

        def check_available(self) -> None:
            raise LaunchError("pbs-test: no qsub here")

    return QueueExecutor
