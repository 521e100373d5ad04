"""The commands people type (issue 53, finding 9): `bench report`, a did-you-mean that points into another group,
the systems and tags listed, and no 96-node run for a missing `--tag`."""

import re

import yaml
from conftest import ROOT


def _one_error_line(out) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.exit_code == 2 and len(lines) == 1 and lines[0].startswith("bench: error: "), out.output
    return lines[0]


def test_bench_report_is_bench_result_report(bench, tmp_path):
    """`bench report` said "No such command 'report'"; it is `bench result report`, whose help and answers it has."""
    short, full = bench("report", "--help"), bench("result", "report", "--help")
    assert short.exit_code == 0 and short.output.split("\n", 1)[1] == full.output.split("\n", 1)[1]
    line = _one_error_line(bench("report", "-o", str(tmp_path / "r.html")))
    assert line == _one_error_line(bench("result", "report", "-o", str(tmp_path / "r.html"))) and "no runs" in line


def test_a_verb_of_another_group_is_named_where_it_lives(bench):
    """`bench table` said only "No such command 'table'"."""
    assert "did you mean `bench result table`?" in _one_error_line(bench("table"))
    assert "did you mean `bench result export`?" in _one_error_line(bench("export", "--format", "csv"))
    assert "`bench system list` or `bench tag list`" in _one_error_line(bench("list"))
    assert "did you mean `bench result table`?" in _one_error_line(bench("tabel"))
    assert "Did you mean 'status'?" in _one_error_line(bench("stauts"))  # click's own, within the group
    assert "Did you mean 'table'?" in _one_error_line(bench("result", "tabel"))
    assert "did you mean" not in _one_error_line(bench("frobnicate")).lower()


def test_system_list_names_every_profile_and_show_prints_one(bench, site, monkeypatch):
    (site / "slurm" / "systems" / "broken.yaml").write_text("name: broken\ndevice: [\n")
    monkeypatch.setenv("COLUMNS", "100")
    out = bench("system", "list")
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:] if line[:1].strip()}
    names = sorted(p.stem for p in (site / "slurm" / "systems").glob("*.yaml"))
    assert sorted(rows) == names and all(len(line) <= 100 for line in out.stdout.splitlines())
    assert re.fullmatch(r"juwels-booster +slurm +srun +312 bf16 +booster +4 x A100-SXM4-40GB", rows["juwels-booster"])
    assert re.fullmatch(r"local +local +direct +0.1 fp32 +local +2 x cpu", rows["local"])
    assert "(cannot be read)" in rows["broken"] and "broken.yaml" in out.stderr
    shown = bench("system", "show", "juwels-booster")
    assert shown.exit_code == 0 and shown.stdout.startswith("# ")
    assert yaml.safe_load(shown.stdout) == yaml.safe_load((site / "slurm/systems/juwels-booster.yaml").read_text())
    line = _one_error_line(bench("system", "show", "juwels"))
    assert "unknown system 'juwels' (did you mean 'juwels-booster'?)" in line


def test_tag_list_names_every_tag_with_its_layout(bench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = bench("tag", "list")
    assert out.exit_code == 0, out.output
    assert all(len(line) <= 80 for line in out.stdout.splitlines()), out.stdout
    tags = yaml.safe_load((ROOT / "benchmark" / "nlp.yaml").read_text())["tags"]
    starts = [line.split()[0] for line in out.stdout.splitlines()[2:] if line[:1].strip()]
    assert starts == list(tags)
    assert re.search(r"^175 +gpt-175b +juwels-booster +96 +tp 8 pp 8 mbs 1 gas 16\n    JUPITER 175B", out.stdout, re.M)
    assert "smoke" in out.stdout and "tiny GPT on CPUs" in out.stdout
    assert "benchmark file not found" in _one_error_line(bench("tag", "list", "--benchmark", "nosuch"))


def test_a_run_without_a_tag_is_refused_in_one_line(bench, results):
    """A bare `bench run --dry-run` wrote (and `bench run` submitted) the 96-node 175B point."""
    for args in (("run", "--dry-run"), ("run",)):
        line = _one_error_line(bench(*args))
        assert "give --tag, one of 13, 175, smoke," in line and "bench tag list" in line
    assert not results.exists() or not list(results.glob("nlp/*"))
