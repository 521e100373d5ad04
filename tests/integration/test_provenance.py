"""Numbers that say where they come from: the peak and formula behind an MFU (and no MFU where the device's
peak is unknown), and `bench result compare baseline` naming what changed between two runs."""



import pytest


@pytest.mark.parametrize("field,expected", [("5400000", 5.4e6), ("0", None), ("", None), ("n/a", None)])
def test_slurm_consumed_energy_where_the_site_collects_it(monkeypatch, field, expected):
    import subprocess

    from nlp_bench.launch import slurm

    row = f"42|COMPLETED|0:0|2026-11-24T05:00:00|2026-11-24T05:10:00|{field}\n"
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm, "_ask", lambda argv, *a, **k: subprocess.CompletedProcess(argv, 0, row.encode(), b""))
    seen = slurm.SlurmExecutor()._look("42")
    assert seen.energy_j == expected and seen.state == "COMPLETED" and seen.exit_code == 0
    assert (seen.finished - seen.started).total_seconds() == 600
