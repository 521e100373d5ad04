"""What `bench result` writes, opened where it goes: the HTML report in a headless Chromium (playwright), the
tex export through pdflatex, each export checked cell by cell; and the report's 175B headline with its 560 s
verdict."""

import shutil
import subprocess

import pytest
from headless_chromium import chromium
from measured_runs import completed_175b, fake_sweep


def test_html_report_renders_in_headless_chromium(bench, results, tmp_path):
    """The report at 1280 and 800 pixels: no page-level horizontal overflow (wide tables scroll inside their
    box), every row present, the headline first; the screenshots stay in tmp_path to look at."""
    fake_sweep(bench, results, tmp_path)
    report = tmp_path / "report.html"
    out = bench("result", "report", "-o", str(report))
    assert out.exit_code == 0 and "(8 points)" in out.output, out.output
    html = report.read_text()
    assert html.count('class="result-row"') == 8 and html.count("data:image/png;base64,") == 2 + 2 + 8
    assert 'src="http' not in html and "<link" not in html, "the report must be self-contained"
    assert html.count("<details class=\"provenance\">") == 8, "provenance folded, one per point"
    with chromium() as browser:
        for width in (1280, 800):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(report.as_uri())
            scroll, client = page.evaluate("[document.documentElement.scrollWidth, "
                                           "document.documentElement.clientWidth]")
            assert scroll <= client == width, f"{width}px: the page is {scroll}px wide"
            assert page.locator("tr.result-row").count() == 8 and page.locator("tr.steady-row").count() == 8
            first = page.locator("body > *").nth(1)
            assert first.get_attribute("id") == "headline", "the headline comes right after the title"
            text = first.inner_text()
            assert "175.64 s" in text and "JUBE's figure" in text and "Steady state" in text, text
            page.screenshot(path=str(tmp_path / f"report_{width}.png"), full_page=True)
            headers = page.locator("#results th")  # Tokens/sec: sort descending by clicking twice
            header = headers.nth([t.strip() for t in headers.all_text_contents()].index("Tokens/sec"))
            header.click()
            header.click()
            assert header.get_attribute("aria-sort") == "descending"
            first_row = page.locator("#results tr.result-row").first.inner_text()
            assert "113872.51" in first_row, first_row
    shot = (tmp_path / "report_800.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000

@pytest.mark.parametrize("best,verdict,word", [(540.0, "pass", "within"), (600.0, "fail", "over")])
def test_report_headline_quotes_the_175b_figure_and_names_it(best, verdict, word):
    from nlp_bench.report.headline import headline

    def row(point, model, size, seconds, state="COMPLETED"):
        return {"run": "r", "point": point, "model": model, "Model_Size": size, "state": state, "Nodes": 96,
                "Tensor_Parallel": 8, "Pipeline_Parallel": 8, "MBS": 1, "GAS": 16, "Tokens/sec": 20e6 / seconds,
                "time_to_report_in_seconds": seconds}

    rows = [row("a", "gpt-175b", 175, best + 50), row("b", "gpt-175b", 175, best), row("c", "gpt-13b", 13, 100.0),
            row("d", "gpt-175b", 175, 10.0, state="FAILED")]
    steady = {("r", "b"): {"steady": {"time_to_report_s": best * 0.8, "warmup_excluded": 2, "intervals": 10}}}
    found = headline(rows, steady)
    assert found.point == "b" and found.verdict == verdict and f"{word} the 560 s baseline" in found.title
    assert f"{best:,.2f} s" in found.title and "JUBE" in found.figure and "560 s baseline" in found.why
    assert "-20.0%" in found.steady_note and "2 warm-up interval(s) of 10" in found.steady_note
    assert headline([row("d", "gpt-175b", 175, 10.0, state="FAILED")], {}).point is None

def _latex_cells(text: str) -> list[list[str]]:
    """The cells of a tabular, unescaped: a line is cut at every `&` that no backslash escapes."""
    import re

    body = text.split("\\midrule\n", 1)[1].split("\\bottomrule", 1)[0]
    head = text.split("\\toprule\n", 1)[1].split("\\midrule", 1)[0]
    unescape = {"\\_": "_", "\\%": "%", "\\&": "&", "\\#": "#", "\\$": "$", "\\{": "{", "\\}": "}"}
    rows = []
    for line in (head + body).strip().splitlines():
        cells = re.split(r"(?<!\\)&", line.rstrip().removesuffix("\\\\"))
        rows.append([re.sub(r"\\[_%&#${}]", lambda m: unescape[m.group()], c.strip()) for c in cells])
        for cell in cells:  # nothing a LaTeX run would read as markup is left bare
            assert not re.search(r"(?<!\\)[_%#$]", cell), cell
    return rows

def test_exports_open_where_they_go(bench, results, tmp_path):
    """The tex export left `_` unescaped (pdflatex stops), the html one was a fragment with `<NA>`, and an
    empty value was "-" in one format and empty in another."""
    completed_175b(bench, results)
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0  # a point with nothing measured
    files = {}
    for fmt in ("csv", "md", "html", "tex"):
        files[fmt] = tmp_path / f"t.{fmt}"
        assert bench("result", "export", "--format", fmt, "-o", str(files[fmt])).exit_code == 0
    cells = _latex_cells(files["tex"].read_text())
    assert cells[0][:4] == ["Model", "Nodes", "TP", "PP"] and "Global" in cells[0] and "batch" in cells[1]
    page = files["html"].read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>") and "<NA>" not in page
    assert "&lt;NA&gt;" not in page and "<td>-</td>" not in page and "<td></td>" in page
    csv_row = files["csv"].read_text().splitlines()[1].split(",")
    assert "" in csv_row and "-" not in csv_row
    md_row = [c.strip() for c in files["md"].read_text().splitlines()[2].strip("|").split("|")]
    assert "" in md_row and "-" not in md_row
    tex = tmp_path / "c.tex"
    assert bench("result", "export", "--format", "tex", "--columns", "Nodes,Tokens/sec", "-o", str(tex)).exit_code == 0
    assert _latex_cells(tex.read_text())[1] == ["8", ""]

@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex (Debian: texlive-latex-base and "
                    "texlive-latex-recommended; .ci/run installs them)")
def test_the_tex_export_compiles(bench, results, tmp_path):
    """pdflatex stopped at the first unescaped `_` of the tex export; the parser above checks the cells, this the
    whole: the table, `\\input` into a document with booktabs, must make a PDF."""
    completed_175b(bench, results)
    assert bench("result", "export", "--format", "tex", "-o", str(tmp_path / "table.tex")).exit_code == 0
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                                      "\\tiny\n\\input{table.tex}\n\\end{document}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and (tmp_path / "doc.pdf").stat().st_size > 1000, proc.stdout[-3000:]
