"""Numbers that say where they come from: the peak and formula behind an MFU (and no MFU where the device's
peak is unknown), and `bench result compare baseline` naming what changed between two runs."""

import json
import shutil

import pytest
from conftest import ROOT, record_job

from nlp_bench.analysis.results import analyse_point
from nlp_bench.store import states


def _measured(folder, seconds: list[float], env: dict[str, str]) -> None:
    """A completed job's log (one line per 10 iterations) and the environment its jobscript recorded."""
    gbs = json.loads((folder / "point.json").read_text())["layout"]["global_batch_size"]
    lines = [f"[default3]: iteration {10 * i:8d}/   1000 | elapsed time per iteration (s): {t:.4f} | "
             f"global batch size: {gbs:5d} | lm loss: 8.0E+00 |" for i, t in enumerate(seconds, 1)]
    (folder / "job.out").write_text("\n".join(lines) + "\n")
    (folder / "provenance.env").write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
    record_job(folder, states.COMPLETED, job_id="1", exit_code=0)

def _run(bench, results, seconds, env):
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0
    run = sorted((results / "nlp").iterdir())[-1]
    _measured(next(p for p in run.iterdir() if p.is_dir()), seconds, env)
    return run.name

ENV = {"NCCL_ALGO": "Ring", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "SLURM_JOB_ID": "1", "MASTER_PORT": "6001"}

STEADY = [40.0, 34.1, 33.9, 34.0, 34.2, 33.8, 34.0, 34.1]  # a warm-up interval, then about 34 s

def test_baseline_comparison_names_the_one_environment_variable_that_changed(bench, results):
    base = _run(bench, results, STEADY, ENV)
    slower = _run(bench, results, [t * 1.10 for t in STEADY], {**ENV, "NCCL_ALGO": "Tree", "SLURM_JOB_ID": "2"})
    out = bench("result", "compare", "baseline", base, slower)
    assert out.exit_code == 0, out.output
    assert "slower" in out.output and "environment NCCL_ALGO: Ring -> Tree" in out.output, out.output
    assert "SLURM_JOB_ID" not in out.output and "CUDA_DEVICE_MAX_CONNECTIONS" not in out.output
    found, = json.loads(bench("result", "compare", "baseline", base, slower, "--format", "json").output)
    assert found["ratio"] == pytest.approx(1 / 1.10, rel=1e-3) and found["ci95"][1] < 1
    assert found["differences"] == ["environment NCCL_ALGO: Ring -> Tree"]

def test_baseline_comparison_within_noise_lists_nothing(bench, results):
    base = _run(bench, results, STEADY, ENV)
    again = _run(bench, results, list(reversed(STEADY[1:])) + [34.0], {**ENV, "NCCL_ALGO": "Tree"})
    found, = json.loads(bench("result", "compare", "baseline", base, again, "--format", "json").output)
    assert found["verdict"] == "within noise" and found["ci95"][0] < 1 < found["ci95"][1]
    assert found["differences"] == []
    before = bench("result", "compare", again, "--baseline", base, "--format", "json")  # the old spelling
    assert before.stderr.startswith("bench: note: `bench result compare RUN --baseline RUN2` is now spelled")
    assert json.loads(before.stdout) == [found]

NEURON_ENV = {**ENV, "PJRT_DEVICE": "NEURON", "NEURON_CC_FLAGS": "--model-type transformer",
              "NEURON_RT_STOCHASTIC_ROUNDING_EN": "0", "XLA_IR_DEBUG": "0", "package.torch": "2.9.0",
              "package.torch-xla": "2.9.0", "package.torch-neuronx": "2.9.0.2.11.0", "package.neuronx-cc": "2.21.0"}

def test_result_provenance_keeps_pjrt_neuron_xla_and_the_package_versions(bench, results):
    """result.json carries what a Trainium job's provenance.env recorded: the PJRT_/NEURON_/XLA_ variables
    under environment, the package.<name>=<version> lines as packages (not as variables); a later run with
    another torch-xla names that change."""
    base = _run(bench, results, STEADY, NEURON_ENV)
    folder = next(p for p in (results / "nlp" / base).iterdir() if p.is_dir())
    prov = analyse_point(folder, force=True)["provenance"]
    env = prov["environment"]
    assert env["PJRT_DEVICE"] == "NEURON" and env["NEURON_CC_FLAGS"] == "--model-type transformer"
    assert env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "0" and env["XLA_IR_DEBUG"] == "0"
    assert prov["packages"] == {"torch": "2.9.0", "torch-xla": "2.9.0", "torch-neuronx": "2.9.0.2.11.0",
                                "neuronx-cc": "2.21.0"}
    assert not any(name.startswith("package.") for name in env)
    newer = _run(bench, results, [t * 1.10 for t in STEADY], {**NEURON_ENV, "package.torch-xla": "2.10.0"})
    found, = json.loads(bench("result", "compare", "baseline", base, newer, "--format", "json").output)
    assert found["differences"] == ["package torch-xla: 2.9.0 -> 2.10.0"]

def test_mfu_names_its_formula_and_peak(bench, results):
    _run(bench, results, STEADY, ENV)
    folder = next(p for p in next((results / "nlp").iterdir()).iterdir() if p.is_dir())
    summary = analyse_point(folder, force=True)["summary"]
    basis = summary["mfu_basis"]
    assert summary["mfu"] > 0 and summary["mfu_note"] is None
    assert basis["peak_tflops"] == 312 and basis["precision"] == "bf16" and basis["dense"] is True
    assert basis["device"] == "A100-SXM4-40GB" and "A100" in basis["source"] and "Megatron" in basis["formula"]

def test_an_unknown_device_gets_no_mfu_and_says_why(bench, results, tmp_path, monkeypatch):
    root = tmp_path / "root"
    shutil.copytree(ROOT / "benchmark", root / "benchmark")
    shutil.copytree(ROOT / "slurm", root / "slurm")
    profile = (root / "slurm" / "systems" / "juwels-booster.yaml").read_text()
    profile = profile.replace("name: juwels-booster", "name: mystery").replace("peak_tflops: 312", "peak_tflops: null")
    (root / "slurm" / "systems" / "mystery.yaml").write_text(profile.replace("device_name: A100-SXM4-40GB",
                                                                              "device_name: XPU-9000"))
    monkeypatch.setenv("NLP_BENCH_ROOT", str(root))
    assert bench("run", "--tag", "13", "--system", "mystery", "--dry-run").exit_code == 0
    folder = next(p for p in next((results / "nlp").iterdir()).iterdir() if p.is_dir())
    _measured(folder, STEADY, ENV)
    summary = analyse_point(folder)["summary"]
    assert summary["mfu"] is None and summary["mfu_basis"] is None
    assert "no peak_tflops" in summary["mfu_note"] and "XPU-9000" in summary["mfu_note"]
    assert summary["tokens_per_s"] > 0  # everything else is still measured

class FakeNVML:
    """Two GPUs: an energy counter (millijoules) where `counter`, else only the power draw (milliwatts)."""

    class NVMLError(Exception):
        pass

    def __init__(self, counter: bool, watts: float = 300.0):
        self.counter, self.watts, self.millijoules, self.shut = counter, watts, 1_000_000.0, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.counter:
            raise self.NVMLError("Not Supported")
        return self.millijoules

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.watts * 1000

def test_energy_meter_reads_the_counter_of_every_gpu():
    from nlp_bench.train.energy import EnergyMeter

    nvml = FakeNVML(counter=True)
    meter = EnergyMeter(nvml)
    assert meter.available and meter.mode == "energy counter" and meter.reason is None
    nvml.millijoules += 5_000  # each of the two GPUs used 5 J
    assert meter.read() == pytest.approx(10.0)
    assert meter.read() == pytest.approx(0.0)
    meter.close()
    assert nvml.shut

def test_energy_meter_integrates_power_where_there_is_no_counter():
    from nlp_bench.train.energy import EnergyMeter

    now = [100.0]
    nvml = FakeNVML(counter=False, watts=250.0)
    meter = EnergyMeter(nvml, interval_s=3600, clock=lambda: now[0])  # the thread never wakes: samples by hand
    assert meter.mode == "power samples"
    now[0] += 2.0
    meter.sample()
    nvml.watts = 350.0
    now[0] += 1.0
    joules = meter.read()  # 2 s at 2 x 250 W, then 1 s ramping from 500 W to 700 W
    assert joules == pytest.approx(2 * 500 + 1 * 600)
    meter.close()

def test_without_nvml_the_meter_says_why(monkeypatch):
    import importlib

    from nlp_bench.train import energy

    def missing(name):
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", missing)
    meter = energy.EnergyMeter()
    assert not meter.available and "pynvml is not installed" in meter.reason and meter.read() is None

def test_interval_log_prints_energy_that_the_analysis_turns_into_joules_per_token(capsys):
    from types import SimpleNamespace

    from nlp_bench.analysis import metrics, parsers
    from nlp_bench.train.config import BoardConfig
    from nlp_bench.train.energy import EnergyMeter
    from nlp_bench.train.logline import IntervalLog

    nvml = FakeNVML(counter=True)
    groups = SimpleNamespace(rank=0, world=1, is_last_stage=True, host_dp=None)
    board = BoardConfig(folder=None, queue_size=1, timers=False, batch_size=False, validation_ppl=False)
    log = IntervalLog(groups, 8, 128, 1e12, board, energy=True, meter=EnergyMeter(nvml))
    for iteration in (10, 20, 30):
        for _ in range(10):
            log.add([2.0], False)
        nvml.millijoules += 512_000 * (3 if iteration == 10 else 1)  # 2 GPUs; the first interval warms up
        elapsed = 30.0 if iteration == 10 else 10.0  # 3 s, then 1 s per iteration
        log._clock = lambda elapsed=elapsed: log.started + elapsed
        log.emit(iteration, 30, 1e-4, 1.0, 1.0)
    log.close(30, finished=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if "iteration" in line]
    assert all("energy (J): " in line for line in lines)
    records = parsers.parse("\n".join(lines)).records
    assert [r.energy_j for r in records] == pytest.approx([3072.0, 1024.0, 1024.0])
    found = metrics.energy_summary(records, 128)
    assert found["intervals"] == 2  # the slow first interval is warm-up, as for tokens/s
    assert found["joules_per_token"] == pytest.approx(1024.0 / (10 * 8 * 128))
    assert found["report_kwh"] == pytest.approx(found["joules_per_token"] * 20e6 / 3.6e6)

def test_energy_in_result_table_and_report_or_the_reason_it_is_missing(bench, results, tmp_path):
    run = _run(bench, results, STEADY, ENV)
    folder = next(p for p in (results / "nlp" / run).iterdir() if p.is_dir())
    log = (folder / "job.out").read_text().replace(" |\n", " | energy (J): 40960.0 |\n")
    (folder / "job.out").write_text(log)
    (folder / "result.json").unlink(missing_ok=True)
    result = analyse_point(folder)
    gbs = json.loads((folder / "point.json").read_text())["layout"]["global_batch_size"]
    assert result["energy"]["joules_per_token"] == pytest.approx(40960.0 / (10 * gbs * 2048))
    row, = json.loads(bench("result", "table", "--format", "json").output)
    assert row["Joules/token"] == pytest.approx(result["energy"]["joules_per_token"])
    assert row["Report_kWh"] == pytest.approx(result["energy"]["report_kwh"])
    assert "Joules/token" in bench("result", "table", "--wide").output
    report = tmp_path / "r.html"
    assert bench("result", "report", "-o", str(report)).exit_code == 0
    page = report.read_text()
    assert "NVML, the job&#39;s GPUs" in page and "312 TFLOP/s dense bf16" in page
    assert bench("run", "--tag", "smoke", "--dry-run").exit_code == 0  # a CPU point: no energy, and why
    cpu = next(p for p in sorted((results / "nlp").iterdir())[-1].iterdir() if p.is_dir())
    _measured(cpu, STEADY, ENV)
    energy = analyse_point(cpu)["energy"]
    assert energy["joules_per_token"] is None and "GPUs only (device cpu)" in energy["reason"]

def test_whole_job_energy_from_slurm_when_the_trainer_measured_none(bench, results):
    run = _run(bench, results, STEADY, ENV)
    folder = next(p for p in (results / "nlp" / run).iterdir() if p.is_dir())
    record_job(folder, states.COMPLETED, consumed_energy_j=1.0e7)
    (folder / "result.json").unlink(missing_ok=True)
    energy = analyse_point(folder)["energy"]
    gbs = json.loads((folder / "point.json").read_text())["layout"]["global_batch_size"]
    assert energy["joules_per_token"] == pytest.approx(1.0e7 / (80 * gbs * 2048))
    assert "sacct ConsumedEnergy" in energy["source"] and "start-up included" in energy["source"]
