"""A run through every stage (app.stages) with a stand-in jobscript (tests/fixtures) started as a local job:
a dry run ends at write; launch, wait and analyse work from the records write handed on without opening
point.json again; a resume starts at launch and locks its own results folder; the planner's calibration reads
each point.json once."""

import json
import shutil

import pytest
from conftest import ROOT
from stage_orders import PREDICTED, smoke_order

from nlp_bench.app import execute, planning
from nlp_bench.app.stage_records import Done, Finished
from nlp_bench.app.stages import analyse_run, launch_jobs, render_scripts, run_stages, wait_for_jobs, write_run
from nlp_bench.store import states
from nlp_bench.store.names import LOCAL_LOCK
from nlp_bench.store.point_folder import PointDir

STUB = ROOT / "tests" / "fixtures" / "stub_jobscript.sbatch.j2"

@pytest.fixture
def stub_site(site):
    """The site layer with the stand-in jobscript (tests/fixtures): a local job that logs one iteration."""
    shutil.copy(STUB, site / "slurm" / "templates" / "jobscript.sbatch.j2")
    return site

def test_a_dry_run_ends_at_write_with_nothing_launched(site, tmp_path, capsys):
    rendered = render_scripts(smoke_order(tmp_path / "results"))
    assert write_run(rendered) == Done(0)
    (run,) = (tmp_path / "results" / "nlp").iterdir()
    (one,) = rendered.points
    folder = run / one.record.id
    assert json.loads((folder / "point.json").read_text()) == one.record.data
    assert json.loads((folder / "prediction.json").read_text()) == PREDICTED
    assert (folder / "jobscript.sbatch").read_text() == one.jobscript
    assert PointDir(folder).attempt() is None
    assert "(not submitted)" in capsys.readouterr().out

def test_a_local_run_goes_through_every_stage_without_opening_point_json_again(stub_site, tmp_path, point_reads,
                                                                             monkeypatch, capsys):
    written = write_run(render_scripts(smoke_order(tmp_path / "results", dry_run=False)))
    launched = launch_jobs(written)
    assert launched.states == (states.COMPLETED,)
    finished = wait_for_jobs(launched)
    assert finished == Finished(written, 0)
    assert analyse_run(finished) == Done(0)
    assert "1024.00" in capsys.readouterr().out  # the stand-in's tokens/s in the table
    monkeypatch.setenv("NLP_BENCH_TEST_EXIT", "1")
    assert run_stages(smoke_order(tmp_path / "results", dry_run=False)) == 1
    assert "ended FAILED (nonzero_exit: exit code 1)" in capsys.readouterr().err
    assert point_reads == []

def test_a_resume_starts_at_launch_reading_each_point_once_and_locks_its_own_results_folder(
        stub_site, tmp_path, point_reads, monkeypatch, capsys):
    root, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    monkeypatch.setenv("NLP_BENCH_TEST_EXIT", "1")
    assert run_stages(smoke_order(root, dry_run=False)) == 1
    (run,) = (root / "nlp").iterdir()
    monkeypatch.setenv("NLP_BENCH_TEST_EXIT", "0")
    elsewhere.mkdir()
    point_reads.clear()
    assert execute.resume(elsewhere, str(run)) == 0
    assert point_reads == ["gpt-tiny_n1_tp2_pp1_mbs2_gas2"]
    assert (root / LOCAL_LOCK).exists() and not (elsewhere / LOCAL_LOCK).exists()
    assert "1 point(s) to run again" in capsys.readouterr().out

def test_calibration_reads_each_point_json_once(stub_site, tmp_path, point_reads):
    root = tmp_path / "results"
    assert run_stages(smoke_order(root, dry_run=False)) == 0
    (run,) = (root / "nlp").iterdir()
    point_reads.clear()
    (found,) = planning.measured(root, [run.name])
    planned, tokens, label = found
    assert point_reads == ["gpt-tiny_n1_tp2_pp1_mbs2_gas2"]
    assert tokens == 1024.0 and label == f"{run.name}/gpt-tiny_n1_tp2_pp1_mbs2_gas2"
    assert (planned.model.name, planned.system.name) == ("gpt-tiny", "local")
