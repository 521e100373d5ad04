"""The local executor runs a jobscript as a one-node Slurm job and records what happened."""










def test_the_registry_names_every_executor_and_what_it_can_do():
    import pytest

    from nlp_bench.errors import LaunchError
    from nlp_bench.launch.executor import EXECUTORS, get_executor

    local, slurm = get_executor("local"), get_executor("slurm")
    assert EXECUTORS.names() == ["local", "slurm"]
    assert (local.queues, local.holds_jobs, slurm.queues, slurm.holds_jobs) == (False, False, True, True)
    with pytest.raises(LaunchError, match="unknown executor 'pbs'; known: local, slurm"):
        get_executor("pbs")
