"""`bench parse` and the parsers in processes of their own: crafted lines take linear time, `bench parse --json`
prints JSON (no NaN, no Infinity) and reports skipped lines, and the perf script runs at a tiny size. No test
here times anything: the crafted lines run under a generous timeout that only a parser slower than linear (the
first versions took minutes on them) can hit."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, run_bench
from jupiter_log import GOOD, JUPITER


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, which are no JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)

CRAFTED = textwrap.dedent('''
    import json, sys
    from nlp_bench.analysis import parsers
    size = int(sys.argv[1])
    good = sys.argv[2]
    header = "[default3]: iteration       15/ 3125000 |"
    def rep(unit, n):
        return (unit * (n // len(unit) + 1))[:n]
    shapes = {
        "header, spaces": header + " " * size + "x", "header, tabs": header + "\\t" * size + "x",
        "header, letters": header + "a" * size, "header, a:": header + rep("a:", size),
        "header, words and a colon": header + rep("ab ", size) + ": 1 |",
        "header, many fields": header + rep(" a b: 1 |", size), "iteration repeated": rep("iteration ", size),
        "pipes": rep("|", size), "letters": "a" * size, "spaces": " " * size,
        "LOG repeated": rep("LOG ", size) + "- (0, 1) step_loss : " + "x" * 1000,
        "nested bars": rep("Epoch 0: 1%|| 1/2 [", size // 2) + ", 1s/it" + rep(", a=1", size // 2),
        "bar, postfix not closed": "Epoch 0: 3%|| 1/2 [x, 1s/it" + rep(", a=1", size),
        "bar keys": "Epoch 0: 3%|| 1/2 [x, 1s/it" + rep(", a b c", size) + "=1]",
        "torchtitan": rep("step: 1  loss: ", size), "nanotron": "iteration: 1 / 2 |" + rep(" a: 1 |", size),
        "nemo2": "Training epoch 0, iteration 1/2" + rep(" | a: 1", size), "mllog": rep(":::MLLOG {", size),
        "nxd": rep("step 1 step_time ", size), "mesh": rep("device mesh with parallelism: ", size),
    }
    found = {}
    for name, line in shapes.items():
        text = good + "\\n" + line + "\\n" + good.replace("iteration       10/", "iteration       20/") + "\\n"
        parsed = parsers.parse(text)
        alone = [parsers._read([text], [parser], limit=len(text)) for parser in parsers.FORMATS.names()]  # no limit
        found[name] = [[r.iteration for r in parsed.records], parsed.skipped_long_lines,
                       [[r.iteration for r in scans[0].result()[0]] for scans, _, _ in alone],
                       sum(skipped for _, skipped, _ in alone)]
    print(json.dumps(found))
''')

def test_crafted_lines_take_linear_time():
    """Lines crafted against patterns that scan a line again from every position (a lazy `key:` search, a
    lazy gap after every `LOG `, bars nested in a bar): at 150 KB the first parsers took minutes on each.
    Here they are skipped for their length, and read in full with no length limit, within the timeout."""
    try:
        proc = subprocess.run([sys.executable, "-c", CRAFTED, "150000", GOOD], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    except subprocess.TimeoutExpired:
        pytest.fail("parsing 150 KB crafted lines took more than 30 s: something is slower than linear")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, (records, skipped, unlimited, none_skipped) in json.loads(proc.stdout).items():
        assert records == [10, 20] and skipped == 1, name
        assert unlimited == [[10, 20]] + [[]] * (len(unlimited) - 1) and none_skipped == 0, name

GOOD_MS = " iteration 10/ 100 | elapsed time per iteration (ms): 1000.0 | global batch size: 8 |\n"

@pytest.mark.parametrize("line,records,tokens,steady", [
    # a time of 1e-320 ms made tokens/s Infinity, which no JSON parser reads: such a time is a broken line
    (" iteration 20/ 100 | elapsed time per iteration (ms): 1e-320 | global batch size: 8 |\n", [10], [16384.0],
     {"mean": 8 * 2048, "median": 8 * 2048, "std": None, "ci95": None}),
    # a logged rate whose tokens/s overflows keeps its record, with tokens/s null (and the steady state after
    # the first interval, warm-up beside it, has no tokens/s: null)
    (" iteration 30/ 100 | elapsed time per iteration (ms): 1000.0 | samples per second: 1e308 |\n", [10, 30],
     [16384.0, None], None),
])
def test_parse_json_has_no_nan_or_infinity(tmp_path, line, records, tokens, steady):
    log = tmp_path / "job.out"
    log.write_text(GOOD_MS + line)
    proc = run_bench("parse", str(log), "--json", "--seq-length", "2048", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = _strict(proc.stdout)
    assert [r["iteration"] for r in out["records"]] == records
    assert [r["tokens_per_s"] for r in out["records"]] == tokens
    assert out["summary"]["tokens_per_s"] == steady and out["skipped_long_lines"] == 0

def test_a_line_whose_only_time_is_broken_is_no_record(tmp_path):
    """Alone, the 1e-320 ms line printed `"tokens_per_s": Infinity`; beside a good line it crashed the
    summary with a traceback. It is no record: alone, the log has none (one line, exit 2)."""
    log = tmp_path / "job.out"
    log.write_text(" iteration 20/ 100 | elapsed time per iteration (ms): 1e-320 | global batch size: 8 |\n")
    proc = run_bench("parse", str(log), "--json", "--seq-length", "2048", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "no iteration records" in proc.stderr

def test_parse_reports_skipped_lines_in_text_and_json(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(JUPITER.replace("srun: error", "z" * 100_000, 1))
    pretty = run_bench("parse", str(log), cwd=tmp_path)
    assert pretty.returncode == 0, pretty.stderr
    assert "skipped 1 line(s) longer than 65,536 characters" in pretty.stdout
    out = _strict(run_bench("parse", str(log), "--json", cwd=tmp_path).stdout)
    assert out["skipped_long_lines"] == 1 and out["summary"]["intervals"] == 6
    nothing = tmp_path / "nothing.out"
    nothing.write_text("z" * 100_000 + "\n")
    proc = run_bench("parse", str(nothing), cwd=tmp_path)
    assert proc.returncode == 2 and "skipped 1 line(s) longer than 65,536 characters" in proc.stderr

def test_the_perf_script_runs_at_a_tiny_size(tmp_path):
    """benchmark/perf/parse.py as RESULTS.md's figures were taken, at sizes CI can afford."""
    script = ROOT / "benchmark" / "perf" / "parse.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args, needle in ((["--megabytes", "1", "--repeats", "1"], "read + parse"),
                         (["--mode", "linear", "--line-megabytes", "0.1,0.2", "--repeats", "1"], "nested"),
                         (["--mode", "memory", "--memory-megabytes", "2"], "parsers.parse_log")):
        proc = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert needle in proc.stdout
