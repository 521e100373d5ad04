"""benchmark/perf/energy_meters.py: the GPU's energy counter and the power-sample fallback over the same
command, on a fake NVML whose GPUs draw a known power."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

SCRIPT = str(ROOT / "benchmark" / "perf" / "energy_meters.py")

FAKE_NVML = textwrap.dedent('''
    """Two GPUs drawing 250 W each, steadily: the counter grows with the clock."""
    import time

    _START = time.monotonic()
    __version__ = "fake"


    def nvmlInit():
        pass


    def nvmlShutdown():
        pass


    def nvmlDeviceGetCount():
        return 2


    def nvmlDeviceGetHandleByIndex(index):
        return index


    def nvmlDeviceGetTotalEnergyConsumption(handle):
        return int((time.monotonic() - _START) * 250_000) + 10_000_000


    def nvmlDeviceGetPowerUsage(handle):
        return 250_000
''')


def _run(tmp_path, *command, nvml=True):
    env = dict(os.environ)
    (tmp_path / "pynvml.py").write_text(FAKE_NVML if nvml else 'raise ImportError("no NVML here")\n')
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    out = tmp_path / "energy.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--window", "0.2", "--json", str(out), "--", *command],
                          capture_output=True, text=True, timeout=120, env=env)
    return proc, out


def test_both_meters_read_the_same_steady_draw_and_the_commands_exit_code_is_kept(tmp_path):
    proc, out = _run(tmp_path, sys.executable, "-c", "import time, sys; time.sleep(1.0); sys.exit(3)")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    found = json.loads(out.read_text())
    assert found["exit"] == 3 and len(found["windows"]) >= 3
    # 2 GPUs x 250 W over the command's time, by the counter and by the integrated samples alike
    assert abs(found["counter_j"] - 500 * found["seconds"]) < 0.05 * 500 * found["seconds"]
    assert abs(found["samples_j"] / found["counter_j"] - 1) < 0.05
    assert "samples/counter" in proc.stdout


def test_without_nvml_the_command_runs_unmeasured(tmp_path):
    proc, out = _run(tmp_path, sys.executable, "-c", "print('ran')", nvml=False)
    assert proc.returncode == 0 and "ran" in proc.stdout and "running the command unmeasured" in proc.stdout
    assert not out.exists()

