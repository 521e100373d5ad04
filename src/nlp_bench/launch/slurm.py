"""The Slurm executor: sbatch to submit; sacct, then squeue and scontrol, then the job's own last line to
watch; scancel, confirmed, to cancel.

What it assumes of Slurm is only what Slurm promises: an answer may be lost (a busy controller makes sbatch
time out although it queued the job), a finished job is forgotten by the controller after MinJobAge and is
remembered only where accounting runs, and a controller may not answer at all. So a submission is recorded
before sbatch is called and, when its answer is lost, found again by the job's name and folder before
anything is submitted twice; a job no one remembers becomes LOST after a while instead of RUNNING for ever;
and a view says when Slurm did not answer instead of showing stale states as news.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch.executor import Cancelled, job_environment, open_attempt, register_executor
from nlp_bench.launch.job_end import finish
from nlp_bench.launch.slurm_said import never_sent, one_line, unauthenticated
from nlp_bench.store import protocol, states
from nlp_bench.store.names import JOB_OUT, JOBSCRIPT, OUTPUTS
from nlp_bench.store.point_folder import PointDir, sha256
from nlp_bench.store.records import Attempt, now_iso, parse_time


def _seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


#: how long one Slurm query may take before the controller counts as not answering
QUERY_TIMEOUT_S = _seconds("NLP_BENCH_SLURM_TIMEOUT", 20)
#: how long the controller may take to answer a ping before a submission is refused: a ping asks nothing of
#: its queue, so a controller that lets it wait this long would leave a submission undecided for minutes
PING_TIMEOUT_S = _seconds("NLP_BENCH_SLURM_PING_TIMEOUT", 10)
#: how long sbatch may take (a busy controller answers late; sbatch itself gives up after MessageTimeout)
SUBMIT_TIMEOUT_S = _seconds("NLP_BENCH_SBATCH_TIMEOUT", 60)
#: how long a submission whose answer was lost is looked for before bench leaves it to a later `bench status`
RECONCILE_S = _seconds("NLP_BENCH_RECONCILE_TIMEOUT", 120)
#: how long Slurm must go on answering without the job before a submission whose answer was lost counts as
#: not queued: a controller that was hung serves the waiting sbatch request some moments after it answers
#: again (three of Slurm's default MessageTimeout)
SETTLE_S = _seconds("NLP_BENCH_SUBMIT_SETTLE", 30)
#: a job that neither accounting nor the controller knows, and whose log has no exit line, is LOST after this
LOST_AFTER_S = _seconds("NLP_BENCH_LOST_AFTER", 600)
#: how long a cancel waits for Slurm to show the jobs ended
CANCEL_CONFIRM_S = _seconds("NLP_BENCH_CANCEL_CONFIRM", 30)
#: after the controller did not answer, this long without asking it again (one slow status, not forty)
SILENT_BACKOFF_S = 30.0

#: Slurm's state names (sacct / squeue long and short forms) mapped onto the store's vocabulary
SLURM_STATES = {
    "PENDING": states.PENDING, "CONFIGURING": states.PENDING, "REQUEUED": states.PENDING,
    "RESV_DEL_HOLD": states.PENDING, "REQUEUE_HOLD": states.PENDING, "REQUEUE_FED": states.PENDING,
    "RUNNING": states.RUNNING, "COMPLETING": states.RUNNING, "STAGE_OUT": states.RUNNING,
    "SUSPENDED": states.RUNNING, "RESIZING": states.RUNNING, "SIGNALING": states.RUNNING,
    "COMPLETED": states.COMPLETED, "FAILED": states.FAILED, "BOOT_FAIL": states.NODE_FAIL,
    "DEADLINE": states.TIMEOUT, "TIMEOUT": states.TIMEOUT, "CANCELLED": states.CANCELLED,
    "PREEMPTED": states.CANCELLED, "REVOKED": states.CANCELLED, "NODE_FAIL": states.NODE_FAIL,
    "OUT_OF_MEMORY": states.OUT_OF_MEMORY,
    "PD": states.PENDING, "R": states.RUNNING, "CG": states.RUNNING, "CD": states.COMPLETED, "F": states.FAILED,
    "TO": states.TIMEOUT, "CA": states.CANCELLED, "NF": states.NODE_FAIL, "OOM": states.OUT_OF_MEMORY,
}


def from_slurm(state: str) -> str:
    """Normalise a Slurm state ('CANCELLED by 0', 'CD', ...) to the store's vocabulary."""
    word = state.split()[0].rstrip("+") if state.strip() else ""
    return SLURM_STATES.get(word, states.UNKNOWN)


#: sbatch's words for a request whose answer was lost: the job may have been queued all the same
_LOST_ANSWER = re.compile(r"Socket timed out|Zero Bytes were transmitted|Communication connection failure|"
                          r"Transport endpoint|Resource temporarily unavailable|Connection reset", re.I)
#: a query about a job Slurm does not know (as opposed to a query Slurm did not answer)
_UNKNOWN_JOB = re.compile(r"Invalid job id|does not exist|not found", re.I)
_ACCOUNTING_OFF = re.compile(r"accounting storage is disabled|not running a supported accounting", re.I)


class _NoAnswer(Exception):
    """The controller (or the command) did not answer; the message says how."""


class _Unauthenticated(_NoAnswer):
    """Slurm could not authenticate the request (munge down): no Slurm question gets an answer until it can.
    `sent`: False where the credential was never made, so the request never reached Slurm."""

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Refused(Exception):
    """sbatch answered no; the message is its reason."""


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LaunchError(f"{tool} not found: this machine has no Slurm client; use --dry-run to write the "
                          f"jobscript and submit it with sbatch where Slurm runs")
    return path


def _query_environment() -> dict[str, str]:
    """Times in UTC and one format, whatever the user's time zone or SLURM_TIME_FORMAT."""
    return {**os.environ, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}


def _ask(cmd: list[str], timeout: float = QUERY_TIMEOUT_S, body: bytes | None = None,
         cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm command; _NoAnswer when it cannot start, times out, reports a lost connection, or could not
    authenticate (_Unauthenticated)."""
    try:
        proc = subprocess.run(cmd, input=body, capture_output=True, timeout=timeout, cwd=cwd,
                              env=env or _query_environment())
    except subprocess.TimeoutExpired:
        raise _NoAnswer(f"{Path(cmd[0]).name} did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise _NoAnswer(f"{Path(cmd[0]).name} could not run: {exc.strerror}") from None
    out = proc.stderr.decode(errors="replace").strip() or proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        refused = unauthenticated(out)
        if refused is not None:
            raise _Unauthenticated(f"{Path(cmd[0]).name}: {refused}", sent=not never_sent(out))
        if _LOST_ANSWER.search(out) or "Unable to contact slurm controller" in out:
            raise _NoAnswer(f"{Path(cmd[0]).name}: {one_line(out) or proc.returncode}")
    return proc


def _complaint(proc: subprocess.CompletedProcess) -> str:
    """What a command that answered no said, in one line."""
    return one_line(proc.stderr.decode(errors="replace")) or one_line(_text(proc)) or f"exit {proc.returncode}"


def _text(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.decode(errors="replace")


def _moment(raw: str) -> datetime | None:
    """A Slurm time (asked for in UTC), None for Unknown/None/N/A."""
    try:
        return datetime.fromisoformat(raw.strip()).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


@dataclass(frozen=True)
class Seen:
    """A job as Slurm describes it."""

    state: str
    exit_code: int | None = None
    started: datetime | None = None
    finished: datetime | None = None
    energy_j: float | None = None


#: sacct's fields for a job's state, exit, times and energy
_ACCOUNTED = "JobID,State,ExitCode,Start,End,ConsumedEnergyRaw"
#: how long what a prefetch learnt stands in for asking again
PREFETCH_S = 5.0


def _accounted(row: list[str]) -> tuple[str | None, Seen | None]:
    """(job id, what sacct says of it) from a row of _ACCOUNTED fields; (None, None) for a malformed row."""
    if len(row) < 6:
        return None, None
    code = row[2].split(":")[0]
    try:
        energy = float(row[5]) if row[5] else None
    except ValueError:
        energy = None
    return row[0], Seen(from_slurm(row[1]), int(code) if code.isdigit() else None, _moment(row[3]),
                        _moment(row[4]), energy if energy else None)


def _script_job_name(body: bytes) -> str | None:
    found = re.search(rb"^#SBATCH\s+(?:--job-name[= ]|-J\s*)(\S+)", body, re.M)
    return found.group(1).decode(errors="replace").strip("'\"") if found else None


@register_executor
class SlurmExecutor:
    name = "slurm"
    queues = True
    holds_jobs = True

    def __init__(self) -> None:
        self.silence: str | None = None
        self._silent_until = 0.0
        self._accounting: bool | None = None  # None: not asked yet
        self._accounted: dict[str, Seen] = {}  # what the last prefetch learnt, by job id
        self._accounted_at = float("-inf")

    def check_available(self) -> None:
        require("sbatch")

    def check_answers(self, system: str) -> None:
        """The controller answers `scontrol ping`, or the submission is refused here, before any point is
        marked SUBMITTING: sbatch to a controller that is down or hung waits, then bench looks for the job
        it may have queued, and the point stays undecided until the controller answers again."""
        try:
            proc = _ask([require("scontrol"), "ping"], PING_TIMEOUT_S)
            said = one_line(_text(proc)) or _complaint(proc)
            if not re.search(r"\bis UP\b", _text(proc)):
                raise _NoAnswer(f"scontrol ping: {said}")
        except _NoAnswer as exc:
            raise LaunchError(f"system {system}: Slurm did not answer ({exc}): nothing was queued; start its "
                              f"controller, or ask `bench doctor --system {system}`") from None

    # --- asking Slurm -----------------------------------------------------------------------------

    def _controller(self, cmd: list[str]) -> subprocess.CompletedProcess:
        """A question for the controller, unless it stayed silent a moment ago."""
        if time.monotonic() < self._silent_until:
            raise _NoAnswer(self.silence or "the controller did not answer")
        try:
            proc = _ask(cmd)
        except _NoAnswer as exc:
            self._silent(exc)
            raise
        return proc

    def _silent(self, exc: _NoAnswer) -> None:
        """Slurm did not answer: the views say so, and it is not asked again for a while."""
        self.silence, self._silent_until = str(exc), time.monotonic() + SILENT_BACKOFF_S

    def _sacct(self, args: list[str]) -> list[list[str]] | None:
        """Rows of sacct (fields split), or None where accounting does not answer."""
        if self._accounting is False or shutil.which("sacct") is None or time.monotonic() < self._silent_until:
            return None
        try:
            proc = _ask(["sacct", "-X", "-n", "-P", *args])
        except _Unauthenticated as exc:  # no Slurm command is answered then: the controller is not asked either
            self._silent(exc)
            return None
        except _NoAnswer:
            return None  # accounting is a help, not a need: squeue and scontrol still answer
        if proc.returncode != 0:
            if _ACCOUNTING_OFF.search(proc.stderr.decode(errors="replace")):
                self._accounting = False
            return None
        self._accounting = True
        return [line.split("|") for line in _text(proc).splitlines() if line.strip()]

    def prefetch(self, job_ids: list[str]) -> None:
        """Ask accounting about many jobs at once, for the polls that follow within PREFETCH_S: a view or a
        --wait over a thousand points asks sacct a few times a round, not a thousand."""
        self._accounted, self._accounted_at = {}, time.monotonic()
        for start in range(0, len(job_ids), 200):
            chunk = job_ids[start:start + 200]
            rows = self._sacct(["-j", ",".join(chunk), "-o", _ACCOUNTED]) or []
            self._accounted.update((seen_id, seen) for seen_id, seen in map(_accounted, rows) if seen_id)

    def _look(self, job_id: str) -> Seen | None:
        """How Slurm describes the job; None when it answers that it does not know it. _NoAnswer when the
        controller was needed and did not answer. Accounting tells how a job ended (and still knows it when
        the controller has forgotten it); while it runs, the controller knows first (slurmdbd hears of a
        start or an end some moments later), so a job accounting shows unfinished is asked of it too."""
        accounted = None
        if time.monotonic() - self._accounted_at < PREFETCH_S and job_id in self._accounted:
            accounted = self._accounted[job_id]
        else:
            for seen_id, seen in map(_accounted, self._sacct(["-j", job_id, "-o", _ACCOUNTED]) or []):
                if seen_id == job_id:
                    accounted = seen
        if accounted is not None and accounted.state in states.TERMINAL:
            return accounted
        try:
            return self._controlled(job_id) or accounted
        except _NoAnswer:
            # accounting hears of a start moments late: its PENDING for a job recorded RUNNING is stale, and
            # without the controller only a start it reports is news
            if accounted is None or accounted.state != states.RUNNING:
                raise
            return accounted

    def _controlled(self, job_id: str) -> Seen | None:
        """The job as the controller describes it (scontrol show job); None where it does not know it."""
        if shutil.which("scontrol") is None:  # not "Slurm knows nothing of it": there is no Slurm to ask here
            self.silence = "no Slurm client (scontrol) on this machine"
            raise _NoAnswer(self.silence)
        proc = self._controller(["scontrol", "show", "job", job_id])
        if proc.returncode != 0:
            if _UNKNOWN_JOB.search(proc.stderr.decode(errors="replace")):
                return None
            self._silent(_NoAnswer(f"scontrol: {_complaint(proc)}"))
            raise _NoAnswer(self.silence)
        text = _text(proc)
        state = re.search(r"JobState=(\S+)", text)
        if not state:
            return None
        code = re.search(r"ExitCode=(\d+):", text)
        start, end = re.search(r"StartTime=(\S+)", text), re.search(r"EndTime=(\S+)", text)
        found = from_slurm(state.group(1))
        running = found == states.RUNNING or found in states.TERMINAL
        return Seen(found, int(code.group(1)) if code else None, _moment(start.group(1)) if start and running else None,
                    _moment(end.group(1)) if end and found in states.TERMINAL else None)

    # --- submitting -------------------------------------------------------------------------------

    def _sbatch(self, point: PointDir, body: bytes, name: str, options: list[str]) -> str:
        """Submit the script's bytes on sbatch's standard input: what Slurm keeps is what was hashed."""
        cmd = [require("sbatch"), "--parsable", *options, f"--job-name={name}"]
        proc = _ask(cmd, SUBMIT_TIMEOUT_S, body, point.path, job_environment())  # the job's own environment
        if proc.returncode != 0:
            raise _Refused(_complaint(proc))
        return _text(proc).strip().split(";")[0]

    def submit(self, point_dir: Path, chain: Sequence[str] = (JOBSCRIPT,), after: Sequence[str] = ()) -> str:
        """Each script of the chain held (afterok) until the one before it completed; a failed step cancels
        the rest (--kill-on-invalid-dep) instead of leaving them pending for ever. The jobs in `after` hold
        the first script only: the others wait on it anyway."""
        point = PointDir(point_dir)
        bodies = point.freeze_scripts(tuple(chain))
        names = [_script_job_name(bodies[s]) or s for s in chain]
        point.begin_attempt(self.name, job_names=names,
                            scripts_sha256={script: sha256(body) for script, body in bodies.items()})
        ids: list[str] = []
        for script, name in zip(chain, names, strict=True):
            held = [ids[-1]] if ids else list(after)
            options = [f"--dependency=afterok:{':'.join(held)}"] if held else []
            if ids:
                options.append("--kill-on-invalid-dep=yes")
            try:
                ids.append(self._sbatch(point, bodies[script], name, options))
            except _Refused as exc:
                self._abandon(point, ids, f"sbatch refused {script}: {exc}", "usage")
                raise LaunchError(f"sbatch refused {point.path / script}: {exc}") from None
            except _NoAnswer as exc:
                if isinstance(exc, _Unauthenticated) and not exc.sent:
                    self._abandon(point, ids, f"Slurm did not answer ({exc}): nothing was queued")
                    raise LaunchError(f"Slurm did not answer the submission of {point.path / script} ({exc}): "
                                      "nothing was queued; submit again once it answers (--resume)") from None
                point.update(chain_job_ids=list(ids))
                try:
                    found = self._find_until(point, name, time.monotonic() + RECONCILE_S)
                except _NoAnswer:
                    raise LaunchError(f"sbatch did not answer for {point.path / script} ({exc}) and Slurm could not "
                                      "be asked whether it queued the job; nothing is submitted again for this "
                                      "point until `bench status` finds out") from None
                if found is None:
                    self._abandon(point, ids, f"sbatch did not answer ({exc}), and Slurm has no job {name!r} in "
                                              f"{point.path}: nothing was queued")
                    raise LaunchError(f"sbatch did not answer for {point.path / script} ({exc}), and Slurm has no "
                                      "such job: nothing was queued") from None
                ids.append(found)
            point.update(chain_job_ids=list(ids))
        point.update(states.PENDING, job_id=ids[-1], chain_job_ids=ids)
        return ids[-1]

    def _abandon(self, point: PointDir, ids: list[str], why: str, failure: str | None = None,
                 number: int | None = None) -> None:
        """A chain that could not be submitted whole: its queued jobs are cancelled, the point is runnable
        again."""
        if ids:
            try:
                _ask([require("scancel"), *ids])
            except _NoAnswer as exc:
                why += f"; scancel of the chain's jobs {', '.join(ids)} did not answer ({exc})"
        point.update(states.NOT_SUBMITTED, number=number, chain_job_ids=ids, failure_class=failure, failure_detail=why)

    def _find_until(self, point: PointDir, name: str, deadline: float) -> str | None:
        """_find, asked again until Slurm shows the job (its id), or has answered without it for SETTLE_S
        (None); _NoAnswer when neither happened by `deadline`."""
        answered_since = None
        while True:
            self._silent_until = 0.0  # the controller is asked again however it answered a moment ago
            try:
                found = self._find(point, name, point.attempt())
            except _NoAnswer:
                found, answered_since = None, None
            else:
                if found is not None:
                    return found
                answered_since = answered_since or time.monotonic()
                if time.monotonic() - answered_since >= SETTLE_S:
                    return None
            if time.monotonic() >= deadline:
                raise _NoAnswer(self.silence or "Slurm has not shown the job yet")
            time.sleep(1.0)

    def _reconcile(self, point: PointDir) -> Attempt:
        """An attempt whose submission answer was lost (or whose bench died while submitting): its jobs are
        found by name and folder. Ends PENDING with their ids, NOT_SUBMITTED (its queued jobs cancelled)
        where Slurm lacks one, or still SUBMITTING where Slurm did not answer."""
        attempt = point.attempt()
        ids = list(attempt.chain_job_ids)
        submitted = parse_time(attempt.submitted) or datetime.now(timezone.utc)
        settled = (datetime.now(timezone.utc) - submitted).total_seconds() >= SUBMIT_TIMEOUT_S + SETTLE_S
        scripts = list(attempt.scripts_sha256)
        try:
            for index, name in enumerate(attempt.job_names[len(ids):], len(ids)):
                found = self._find(point, name, attempt) or self._started(point, scripts[index:index + 1], attempt)
                if found is None and not settled:
                    return attempt  # the request may not have been served yet: undecided
                if found is None:
                    self._abandon(point, ids, f"the submission's answer was lost, and Slurm has no job {name!r} in "
                                              f"{point.path}: nothing (more) was queued", number=attempt.number)
                    return point.attempt()
                ids.append(found)
        except _NoAnswer:
            return attempt
        return point.update(states.PENDING, number=attempt.number, job_id=ids[-1], chain_job_ids=ids)

    @staticmethod
    def _started(point: PointDir, script: list[str], attempt: Attempt) -> str | None:
        """The job id the script's job wrote into its output when it started (Slurm may have forgotten the
        job since: no accounting, older than MinJobAge)."""
        if not script or script[0] not in OUTPUTS:
            return None
        begun = protocol.start_of(point.path / OUTPUTS[script[0]][0])
        earlier = {j for a in point.state().attempts[:-1] for j in a.chain_job_ids}
        return begun.job_id if begun is not None and begun.job_id not in earlier else None

    def _find(self, point: PointDir, name: str, attempt: Attempt) -> str | None:
        """The id of the job of this name, in this folder, submitted for this attempt; None if Slurm has none."""
        since = (parse_time(attempt.submitted) or datetime.now(timezone.utc)) - timedelta(minutes=5)
        earlier = {j for a in point.state().attempts[:-1] for j in a.chain_job_ids}
        folder = str(point.path.resolve())
        candidates = []
        proc = self._controller(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i|%Z|%V"])
        if proc.returncode == 0:
            candidates += [line.split("|") for line in _text(proc).splitlines() if line.count("|") == 2]
        rows = self._sacct(["--name", name, "-S", since.strftime("%Y-%m-%dT%H:%M:%S"), "-o", "JobID,WorkDir,Submit"])
        candidates += [row for row in rows or [] if len(row) == 3]
        for job_id, workdir, submitted in candidates:
            when = _moment(submitted)
            if job_id not in earlier and _same_folder(workdir, folder) and (when is None or when >= since):
                return job_id
        return None

    # --- watching ---------------------------------------------------------------------------------

    def poll(self, point_dir: Path) -> str:
        point, attempt, recorded = open_attempt(point_dir)
        if attempt is None:
            return recorded
        if attempt.state == states.SUBMITTING:
            attempt = self._reconcile(point)
            if attempt.state != states.PENDING:
                return attempt.state
        try:
            seen = self._look(attempt.job_id)
        except _NoAnswer:
            return attempt.state
        if seen is None:
            return self._unseen(point, attempt)
        if seen.state in states.TERMINAL:
            extra = {"consumed_energy_j": seen.energy_j} if seen.energy_j else {}
            return finish(point_dir, seen.state, seen.exit_code, number=attempt.number, started=seen.started,
                          finished=seen.finished,
                          times_from="scheduler" if seen.finished else None, unseen_since=None, **extra).state
        fields = {"unseen_since": None} if attempt.unseen_since else {}
        if seen.started and not attempt.started:
            fields.update(started=seen.started.isoformat(), times_from="scheduler")
        if seen.state != attempt.state or fields:
            point.update(seen.state if seen.state != attempt.state else None, number=attempt.number, **fields)
        return seen.state

    def _unseen(self, point: PointDir, attempt: Attempt) -> str:
        """Slurm answered and knows nothing of the job: the job's own last line says how it ended; without
        one, the job is LOST once Slurm has not known it for LOST_AFTER_S."""
        ended = protocol.exit_of(point.path / JOB_OUT)
        if ended is not None:
            return finish(point.path, states.COMPLETED if ended.code == 0 else states.FAILED, ended.code,
                          number=attempt.number).state
        since = parse_time(attempt.unseen_since)
        if since is None:
            point.update(number=attempt.number, unseen_since=now_iso())
        elif (datetime.now(timezone.utc) - since).total_seconds() >= LOST_AFTER_S:
            return finish(point.path, states.LOST, None, number=attempt.number).state
        return attempt.state

    # --- cancelling -------------------------------------------------------------------------------

    def cancel(self, point_dir: Path) -> Cancelled:
        """scancel every job of the chain, then wait until Slurm shows them ended: a cancel is confirmed only
        then."""
        point = PointDir(point_dir)
        attempt = point.attempt()
        if attempt is not None and attempt.state == states.SUBMITTING:
            attempt = self._reconcile(point)
        if attempt is None or attempt.state in states.SETTLED:
            return Cancelled(True, "nothing to cancel")
        if attempt.state == states.SUBMITTING:
            return Cancelled(False, f"Slurm did not answer whether the job was queued ({self.silence})")
        ids = list(attempt.chain_job_ids or [attempt.job_id])
        try:
            proc = _ask([require("scancel"), *ids])
        except _NoAnswer as exc:
            return Cancelled(False, f"scancel did not answer ({exc}); jobs {', '.join(ids)} may still run")
        complaint = proc.stderr.decode(errors="replace").strip()
        if proc.returncode != 0 and not re.search(r"already complet|Invalid job id", complaint, re.I):
            return Cancelled(False, f"scancel refused: {_complaint(proc)}")
        if proc.returncode == 0:  # a job's end seen from its log alone (no accounting) is then the cancel's
            point.update(number=attempt.number, cancel_requested=now_iso())
        deadline = time.monotonic() + CANCEL_CONFIRM_S
        left = ids
        while True:
            try:
                left = [j for j in left if (seen := self._look(j)) is not None and seen.state not in states.TERMINAL]
            except _NoAnswer as exc:
                return Cancelled(False, f"Slurm did not confirm the cancel ({exc}); jobs {', '.join(left)} may still run")
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if left:
            return Cancelled(False, f"Slurm accepted the cancel, but jobs {', '.join(left)} still run after "
                                    f"{CANCEL_CONFIRM_S:.0f} s")
        self.poll(point_dir)
        return Cancelled(True, f"jobs {', '.join(ids)} ended")


def _same_folder(workdir: str, folder: str) -> bool:
    try:
        return Path(workdir).resolve() == Path(folder)
    except OSError:
        return workdir == folder
