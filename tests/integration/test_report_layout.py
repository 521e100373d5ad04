"""The HTML report as a reader sees it, laid out by a real headless Chromium at the widths of a laptop and a
desktop: every column of the results table on screen (it scrolled sideways at 1400 px and hid `state`), every
iteration trace drawn the same size (the last one was larger), and no table of dashes where the reference has
no row. The screenshots stay in tmp_path to look at."""

from conftest import ROOT, record_job
from headless_chromium import chromium
from measured_runs import measured_logs

from nlp_bench.store import states

#: what Chromium measures, in the page's own pixels: the viewport, the results table's box, each header cell
#: of that table, each trace figure
_LAYOUT = """() => {
  const rect = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width,
                                                                      height: r.height}; };
  const box = document.querySelector("#results").parentElement;
  return {viewport: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
          box: {...rect(box), scroll: box.scrollWidth, client: box.clientWidth},
          headers: [...document.querySelectorAll("#results th")].map((th) => ({name: th.textContent, ...rect(th)})),
          traces: [...document.querySelectorAll("figure img[alt^='trace_']")].map(rect)};
}"""


def _two_runs(bench, results, tmp_path) -> list[str]:
    """A 13B sweep over 8 and 16 nodes (a reference row exists) and the shipped smoke grid on one node (no
    reference row), measured, one smoke point failed: a report of both has many columns that differ between
    its points."""
    (tmp_path / "g.yaml").write_text('tag: "13"\nmatrix: {nodes: [8, 16]}\nderived: {gas: "256 * 8 // nodes"}\n')
    runs = {}
    for name, grid, seconds in (("13b", tmp_path / "g.yaml", lambda lay: 34.0 * 8 / lay["nodes"]),
                                ("smoke", ROOT / "benchmark" / "grids" / "smoke.yaml",
                                 lambda lay: 0.05 * lay["tp"] * (1.3 if lay["mbs"] == 1 else 1.0))):
        before = set(results.glob("nlp/*/"))
        assert bench("sweep", str(grid), "--dry-run").exit_code == 0
        (runs[name],) = set(results.glob("nlp/*/")) - before
        measured_logs(sorted(runs[name].glob("*/")), seconds)
    record_job(sorted(runs["smoke"].glob("*/"))[-1], states.FAILED, exit_code=1)  # the state differs
    return sorted(run.name for run in runs.values())


def test_report_fits_1400_and_1024_pixels_in_chromium(bench, results, tmp_path):
    runs = _two_runs(bench, results, tmp_path)
    report = tmp_path / "report.html"
    out = bench("result", "report", *runs, "-o", str(report))
    assert out.exit_code == 0 and "(6 points)" in out.output, out.output
    html = report.read_text()
    assert "1 nodes" not in html and "point(s)" not in html
    assert html.count('class="comparison-row"') == 2, "only the 13B points have a reference row to stand beside"
    assert "jupiter has no reference row for gpt-tiny" in html
    with chromium() as browser:
        for width in (1400, 1024):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(report.as_uri())
            page.screenshot(path=str(tmp_path / f"report_{width}.png"), full_page=True)
            seen = page.evaluate(_LAYOUT)
            box = seen["box"]
            assert seen["page"] <= seen["viewport"] == width, f"{width} px: the page is {seen['page']} px wide"
            assert box["scroll"] <= box["client"], f"{width} px: the results table scrolls sideways: {seen}"
            names = [h["name"].strip() for h in seen["headers"]]
            assert {"state", "run", "Tokens/sec"} <= set(names), names
            for header in seen["headers"]:
                assert box["left"] <= header["left"] and header["right"] <= min(box["right"], width), (
                    f"{width} px: {header['name']} is off screen: {header} in {box}")
            sizes = {(round(t["width"]), round(t["height"])) for t in seen["traces"]}
            assert len(seen["traces"]) == 5 and len(sizes) == 1, f"{width} px: trace sizes {sizes}"
            page.close()
    for width in (1400, 1024):
        shot = (tmp_path / f"report_{width}.png").read_bytes()
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
