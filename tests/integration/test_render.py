"""The committed reference jobscripts are exactly what `bench run --dry-run` renders today."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from nlp_bench.launch.render import render_jobscript
from nlp_bench.spec.benchmark import load_benchmark


def _dry_run(bench, results: Path, tag: str) -> str:
    out = bench("run", "--tag", tag, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "sbatch jobscript.sbatch" in out.output
    scripts = list(results.glob("nlp/*/*/jobscript.sbatch"))
    assert len(scripts) == 1
    assert str(scripts[0]) in out.output
    return scripts[0].read_text()

@pytest.mark.parametrize("tag,golden", [("175", "jobscript_175B.sbatch"), ("13", "jobscript_13B.sbatch")])
def test_dry_run_matches_committed_script(bench, results, tag, golden):
    rendered = _dry_run(bench, results, tag)
    assert rendered == (ROOT / "slurm" / golden).read_text(), (
        f"slurm/{golden} is stale: regenerate it with `bench run --tag {tag} --dry-run`")

def test_175b_script_values(bench, results):
    text = _dry_run(bench, results, "175")
    for needle in ("#SBATCH --nodes=96", "export TP_SIZE=8", "export PP_SIZE=8", "export MICRO_BATCH_SIZE=1",
                   "export GAS=16", "export GLOBAL_BATCH_SIZE=96", "export NHIDDEN=12288", "export NLAYERS=96",
                   "export NHEADS=96", "export SEQ_LEN=2048", "#SBATCH --partition=booster", "#SBATCH --gres=gpu:4",
                   "#SBATCH --cpus-per-task=48", "--bf16", "--init-method-std 0.0048", "--use-distributed-optimizer",
                   "--sequence-parallel", "--recompute-activations", "--use-flash-attn", "--distributed-backend nccl",
                   "--rdzv_backend c10d", "--max_restarts 0", "--tee 3", "-m nlp_bench.train",
                   'export MASTER_ADDR="${MASTER_ADDR}i"', "srun --ntasks-per-node=1"):
        assert needle in text, needle
    assert "--fp16" not in text
    assert not list(results.glob("nlp/*/*/job.out")), "a dry run must not run anything"

def test_13b_script_values(bench, results):
    text = _dry_run(bench, results, "13")
    for needle in ("#SBATCH --nodes=8", "export TP_SIZE=2", "export PP_SIZE=4", "export GAS=256",
                   "export GLOBAL_BATCH_SIZE=1024", "export NHIDDEN=5120", "export NLAYERS=40", "export NHEADS=32",
                   "--fp16", "--lr-warmup-samples 216320", "--train-samples 300000000"):
        assert needle in text, needle

@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("tag", ["175", "13", "smoke"])
def test_scripts_are_valid_bash(tag):
    script = render_jobscript(load_benchmark().point(tag))
    proc = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr

@pytest.mark.parametrize("system,devices", [("jupiter", 4), ("h100-8", 8), ("jureca-dc", 4)])
def test_175b_renders_for_other_sites(system, devices):
    point = load_benchmark().point("175", system)
    script = render_jobscript(point)
    assert f"export GPUS_PER_NODE={devices}" in script and "#SBATCH --nodes=96" in script
    assert f"export DP_SIZE={96 * devices // 64}" in script
    proc = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr

def test_trainium_point_is_a_compile_job_then_the_run_job(bench, results):
    """trn1: the compile script and the run script, both pinned by committed golden files."""
    out = bench("run", "--tag", "175", "--system", "trn1", "--dry-run")
    assert out.exit_code == 0, out.output
    assert "sbatch --dependency=afterok:$(sbatch --parsable compile.sbatch) jobscript.sbatch" in out.output
    (point,) = results.glob("nlp/*/gpt-175b_*")
    for name, golden in (("compile.sbatch", "compile_175B.sbatch"), ("jobscript.sbatch", "jobscript_175B.sbatch")):
        assert (point / name).read_text() == (ROOT / "slurm" / "trn1" / golden).read_text(), (
            f"slurm/trn1/{golden} is stale: regenerate it with `bench run --tag 175 --system trn1 --dry-run`")
    compile_text, run_text = (point / "compile.sbatch").read_text(), (point / "jobscript.sbatch").read_text()
    for text in (compile_text, run_text):
        for needle in ("#SBATCH --exclusive", "#SBATCH --nodes=32", "export TP_SIZE=32", "export PP_SIZE=1",
                       "export FI_PROVIDER=efa", "export FI_EFA_USE_DEVICE_RDMA=1", "--distributed-backend xla",
                       'NEURON_COMPILE_CACHE_URL="${NEURON_COMPILE_CACHE_URL:-/var/tmp/neuron-compile-cache}"'):
            assert needle in text, needle
    assert "${NLP_BENCH_COMPILE_COMMAND:-neuron_parallel_compile} torchrun" in compile_text
    # a 10-iteration trial (10 x the global batch of 96) with the run's learning-rate schedule
    assert "--train-samples 960" in compile_text and "--lr-decay-samples 128953125" in compile_text
    assert "--train-samples 300000000" in run_text
    assert "#SBATCH --output=compile.out" in compile_text and "#SBATCH --output=job.out" in run_text
    assert "neuron_parallel_compile" not in run_text.split("TRAIN_ARGS=(")[1]
    for script in (compile_text, run_text):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0

@pytest.mark.parametrize("system,nodes,pp,gas", [("trn1", 16, 8, 512), ("trn2", 8, 4, 256)])
def test_llama3_70b_keeps_nxd_trainings_layouts_on_trainium(bench, results, system, nodes, pp, gas):
    """The NxD Training tutorial's layouts render (with one line saying the built-in trainer cannot run pipeline
    parallelism on xla) and are planned; a real submission is refused in that line."""
    out = bench("run", "--tag", "llama3-70b", "--system", system, "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob(f"nlp/*/llama3-70b_n{nodes}_tp32_pp{pp}_mbs1_gas{gas}/jobscript.sbatch")
    text = script.read_text()
    for needle in ("export TP_SIZE=32", f"export PP_SIZE={pp}", "--group-query-attention", "--num-query-groups 8",
                   "--distributed-backend xla", "export GLOBAL_BATCH_SIZE=1024"):
        assert needle in text, needle
    warned = [line for line in out.output.splitlines() if "rendered and planned but not run here" in line]
    assert len(warned) == 1 and f"pipeline parallelism (pp {pp})" in warned[0]
    out = bench("run", "--tag", "llama3-70b", "--system", system)
    assert out.exit_code == 2 and "rendered and planned but not run here" in out.output.splitlines()[0]
    out = bench("plan", "--tag", "llama3-70b", "--system", system, "--pp", str(pp), "--tp", "32", "--json")
    rows = json.loads(out.output)
    assert rows and all(r["memory_gib"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert all("no pipeline parallelism on xla" in r["reason"] or "GiB available" in r["reason"] for r in rows)

@pytest.mark.parametrize("tag,folder", [("llama3-8b", "llama3-8b_n1_tp2_pp1_mbs1_gas32"),
                                        ("llama3-70b", "llama3-70b_n8_tp8_pp4_mbs1_gas64")])
def test_llama_tags_render_their_architecture(bench, results, tag, folder):
    out = bench("run", "--tag", tag, "--dry-run")
    assert out.exit_code == 0, out.output
    text = (next(results.glob(f"nlp/*/{folder}")) / "jobscript.sbatch").read_text()
    for needle in ("--group-query-attention", "--num-query-groups 8", "--swiglu", "--normalization RMSNorm",
                   "--position-embedding-type rope", "--rotary-base 500000", "--disable-bias-linear",
                   "--untie-embeddings-and-output-weights", "--vocab-size 128256", "--tokenizer-type NullTokenizer",
                   "--mock-data", "export SEQ_LEN=8192", "export GLOBAL_BATCH_SIZE=128"):
        assert needle in text, needle
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
