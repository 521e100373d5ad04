"""One log through every view of the real `bench`, each figure compared to the last digit: `bench parse` (text
and --json), the run folder's result.json (the analysis path), `bench result table` (pretty and csv), `bench
result export --format json`, `bench status` and the HTML report. The log is this trainer's, written by its
own line function: the start-up line that states the sequence length, then iteration lines whose times are
printed to four decimals while their rates come from the unrounded times (the rounding that made `bench
parse` and the table differ in the second decimal)."""

import csv
import html.parser
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import record_job

from nlp_bench.report.figures import DECIMALS
from nlp_bench.train.logline import iteration_line

#: unrounded seconds per iteration of each logged interval: a slow first one (warm-up), then a noisy steady state
TIMES = [2.51271834, 1.99338712, 2.01182637, 1.98711326, 2.00499177]
TFLOPS = [0.0913, 0.1172, 0.1161, 0.1175, 0.1164]
BENCH = Path(sys.executable).parent / "bench"


def _bench(*args: str, cwd: Path) -> str:
    return _benches([args], cwd)[0]


def _benches(commands: list, cwd: Path) -> list[str]:
    """The stdout of each `bench` command, all started at once (each only reads the run)."""
    procs = [subprocess.Popen([str(BENCH), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in commands]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        outs.append(out)
    return outs


def _log(gbs: int, seq: int) -> str:
    head = ("nlp-bench trainer: torch 2.13.0, backend gloo, device cpu, 1 threads per rank, fp32\n"
            f"nlp-bench trainer: world 2 = tp 2 x pp 1 x dp 1; micro batch 2, {gbs // 2} micro-batches per iteration, "
            f"global batch {gbs}, sequence {seq}; sequence parallel off, distributed optimizer off, recompute none\n")
    return head + "".join(
        iteration_line(iteration=2 * i, total=2 * len(TIMES), consumed=2 * i * gbs, seconds=t, lr=1e-3, global_batch=gbs,
                       seq_length=seq, loss=10.5, loss_scale=1.0, grad_norm=1.2, skipped=0, nan=0, tflops=f) + "\n"
        for i, (t, f) in enumerate(zip(TIMES, TFLOPS, strict=True), 1))


class _Cells(html.parser.HTMLParser):
    """The text of each cell of the tables of an HTML page, by table id, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.table = self.cell = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.table = dict(attrs).get("id")
            self.tables[self.table] = []
        elif tag == "tr" and self.table:
            self.tables[self.table].append([])
        elif tag in ("td", "th") and self.table:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[self.table][-1].append(self.cell.strip())
            self.cell = None
        elif tag == "table":
            self.table = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _shown(figure: str, value: float) -> str:
    return f"{value:.{DECIMALS[figure]}f}"


def _plain(text: str) -> str:
    return text.replace(",", "")


def _row(text: str, label: str) -> list[str]:
    """The cells of the `bench parse` summary row that starts with `label`."""
    line = next(line for line in text.splitlines() if line.startswith(label))
    return [_plain(cell) for cell in line[len(label):].split()]


@pytest.fixture
def measured(tmp_path):
    """A smoke point whose job logged TIMES, and its gbs and sequence length."""
    _bench("run", "--tag", "smoke", "--dry-run", cwd=tmp_path)
    folder = next(p for p in tmp_path.glob("results/nlp/*/*/") if (p / "point.json").is_file())
    point = json.loads((folder / "point.json").read_text())
    gbs, seq = point["layout"]["global_batch_size"], point["model"]["seq_length"]
    (folder / "job.out").write_text(_log(gbs, seq))
    record_job(folder, "COMPLETED", executor="local", job_id="1", exit_code=0)
    return folder, gbs, seq


def test_one_log_shows_one_figure_in_every_view(tmp_path, measured):
    folder, gbs, seq = measured
    log = str(folder / "job.out")
    printed = [float(f"{t:.4f}") for t in TIMES]  # what the log says; JUBE's formula reads these
    jube = gbs * seq / (sum(printed) / len(printed))

    csv_row, = csv.DictReader(io.StringIO(_bench("result", "table", "--format", "csv", cwd=tmp_path)))
    result = json.loads((folder / "result.json").read_text())  # what the table's analysis wrote
    every, steady = result["summary"], result["steady"]
    assert every["tokens_per_s"] == pytest.approx(jube, rel=1e-12) and steady["warmup_excluded"] == 1
    exported, report = tmp_path / "x.json", tmp_path / "report.html"
    columns = "Tokens/sec,time_to_report_in_seconds,Avg_TFLOPs/GPU"
    parsed, text, pretty, status, _, _ = _benches([("parse", log, "--json"), ("parse", log),
                                                   ("result", "table", "--columns", columns), ("status",),
                                                   ("result", "export", "--format", "json", "-o", str(exported)),
                                                   ("result", "report", "-o", str(report))], tmp_path)
    parsed = json.loads(parsed)["summary"]
    for key in ("tokens_per_s", "tokens_per_s_all_intervals", "samples_per_s", "samples_per_s_all_intervals",
                "time_to_report_s", "time_to_report_s_all_intervals", "avg_tflops_per_gpu_all_intervals",
                "warmup_excluded"):
        assert parsed[key] == steady[key], key  # the analysis path and `bench parse`: the same bits
    assert (steady["tokens_per_s_all_intervals"], steady["samples_per_s_all_intervals"],
            steady["time_to_report_s_all_intervals"], steady["avg_tflops_per_gpu_all_intervals"]) == (
        every["tokens_per_s"], every["samples_per_s"], every["time_to_report_s"], every["avg_tflops_per_gpu"])
    assert every["samples_per_s"] * seq == pytest.approx(every["tokens_per_s"], rel=1e-12)
    assert steady["samples_per_s"] * seq == pytest.approx(steady["tokens_per_s"]["mean"], rel=1e-12)

    export_row = json.loads(exported.read_text())[0]
    for column, figure, value in (("Tokens/sec", "tokens_per_s", every["tokens_per_s"]),
                                  ("time_to_report_in_seconds", "time_to_report_s", every["time_to_report_s"]),
                                  ("Avg_TFLOPs/GPU", "tflops_per_gpu", every["avg_tflops_per_gpu"])):
        assert float(csv_row[column]) == value, column
        assert _shown(figure, export_row[column]) == _shown(figure, value), column

    # the texts: each figure rounded by the one rule, whichever view prints it
    jube_tokens, jube_report = _shown("tokens_per_s", every["tokens_per_s"]), _shown("time_to_report_s", every["time_to_report_s"])
    spread = steady["tokens_per_s"]
    steady_tokens, steady_report = _shown("tokens_per_s", spread["mean"]), _shown("time_to_report_s", steady["time_to_report_s"])
    assert _row(text, "tokens/s, time-weighted mean") == [steady_tokens, jube_tokens]
    assert _row(text, "tokens/s, median interval") == [_shown("tokens_per_s", spread["median"])]
    assert _row(text, "tokens/s, std of the intervals") == [_shown("tokens_per_s", spread["std"])]
    assert _row(text, "tokens/s, 95% CI of the mean") == [_shown("tokens_per_s", spread["ci95"][0]), "..",
                                                          _shown("tokens_per_s", spread["ci95"][1])]
    assert _row(text, "samples/s, time-weighted mean") == [_shown("samples_per_s", steady["samples_per_s"]),
                                                           _shown("samples_per_s", every["samples_per_s"])]
    assert _row(text, "time to report 20,000,000 tokens (s)") == [steady_report, jube_report]
    assert _row(text, "TFLOPs/GPU, mean of the logged") == [_shown("tflops_per_gpu", every["avg_tflops_per_gpu"])]

    pretty = pretty.splitlines()
    under = next(i for i, line in enumerate(pretty) if line.strip().startswith("─"))  # the header's rule
    assert pretty[under + 1].split() == [jube_tokens, jube_report, _shown("tflops_per_gpu", every["avg_tflops_per_gpu"])]
    status = next(line for line in status.splitlines() if "COMPLETED" in line)
    assert jube_tokens in _plain(status).split()

    page = report.read_text()
    cells = _Cells()
    cells.feed(page)
    header, row = cells.tables["results"]
    shown = dict(zip(header, row, strict=True))
    assert (shown["Tokens/sec"], shown["time_to_report_in_seconds"], shown["Avg_TFLOPs/GPU"]) == (
        jube_tokens, jube_report, _shown("tflops_per_gpu", every["avg_tflops_per_gpu"]))
    header, row = cells.tables["steady"]
    shown = dict(zip(header, (_plain(c) for c in row), strict=True))
    assert shown["tokens/s, time-weighted mean (tokens over seconds)"] == steady_tokens
    assert shown["tokens/s, median interval"] == _shown("tokens_per_s", spread["median"])
    assert shown["time to report, steady state (s)"] == steady_report
    quoted = [_plain(n) for n in re.findall(r"([\d,]+\.\d+) s\b", page)]
    assert jube_report in quoted and steady_report in quoted  # the headline: JUBE's, the steady state beside it
