"""`bench run --tag smoke-moe` end to end on this machine: an MoE model on 2 gloo ranks with expert
parallelism 2, parsed and tabled with its expert columns."""

import json

import pytest
from conftest import run_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("smoke-moe")
    proc = run_bench("run", "--tag", "smoke-moe", cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd


def test_the_run_trains_with_two_expert_ranks(moe_run):
    folder = next(moe_run.glob("results/nlp/*/*/"))
    assert folder.name == "moe-tiny_n1_tp1_pp1_ep2_mbs2_gas2"
    log = (folder / "job.out").read_text()
    script = (folder / "jobscript.sbatch").read_text()
    assert "export EP_SIZE=2" in script and '--expert-model-parallel-size "$EP_SIZE"' in script
    assert "expert parallel 2, expert tp 1" in log
    result = json.loads((folder / "result.json").read_text())
    assert result["summary"]["iterations"] == 40
    balance = [r["load_balancing_loss"] for r in result["records"]]
    assert len(balance) == 8 and all(0.9 < b < 1.5 for b in balance)  # 1 when the experts are balanced


def test_the_table_row_shows_ep_and_the_active_and_total_parameters(moe_run):
    proc = run_bench("result", "table", "--columns", "EP,Active_Params,Total_Params,MFU,state", cwd=moe_run)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if "COMPLETED" in line]
    assert len(rows) == 1 and rows[0][:3] == ["2", "4.34M", "4.54M"]
    assert "active parameters only" in proc.stdout
