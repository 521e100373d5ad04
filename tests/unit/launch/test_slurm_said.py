"""Slurm's complaints as bench repeats them: one line, and an authentication failure told from a refusal. The
texts are what Slurm 23's clients wrote on the tests' cluster with munged stopped."""

import pytest

from nlp_bench.launch.slurm_said import never_sent, one_line, unauthenticated

MUNGE = ('Munge encode failed: Failed to access "/run/munge/munge.socket.2": No such file or directory '
         '(Did you start munged?)')
SCANCEL = ("scancel: error: If munged is up, restart with --num-threads=10\n"
           f"scancel: error: {MUNGE}\n"
           "scancel: error: slurm_send_node_msg: auth_g_create: REQUEST_KILL_JOB has authentication error\n"
           "scancel: error: Kill job error on job id 532: Protocol authentication error\n")
SQUEUE = ("squeue: error: If munged is up, restart with --num-threads=10\n"
          f"squeue: error: {MUNGE}\n"
          "squeue: error: slurm_send_node_msg: auth_g_create: REQUEST_FED_INFO has authentication error\n"
          "squeue: error: If munged is up, restart with --num-threads=10\n"
          f"squeue: error: {MUNGE}\n"
          "squeue: error: slurm_send_node_msg: auth_g_create: REQUEST_JOB_INFO_SINGLE has authentication error\n"
          "slurm_load_jobs error: Protocol authentication error\n")
SBATCH = ("sbatch: error: If munged is up, restart with --num-threads=10\n"
          f"sbatch: error: {MUNGE}\n"
          "sbatch: error: slurm_send_node_msg: auth_g_create: REQUEST_SUBMIT_BATCH_JOB has authentication error\n"
          "sbatch: error: Batch job submission failed: Protocol authentication error\n")
SACCT = ("sacct: error: If munged is up, restart with --num-threads=10\n"
         f"sacct: error: {MUNGE}\n"
         "sacct: error: slurm_send_node_msg: auth_g_create: REQUEST_PERSIST_INIT has authentication error\n"
         "sacct: error: Problem talking to the database: Protocol authentication error\n")
#: the controller refused a credential it could not verify (another key): the request reached it
DECODED = "sbatch: error: Batch job submission failed: Protocol authentication error\n"
REFUSED = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
UNKNOWN = "scancel: error: Kill job error on job id 99999: Invalid job id specified\n"


def test_scancels_four_lines_are_one():
    said = one_line(SCANCEL)
    assert "\n" not in said and said == (f"{MUNGE}; slurm_send_node_msg: auth_g_create: REQUEST_KILL_JOB has "
                                         "authentication error; Kill job error on job id 532: Protocol "
                                         "authentication error")


def test_a_line_said_twice_is_said_once_and_a_long_complaint_is_cut():
    assert one_line(SQUEUE).count(MUNGE) == 1
    long = one_line("\n".join(f"scancel: error: Kill job error on job id {n}: Invalid job id" for n in range(99)))
    assert len(long) == 400 and long.endswith("…") and "\n" not in long


@pytest.mark.parametrize("text", [SCANCEL, SQUEUE, SBATCH, SACCT])
def test_munge_down_is_an_authentication_failure_that_never_left(text):
    assert unauthenticated(text) == f"authentication failed ({MUNGE})"
    assert never_sent(text)


def test_a_credential_the_controller_refused_may_have_been_seen():
    assert unauthenticated(DECODED) == "authentication failed (Protocol authentication error)"
    assert not never_sent(DECODED)


@pytest.mark.parametrize("text", [REFUSED, UNKNOWN, ""])
def test_other_complaints_are_no_authentication_failure(text):
    assert unauthenticated(text) is None
