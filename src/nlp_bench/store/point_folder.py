"""A point's folder: its records, read and validated, and the record of its jobs' lives (state.json)."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nlp_bench.store import locks, states, unkept
from nlp_bench.store.files import StoreError, Unwritable, os_reason, read_object, write_object, write_text
from nlp_bench.store.names import (
    ARCHIVED,
    COMPILE_SCRIPT,
    JOB_ERR,
    JOB_OUT,
    JOBSCRIPT,
    POINT_JSON,
    POINT_LOCK,
    PREDICTION_JSON,
    PROVENANCE_ENV,
    PROVENANCE_PACKAGE,
    RESULT_JSON,
    STATE_JSON,
    STATE_LOCK,
    SUBMITTED,
)
from nlp_bench.store.records import Attempt, PointRecord, StateRecord, check_number, now_iso

#: what a result's summary and energy hold beside numbers: names, formulas, sources, reasons
_TEXT_FIELDS = {"tflops_convention", "mfu_basis", "mfu_note", "source", "reason"}


@dataclass(frozen=True)
class PointDir:
    """One point of a run on disk. Every read goes to the disk: another process (a job, a second bench)
    may have changed the files since the last one."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def id(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        return (self.path / POINT_JSON).is_file()

    def require(self) -> None:
        """StoreError when the folder is gone: a job's record must not be asked of (or written to) nothing."""
        if not self.path.is_dir():
            raise StoreError(f"{self.path}: the point's folder is gone (moved or removed while its job ran?)")

    def file(self, name: str) -> Path:
        return self.path / name

    # --- the resolved point and what was predicted of it ------------------------------------------------

    def point(self) -> PointRecord:
        self.require()
        path = self.path / POINT_JSON
        return PointRecord.read(read_object(path), path)

    def write_point(self, data: dict[str, Any], jobscript: str, compile_script: str | None = None) -> None:
        """point.json and the scripts (executable, so they also run by hand); while a run is created."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make {self.path}: {os_reason(exc)}") from None
        write_object(self.path / POINT_JSON, data, durable=False)
        write_text(self.path / JOBSCRIPT, jobscript, mode=0o755, durable=False)
        if compile_script is not None:
            write_text(self.path / COMPILE_SCRIPT, compile_script, mode=0o755, durable=False)

    def layout_disagreement(self, stated: dict[str, tuple[int, str]], script: Path,
                            layout: dict[str, Any] | None = None) -> str | None:
        """One line where point.json's layout (`layout`, where the caller read it already) is not what
        `script` runs (`stated`: by layout field, the value and where the script says it); None where they
        agree. A point.json edited by hand must not show, nor run again as, a layout its job never ran."""
        layout = self.point().layout if layout is None else layout
        differ = [f"layout.{key} is {layout[key]} but {script} runs {value} ({where})"
                  for key, (value, where) in stated.items() if isinstance(layout.get(key), int) and layout[key] != value]
        if not differ:
            return None
        return f"{self.path / POINT_JSON} disagrees with its jobscript: " + "; ".join(differ)

    def prediction(self) -> dict[str, Any] | None:
        path = self.path / PREDICTION_JSON
        if not path.exists():
            return None
        data = read_object(path)
        for key in ("tokens_per_s", "tokens_per_s_low", "tokens_per_s_high", "memory_gib"):
            check_number(data, key, path)
        return data

    def write_prediction(self, data: dict[str, Any]) -> None:
        write_object(self.path / PREDICTION_JSON, data, durable=False)

    def _provenance_lines(self) -> dict[str, str]:
        try:
            text = (self.path / PROVENANCE_ENV).read_text(errors="replace")
        except OSError:
            return {}
        pairs = (line.partition("=") for line in text.splitlines())
        return {name: value for name, sep, value in pairs if sep}

    def environment(self) -> dict[str, str]:
        """provenance.env's environment variables, which the jobscript writes at start (NAME=value per line);
        empty before that."""
        return {k: v for k, v in self._provenance_lines().items() if not k.startswith(PROVENANCE_PACKAGE)}

    def packages(self) -> dict[str, str]:
        """The Python packages the job's python found at start, by name, with their versions (provenance.env's
        package.<name>=<version> lines); empty before that, or where the job's python had none of them."""
        return {k.removeprefix(PROVENANCE_PACKAGE): v for k, v in self._provenance_lines().items()
                if k.startswith(PROVENANCE_PACKAGE)}

    # --- the parsed result --------------------------------------------------------------------------

    def result(self) -> dict[str, Any] | None:
        path = self.path / RESULT_JSON
        if not path.exists():
            return None
        data = read_object(path)
        for key, kinds in (("summary", (dict, type(None))), ("records", list), ("energy", (dict, type(None))),
                           ("provenance", (dict, type(None)))):
            if not isinstance(data.get(key), kinds):
                raise StoreError(f"{path}: {key} is missing or of the wrong kind; delete the file and it is made "
                                 "again from job.out")
        for part in ("summary", "energy"):
            for key, value in (data.get(part) or {}).items():
                if key not in _TEXT_FIELDS:
                    check_number({key: value}, key, path, f"{part}.")
        return data

    def write_result(self, data: dict[str, Any]) -> None:
        write_object(self.path / RESULT_JSON, data)

    def forget_result(self) -> None:
        (self.path / RESULT_JSON).unlink(missing_ok=True)

    # --- the jobs ---------------------------------------------------------------------------------

    def state(self) -> StateRecord:
        """Every attempt (none: never submitted). StoreError where the folder itself is gone: that is no
        point that was never submitted. A state this process worked out and could not write (store.unkept)
        stands for the file while the file is unchanged."""
        path = self.path / STATE_JSON
        shown = unkept.held(path)
        if shown is not None:
            return shown
        if path.exists():
            return StateRecord.read(read_object(path), path)
        self.require()
        return StateRecord()

    def attempt(self) -> Attempt | None:
        return self.state().current

    @contextlib.contextmanager
    def _editing(self) -> Iterator[StateRecord]:
        """state.json read and, if the block ends normally, written back, under the state lock: two writers
        (a launcher, a `bench status`, a cancel) never lose each other's change. Where the file system
        refuses the lock or the write, a reader inside unkept.shown() keeps the record in memory instead."""
        self.require()
        refused = None
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(locks.hold(self.path / STATE_LOCK, f"the state of {self.path}", wait=True))
            except Unwritable as exc:
                refused = unkept.refused(exc)
            record = self.state()
            yield record
            if refused is None:
                try:
                    write_object(self.path / STATE_JSON, record.to_dict())
                    return
                except Unwritable as exc:
                    refused = unkept.refused(exc)
            unkept.remember(self.path / STATE_JSON, record, refused)

    def begin_attempt(self, executor: str, state: str = states.SUBMITTING, **fields: Any) -> Attempt:
        """A new attempt, recorded before the scheduler is asked: a bench that dies in between leaves the
        evidence that a job may exist."""
        fields.setdefault("folder", str(self.path.resolve()))
        with self._editing() as record:
            attempt = Attempt(number=len(record.attempts) + 1, executor=executor, state=state,
                              submitted=now_iso(), **fields)
            attempt.history.append({"state": state, "at": attempt.submitted})
            record.attempts.append(attempt)
        return attempt

    def update(self, state: str | None = None, *, number: int | None = None, **fields: Any) -> Attempt:
        """Change the current attempt: a new state is appended to its history (with the job id it concerns,
        so a second job in the same state shows too), the other fields are replaced. With `number`, only
        that attempt is changed: a poll that saw an earlier attempt never writes over a later one, and an
        attempt that ended is never changed again."""
        with self._editing() as record:
            attempt = record.current
            if attempt is None:
                raise StoreError(f"{self.path / STATE_JSON}: no job was submitted for this point")
            if number is not None and (attempt.number != number or attempt.state in states.TERMINAL):
                return attempt
            for name, value in fields.items():
                if not hasattr(attempt, name):
                    raise TypeError(f"an attempt has no field {name!r}")
                setattr(attempt, name, value)
            if state is not None and (state != attempt.state or fields.get("job_id")):
                attempt.history.append({"state": state, "at": now_iso(), "job_id": attempt.job_id})
                attempt.state = state
        return attempt

    def copy_of(self) -> Path | None:
        """The folder whose job this one's record follows, where this is a copy of it (`cp -r`) made while
        the job may run: that job is the original's, to follow and signal there, never from here. None where
        this is the folder the job was submitted from, the same one by another path (a link, a bind mount),
        or a move of it (the folder it was submitted from is gone); and where no job may run."""
        found = self._elsewhere()
        return found[0] if found is not None and found[1] else None

    def follow_move(self) -> bool:
        """Record this folder as the job's where the folder it was submitted from is gone (the run was moved):
        a copy made of it later is then known as one. True where it was recorded."""
        found = self._elsewhere()
        if found is None or found[1]:
            return False
        self.update(number=self.attempt().number, folder=str(self.path.resolve()))
        return True

    def _elsewhere(self) -> tuple[Path, bool] | None:
        """The folder the current attempt was submitted from, where its job may still run and that folder is
        not this one (by this path or another), with whether it is still there; None otherwise."""
        attempt = self.attempt()
        if attempt is None or attempt.folder is None or attempt.state in states.SETTLED:
            return None
        made, here = Path(attempt.folder), self.path.resolve()
        try:
            same = made == here or made.samefile(here)
        except (FileNotFoundError, NotADirectoryError):
            return made, False
        except OSError:  # it cannot be looked at: not taken for this one, as nothing is signalled on a guess
            return made, True
        return None if same else (made, True)

    def cancel_unsubmitted(self, executor: str) -> bool:
        """Record a point that was never submitted as cancelled (a launcher still going through the run
        then leaves it); False where it was submitted meanwhile."""
        with self._editing() as record:
            if record.state != states.NOT_SUBMITTED:
                return False
            at = now_iso()
            record.attempts.append(Attempt(
                number=len(record.attempts) + 1, executor=executor, state=states.CANCELLED, finished=at,
                failure_class="cancelled", failure_detail="cancelled before it was submitted",
                history=[{"state": states.CANCELLED, "at": at}]))
        return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held while a process submits the point's job (and, where it runs it itself, until the job ends):
        a second process gets locks.Busy."""
        with locks.hold(self.path / POINT_LOCK, f"point {self.path}"):
            yield

    def keep_earlier_output(self) -> int:
        """Before another attempt: job.out/job.err become job.out.N/job.err.N, and result.json (analysed
        from the earlier log) goes. Returns N."""
        number = 1
        while (self.path / f"{JOB_OUT}.{number}").exists() or (self.path / f"{JOB_ERR}.{number}").exists():
            number += 1
        try:
            for name in (JOB_OUT, JOB_ERR):
                if (self.path / name).exists():
                    (self.path / name).rename(self.path / f"{name}.{number}")
            self.forget_result()
        except OSError as exc:
            raise StoreError(f"cannot keep the earlier output of {self.path}: {os_reason(exc)}") from None
        return number

    def freeze_scripts(self, chain: tuple[str, ...]) -> dict[str, bytes]:
        """Copy the chain's scripts to submitted/ as they are now and return their bytes: what the scheduler
        gets, what runs and what is hashed are the same bytes, whatever happens to the originals later."""
        folder = self.path / SUBMITTED
        found = {}
        try:
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            for script in chain:
                body = (self.path / script).read_bytes()
                (folder / script).write_bytes(body)
                (folder / script).chmod(0o755)
                found[script] = body
        except OSError as exc:
            raise StoreError(f"cannot copy the scripts of {self.path} for submission: {os_reason(exc)}") from None
        return found

    def submitted_script(self, name: str = JOBSCRIPT) -> Path:
        return self.path / SUBMITTED / name

    def archive(self, target: Path) -> None:
        """Copy the point's scripts, logs and records, as they are, into `target` (a submission bundle); its
        state as this process shows it where it could not be written (store.unkept), as the bundle's table
        shows it."""
        for name in ARCHIVED:
            if (self.path / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.path / name, target / name)
        shown = unkept.held(self.path / STATE_JSON)
        if shown is not None:
            write_object(target / STATE_JSON, shown.to_dict(), durable=False)


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()

