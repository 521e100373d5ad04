"""Executors, launchers and log formats register themselves: a part added in a test (or a module) is accepted by
the profiles, `bench run`, `bench doctor` and `bench parse` without a whitelist or a table learning its name,
and a name no part answers to is refused in one line that names where it came from and what is known."""

import re
from pathlib import Path

import pytest

from nlp_bench.analysis.formats import FORMATS
from nlp_bench.errors import LaunchError
from nlp_bench.launch.executor import EXECUTORS, executor_for, get_executor, register_executor
from nlp_bench.launch.launcher import LAUNCHERS, register_launcher
from nlp_bench.spec.systems import load_system_file


@pytest.fixture(autouse=True)
def _registries_restored(monkeypatch):
    """What a test registers is forgotten after it (the shipped parts were all found first)."""
    for registry in (EXECUTORS, LAUNCHERS, FORMATS):
        registry.names()
        monkeypatch.setattr(registry, "entries", dict(registry.entries))
        monkeypatch.setattr(registry, "aliases", dict(registry.aliases))

def _profile(site: Path, name: str, **changes: str) -> Path:
    """A copy of the shipped `local` profile under another name, with some keys changed."""
    text = (site / "slurm" / "systems" / "local.yaml").read_text().replace("name: local", f"name: {name}")
    for key, value in changes.items():
        text = re.sub(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
    path = site / "slurm" / "systems" / f"{name}.yaml"
    path.write_text(text)
    return path

def _queue_executor():
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

def _pdsh_launcher():
    @register_launcher
    class PdshLauncher:
        name = "pdsh-test"
        start = "pdsh -w \"$NODES\" "
        stop = "pdsh-kill-test"

        def rendezvous(self, system) -> str:
            return "export MASTER_ADDR=$(first-node-test)"

    return PdshLauncher

def test_a_registered_executor_is_accepted_by_a_profile_and_a_dry_run(site, bench, results):
    queue = _queue_executor()
    path = _profile(site, "pbs-site", executor="pbs-test")
    system = load_system_file(path)
    assert system.profile_path == str(path) and isinstance(executor_for(system), queue)
    assert isinstance(get_executor("pbs-test"), queue)
    out = bench("run", "--tag", "smoke", "--system", "pbs-site", "--dry-run")
    assert out.exit_code == 0, out.output
    assert len(list(results.glob("nlp/*/*/jobscript.sbatch"))) == 1

def test_a_registered_launcher_writes_the_jobscript_lines(site, bench, results):
    _pdsh_launcher()
    _profile(site, "pdsh-site", launcher="pdsh-test")
    out = bench("run", "--tag", "smoke", "--system", "pdsh-site", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/*/jobscript.sbatch")
    text = script.read_text()
    assert "\nexport MASTER_ADDR=$(first-node-test)\n" in text
    assert '\npdsh -w "$NODES" bash -c "$LAUNCH" torchrun "${TRAIN_ARGS[@]}" &\n' in text
    assert "\n            pdsh-kill-test\n" in text
    assert "scontrol" not in text and "localhost" not in text
