"""Executors, launchers and log formats register themselves, checked in-process: a part added in a test (or a
module) is found, resolved and accepted by profiles, `bench doctor` and `bench parse` without a whitelist or a
table learning its name, and a name no part answers to is refused in one line that names where it came from
and what is known."""

import re
import sys
import textwrap

import pytest
from registry_parts import queue_executor, site_profile

from nlp_bench.analysis import parsers
from nlp_bench.analysis.formats import FORMATS, register_format
from nlp_bench.analysis.formats.item_scan import ItemScan
from nlp_bench.analysis.log_record import ParseError, Record
from nlp_bench.errors import BenchError, LaunchError, SpecError
from nlp_bench.launch.executor import EXECUTORS, executor_for, get_executor
from nlp_bench.launch.launcher import LAUNCHERS, launcher_for
from nlp_bench.registry import Registry
from nlp_bench.spec.systems import load_system

pytestmark = pytest.mark.usefixtures("registries_restored")

def test_the_shipped_parts_are_found_by_walking_their_packages():
    assert EXECUTORS.names() == ["local", "slurm"]
    assert LAUNCHERS.names() == ["direct", "srun"]
    assert FORMATS.names() == ["megatron", "mlperf", "torchtitan", "nanotron", "nemo2", "nxd-core", "progress-bar",
                               "hf-bert"]  # the order detection tries them in
    assert {"nlp-bench", "megatron-current", "nemo1", "nxdt"} <= set(FORMATS.known())
    assert FORMATS.resolve("nemo1") == "progress-bar"

def test_a_module_added_to_a_package_registers_without_a_list(tmp_path, monkeypatch):
    """The walk finds a module nobody names: adding a part is adding its module."""
    package = tmp_path / "parts_for_test"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""
        from nlp_bench.errors import SpecError
        from nlp_bench.registry import Registry
        PARTS = Registry("widget", __name__, SpecError)
    """))
    (package / "blue.py").write_text("from parts_for_test import PARTS\nPARTS.add('blue', 'a blue widget')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "parts_for_test", raising=False)
    import parts_for_test

    assert parts_for_test.PARTS.names() == ["blue"] and parts_for_test.PARTS.get("blue") == "a blue widget"
    with pytest.raises(SpecError) as refused:
        parts_for_test.PARTS.get("bleu", "site.yaml")
    assert str(refused.value) == "site.yaml: unknown widget 'bleu' (did you mean 'blue'?); known: blue"

def test_a_name_taken_twice_is_refused_and_the_same_part_again_is_not():
    registry: Registry[str] = Registry("thing", "nlp_bench.launch", BenchError)
    registry.add("a", "first", aliases=("alpha",))
    registry.add("a", "first", aliases=("alpha",))
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        registry.add("a", "second")
    with pytest.raises(ValueError, match="thing 'alpha' is registered twice"):
        registry.add("b", "other", aliases=("alpha",))

def test_an_unknown_executor_in_a_profile_is_refused_in_one_line_naming_the_file(site):
    path = site_profile(site, "pbs-site", executor="pbs")
    system = load_system("pbs-site")  # a name: spec cannot know launch's executors
    with pytest.raises(LaunchError) as refused:
        executor_for(system)
    assert str(refused.value) == f"{path}: unknown executor 'pbs'; known: local, slurm"
    with pytest.raises(LaunchError, match=r"^unknown executor 'pbs'; known: local, slurm$"):
        get_executor("pbs")  # a record's name: no profile to name

def test_the_doctor_refuses_an_unknown_executor_in_one_line(site, tmp_path):
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    path = site_profile(site, "pbs-site", executor="pbs")
    out = CliRunner().invoke(cli, ["--results-dir", str(tmp_path / "r"), "doctor", "--system", "pbs-site"])
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines() == [f"bench: error: {path}: unknown executor 'pbs'; known: local, slurm"]

def test_the_doctor_says_it_has_no_checks_for_a_scheduler_it_does_not_know(site, monkeypatch):
    from nlp_bench.app import doctor
    from nlp_bench.spec.benchmark import load_benchmark

    queue_executor()
    site_profile(site, "pbs-site", executor="pbs-test")
    monkeypatch.setattr(doctor, "_environment", lambda system: doctor.Check("python environment", doctor.OK, "-"))
    point = load_benchmark("nlp").point("smoke", "pbs-site")
    checks = {c.name: c for c in doctor.doctor(point, on_node=True)}
    assert not any(name.startswith("slurm") for name in checks)
    for name in ("scheduler", "compute node"):
        assert (checks[name].status, checks[name].detail) == (
            doctor.WARN, "executor pbs-test: not checked (the doctor knows only Slurm's commands)")

@pytest.mark.parametrize("value", ["3", "Slurm Cluster", "''"])
def test_a_profile_whose_executor_is_no_name_is_refused_by_spec(site, value):
    path = site_profile(site, "odd-site", executor=value)
    with pytest.raises(SpecError) as refused:
        load_system("odd-site")
    assert str(refused.value).startswith(f"{path}: executor must be the name of a registered executor, got ")

def test_an_unknown_launcher_is_refused_in_one_line_naming_the_file(site, bench):
    path = site_profile(site, "mpi-site", launcher="mpirun")
    with pytest.raises(LaunchError) as refused:
        launcher_for(load_system("mpi-site"))
    assert str(refused.value) == f"{path}: unknown launcher 'mpirun' (did you mean 'srun'?); known: direct, srun"
    out = bench("run", "--tag", "smoke", "--system", "mpi-site", "--dry-run")
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines() == [f"bench: error: {path}: unknown launcher 'mpirun' (did you mean 'srun'?); known: direct, srun"]

_TICKS = "".join(f"TICK step={step} loss={10 - step}.5 seconds=0.25\n" for step in range(1, 5))

def _tick_format():
    @register_format(5, ("tick-v2",))
    class TickScan(ItemScan):
        NAME = "tick"
        STEP = ("TICK ", re.compile(r"TICK step=(\d+) loss=(\S+) seconds=(\S+)"))

        def records(self, rows, warnings):
            return [Record(int(step), None, float(time), loss=float(loss)) for step, loss, time in rows]

    return TickScan

def test_a_registered_format_is_detected_and_named_by_format(tmp_path):
    _tick_format()
    parsed = parsers.parse(_TICKS)
    assert parsed.format == "tick" and [r.iteration for r in parsed.records] == [1, 2, 3, 4]
    assert parsed.records[0].loss == 9.5 and parsed.records[0].iteration_time_s == 0.25
    assert parsers.parse(_TICKS, "tick-v2").format == "tick-v2"
    log = tmp_path / "job.out"
    log.write_text(_TICKS)
    assert parsers.parse_log(log, "tick").format == "tick"
    with pytest.raises(parsers.NoRecords, match=r"formats tried: tick, megatron, "):
        parsers.parse("nothing here\n")

def test_the_cli_parses_a_registered_format_and_refuses_an_unknown_one_in_one_line(tmp_path, bench):
    _tick_format()
    log = tmp_path / "job.out"
    log.write_text(_TICKS)
    out = bench("parse", str(log), "--format", "tick", "--json")
    assert out.exit_code == 0, out.output
    assert '"tick"' in out.output
    out = bench("parse", str(log), "--format", "tock")
    assert out.exit_code == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("bench: error: unknown log format 'tock' (did you mean 'tick'?); known: hf-bert, megatron, ")
    assert ", nxdt, progress-bar, tick, tick-v2, torchtitan" in line
    with pytest.raises(ParseError, match=r"^unknown log format 'tock'"):
        parsers.parse(_TICKS, "tock")
