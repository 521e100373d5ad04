"""One vocabulary of job states for every executor, and the record of a job's life in state.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nlp_bench.fsio import write_json_atomic
from nlp_bench.workspace import STATE_JSON, now_iso, read_optional

PENDING, RUNNING, COMPLETED, FAILED = "PENDING", "RUNNING", "COMPLETED", "FAILED"
TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY, UNKNOWN = "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "UNKNOWN"
TERMINAL = frozenset({COMPLETED, FAILED, TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY})

#: Slurm's state names (sacct / squeue long forms) mapped onto ours.
SLURM = {
    "PENDING": PENDING, "CONFIGURING": PENDING, "REQUEUED": PENDING, "RESV_DEL_HOLD": PENDING,
    "RUNNING": RUNNING, "COMPLETING": RUNNING, "STAGE_OUT": RUNNING, "SUSPENDED": RUNNING, "RESIZING": RUNNING,
    "COMPLETED": COMPLETED, "FAILED": FAILED, "BOOT_FAIL": NODE_FAIL, "DEADLINE": TIMEOUT, "TIMEOUT": TIMEOUT,
    "CANCELLED": CANCELLED, "PREEMPTED": CANCELLED, "REVOKED": CANCELLED, "NODE_FAIL": NODE_FAIL,
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
}


def from_slurm(state: str) -> str:
    """Normalise a Slurm state ('CANCELLED by 0', 'CD', ...) to our vocabulary."""
    word = state.split()[0].rstrip("+") if state.strip() else ""
    short = {"PD": PENDING, "R": RUNNING, "CG": RUNNING, "CD": COMPLETED, "F": FAILED, "TO": TIMEOUT,
             "CA": CANCELLED, "NF": NODE_FAIL, "OOM": OUT_OF_MEMORY}
    return SLURM.get(word) or short.get(word, UNKNOWN)


def load(point_dir: Path) -> dict[str, Any] | None:
    return read_optional(Path(point_dir) / STATE_JSON)


def record(point_dir: Path, state: str, **fields: Any) -> dict[str, Any]:
    """Update state.json: the current state, any new fields, and a history entry on every change."""
    current = load(point_dir) or {"history": []}
    if current.get("state") != state:
        current["history"].append({"state": state, "at": now_iso()})
    current.update(fields, state=state)
    write_json_atomic(Path(point_dir) / STATE_JSON, current)
    return current
