"""`bench result export --columns`, and the tex export made for a paper (issue 53, finding 9): the chosen
columns, headers in words, figures right-aligned, a caption and a label, compiled by the real pdflatex."""

import re
import shutil
import subprocess

import pytest
from measured_runs import completed_175b


def test_export_writes_the_columns_asked_for(bench, results, tmp_path):
    completed_175b(bench, results)
    out = bench("result", "export", "--format", "csv", "--columns", "Nodes,Tokens_sec", "-o", str(tmp_path / "t.csv"))
    assert out.exit_code == 0, out.output
    header, row = (tmp_path / "t.csv").read_text().splitlines()
    assert header == "Nodes,Tokens/sec" and row.startswith("96,")
    out = bench("result", "export", "--format", "csv", "--columns", "Nodes,Tokens", "-o", str(tmp_path / "u.csv"))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.exit_code == 2 and len(lines) == 1 and "unknown column 'Tokens'" in lines[0], out.output
    assert "known: " in lines[0] and "Tokens/sec" in lines[0] and not (tmp_path / "u.csv").exists()


def _tabular(text: str) -> tuple[str, list[list[str]]]:
    """The tabular's column specification and its lines of cells (header first)."""
    spec = re.search(r"\\begin\{tabular\}\{([a-z]+)\}", text).group(1)
    body = text.split("\\toprule\n", 1)[1].split("\\bottomrule", 1)[0].replace("\\midrule\n", "")
    return spec, [[c.strip() for c in line.removesuffix("\\\\").split("&")] for line in body.strip().splitlines()]


def test_the_tex_export_is_a_table_for_a_paper(bench, results, tmp_path):
    """It was a 28-column left-aligned tabular of every result column, with the columns' code names."""
    completed_175b(bench, results)
    out = bench("result", "export", "--format", "tex", "-o", str(tmp_path / "table.tex"))
    assert out.exit_code == 0, out.output
    text = (tmp_path / "table.tex").read_text()
    spec, cells = _tabular(text)
    assert cells[:2] == [["Model", "Nodes", "TP", "PP", "Global", "Tokens/s", "TFLOP/s", "MFU", "Time to"],
                         ["(B)", "", "", "", "batch", "", "per GPU", "", "report (s)"]]
    assert spec == "r" * 9 and cells[2] == ["175.0", "96", "8", "8", "96", "34063.43", "128.99", "0.3019", "587.14"]
    assert "\\begin{table}" in text and "\\small" in text and re.search(r"\\caption\{.*\(run [\w.-]+\)", text)
    assert re.search(r"\\label\{tab:nlp-bench-[\w.-]+\}", text)
    out = bench("result", "export", "--format", "tex", "--columns", "system,Nodes,Tokens/sec", "-o",
                str(tmp_path / "chosen.tex"))
    spec, cells = _tabular((tmp_path / "chosen.tex").read_text())
    assert out.exit_code == 0 and spec == "lrr" and cells[0] == ["System", "Nodes", "Tokens/s"]


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex (Debian: texlive-latex-base and "
                    "texlive-latex-recommended)")
def test_the_paper_table_compiles_in_a_document_with_booktabs(bench, results, tmp_path):
    completed_175b(bench, results)
    assert bench("result", "export", "--format", "tex", "-o", str(tmp_path / "table.tex")).exit_code == 0
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                                      "\\input{table.tex}\nTable~\\ref{" + re.search(
                                          r"\\label\{([^}]+)\}", (tmp_path / "table.tex").read_text()).group(1)
                                      + "}.\n\\end{document}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and (tmp_path / "doc.pdf").stat().st_size > 1000, proc.stdout[-3000:]
    assert "Overfull \\hbox" not in proc.stdout, proc.stdout[-3000:]
