"""The linter's rules (pyproject.toml, [tool.ruff]) hold on the whole tree: CI runs this with the tests."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    proc = subprocess.run([ruff, "check", "src", "tests", "benchmark"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
