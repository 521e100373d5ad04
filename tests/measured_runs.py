"""Runs as a finished measurement leaves them, made by a dry run whose logs are then written as the jobs would
have: for the tests of `bench result` (compare, table, plot, report, export) that need measured rows but no
training."""

import json
from collections.abc import Callable
from pathlib import Path

from conftest import DATA, record_job

from nlp_bench.store import states


def completed_175b(bench, results: Path) -> Path:
    """A 175B point whose job.out is the seed's verification log (96 nodes, tp 8, pp 8)."""
    assert bench("run", "--tag", "175", "--dry-run").exit_code == 0
    folder = next(results.glob("nlp/*/*/"))
    (folder / "job.out").write_text((DATA / "seed003_verification.log").read_text())
    record_job(folder, states.COMPLETED, job_id="1", exit_code=0)
    return folder


def fake_sweep(bench, results: Path, tmp_path: Path) -> None:
    """A 13B sweep over nodes and tp x pp whose logs say what a measured run would: faster with more
    nodes, best at tp 2 / pp 4, a slow first interval."""
    (tmp_path / "g.yaml").write_text('tag: "13"\nmatrix: {nodes: [8, 16], tp: [1, 2], pp: [2, 4]}\n'
                                     'derived: {gas: "1024 // (nodes * 4 // (tp * pp))"}\n')
    # --no-plan: the tp 1 points are predicted not to fit on a 40 GiB A100, and the plots want them all
    assert bench("sweep", str(tmp_path / "g.yaml"), "--dry-run", "--no-plan").exit_code == 0
    measured_logs(sorted(results.glob("nlp/*/*/")),
                  lambda lay: 34.0 * 8 / lay["nodes"] * (1.0 if (lay["tp"], lay["pp"]) == (2, 4) else 1.3))


def measured_logs(folders: list[Path], seconds: Callable[[dict], float]) -> None:
    """Each dry-run point folder given the log of a finished job, `seconds(layout)` per iteration over six
    intervals, the first half as slow again, and recorded COMPLETED."""
    for folder in folders:
        lay = json.loads((folder / "point.json").read_text())["layout"]
        base = seconds(lay)
        lines = [f"[default3]: iteration {10 * i:8d}/   1000 | elapsed time per iteration (s): "
                 f"{base * (1.5 if i == 1 else 1.0):.4f} | global batch size: {lay['global_batch_size']:5d} | "
                 f"lm loss: 8.0E+00 |" for i in range(1, 7)]
        (folder / "job.out").write_text("\n".join(lines) + "\n")
        record_job(folder, states.COMPLETED, job_id="1", exit_code=0)
