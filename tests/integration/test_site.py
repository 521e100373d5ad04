"""The site layer from a live cluster: `bench system detect` (Slurm's records read, the device table) and
`bench doctor` (what a first run needs). These run on recorded scontrol output; tests/test_slurm.py runs
both against the emulated cluster."""



import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_bench

from nlp_bench.app.doctor import FAIL, OK, doctor
from nlp_bench.app.site_profile import detect
from nlp_bench.launch.slurm_inventory import read_inventory

CONFIG = "Configuration data as of 2026-11-23T10:00:00\nClusterName             = booster\nSLURM_VERSION           = 23.02.7\n"

PARTITIONS = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL Default=YES MaxNodes=UNLIMITED MaxTime=1-00:00:00 "
    "Nodes=g[01-04] State=UP TotalCPUs=384 TotalNodes=4\n"
    "PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL Default=NO MaxTime=02:00:00 Nodes=c[01-02] State=UP "
    "TotalCPUs=256 TotalNodes=2\n")

def _node(name: str, gres: str, cpus: int, partitions: str, features: str = "(null)") -> str:
    return (f"NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUTot={cpus} AvailableFeatures={features} "
            f"ActiveFeatures={features} Gres={gres} NodeAddr={name} OS=Linux 5.14.0-362.el9.x86_64 #1 SMP PREEMPT "
            f"RealMemory=515000 Sockets=2 Boards=1 State=IDLE Partitions={partitions} Reason=cable swap by ops "
            f"[root@2026-11-01]\n")

NODES = "".join([_node(f"g0{i}", "gpu:h100:4(S:0-1)", 96, "gpu") for i in range(1, 5)]
                + [_node(f"c0{i}", "(null)", 128, "cpu") for i in range(1, 3)])

def fake_slurm(argv, timeout):
    out = {"config": CONFIG, "partition": PARTITIONS, "node": NODES}[argv[2]]
    return subprocess.CompletedProcess(argv, 0, out, "")

@pytest.fixture
def slurm_tools(monkeypatch):
    """scontrol and friends 'on PATH' for read_inventory's check, answered by fake_slurm."""
    monkeypatch.setattr("nlp_bench.launch.slurm_inventory.shutil.which", lambda name: f"/usr/bin/{name}")

def test_detected_gpu_profile_is_filled_from_gres_and_the_device_table(slurm_tools, site, bench):
    from nlp_bench.spec.systems import load_system

    text, missing = detect("booster-h100", inventory=read_inventory(fake_slurm))
    (site / "slurm" / "systems" / "booster-h100.yaml").write_text(text)
    system = load_system("booster-h100")
    assert (system.device, system.device_name, system.devices_per_node, system.peak_tflops) == ("cuda", "H100-SXM-80GB", 4, 989)
    assert system.partition == "gpu" and system.max_nodes == 4 and system.sbatch["gpus-per-node"] == 4
    assert system.sbatch["cpus-per-task"] == 96 and system.backend == "nccl" and "H100" in system.sources["peak_tflops"]
    assert system.detected["partitions"]["cpu"]["max_time"] == "02:00:00"
    assert set(missing) == {"inter_node_gbps", "link_latency_us"} and text.count("FILL IN") >= 2
    out = bench("run", "--tag", "smoke", "--system", "booster-h100", "--dry-run")
    assert out.exit_code == 0, out.output

def test_detected_cpu_partition_runs_ranks_on_cpus(slurm_tools, site):
    from nlp_bench.spec.systems import load_system

    text, missing = detect("cpu-nodes", partition="cpu", inventory=read_inventory(fake_slurm))
    (site / "slurm" / "systems" / "cpu-nodes.yaml").write_text(text)
    system = load_system("cpu-nodes")
    assert (system.device, system.backend, system.devices_per_node, system.env["OMP_NUM_THREADS"]) == ("cpu", "gloo", 2, 64)
    assert "gpus-per-node" not in system.sbatch and set(missing) == {"inter_node_gbps", "link_latency_us"}
    # CPU ranks test the plumbing: nominal per-core figures (64 cores a rank) rather than blanks, each sourced
    assert system.peak_tflops == 6.4 and system.memory_bandwidth_gbps == 640 and "AVX2" in system.sources["peak_tflops"]

def test_detect_names_an_unknown_partition_in_one_line(slurm_tools, monkeypatch, tmp_path, bench):
    monkeypatch.setattr("nlp_bench.launch.slurm_inventory.run_command", fake_slurm)
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    out = CliRunner().invoke(cli, ["system", "detect", "--partition", "gpuu", "-o", str(tmp_path / "x.yaml")])
    assert out.exit_code == 2 and "unknown partition 'gpuu'" in out.stderr and "did you mean 'gpu'" in out.stderr
    assert not (tmp_path / "x.yaml").exists()

def test_what_slurm_cannot_tell_is_given_on_the_command_line_and_the_profile_is_planned(slurm_tools, site,
                                                                                        monkeypatch):
    """`--set inter_node_gbps=... --set link_latency_us=...`: nothing is left to fill in, the values carry
    their source, and `bench plan` times the profile at once; a key detect does not write is one line."""
    from click.testing import CliRunner

    from nlp_bench.cli import cli
    from nlp_bench.spec.systems import load_system

    monkeypatch.setattr("nlp_bench.launch.slurm_inventory.run_command", fake_slurm)
    profile = site / "slurm" / "systems" / "given.yaml"
    out = CliRunner().invoke(cli, ["system", "detect", "-o", str(profile), "--set", "inter_node_gbps=25",
                                   "--set", "link_latency_us=4.5"])
    assert out.exit_code == 0 and "fill in" not in out.output, out.output
    system = load_system("given")
    assert (system.inter_node_gbps, system.link_latency_us) == (25, 4.5) and "--set" in system.sources["inter_node_gbps"]
    assert "# FILL IN" not in profile.read_text() and ": FILL IN" not in profile.read_text()
    plan = CliRunner().invoke(cli, ["plan", "--tag", "smoke", "--system", "given", "--top", "1"])
    assert plan.exit_code == 0 and "bench run --tag smoke --system given" in plan.output, plan.output
    for bad, said in (("ib_gbps=25", "unknown --set key 'ib_gbps'"), ("inter_node_gbps=fast", "a positive number")):
        out = CliRunner().invoke(cli, ["system", "detect", "-o", str(site / "x.yaml"), "--set", bad])
        assert out.exit_code == 2 and said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.output
    assert not (site / "x.yaml").exists()

def test_probe_names_the_gpu_and_an_unseen_gpu_means_cpu_ranks(slurm_tools, site, monkeypatch):
    """--probe: nvidia-smi's name picks the device (Gres here names no type); where nvidia-smi sees no GPU
    on a node whose Gres lists some, the ranks run on its CPUs and the GPUs are still requested."""
    from nlp_bench.app import site_profile
    from nlp_bench.spec.systems import load_system

    untyped = NODES.replace("gpu:h100:4(S:0-1)", "gpu:4")

    def slurm(argv, timeout):
        out = {"config": CONFIG, "partition": PARTITIONS, "node": untyped}[argv[2]]
        return subprocess.CompletedProcess(argv, 0, out, "")

    seen = "node g01\ncpus 96\n" + "gpu NVIDIA H100 80GB HBM3, 81559\n" * 4
    monkeypatch.setattr(site_profile, "run_on_node", lambda *a, **k: (True, seen))
    text, _ = detect("probed", probe=True, inventory=read_inventory(slurm))
    (site / "slurm" / "systems" / "probed.yaml").write_text(text)
    system = load_system("probed")
    assert (system.device, system.device_name, system.peak_tflops) == ("cuda", "H100-SXM-80GB", 989)
    assert "named by nvidia-smi" in text and system.detected["probe"]["gpus"][0]["memory_gib"] == 79.6
    monkeypatch.setattr(site_profile, "run_on_node", lambda *a, **k: (True, "node g01\ncpus 96\n"))
    text, missing = detect("blind", probe=True, inventory=read_inventory(slurm))
    (site / "slurm" / "systems" / "blind.yaml").write_text(text)
    system = load_system("blind")
    assert (system.device, system.backend, system.devices_per_node) == ("cpu", "gloo", 4)
    assert system.sbatch["gpus-per-node"] == 4 and "found none" in text and "peak_tflops" not in missing
    monkeypatch.setattr(site_profile, "run_on_node", lambda *a, **k: (False, "srun: error: Unable to allocate"))
    with pytest.raises(Exception, match="probe job on partition gpu failed: srun: error: Unable to allocate"):
        detect("failed", probe=True, inventory=read_inventory(slurm))

def test_a_shipped_profile_is_refused_at_submission_with_the_key_to_change(tmp_path, monkeypatch):
    """A fresh clone: `bench run --tag 175 --system juwels-booster` (not dry) would queue a job that cannot run
    (account CHANGE_ME, a venv under $HOME that is not there, data under an unset $PROJECT)."""
    monkeypatch.delenv("PROJECT", raising=False)
    monkeypatch.delenv("NLP_BENCH_DATA", raising=False)
    monkeypatch.delenv("NLP_BENCH_VENV", raising=False)
    proc = run_bench("run", "--tag", "175", "--system", "juwels-booster", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("bench: error: sbatch.account of profile juwels-booster is still CHANGE_ME (edit "
                           "slurm/systems/juwels-booster.yaml, or pass --account VALUE)")
    assert "nothing was submitted" in line and not any((tmp_path / "results").rglob("run.json"))
    # --dry-run writes the scripts and warns about each, with what to change
    proc = run_bench("run", "--tag", "175", "--system", "juwels-booster", "--account", "proj", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [w for w in proc.stderr.splitlines() if w.startswith("bench: warning:")]
    assert len(warnings) == 2 and all(w.endswith("a run without --dry-run refuses to submit") for w in warnings)
    assert "env_setup[2] of profile juwels-booster sources" in warnings[0] and "does not exist" in warnings[0]
    assert "data_dir of profile juwels-booster ($PROJECT/nlp-bench/data) reads $PROJECT, which is not set" in warnings[1]
    script = next((tmp_path / "results").rglob("jobscript.sbatch")).read_text()
    assert "#SBATCH --account=proj" in script and "CHANGE_ME" not in script

def test_slurm_options_on_the_command_line_reach_the_jobscript(bench, results):
    out = bench("run", "--tag", "175", "--dry-run", "--account", "proj", "--partition", "develbooster", "--time",
                "00:30:00", "--qos", "q", "--reservation", "r", "--sbatch", "constraint=a100", "--sbatch", "exclusive")
    assert out.exit_code == 0, out.output
    script = next(results.rglob("jobscript.sbatch")).read_text()
    for line in ("--account=proj", "--partition=develbooster", "--time=00:30:00", "--qos=q", "--reservation=r",
                 "--constraint=a100"):
        assert f"#SBATCH {line}\n" in script
    assert "#SBATCH --exclusive\n" in script
    out = bench("run", "--tag", "175", "--dry-run", "--sbatch", "bad key=1")
    assert out.exit_code == 2 and "'bad key' is not an sbatch option name" in out.output


def test_doctor_on_this_machine_passes_and_names_a_missing_data_file(bench, monkeypatch, tmp_path):
    from nlp_bench.spec.benchmark import load_benchmark

    out = bench("doctor", "--system", "local")
    assert out.exit_code == 0 and "ready for a first run" in out.output, out.output
    assert "nlp-bench" in out.output and "torch" in out.output
    point = load_benchmark().point("13")
    monkeypatch.setenv("NLP_BENCH_DATA", str(tmp_path))
    (tmp_path / "gpt2-vocab.json").write_text("{}")
    checks = {(c.name, Path(c.detail.split()[0]).name): c.status for c in doctor(point) if c.name.startswith("data")}
    assert checks[("data vocab-file", "gpt2-vocab.json")] == OK
    assert checks[("data merge-file", "gpt2-merges.txt")] == FAIL
    assert checks[("data data-path", "oscar_text_document.bin")] == FAIL


def test_doctor_checks_the_megatron_lm_checkout_for_that_trainer(bench, monkeypatch):
    monkeypatch.delenv("MEGATRON_LM_REPO", raising=False)
    out = bench("doctor", "--system", "local", "--trainer", "megatron-lm")
    assert out.exit_code == 1 and "FAIL  megatron-lm" in out.output and "MEGATRON_LM_REPO" in out.output
    monkeypatch.setenv("MEGATRON_LM_REPO", str(ROOT / "tests" / "fixtures" / "megatron_lm"))
    out = bench("doctor", "--system", "local", "--trainer", "megatron-lm")
    assert out.exit_code == 0, out.output
    assert "ok    megatron-lm         Megatron-LM 0.20.0 (commit unknown: not a git checkout) at " in out.output
    assert "ok    megatron-lm flags   every flag of tag smoke's jobscript is in benchmark/megatron-lm/flags/0.20.0.tsv" \
        in out.output
    assert "megatron-lm" not in bench("doctor", "--system", "local").output  # the built-in trainer needs none


def test_doctor_names_the_version_a_tag_cannot_run_on(bench, monkeypatch, tmp_path):
    """A checkout of the reference's version (0.4.0rc0, from before --mock-data) fails the smoke tag's flags;
    one of an unknown version is checked against the nearest table, and says so."""
    old = tmp_path / "Megatron-LM"
    shutil.copytree(ROOT / "tests" / "fixtures" / "megatron_lm", old)
    info = old / "megatron" / "core" / "package_info.py"
    info.write_text(info.read_text().replace("MINOR = 20", "MINOR = 4").replace("PRE_RELEASE = ''", "PRE_RELEASE = 'rc0'"))
    monkeypatch.setenv("MEGATRON_LM_REPO", str(old))
    out = bench("doctor", "--system", "local", "--trainer", "megatron-lm")
    assert out.exit_code == 1 and "ok    megatron-lm         Megatron-LM 0.4.0rc0" in out.output
    assert "FAIL  megatron-lm flags   tag 'smoke' on local: Megatron-LM 0.4.0rc0 (f772743329) has no flag --mock-data" \
        in out.output
    info.write_text(info.read_text().replace("MINOR = 4", "MINOR = 19").replace("'rc0'", "''"))
    out = bench("doctor", "--system", "local", "--trainer", "megatron-lm")
    assert "warn  megatron-lm flags" in out.output and "Megatron-LM 0.19.0 has no flag table here: checked against " \
        "the nearest known, 0.20.0" in out.output, out.output
