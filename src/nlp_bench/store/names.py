"""The names of the files and folders of a run, in one place: the on-disk contract."""

from __future__ import annotations

RUN_JSON, POINT_JSON, STATE_JSON, RESULT_JSON = "run.json", "point.json", "state.json", "result.json"
#: what the planner predicted for a point before it ran (written where the system can be timed)
PREDICTION_JSON = "prediction.json"
JOBSCRIPT, JOB_OUT, JOB_ERR = "jobscript.sbatch", "job.out", "job.err"
#: the compile job of systems that compile ahead of the run (Neuron): its script and output
COMPILE_SCRIPT, COMPILE_OUT, COMPILE_ERR = "compile.sbatch", "compile.out", "compile.err"
#: where each script's output goes when no scheduler directive says so (the local executor)
OUTPUTS = {JOBSCRIPT: (JOB_OUT, JOB_ERR), COMPILE_SCRIPT: (COMPILE_OUT, COMPILE_ERR)}
#: the scripts of the latest attempt exactly as they were handed to the scheduler: an edit of
#: jobscript.sbatch after submission changes neither what runs nor the hash that is recorded
SUBMITTED = "submitted"
#: written by the jobscript at start: the environment that shapes performance
PROVENANCE_ENV = "provenance.env"
#: in provenance.env: a line `package.<name>=<version>` is a Python package's version the job found, not an
#: environment variable (the dot keeps the two apart: no shell variable holds one)
PROVENANCE_PACKAGE = "package."
#: the trainer's arguments as the job ran them (after the shell expanded them), one per line
TRAIN_ARGS_FILE = "train.args"
#: the points a sweep dropped, one CSV row each (its parameters, the reason, the rule counted by)
DROPPED_CSV = "dropped.csv.gz"
#: the lock a process holds on a point while it submits (and, on this machine, runs) its job
POINT_LOCK = ".lock"
#: held for the moment state.json is read, changed and written again, so two writers never lose an update
STATE_LOCK = ".state.lock"
#: in submitted/: the process id the local job's shell writes first, before bench may have recorded it
JOB_PID = "job.pid"
#: at the root of the results folder: held while a job of the local executor runs, one at a time per folder
LOCAL_LOCK = ".local-executor.lock"
#: at the root of the results folder: the counter that orders runs by creation, whatever the clocks say
SEQUENCE = ".run-sequence"
#: a run being written: created in a folder with this prefix and renamed into place when complete
CREATING = ".creating-"
#: held by the process that writes such a folder; a folder whose lock is free was abandoned
CREATING_LOCK = ".creating.lock"
#: a point's files as a submission bundle archives them (copied as they are)
ARCHIVED = (JOBSCRIPT, TRAIN_ARGS_FILE, JOB_OUT, JOB_ERR, PROVENANCE_ENV, POINT_JSON, STATE_JSON, RESULT_JSON,
            f"{SUBMITTED}/{JOBSCRIPT}")
