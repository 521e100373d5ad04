"""Typed records of the run store, each checked when it is read: a damaged or hand-edited file becomes one
StoreError that names the file and the field, never a KeyError somewhere above."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nlp_bench.store import states
from nlp_bench.store.files import StoreError

#: seconds by which a job's wall-clock times may differ from its boot clock's run time before the difference
#: is called a step of the wall clock (a local job's start is bench's, a moment before the job's first line)
CLOCK_STEP_S = 5.0


def now_iso() -> str:
    """Now, in UTC with its offset: every time the store writes is comparable with every other."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def parse_time(text: str | None) -> datetime | None:
    """A recorded time as an aware datetime (a time written without an offset is taken as UTC)."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _want(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path, what: str = "") -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        shown = "missing" if key not in data else f"{type(value).__name__} {value!r:.40}"
        raise StoreError(f"{path}: {what}{key} must be {names}, found {shown}")
    return value


def check_number(data: dict[str, Any], key: str, path: Path, what: str = "") -> None:
    """A field that holds a number or nothing (a figure a view computes with)."""
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise StoreError(f"{path}: {what}{key} must be a number or null, found {type(value).__name__} {value!r:.40}")


def _positive(data: dict[str, Any], key: str, path: Path, what: str) -> int:
    value = _want(data, key, int, path, what)
    if value < 1:
        raise StoreError(f"{path}: {what}{key} must be at least 1, found {value}")
    return value


@dataclass(frozen=True)
class RunRecord:
    """run.json: what was asked. Its point list is the truth about which points the run has."""

    id: str
    benchmark: str
    system: str
    created: str
    points: tuple[str, ...]
    #: the store's creation counter: "the newest run" is the one with the largest (absent in old runs)
    sequence: int | None = None
    tags: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    versions: dict[str, Any] = field(default_factory=dict)
    #: what a sweep adds (grid, its spec, combinations, dropped counts)
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("id", "benchmark", "system", "created", "points", "sequence", "tags", "command", "versions")

    @classmethod
    def read(cls, data: dict[str, Any], path: Path) -> RunRecord:
        for key in ("id", "benchmark", "system", "created"):
            _want(data, key, str, path)
        points = _want(data, "points", list, path)
        if not all(isinstance(p, str) and p and "/" not in p and not p.startswith(".") for p in points):
            raise StoreError(f"{path}: points must be a list of point folder names")
        if len(set(points)) != len(points):
            raise StoreError(f"{path}: points names a folder twice")
        for key in ("tags", "command"):
            if not isinstance(data.get(key, []), list):
                raise StoreError(f"{path}: {key} must be a list")
        sequence = data.get("sequence")
        if sequence is not None:
            _want(data, "sequence", int, path)
        return cls(data["id"], data["benchmark"], data["system"], data["created"], tuple(points), sequence,
                   tuple(map(str, data.get("tags") or ())), tuple(map(str, data.get("command") or ())),
                   data.get("versions") if isinstance(data.get("versions"), dict) else {},
                   {k: v for k, v in data.items() if k not in cls._FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "sequence": self.sequence, "benchmark": self.benchmark, "tags": list(self.tags),
                "system": self.system, "created": self.created, "command": list(self.command),
                "points": list(self.points), "versions": self.versions, **self.extra}


@dataclass(frozen=True)
class PointRecord:
    """point.json: the resolved point (spec.benchmark.Point.to_dict()), with the fields the layers above
    read checked once here."""

    data: dict[str, Any]

    @classmethod
    def read(cls, data: dict[str, Any], path: Path) -> PointRecord:
        for key in ("id", "system", "benchmark", "tag"):
            _want(data, key, str, path)
        model = _want(data, "model", dict, path)
        for key in ("seq_length", "num_layers", "hidden_size", "vocab_padded", "ffn_hidden_size"):
            _positive(model, key, path, "model.")
        _want(model, "name", str, path, "model.")
        _want(model, "size_billions", (int, float), path, "model.")
        layout = _want(data, "layout", dict, path)
        for key in ("nodes", "tp", "pp", "dp", "mbs", "gas", "global_batch_size", "world"):
            _positive(layout, key, path, "layout.")
        info = _want(data, "system_info", dict, path)
        _want(info, "executor", str, path, "system_info.")
        _want(data, "train", dict, path)
        made = data.get("megatron_lm")
        if made is not None:
            _want(data, "megatron_lm", dict, path)
            for key in ("version", "commit", "repo"):
                if not isinstance(made.get(key), (str, type(None))):
                    raise StoreError(f"{path}: megatron_lm.{key} must be text or null")
            for key in ("translations", "translated"):
                names = made.get(key, [])
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise StoreError(f"{path}: megatron_lm.{key} must be a list of flag names")
        return cls(data)

    @property
    def megatron_lm(self) -> dict[str, Any] | None:
        """With Megatron-LM: the checkout its arguments were made for (version, commit, flag table, translations)."""
        return self.data.get("megatron_lm")

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def model(self) -> dict[str, Any]:
        return self.data["model"]

    @property
    def layout(self) -> dict[str, Any]:
        return self.data["layout"]

    @property
    def train(self) -> dict[str, Any]:
        return self.data["train"]

    @property
    def system(self) -> str:
        return self.data["system"]

    @property
    def system_info(self) -> dict[str, Any]:
        return self.data["system_info"]

    @property
    def executor(self) -> str:
        return self.data["system_info"]["executor"]

    @property
    def trainer(self) -> str:
        return self.data.get("trainer") or "builtin"

    @property
    def seq_length(self) -> int:
        return self.data["model"]["seq_length"]

    @property
    def global_batch_size(self) -> int:
        return self.data["layout"]["global_batch_size"]

    def planned_iterations(self) -> int | None:
        """Iterations the trainer will run."""
        train = self.train
        if train.get("train-iters"):
            return int(train["train-iters"])
        if train.get("train-samples"):
            return int(train["train-samples"]) // self.global_batch_size
        return None


@dataclass
class Attempt:
    """One submission of a point and what became of it. A resumed point gets a new attempt, so nothing of
    an earlier one (its failure, its times) is ever shown beside a later job."""

    number: int
    executor: str
    state: str = states.SUBMITTING
    job_id: str | None = None
    #: every job of the chain (compile, then run), in order; the point's state follows the last
    chain_job_ids: list[str] = field(default_factory=list)
    #: the name and folder the scheduler knows the jobs by (how a lost submission is found again)
    job_names: list[str] = field(default_factory=list)
    #: the local executor's job: pid, the process's start time and the boot it started in
    process: dict[str, Any] | None = None
    #: sha256 of each script as it was handed to the scheduler, by script name
    scripts_sha256: dict[str, str] = field(default_factory=dict)
    #: the point's folder (resolved) the job was submitted from: a copy of the folder is not where it lives
    folder: str | None = None
    submitted: str | None = None
    started: str | None = None
    finished: str | None = None
    #: where started/finished come from: the scheduler's accounting, the job's own log, or bench's polls
    times_from: str | None = None
    #: the job's run time by its node's boot clock (its first and exit lines' stamps), which no step of the
    #: wall clock moves: the run time where the times are not the scheduler's
    monotonic_s: float | None = None
    exit_code: int | None = None
    failure_class: str | None = None
    failure_detail: str | None = None
    consumed_energy_j: float | None = None
    #: since when the scheduler has answered that it does not know the job (it becomes LOST later)
    unseen_since: str | None = None
    #: when `bench cancel` began to stop the job: an end it then sees, other than completing, is the cancel's
    cancel_requested: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, data: dict[str, Any], path: Path) -> Attempt:
        _positive(data, "number", path, "attempt.")
        _want(data, "executor", str, path, "attempt.")
        state = _want(data, "state", str, path, "attempt.")
        state = states.OLD_SPELLINGS.get(state, state)
        if state not in states.ALL:
            raise StoreError(f"{path}: attempt.state {state!r} is not a job state ({', '.join(sorted(states.ALL))})")
        for key, kinds in _ATTEMPT_FIELDS.items():
            value = data.get(key)
            if key in data and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
                names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
                raise StoreError(f"{path}: attempt.{key} must be {names}, found {type(data[key]).__name__}")
        if data.get("process") is not None and not isinstance(data["process"].get("pid"), int):
            raise StoreError(f"{path}: attempt.process.pid must be a number")
        return cls(**{k: v for k, v in data.items() if k in _ATTEMPT_FIELDS or k in ("number", "executor")},
                   state=state)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def elapsed_s(self, now: datetime | None = None) -> float | None:
        """Seconds the job has run: to its end (by the boot clock where the job stamped it), or to `now`
        while it runs; None before it started."""
        if self.finished and self.monotonic_s is not None:
            return self.monotonic_s
        wall = self._wall_s(now)
        return None if wall is None else max(0.0, wall)

    def _wall_s(self, now: datetime | None = None) -> float | None:
        """From the start to the end (or `now`) by the wall-clock times: less than nothing where the clock
        was stepped back."""
        start = parse_time(self.started)
        if start is None:
            return None
        end = parse_time(self.finished)
        if end is None and self.state == states.RUNNING:
            end = now or datetime.now(timezone.utc)
        if end is None:
            return None
        return (end - start).total_seconds()

    def job_time_s(self) -> float | None:
        """The job's run time once it has ended (the table's Job_Time)."""
        return self.elapsed_s() if self.finished else None

    def clock_step(self) -> str | None:
        """What a wall clock stepped while the job ran did to its times, said once per view, or None: the
        job's wall-clock start and end then span more or less than its boot clock counted."""
        wall = self._wall_s() if self.finished else None
        if wall is None or self.monotonic_s is None or abs(wall - self.monotonic_s) <= CLOCK_STEP_S:
            return None
        return (f"the wall clock stepped {wall - self.monotonic_s:+.0f} s while job {self.job_id} ran (its start "
                f"and end span {wall:.0f} s, its node's boot clock {self.monotonic_s:.0f} s): its run time is "
                "the boot clock's")


_TEXT = (str, type(None))
#: every other field of an attempt and what it may hold
_ATTEMPT_FIELDS: dict[str, tuple[type, ...]] = {
    "job_id": _TEXT, "chain_job_ids": (list,), "job_names": (list,), "process": (dict, type(None)),
    "scripts_sha256": (dict,), "folder": _TEXT, "submitted": _TEXT, "started": _TEXT, "finished": _TEXT,
    "times_from": _TEXT, "monotonic_s": (int, float, type(None)), "exit_code": (int, type(None)),
    "failure_class": _TEXT, "failure_detail": _TEXT,
    "consumed_energy_j": (int, float, type(None)), "unseen_since": _TEXT, "cancel_requested": _TEXT,
    "history": (list,),
}


@dataclass
class StateRecord:
    """state.json: every attempt of the point, the last one current."""

    attempts: list[Attempt] = field(default_factory=list)

    @classmethod
    def read(cls, data: dict[str, Any], path: Path) -> StateRecord:
        if "attempts" not in data:  # a run written before attempts were kept: its one job
            return cls([Attempt.read(_first_attempt(data), path)] if data.get("executor") else [])
        raw = _want(data, "attempts", list, path)
        attempts = []
        for item in raw:
            if not isinstance(item, dict):
                raise StoreError(f"{path}: attempts must be a list of objects")
            attempts.append(Attempt.read(item, path))
        return cls(attempts)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def state(self) -> str:
        return self.current.state if self.current else states.NOT_SUBMITTED

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "attempts": [a.to_dict() for a in self.attempts]}


def _first_attempt(data: dict[str, Any]) -> dict[str, Any]:
    """An old state.json (one job's fields at the top level) as the attempt it describes."""
    known = {f.name for f in dataclasses.fields(Attempt)}
    found = {k: v for k, v in data.items() if k in known}
    return {**found, "number": 1, "state": data.get("state", states.UNKNOWN)}
