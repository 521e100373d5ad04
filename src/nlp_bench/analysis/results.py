"""The result store: result.json per point (parsed records and summary), and the rows of a run."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from nlp_bench import flops
from nlp_bench.analysis import metrics, parsers
from nlp_bench.fsio import read_json, write_json_atomic
from nlp_bench.workspace import (
    JOB_OUT,
    JOBSCRIPT,
    POINT_JSON,
    PREDICTION_JSON,
    PROVENANCE_ENV,
    RESULT_JSON,
    RUN_JSON,
    STATE_JSON,
    Run,
    now_iso,
    read_optional,
)

#: The JUPITER JUBE result columns, then what users need beyond them.
COLUMNS = [
    "system", "version", "queue", "JobID", "Job_Time", "Model_Size", "Nodes", "Batch_Size", "Pipeline_Parallel",
    "Tensor_Parallel", "Iterations", "Avg_TFLOPs/GPU", "Tokens/sec", "time_to_report_in_seconds",
    "DP", "MBS", "GAS", "MFU", "Predicted_Tokens/sec", "Predicted/Measured", "state", "failure_class", "run",
    "point", "trainer", "Joules/token", "Report_kWh",
]


def shape_of(point: dict[str, Any]) -> flops.Shape:
    model, layout, train = point["model"], point["layout"], point["train"]
    return flops.Shape(
        global_batch=layout["global_batch_size"], seq_length=model["seq_length"], num_layers=model["num_layers"],
        hidden=model["hidden_size"], vocab_padded=model["vocab_padded"], ffn_hidden=model["ffn_hidden_size"],
        swiglu=bool(train.get("swiglu")), recompute=bool(train.get("recompute-activations")
                                                          or train.get("recompute-granularity")),
    )


def analyse_point(point_dir: Path, force: bool = False) -> dict[str, Any] | None:
    """Parse the point's job.out into result.json (again only when the log is newer); None without a log."""
    point_dir = Path(point_dir)
    log, out = point_dir / JOB_OUT, point_dir / RESULT_JSON
    if not log.is_file():
        return None
    if not force and out.is_file() and out.stat().st_mtime >= log.stat().st_mtime:
        return read_json(out)
    point = read_json(point_dir / POINT_JSON)
    text = parsers.read_log(log)
    try:
        parsed = parsers.parse(text)
    except parsers.ParseError:
        parsed = parsers.Parsed(None, [])
    records, seq_length = parsed.records, point["model"]["seq_length"]
    basis, note = metrics.mfu_basis(point["system"], point["system_info"])
    summary = metrics.summarise(records, seq_length, point["layout"]["global_batch_size"],
                                shape_of(point), point["layout"]["world"], basis and basis["peak_tflops"])
    if summary is not None:
        summary.mfu_basis, summary.mfu_note = basis, note
    result = {
        "point": point["id"], "format": parsed.format, "analysed": now_iso(),
        # the JUBE-compatible figures (every interval) the table shows, and the steady state beside them
        "summary": summary.to_dict() if summary else None,
        "steady": metrics.steady_summary(records, seq_length)[1] if records else None,
        "energy": _energy(point, records, text, read_optional(point_dir / STATE_JSON) or {}),
        "provenance": provenance(point_dir, text),
        "records": [r.to_dict() for r in records],
    }
    write_json_atomic(out, result)
    return result


_ENERGY_NOTE = re.compile(r"nlp-bench trainer: energy: not measured \((.*)\)")


def _energy(point: dict[str, Any], records: list, log_text: str, state: dict[str, Any]) -> dict[str, Any]:
    """The steady-state energy per token from the trainer's NVML figures; else the whole job's from Slurm's
    accounting (start-up included, so higher); else nulls and why."""
    seq_length = point["model"]["seq_length"]
    note = _ENERGY_NOTE.search(log_text)
    if point.get("trainer", "builtin") != "builtin":
        why = f"{point['trainer']}'s log has no energy figures"
    elif point["system_info"].get("device") != "cuda":
        why = f"energy is measured on GPUs only (device {point['system_info'].get('device')})"
    else:
        why = note.group(1) if note else "the log has no energy figures"
    found = metrics.energy_summary(records, seq_length, why_not=why)
    consumed = state.get("consumed_energy_j")
    if found["joules_per_token"] is None and consumed and records:
        tokens = records[-1].iteration * point["layout"]["global_batch_size"] * seq_length
        per_token = consumed / tokens
        found = {"joules_per_token": per_token, "report_kwh": per_token * flops.REPORT_TOKENS / metrics.JOULES_PER_KWH,
                 "source": "Slurm accounting (sacct ConsumedEnergy): the whole job, start-up included",
                 "intervals": None, "reason": None}
    return found


_LIBRARIES = re.compile(r"nlp-bench trainer: torch (\S+?),?(?: \(CUDA (\S+), NCCL ([^)]+)\))?, backend")


def provenance(point_dir: Path, log_text: str) -> dict[str, Any]:
    """Where a number comes from: the commit that rendered the jobscript, the script's sha256, the nodes,
    the library versions the trainer reported and the environment that shapes performance."""
    run_meta = read_optional(point_dir.parent / RUN_JSON) or {}
    script = point_dir / JOBSCRIPT
    environment: dict[str, str] = {}
    env_file = point_dir / PROVENANCE_ENV
    if env_file.is_file():
        for line in env_file.read_text(errors="replace").splitlines():
            name, sep, value = line.partition("=")
            if sep:
                environment[name] = value
    libraries = _LIBRARIES.search(log_text)
    return {
        "git_commit": (run_meta.get("versions") or {}).get("git_commit"),
        "jobscript_sha256": hashlib.sha256(script.read_bytes()).hexdigest() if script.is_file() else None,
        "nodelist": environment.get("SLURM_JOB_NODELIST"),
        "torch": libraries.group(1) if libraries else None,
        "cuda": libraries.group(2) if libraries else None,
        "nccl": libraries.group(3) if libraries else None,
        "environment": environment,
    }


def _job_time(state: dict[str, Any]) -> float | None:
    try:
        return (datetime.fromisoformat(state["finished"]) - datetime.fromisoformat(state["started"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def point_row(point_dir: Path, version: str | None, run_id: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table row of a point; `result` is its analysed result.json when the caller has it already."""
    point = read_json(Path(point_dir) / POINT_JSON)
    state = read_optional(Path(point_dir) / STATE_JSON) or {}
    result = (analyse_point(point_dir) or {}) if result is None else result
    summary = result.get("summary") or {}
    lay = point["layout"]
    predicted = (read_optional(Path(point_dir) / PREDICTION_JSON) or {}).get("tokens_per_s")
    measured = summary.get("tokens_per_s")
    return {
        "system": point["system"], "version": version, "queue": point["system_info"].get("partition"),
        "JobID": state.get("job_id"), "Job_Time": _job_time(state), "Model_Size": point["model"]["size_billions"],
        "Nodes": lay["nodes"], "Batch_Size": lay["global_batch_size"], "Pipeline_Parallel": lay["pp"],
        "Tensor_Parallel": lay["tp"], "Iterations": summary.get("iterations"),
        "Avg_TFLOPs/GPU": summary.get("avg_tflops_per_gpu"), "Tokens/sec": summary.get("tokens_per_s"),
        "time_to_report_in_seconds": summary.get("time_to_report_s"),
        "DP": lay["dp"], "MBS": lay["mbs"], "GAS": lay["gas"], "MFU": summary.get("mfu"),
        "Joules/token": (result.get("energy") or {}).get("joules_per_token"),
        "Report_kWh": (result.get("energy") or {}).get("report_kwh"),
        "Predicted_Tokens/sec": predicted,
        "Predicted/Measured": predicted / measured if predicted and measured else None,
        "state": state.get("state", "NOT_SUBMITTED"), "failure_class": state.get("failure_class"),
        "run": run_id, "point": point["id"], "trainer": point.get("trainer", "builtin"), "model": point["model"]["name"],
    }


def run_rows(run: Run) -> list[dict[str, Any]]:
    """One row per point of the run, analysing logs that have not been analysed yet."""
    return [row for row, _ in run_results(run)]


def run_results(run: Run) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each point's table row with its analysed result.json ({} for a point without a log), for the
    commands that need more than the row (records, steady state, provenance)."""
    version = (run.meta().get("versions") or {}).get("nlp-bench")
    out = []
    for point_dir in run.point_dirs():
        result = analyse_point(point_dir) or {}
        out.append((point_row(point_dir, version, run.id, result), result))
    return out


#: Each column's pandas dtype (nullable: a point that has not run has no numbers), so that every
#: export reads back into the same DataFrame.
_INTEGER = {"Nodes", "Batch_Size", "Pipeline_Parallel", "Tensor_Parallel", "Iterations", "DP", "MBS", "GAS"}
_FLOAT = {"Job_Time", "Model_Size", "Avg_TFLOPs/GPU", "Tokens/sec", "time_to_report_in_seconds", "MFU",
          "Joules/token", "Report_kWh",
          "Predicted_Tokens/sec", "Predicted/Measured"}
DTYPES = {c: "Int64" if c in _INTEGER else "Float64" if c in _FLOAT else "string" for c in COLUMNS}


def rows_frame(rows: list[dict[str, Any]]):
    """Rows as a pandas DataFrame with the columns in the published order and their dtypes."""
    import pandas as pd

    return typed(pd.DataFrame(rows, columns=COLUMNS))


def typed(frame):
    """A result frame with the published columns and dtypes (what an export is read back into)."""
    import pandas as pd

    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        from nlp_bench.errors import ResultError

        raise ResultError(f"not a result table: columns {', '.join(missing)} are missing")
    frame = frame[COLUMNS].copy()
    for column, dtype in DTYPES.items():
        if dtype == "string":
            frame[column] = frame[column].map(lambda v: None if pd.isna(v) else str(v)).astype("string")
        else:
            frame[column] = pd.to_numeric(frame[column]).astype("Float64").astype(dtype)
    return frame
