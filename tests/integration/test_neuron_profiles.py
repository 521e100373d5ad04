"""The Neuron (Trainium) profiles as today's Neuron runs them: no XLA_USE_BF16/XLA_DOWNCAST_BF16 (torch-xla
still honours them by storing every fp32 tensor, master weights and Adam moments included, as bf16), bf16
training chosen by the profile where a tag meets the system, the compiler's flags exported, and the job's
provenance recording the PJRT_/NEURON_/XLA_ variables and the package versions it found."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from conftest import run_bench

from nlp_bench.errors import BenchError, LayoutError
from nlp_bench.launch.render import render_compile_script, render_jobscript
from nlp_bench.plan.points import from_point, from_point_json
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.switches import decode
from nlp_bench.spec.systems import known_systems, load_system
from nlp_bench.store.point_folder import PointDir

XLA_PROFILES = [name for name in known_systems() if load_system(name).backend == "xla"]

#: the tags the Trainium flows are rendered for: 175 (bf16 on GPUs as well), 13 (fp16 on GPUs), the Llama-3
#: 70B of NxD Training's tutorial, and smoke (fp32 on CPUs)
TAGS = ("175", "13", "llama3-70b", "smoke")

REFUSED = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")

def _neuron(name: str) -> bool:
    """A profile of Neuron devices (a CPU stand-in with backend xla is not one)."""
    return "NeuronCore" in load_system(name).device_name

def _train_args(script: str) -> list[str]:
    block = script.split("TRAIN_ARGS=(\n")[1].split("\n)")[0]
    return [line.strip() for line in block.splitlines()]

@pytest.mark.parametrize("system", XLA_PROFILES)
def test_xla_profiles_render_bf16_and_the_compiler_flags_without_xla_use_bf16(system):
    bench = load_benchmark()
    neuron = _neuron(system)
    rendered = []
    for tag in TAGS:
        try:
            point = bench.point(tag, system)
        except BenchError as exc:
            if not neuron:  # a CPU stand-in of one device runs smoke with tp 1, and no large tag
                if tag != "smoke":
                    continue
                point = bench.point(tag, system, tp=1)
            else:
                # only a tag without a layout of its own for this system may be left out: llama3-70b, whose
                # pipelined layouts are NxD Training's for trn1 and trn2
                assert isinstance(exc, LayoutError) and system not in (bench.tags[tag].get("systems") or {}), exc
                assert tag == "llama3-70b" and "pipeline parallelism" in str(exc), exc
                continue
        rendered.append(tag)
        scripts = [render_jobscript(point), render_compile_script(point)]
        for script in filter(None, scripts):
            for name in REFUSED:
                assert name not in script, f"{system} {tag}: {name}"
            assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
            if not neuron:
                continue
            args = _train_args(script)
            assert "--bf16" in args and "--fp16" not in args, f"{system} {tag}: {args}"
            flags = load_system(system).neuron_cc_flags
            assert flags and f"export NEURON_CC_FLAGS='{flags}'\n" in script, f"{system} {tag}"
        if not neuron:
            continue
        # point.json, the planner and the jobscript agree on the precision
        data = json.loads(json.dumps(point.to_dict()))
        assert decode(data["train"]).precision == "bf16"
        assert from_point(point).candidate.switches.precision == "bf16"
        assert from_point_json(data).candidate.switches.precision == "bf16"
        asked = decode(bench.point(tag).train).precision  # on the tag's own system
        if asked != "bf16":
            note = f"in place of the tag's {asked}"
            assert note in data["precision_note"] and note in scripts[0].split("#SBATCH")[0]
        else:
            assert "precision_note" not in data and "# Precision:" not in scripts[0]
    assert "smoke" in rendered
    if neuron:
        assert {"175", "13"} <= set(rendered)
    if system in ("trn1", "trn2"):
        assert "llama3-70b" in rendered

@pytest.mark.parametrize("name", REFUSED)
def test_a_profile_setting_xla_use_bf16_is_refused_in_one_line_naming_it(site, tmp_path, name):
    profile = site / "slurm" / "systems" / "trn1.yaml"
    profile.write_text(profile.read_text().replace("  FI_PROVIDER: efa\n", f"  FI_PROVIDER: efa\n  {name}: 1\n"))
    proc = run_bench("run", "--tag", "smoke", "--system", "trn1", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(profile) in lines[0] and name in lines[0] and "precision: bf16" in lines[0]
    assert "Traceback" not in proc.stderr

def test_the_jobscript_records_pjrt_neuron_xla_and_package_versions(tmp_path):
    """The jobscript's own provenance lines, run by bash with this interpreter as the job's python, and read
    back as result.json's provenance reads them."""
    script = render_jobscript(load_benchmark().point("smoke", "trn1"))
    lines = script[script.index("env | grep"):script.index("on_time_limit()")]
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PJRT_DEVICE": "NEURON", "NEURON_RT_LOG_LEVEL": "WARNING",
           "XLA_FLAGS": "--xla_dump_to=/tmp/x", "HOME": str(tmp_path), "UNRELATED": "1"}
    (tmp_path / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (tmp_path / "python3").chmod(0o755)
    subprocess.run(["bash", "-c", lines], cwd=tmp_path, env=env, check=True)
    folder = PointDir(tmp_path)
    environment = folder.environment()
    assert environment["PJRT_DEVICE"] == "NEURON" and environment["NEURON_RT_LOG_LEVEL"] == "WARNING"
    assert environment["XLA_FLAGS"] == "--xla_dump_to=/tmp/x" and "UNRELATED" not in environment
    assert folder.packages()["torch"] == importlib.metadata.version("torch")
    assert not any(name.startswith("package.") for name in environment)
    # a python without the packages (or none at all) records none, and the script goes on
    (tmp_path / "python3").write_text("#!/bin/sh\nexit 1\n")
    done = subprocess.run(["bash", "-c", lines + "echo went-on"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert "went-on" in done.stdout and done.stderr == "" and PointDir(tmp_path).packages() == {}

def _expanded_train_args(script: str) -> list[str]:
    """The trainer's arguments as the job's shell would pass them: the script's exports, then its TRAIN_ARGS."""
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    block = "TRAIN_ARGS=(\n" + script.split("TRAIN_ARGS=(\n")[1].split("\n)")[0] + "\n)"
    shown = subprocess.run(["bash", "-c", f'{exports}\n{block}\nprintf "%s\\n" "${{TRAIN_ARGS[@]}}"'],
                           capture_output=True, text=True, check=True)
    return shown.stdout.splitlines()

@pytest.mark.parametrize("tag", ["smoke", "13", "175"])
def test_the_native_profile_renders_the_trainer_on_the_neuron_backend_and_its_own_parser_takes_it(tag):
    from nlp_bench.train.args import parse_args
    from nlp_bench.train.config import build_config

    point = load_benchmark().point(tag, "trn2-native")
    script = render_jobscript(point)
    assert render_compile_script(point) is None  # eager and torch.compile: no ahead-of-time compile job
    assert not any(name in script for name in REFUSED)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    args = _expanded_train_args(script)
    assert "--bf16" in args and args[args.index("--distributed-backend") + 1] == "neuron"
    if "--mock-data" in args:  # the others name the site's data files, which the parser opens
        config = build_config(parse_args(args), point.layout.world)
        assert (config.parallel.backend, config.switches.precision, config.parallel.dp) == (
            "neuron", "bf16", point.layout.dp)

def test_a_dry_run_on_the_native_profile_says_in_one_line_what_it_could_not_check(tmp_path):
    proc = run_bench("--results-dir", str(tmp_path / "results"), "run", "--tag", "smoke", "--system", "trn2-native",
                     "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "not checked here" in line]
    assert line.startswith("bench: warning: not checked here: profile trn2-native trains on the native neuron "
                           "backend, which needs TorchNeuron (torch-neuronx 2.13 or later")
    assert "bench doctor --system trn2-native --on-node" in line

def _trainer(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nlp_bench.train", "--num-layers", "2", "--hidden-size", "32",
                           "--num-attention-heads", "2", "--seq-length", "16", "--mock-data", "--vocab-size", "256",
                           "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "2",
                           "--distributed-backend", "neuron", *flags],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})

def test_the_trainer_on_the_neuron_backend_without_torchneuron_is_one_line(tmp_path):
    proc = _trainer()
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nlp_bench.train: error: --distributed-backend neuron needs TorchNeuron (torch-neuronx 2.13 or later with "
        "the torch of its version, Neuron 2.33+, trn2/trn3); it is not installed"]
    # a torch_neuronx that registers no neuron process group (the torch-xla based one has the same name)
    (tmp_path / "torch_neuronx.py").write_text("")
    proc = _trainer(env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.endswith("this torch_neuronx registers no neuron backend (the torch-xla based one runs "
                         "--distributed-backend xla)")
