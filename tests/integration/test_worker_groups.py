"""The tests that use the Slurm cluster run on one pytest-xdist worker, and a module's other tests on one, as
tests/worker_groups.py asks.

pytest 9.2 gives tests structured ids, and xdist 3.8's loadgroup, which marks a group by rewriting the id,
then groups nothing, silently (pytest-dev/pytest-xdist#1386): the Slurm tests ran on both workers, one
cluster between them, stopped by whichever worker finished first. pyproject.toml keeps pytest below 9.2
until xdist groups again; this test says when that holds."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SESSION = """
import os, pytest

@pytest.mark.parametrize("i", range({n}))
def test_alone(i):
    with open({alone!r}, "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.slurm
@pytest.mark.parametrize("i", range({n}))
def test_on_the_cluster(i):
    with open({out!r}, "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.fixture
def slurm_cluster():
    return None

def test_taking_the_cluster(slurm_cluster):
    with open({out!r}, "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

CONFTEST = """
import pytest
from worker_groups import one_worker

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    one_worker(items)
"""


def test_the_tests_that_use_the_cluster_share_one_worker(tmp_path: Path):
    out = tmp_path / "workers.txt"
    (tmp_path / "test_groups.py").write_text(SESSION.format(n=6, out=str(out), alone=str(tmp_path / "alone.txt")))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "-q", "-m", "", "-o", "markers=slurm", "-c", os.devnull, "--rootdir", str(tmp_path),
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = out.read_text().split()
    assert len(workers) == 7 and len(set(workers)) == 1, workers
    alone = (tmp_path / "alone.txt").read_text().split()
    assert len(alone) == 6 and len(set(alone)) == 1, alone
