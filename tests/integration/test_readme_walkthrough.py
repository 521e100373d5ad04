"""The README's "A first real run on your cluster", run as it is written on the tests' Slurm cluster: each
command of its block in bash, in a copy of the checkout's site layer, with `bench` from this environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, shorten

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SECTION = "## A first real run on your cluster"


def walkthrough(readme: str) -> list[str]:
    """The commands of the section's shell block, in order (comments and blank lines left out)."""
    section = readme[readme.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the walkthrough is one ```sh block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_walkthrough_is_the_steps_a_first_run_takes():
    commands = walkthrough((ROOT / "README.md").read_text())
    verbs = [" ".join(c.split()[1:3]) for c in commands]
    steps = ["system detect", "doctor --system", "plan --tag", "run --tag", "sweep --resume", "status RUN",
             "result table", "result report"]
    assert all(c.startswith("bench ") for c in commands), commands
    assert [s for s in steps if any(v.startswith(s) for v in verbs)] == steps, verbs
    positions = [next(i for i, v in enumerate(verbs) if v.startswith(s)) for s in steps]
    assert positions == sorted(positions), "profile, doctor, plan, dry run, submit, status, table, report"


def test_the_readme_walkthrough_runs_as_written_on_the_test_cluster(slurm_cluster, tmp_path):
    checkout = tmp_path / "checkout"
    for part in ("benchmark", "slurm", "results/reference"):
        shutil.copytree(ROOT / part, checkout / part)
    shorten(checkout, "smoke", 10)
    env = {**{k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"}, "NLP_BENCH_ROOT": str(checkout),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80"}
    run_id = None
    said = []
    for command in walkthrough((ROOT / "README.md").read_text()):
        if "RUN" in command.split():
            assert run_id, f"{command!r} needs the run id the dry run prints, and none was printed"
            command = " ".join(run_id if word == "RUN" else word for word in command.split())
        done = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=300)
        said.append(f"$ {command}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, "\n".join(said)[-6000:]
        if " --dry-run" in command:
            found = re.search(r"^run (\S+):", done.stdout, re.M)
            run_id = found and found.group(1)
    profile = (checkout / "slurm" / "systems" / "mysite.yaml").read_text()
    assert "partition: debug" in profile and "device: cpu" in profile and "found none" in profile, profile
    status = said[-3]
    assert "COMPLETED" in status, status
    table = said[-2]
    assert "Tokens/sec" in table and "COMPLETED" in table and "report" in table, table
    report = (checkout / "report.html").read_text()
    assert "mysite" in report and "Tokens/sec" in report
