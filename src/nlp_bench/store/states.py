"""The job-state vocabulary every executor, view and record uses: the only place these words are spelled."""

from __future__ import annotations

#: written, not handed to an executor yet (a dry run's points, a sweep's points before their turn, a point a
#: scheduler refused): `--resume` hands it. Spelt as a point waiting for its turn, not as one that never runs
NOT_SUBMITTED = "TO_SUBMIT"
#: how older records spell a state (state.json keeps each attempt's state as it was written)
OLD_SPELLINGS = {"NOT_SUBMITTED": NOT_SUBMITTED}
#: handed to the scheduler whose answer is not recorded yet (bench died, or the answer was lost): the
#: scheduler is asked for a job of the point's name and folder before anything is submitted again
SUBMITTING = "SUBMITTING"
PENDING, RUNNING, COMPLETED, FAILED = "PENDING", "RUNNING", "COMPLETED", "FAILED"
TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY = "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY"
#: neither the scheduler nor the job's own log knows how the job ended
LOST = "LOST"
#: the scheduler named a state this vocabulary has no word for
UNKNOWN = "UNKNOWN"
#: run.json lists the point, but its folder is gone
MISSING = "MISSING"
#: a published measurement shown beside a run's rows (results/reference): no job of ours
REFERENCE = "REFERENCE"

TERMINAL = frozenset({COMPLETED, FAILED, TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY, LOST})
#: a job may be queued or running: nothing may be submitted for the point
ACTIVE = frozenset({SUBMITTING, PENDING, RUNNING, UNKNOWN})
#: what `--resume` runs again
RERUNNABLE = (TERMINAL - {COMPLETED}) | {NOT_SUBMITTED}
#: nothing to ask a scheduler about: the job ended, or there never was one
SETTLED = TERMINAL | {NOT_SUBMITTED}
ALL = TERMINAL | ACTIVE | {NOT_SUBMITTED, MISSING}
