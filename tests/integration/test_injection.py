"""Values reach the jobscript only as text: no value can run a command when the script runs."""

import os
import subprocess

import pytest
import yaml

from nlp_bench.errors import SpecError

PAYLOADS = ["$(touch PWNED1)", "`touch PWNED2`", "x; touch PWNED3", "x\ntouch PWNED4", "x' ; touch PWNED5 ; '",
            'x" ; touch PWNED6 ; "', "${IFS}$(touch PWNED7)", "x|touch PWNED8", "x && touch PWNED9"]

def _poison_benchmark(root, train=None, sbatch=None, tag="smoke"):
    path = root / "benchmark" / "nlp.yaml"
    data = yaml.safe_load(path.read_text())
    data["tags"][tag]["train"].update(train or {})
    data["tags"][tag].setdefault("sbatch", {}).update(sbatch or {})
    path.write_text(yaml.safe_dump(data))

def test_no_value_runs_a_command(site, tmp_path):
    from nlp_bench.launch.render import render_jobscript
    from nlp_bench.spec.benchmark import load_benchmark

    flags = {f"flag-{i}": payload for i, payload in enumerate(PAYLOADS)}
    _poison_benchmark(site, train=flags)
    profile = site / "slurm" / "systems" / "local.yaml"
    data = yaml.safe_load(profile.read_text())
    data["env"].update({f"EVIL_{i}": payload for i, payload in enumerate(PAYLOADS)})
    profile.write_text(yaml.safe_dump(data))
    script = render_jobscript(load_benchmark().point("smoke"))

    work = tmp_path / "job"
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True)
    stub = bin_dir / "torchrun"  # records the arguments it receives instead of training
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > args.txt\nenv > env.txt\n')
    stub.chmod(0o755)
    (work / "jobscript.sbatch").write_text(script)
    proc = subprocess.run(["bash", "jobscript.sbatch"], cwd=work, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert not list(work.glob("PWNED*")) and not list(tmp_path.glob("**/PWNED*")), "a value ran a command"
    args = (work / "args.txt").read_text()
    for payload in PAYLOADS:
        literal = payload.replace("${IFS}", "")  # ${NAME} references expand by design; the rest is text
        assert literal in args, f"{payload!r} did not arrive as one literal argument"
    env = (work / "env.txt").read_text()
    assert "EVIL_0=$(touch PWNED1)" in env

@pytest.mark.parametrize("value", ["x\n#SBATCH --wrap=touch PWNED", "x\rtouch PWNED", "a\x00b"])
def test_sbatch_values_stay_one_line(site, value):
    from nlp_bench.spec.benchmark import load_benchmark

    _poison_benchmark(site, sbatch={"comment": value})
    with pytest.raises(SpecError, match="must be one printable line"):
        load_benchmark()
