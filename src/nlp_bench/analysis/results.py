"""The result store: result.json per point (parsed records and summary), and the rows of a run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench import flops
from nlp_bench.analysis import metrics, parsers
from nlp_bench.errors import BenchError
from nlp_bench.spec.models import from_record
from nlp_bench.spec.switches import decode
from nlp_bench.spec.trainers import BUILTIN
from nlp_bench.store import states
from nlp_bench.store.files import StoreError, naming
from nlp_bench.store.names import JOB_OUT, JOBSCRIPT
from nlp_bench.store.point_folder import PointDir, sha256
from nlp_bench.store.records import Attempt, PointRecord, now_iso
from nlp_bench.store.runs import Run

#: The JUPITER JUBE result columns, then what users need beyond them. EP, Active_Params and Total_Params are a
#: mixture-of-experts model's (empty on a dense one): its expert parallelism and the parameters a token passes
#: (what its MFU counts) beside all of them.
RESULT_COLUMNS = [
    "system", "version", "queue", "JobID", "Job_Time", "Model_Size", "Nodes", "Batch_Size", "Pipeline_Parallel",
    "Tensor_Parallel", "Iterations", "Avg_TFLOPs/GPU", "Tokens/sec", "time_to_report_in_seconds",
    "DP", "MBS", "GAS", "EP", "MFU", "Active_Params", "Total_Params", "Predicted_Tokens/sec", "Predicted/Measured", "Extrapolated", "state", "failure_class",
    "run", "point", "trainer", "trainer_version", "Joules/token", "Report_kWh", "XLA_Graphs/step", "XLA_Compiles",
]


def shape_of(point: PointRecord) -> flops.Shape:
    model = from_record(point.model, point.train)
    return model.flops_shape(point.layout["global_batch_size"], point.model["vocab_padded"],
                             recompute=decode(point.train).recomputes)


def _fingerprint(log: Path) -> dict[str, int] | None:
    """What identifies the log a result was parsed from: its size and modification time in nanoseconds.
    Both, because on a file system with one-second times a log that grows within the second of its last
    analysis keeps its time but not its size."""
    try:
        info = log.stat()
    except OSError:
        return None
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


def analyse_point(point_dir: Path, force: bool = False, notes: list[str] | None = None,
                  point: PointRecord | None = None) -> dict[str, Any] | None:
    """The point's result: job.out parsed into result.json, again only when the log is not the one the
    result was made from. Without a log, an earlier result.json stands (and `notes` hears so); None when
    there is neither. A result that cannot be kept (a read-only folder, a full disk) is still returned.
    `point`: its point.json where the caller has read it already."""
    point_dir = Path(point_dir)
    folder = PointDir(point_dir)
    log = point_dir / JOB_OUT
    seen = _fingerprint(log)
    try:
        kept = folder.result()
    except StoreError as exc:
        if seen is None:
            raise
        kept = None  # a damaged result is only a cache of the log: it is made again
        if notes is not None:
            notes.append(f"{exc}: made again from {JOB_OUT}")
    if seen is None:
        if kept is not None and notes is not None:
            notes.append(f"{point_dir}: {JOB_OUT} is gone; its figures come from result.json "
                         f"(analysed {kept.get('analysed', 'earlier')})")
        return kept
    if not force and kept is not None and kept.get("source") == seen:
        return kept
    point = folder.point() if point is None else point
    try:
        parsed = parsers.parse_log(log)
    except parsers.ParseError:
        parsed = parsers.Parsed(None, [])
    records, seq_length = parsed.records, point.seq_length
    shape = shape_of(point)
    basis, note = metrics.mfu_basis(point.system, point.system_info, shape, decode(point.train).compute_precision)
    summary = metrics.summarise(records, seq_length, point.global_batch_size, shape,
                                point.layout["world"], basis and basis["peak_tflops"])
    if summary is not None:
        summary.mfu_basis, summary.mfu_note = basis, note
    log_tail = _log_ends(log)
    result = {
        "point": point.id, "format": parsed.format, "analysed": now_iso(), "source": seen,
        # the JUBE-compatible figures (every interval) the table shows, and the steady state beside them
        "summary": summary.to_dict() if summary else None,
        "steady": (metrics.steady_summary(records, seq_length, global_batch_size=point.global_batch_size)[1]
                   if records else None),
        "energy": _energy(point, records, log_tail, folder),
        "provenance": provenance(folder, log_tail, point),
        "xla": xla_counts(log_tail),
        # what the parse skipped or read only in part: the figures above lack those lines
        "unread": parsed.notes(),
        "records": [r.to_dict() for r in records],
    }
    try:
        folder.write_result(result)
    except StoreError as exc:
        if notes is not None:
            notes.append(f"{exc} (the result is shown, not kept)")
    return result


def _log_ends(log: Path, size: int = 65_536) -> str:
    """The start and the end of a log, where the trainer says what it runs on and how it measured energy:
    a log of gigabytes is not read whole for two lines."""
    try:
        with log.open("rb") as fh:
            head = fh.read(size)
            fh.seek(0, 2)
            fh.seek(max(len(head), fh.tell() - size))
            tail = fh.read(size)
    except OSError:
        return ""
    return (head + b"\n" + tail).decode("utf-8", "replace")


_ENERGY_NOTE = re.compile(r"nlp-bench trainer: energy: not measured \((.*)\)")


def _energy(point: PointRecord, records: list, log_text: str, folder: PointDir) -> dict[str, Any]:
    """The steady-state energy per token from the trainer's NVML figures; else the whole job's from Slurm's
    accounting (start-up included, so higher); else nulls and why."""
    seq_length = point.seq_length
    note = _ENERGY_NOTE.search(log_text)
    if point.trainer != BUILTIN:
        why = f"{point.trainer}'s log has no energy figures"
    elif point.system_info.get("device") != "cuda":
        why = f"energy is measured on GPUs only (device {point.system_info.get('device')})"
    else:
        why = note.group(1) if note else "the log has no energy figures"
    found = metrics.energy_summary(records, seq_length, why_not=why)
    attempt = folder.attempt()
    consumed = attempt.consumed_energy_j if attempt else None
    if found["joules_per_token"] is None and consumed and records:
        tokens = records[-1].iteration * point.global_batch_size * seq_length
        per_token = consumed / tokens
        found = {"joules_per_token": per_token, "report_kwh": per_token * flops.REPORT_TOKENS / metrics.JOULES_PER_KWH,
                 "source": "Slurm accounting (sacct ConsumedEnergy): the whole job, start-up included",
                 "intervals": None, "reason": None}
    return found


_XLA_COUNTS = re.compile(
    r"nlp-bench trainer: xla: (\d+) graph executions, (\d+) compiles \(([\d.]+) s\), (\d+) transfers to the host in all"
    r"(?:; per step that compiled nothing \((\d+) of (\d+) steps\): at most (\d+) graph executions and (\d+) transfers"
    r"|; every one of the (\d+) steps compiled)?")


def xla_counts(log_text: str) -> dict[str, Any] | None:
    """What the xla trainer's graphs cost, as torch-xla's metrics counted them (the trainer's closing line):
    totals, and per step among the steps that compiled nothing; None for a run that is not on xla or has not
    finished."""
    found = _XLA_COUNTS.search(log_text)
    if found is None:
        return None
    executions, compiles, compile_s, transfers, steady, steps, per_step, transfers_per_step, all_compiled = found.groups()
    steps = steps or all_compiled
    return {"graph_executions": int(executions), "compiles": int(compiles), "compile_s": float(compile_s),
            "transfers_to_host": int(transfers), "steps": int(steps) if steps else None,
            "steps_without_compile": int(steady) if steady else 0,
            "graph_executions_per_step": int(per_step) if per_step else None,
            "transfers_per_step": int(transfers_per_step) if transfers_per_step else None,
            "source": "torch_xla.debug.metrics (counters ExecuteComputation and UncachedCompile, CompileTime's total, "
                      "TransferFromDeviceTime's samples); per step: the most in any step that compiled nothing"}


_LIBRARIES = re.compile(r"nlp-bench trainer: torch (\S+?),?(?: \(CUDA (\S+), NCCL ([^)]+)\))?, backend")


def provenance(folder: PointDir, log_text: str, point: PointRecord | None = None) -> dict[str, Any]:
    """Where a number comes from: the commit that rendered the jobscript, the sha256 of the script as it was
    submitted (hashed then, not now: the file may have been edited since), the nodes, the library versions
    the trainer reported, the Python packages the job found (torch-xla and the Neuron packages among them) and
    the environment that shapes performance."""
    try:
        run = Run(folder.path.parent).record()
        commit = run.versions.get("git_commit")
    except StoreError:
        commit = None
    attempt = folder.attempt()
    submitted = (attempt.scripts_sha256 or {}).get(JOBSCRIPT) if attempt else None
    if submitted is None:  # a run from before scripts were hashed at submission
        try:
            submitted = sha256(folder.file(JOBSCRIPT).read_bytes())
        except OSError:
            submitted = None
    environment = folder.environment()
    libraries = _LIBRARIES.search(log_text)
    found = {
        "git_commit": commit,
        "jobscript_sha256": submitted,
        "nodelist": environment.get("SLURM_JOB_NODELIST"),
        "torch": libraries.group(1) if libraries else None,
        "cuda": libraries.group(2) if libraries else None,
        "nccl": libraries.group(3) if libraries else None,
        "packages": folder.packages(),
        "environment": environment,
    }
    made = (folder.point() if point is None else point).megatron_lm
    if made is not None:  # what the job found at start, beside what its arguments were made for
        found["megatron_lm"] = {"version": environment.get("MEGATRON_LM_VERSION"),
                                "commit": environment.get("MEGATRON_LM_COMMIT"),
                                "made_for": made.get("version"), "flag_table": made.get("flag_table"),
                                "translated": made.get("translated", [])}
    return found


def point_row(point_dir: Path, version: str | None, run_id: str, result: dict[str, Any] | None = None,
              notes: list[str] | None = None, point: PointRecord | None = None) -> dict[str, Any]:
    """The table row of a point; `result` is its analysed result.json and `point` its point.json when the
    caller has them already. A damaged prediction leaves the row without one (and `notes` hears why)."""
    folder = PointDir(point_dir)
    point = folder.point() if point is None else point
    attempt = folder.attempt()
    result = (analyse_point(point_dir, point=point) or {}) if result is None else result
    summary = result.get("summary") or {}
    lay = point.layout
    try:
        prediction = folder.prediction() or {}
    except StoreError as exc:
        prediction = {}
        if notes is None:
            raise
        notes.append(f"{exc} (the row is shown without its prediction)")
    predicted = prediction.get("tokens_per_s")
    measured = summary.get("tokens_per_s")
    if notes is not None:
        notes.extend(doubts(point_dir, attempt, result.get("unread") or []))
    return {
        "system": point.system, "version": version, "queue": point.system_info.get("partition"),
        "JobID": attempt.job_id if attempt else None, "Job_Time": attempt.job_time_s() if attempt else None,
        "Model_Size": point.model["size_billions"],
        "Nodes": lay["nodes"], "Batch_Size": lay["global_batch_size"], "Pipeline_Parallel": lay["pp"],
        "Tensor_Parallel": lay["tp"], "Iterations": summary.get("iterations"),
        "Avg_TFLOPs/GPU": summary.get("avg_tflops_per_gpu"), "Tokens/sec": summary.get("tokens_per_s"),
        "time_to_report_in_seconds": summary.get("time_to_report_s"),
        "DP": lay["dp"], "MBS": lay["mbs"], "GAS": lay["gas"], "MFU": summary.get("mfu"), **_experts(point),
        "Joules/token": (result.get("energy") or {}).get("joules_per_token"),
        "Report_kWh": (result.get("energy") or {}).get("report_kwh"),
        "Predicted_Tokens/sec": predicted,
        "Predicted/Measured": predicted / measured if predicted and measured else None,
        # the prediction lies outside the planner's corpus: trust it (and the ratio) less
        "Extrapolated": prediction.get("extrapolated") if predicted else None,
        "state": attempt.state if attempt else states.NOT_SUBMITTED,
        "failure_class": attempt.failure_class if attempt else None,
        "run": run_id, "point": point.id, "trainer": point.trainer,
        "trainer_version": _trainer_version(point, folder, version), "model": point.model["name"],
        "XLA_Graphs/step": (result.get("xla") or {}).get("graph_executions_per_step"),
        "XLA_Compiles": (result.get("xla") or {}).get("compiles"),
    }


#: the columns only a model with experts fills, and old exports lack
MOE_COLUMNS = ("EP", "Active_Params", "Total_Params")


def _experts(point: PointRecord) -> dict[str, int | None]:
    """EP, Active_Params and Total_Params of a point whose model has experts (with the padded vocabulary it
    trains, the input embedding counted); empty for a dense one, whose row stays as it was."""
    if not point.model.get("moe"):
        return dict.fromkeys(MOE_COLUMNS)
    model, vocab = from_record(point.model, point.train), point.model["vocab_padded"]
    return {"EP": point.layout.get("ep", 1), "Active_Params": model.active_parameters(vocab),
            "Total_Params": model.total_parameters(vocab)}


def doubts(point_dir: Path, attempt: Attempt | None, unread: list[str]) -> list[str]:
    """What makes a point's figures less than they seem, each in one line naming the file, for the table and
    the status to say: its log's lines that were not read, a wall clock that stepped while its job ran."""
    found = [f"{Path(point_dir) / JOB_OUT}: {line}" for line in unread]
    step = attempt.clock_step() if attempt is not None else None
    return [*found, f"{point_dir}: {step}"] if step else found


def _trainer_version(point: PointRecord, folder: PointDir, version: str | None) -> str | None:
    """The version of the program that trained: nlp-bench's for the built-in trainer; for Megatron-LM the one
    the job found at start (provenance.env), else the one its arguments were made for, with the commit."""
    made = point.megatron_lm
    if made is None:
        return version if point.trainer == BUILTIN else None
    found = folder.environment()
    ran = found.get("MEGATRON_LM_VERSION") or made.get("version")
    commit = found.get("MEGATRON_LM_COMMIT") or made.get("commit")
    if not ran:
        return None
    return f"{ran} ({commit[:10]})" if commit and commit != "unknown" else ran


def missing_row(run_id: str, point_id: str, version: str | None) -> dict[str, Any]:
    """The row of a point run.json lists whose folder is gone: named, not forgotten."""
    row: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
    row.update(version=version, state=states.MISSING, run=run_id, point=point_id)
    return row


@dataclass
class Problems:
    """What a view could not show (damaged files, gone folders, results not kept): said after the view, on
    stderr, so that one bad point does not hide the others."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)


def run_rows(run: Run, problems: Problems | None = None) -> list[dict[str, Any]]:
    """One row per point of the run, analysing logs that have not been analysed yet."""
    return [row for row, _ in run_results(run, problems)]


def run_results(run: Run, problems: Problems | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each point's table row with its analysed result.json ({} for a point without a log), for the
    commands that need more than the row (records, steady state, provenance). With `problems`, a point
    whose files are damaged is left out and named there; without, the first such error is raised."""
    return [(found.row, found.result) for found in analysed_points(run, problems)]


@dataclass(frozen=True)
class AnalysedPoint:
    """A point of a run as the views use it: its point.json as read (None where its folder is gone), its
    table row and its analysed result.json ({} without a log)."""

    record: PointRecord | None
    row: dict[str, Any]
    result: dict[str, Any]


def analysed_points(run: Run, problems: Problems | None = None,
                    known: Mapping[str, PointRecord] | None = None) -> list[AnalysedPoint]:
    """run_results with each point's point.json record beside its row, read once; `known`: the records, by
    point id, that the caller read or wrote already, not read again."""
    record = run.record()
    version = record.versions.get("nlp-bench")
    out = []
    notes = problems.lines if problems is not None else None
    for folder in run.points():
        if not folder.exists():
            if problems is not None:
                problems.add(f"{folder.path}: missing (run.json lists it; the folder was moved or removed)")
            out.append(AnalysedPoint(None, missing_row(run.id, folder.id, version), {}))
            continue
        try:
            point = (known or {}).get(folder.id) or folder.point()
            result = analyse_point(folder.path, notes=notes, point=point) or {}
            out.append(AnalysedPoint(point, point_row(folder.path, version, run.id, result, notes, point), result))
        except BenchError as exc:
            if problems is None:
                raise
            problems.add(naming(folder.path, exc))
    return out


#: Each column's pandas dtype (nullable: a point that has not run has no numbers), so that every
#: export reads back into the same DataFrame.
_INTEGER = {"Nodes", "Batch_Size", "Pipeline_Parallel", "Tensor_Parallel", "Iterations", "DP", "MBS", "GAS",
            *MOE_COLUMNS}
_FLOAT = {"Job_Time", "Model_Size", "Avg_TFLOPs/GPU", "Tokens/sec", "time_to_report_in_seconds", "MFU",
          "Joules/token", "Report_kWh",
          "Predicted_Tokens/sec", "Predicted/Measured"}
COLUMN_DTYPES = {c: "Int64" if c in _INTEGER else "Float64" if c in _FLOAT else "string" for c in RESULT_COLUMNS}


def rows_frame(rows: list[dict[str, Any]]):
    """Rows as a pandas DataFrame with the columns in the published order and their dtypes."""
    import pandas as pd

    return typed(pd.DataFrame(rows, columns=RESULT_COLUMNS))


def typed(frame):
    """A result frame with the published columns and dtypes (what an export is read back into)."""
    import pandas as pd

    missing = [c for c in RESULT_COLUMNS if c not in frame.columns and c not in MOE_COLUMNS]
    if missing:
        from nlp_bench.errors import ResultError

        raise ResultError(f"not a result table: columns {', '.join(missing)} are missing")
    frame = frame.reindex(columns=RESULT_COLUMNS)  # an export from before MOE_COLUMNS: empty there
    for column, dtype in COLUMN_DTYPES.items():
        if dtype == "string":
            frame[column] = frame[column].map(lambda v: None if pd.isna(v) else str(v)).astype("string")
        else:
            frame[column] = pd.to_numeric(frame[column]).astype("Float64").astype(dtype)
    return frame
