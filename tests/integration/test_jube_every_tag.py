"""Every shipped tag and system profile through the real JUBE (jube/nlp_benchmark.yaml). JUBE's debug mode
reads the definition, selects by the tags and evaluates every parameter as a run does, and logs each step's
command instead of running it: one such run per system, the tags taken in turn, must give the `bench run` of
that tag on that system. One real dry run, trn1's Llama 3 70B, writes its jobscript through JUBE and bench.
tests/unit/spec/test_jube_definition.py checks that the definition names them all."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jube_definition import DEFINITION, jube_tag

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.systems import known_systems

pytestmark = [pytest.mark.jube,
              pytest.mark.skipif(shutil.which("jube") is None, reason="JUBE is not installed (apt-get install jube)")]


def _start(*args: str, cwd: Path) -> subprocess.Popen:
    # bench from this interpreter's environment, whichever checkout the tests run in
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cwd.mkdir(parents=True)
    return subprocess.Popen(["jube", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_every_tag_and_system_selects_its_bench_run(tmp_path):
    tags, systems = list(load_benchmark("nlp").tags), known_systems()
    pairs = [(tags[i % len(tags)], systems[i % len(systems)]) for i in range(max(len(tags), len(systems)))]
    started = [_start("--debug", "run", str(DEFINITION), "--tag", jube_tag(tag), jube_tag(system), "dry_run",
                      "-o", "run", cwd=tmp_path / str(index)) for index, (tag, system) in enumerate(pairs)]
    for index, ((tag, system), proc) in enumerate(zip(pairs, started, strict=True)):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, (tag, system, out)
        log = (tmp_path / str(index) / "jube-debug.log").read_text()
        commands = re.findall(r">>> \S+ --results-dir results (run [^;]*);", log)
        assert commands == [f"run --tag {tag} --system {system} --dry-run --wait"], (tag, system, commands)


def test_trn1_llama3_70b_through_jube_says_the_run_is_refused(tmp_path):
    proc = _start("run", str(DEFINITION), "--tag", "llama3_70b", "trn1", "dry_run", "-o", "run", cwd=tmp_path / "jube")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (script,) = (tmp_path / "jube" / "run").glob("*/*_execute/work/results/nlp/*/llama3-70b_n16_tp32_pp8_*/jobscript.sbatch")
    header = script.read_text().split("#SBATCH", 1)[0]
    assert "NOT runnable as it is: `bench run` refuses to submit it:" in header and "runnable as it is:" not in header.replace("NOT runnable as it is:", "")
    assert "pipeline parallelism (pp 8) is not available with the xla backend of system 'trn1'" in header
