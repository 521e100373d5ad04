"""How the Slurm executor reads a job's state from what Slurm's commands answer (the commands faked: the
integration tests run the real ones on the emulated cluster)."""

import subprocess

from conftest import job, record_job

from nlp_bench.launch import slurm
from nlp_bench.store import states


def _answers(monkeypatch, sacct_state: str) -> None:
    """sacct answers with `sacct_state`; the controller (scontrol) does not answer."""
    def ask(cmd, *args, **kwargs):
        if cmd[0] == "sacct":
            row = f"7|{sacct_state}|0:0|2026-11-28T10:00:00|Unknown|\n"
            return subprocess.CompletedProcess(cmd, 0, row.encode(), b"")
        raise slurm._NoAnswer("scontrol did not answer within 3 s")

    monkeypatch.setattr(slurm, "_ask", ask)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")


def test_stale_accounting_never_takes_a_running_job_back_to_pending(tmp_path, monkeypatch):
    """slurmdbd hears of a start moments after the controller: with the controller silent, accounting's
    PENDING for a job recorded RUNNING is old news, not a new state."""
    record_job(tmp_path, states.PENDING, job_id="7")
    record_job(tmp_path, states.RUNNING)
    _answers(monkeypatch, "PENDING")
    assert slurm.SlurmExecutor().poll(tmp_path) == states.RUNNING
    assert job(tmp_path).state == states.RUNNING


def test_accounting_that_saw_the_start_is_news_while_the_controller_is_silent(tmp_path, monkeypatch):
    record_job(tmp_path, states.PENDING, job_id="7")
    _answers(monkeypatch, "RUNNING")
    assert slurm.SlurmExecutor().poll(tmp_path) == states.RUNNING
    assert job(tmp_path).state == states.RUNNING
