"""Every shipped tag and system profile through the real JUBE (jube/nlp_benchmark.yaml): a dry run on each
system, with a tag that resolves there, and each tag at least once, each writing the point of that tag on
that system. tests/unit/spec/test_jube_definition.py checks that the definition names them all."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jube_definition import DEFINITION, jube_tag

from nlp_bench.errors import BenchError
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.systems import known_systems

pytestmark = [pytest.mark.jube,
              pytest.mark.skipif(shutil.which("jube") is None, reason="JUBE is not installed (apt-get install jube)")]


def _runs() -> list[tuple[str, str | None]]:
    """(tag, system) pairs that name every system once and every tag at least once; None: the tag's own."""
    benchmark = load_benchmark("nlp")

    def resolves(tag: str, system: str) -> bool:
        try:
            benchmark.point(tag, system)
        except BenchError:
            return False
        return True

    runs, untried = [], list(benchmark.tags)
    for system in known_systems():
        works = [tag for tag in benchmark.tags if resolves(tag, system)]
        assert works, f"no tag of benchmark/nlp.yaml resolves on system {system}"
        tag = next((t for t in untried if t in works), works[0])
        untried = [t for t in untried if t != tag]
        runs.append((tag, system))
    return runs + [(tag, None) for tag in untried]


def test_every_tag_and_system_dry_runs_in_jube(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    runs = _runs()
    started = []
    for index, (tag, system) in enumerate(runs):
        tags = [jube_tag(tag), *([jube_tag(system)] if system else []), "dry_run"]
        started.append(subprocess.Popen(["jube", "run", str(DEFINITION), "--tag", *tags, "-o", str(tmp_path / str(index))],
                                        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True))
    benchmark = load_benchmark("nlp")
    for index, ((tag, system), proc) in enumerate(zip(runs, started, strict=True)):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, (tag, system, out)
        (record,) = (tmp_path / str(index)).glob("*/*_execute/work/results/nlp/*/*/point.json")
        point = json.loads(record.read_text())
        assert (point["tag"], point["system"]) == (tag, system or benchmark.tags[tag]["system"]), out
