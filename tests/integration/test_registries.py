"""A part registered in a test carried through a whole `bench run --dry-run` of a site profile that names it:
an executor the profile and the run accept, a launcher whose start, stop and rendezvous lines land in the
jobscript written."""

import pytest
from registry_parts import queue_executor, site_profile

from nlp_bench.launch.executor import executor_for, get_executor
from nlp_bench.launch.launcher import register_launcher
from nlp_bench.spec.systems import load_system_file

pytestmark = pytest.mark.usefixtures("registries_restored")

def _pdsh_launcher():
    @register_launcher
    class PdshLauncher:
        name = "pdsh-test"
        start = "pdsh -w \"$NODES\" "
        stop = "pdsh-kill-test"

        def rendezvous(self, system) -> str:
            return "export MASTER_ADDR=$(first-node-test)"

    return PdshLauncher

def test_a_registered_executor_is_accepted_by_a_profile_and_a_dry_run(site, bench, results):
    queue = queue_executor()
    path = site_profile(site, "pbs-site", executor="pbs-test")
    system = load_system_file(path)
    assert system.profile_path == str(path) and isinstance(executor_for(system), queue)
    assert isinstance(get_executor("pbs-test"), queue)
    out = bench("run", "--tag", "smoke", "--system", "pbs-site", "--dry-run")
    assert out.exit_code == 0, out.output
    assert len(list(results.glob("nlp/*/*/jobscript.sbatch"))) == 1

def test_a_registered_launcher_writes_the_jobscript_lines(site, bench, results):
    _pdsh_launcher()
    site_profile(site, "pdsh-site", launcher="pdsh-test")
    out = bench("run", "--tag", "smoke", "--system", "pdsh-site", "--dry-run")
    assert out.exit_code == 0, out.output
    (script,) = results.glob("nlp/*/*/jobscript.sbatch")
    text = script.read_text()
    assert "\nexport MASTER_ADDR=$(first-node-test)\n" in text
    assert '\npdsh -w "$NODES" bash -c "$LAUNCH" torchrun "${TRAIN_ARGS[@]}" &\n' in text
    assert "\n            pdsh-kill-test\n" in text
    assert "scontrol" not in text and "localhost" not in text
