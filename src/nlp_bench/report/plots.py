"""`bench result plot`: the figures a scaling study needs, each written as PNG and SVG.

- strong scaling: tokens/s against nodes, per model, with the ideal line from the smallest node count;
- time to report against nodes, with the 175B baseline (560 s) drawn where 175B points are shown;
- on both, the published reference row of each model shown (a star), where references are given;
- a TP x PP heatmap of tokens/s for every (model, nodes) with more than one layout;
- the iteration-time trace of every completed point, its warm-up intervals marked.

Where several layouts share a node count, scaling plots show the best one (what a tuned run achieves).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from nlp_bench.analysis.metrics import warmup_count
from nlp_bench.analysis.reference import BASELINE_S
from nlp_bench.errors import ResultError
from nlp_bench.store import states
from nlp_bench.words import counted

FIGURE_FORMATS = ("png", "svg")


def _completed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("state") == states.COMPLETED and r.get("Tokens/sec")]


def _best_per_nodes(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, dict]]]:
    best: dict[str, dict[int, dict]] = defaultdict(dict)
    for row in rows:
        current = best[row["model"]].get(row["Nodes"])
        if current is None or row["Tokens/sec"] > current["Tokens/sec"]:
            best[row["model"]][row["Nodes"]] = row
    return {model: sorted(by_nodes.items()) for model, by_nodes in best.items()}


def _node_axis(ax, nodes) -> None:
    """Node counts as plain numbers at the measured counts (a log axis would write 8 as 8 x 10^0)."""
    from matplotlib.ticker import NullFormatter

    ticks = sorted(set(nodes))
    ax.set_xticks(ticks, [str(n) for n in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _figure(width: float, height: float):
    """A figure and its axes, laid out inside its own size: a figure is saved as large as it was made (no
    tight bounding box, which grew or shrank each trace by its title and tick labels), so figures of a kind
    are all one size."""
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), layout="constrained")


def _save(fig, out_dir: Path, stem: str, formats: tuple[str, ...]) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for fmt in formats:
        path = out_dir / f"{stem}.{fmt}"
        fig.savefig(path, dpi=120)
        paths.append(path)
    plt.close(fig)
    return paths


def _references(ax, references: list[dict[str, Any]], models, column: str) -> None:
    for ref in references:
        if ref.get("model") in models and ref.get(column):
            ax.plot([ref["Nodes"]], [ref[column]], "*", markersize=12, color="black",
                    label=f"{ref['model']} reference ({ref['system']}, {counted(ref['Nodes'], 'node')})")


def _reference_nodes(references: list[dict[str, Any]], models) -> list[int]:
    return [ref["Nodes"] for ref in references if ref.get("model") in models]


def plot_strong_scaling(rows: list[dict[str, Any]], out_dir: Path, references: list[dict[str, Any]] = (),
                        formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    fig, ax = _figure(6, 4)
    models = _best_per_nodes(rows)
    _references(ax, references, models, "Tokens/sec")
    for model, points in models.items():
        nodes = [n for n, _ in points]
        tokens = [r["Tokens/sec"] for _, r in points]
        ax.plot(nodes, tokens, "o-", label=f"{model} (best layout per node count)")
        if len(points) > 1:
            ax.plot(nodes, [tokens[0] * n / nodes[0] for n in nodes], "--", color="grey", linewidth=1,
                    label=f"{model} ideal from {counted(nodes[0], 'node')}")
    ax.set(xscale="log", yscale="log", xlabel="nodes", ylabel="tokens/s", title="Strong scaling")
    _node_axis(ax, [n for points in models.values() for n, _ in points] + _reference_nodes(references, models))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "strong_scaling", formats)


def plot_time_to_report(rows: list[dict[str, Any]], out_dir: Path, references: list[dict[str, Any]] = (),
                        formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    fig, ax = _figure(6, 4)
    models = _best_per_nodes(rows)
    _references(ax, references, models, "time_to_report_in_seconds")
    for model, points in models.items():
        ax.plot([n for n, _ in points], [r["time_to_report_in_seconds"] for _, r in points], "o-", label=model)
    for model, seconds in BASELINE_S.items():
        if model in models:
            ax.axhline(seconds, color="red", linestyle="--", linewidth=1, label=f"{model} baseline {seconds:.0f} s")
    ax.set(xscale="log", xlabel="nodes", ylabel="time to report 20M tokens (s)", title="Time to report")
    _node_axis(ax, [n for points in models.values() for n, _ in points] + _reference_nodes(references, models))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "time_to_report", formats)


def plot_heatmaps(rows: list[dict[str, Any]], out_dir: Path, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """One TP x PP heatmap per (model, nodes) that a sweep measured in more than one layout."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["model"], row["Nodes"])].append(row)
    paths = []
    for (model, nodes), members in sorted(groups.items()):
        tps = sorted({r["Tensor_Parallel"] for r in members})
        pps = sorted({r["Pipeline_Parallel"] for r in members})
        if len(tps) * len(pps) < 2:
            continue
        grid = [[float("nan")] * len(tps) for _ in pps]
        for r in members:
            i, j = pps.index(r["Pipeline_Parallel"]), tps.index(r["Tensor_Parallel"])
            if not grid[i][j] >= r["Tokens/sec"]:  # nan or smaller: keep the best micro-batch/GAS choice
                grid[i][j] = r["Tokens/sec"]
        fig, ax = _figure(1.2 * len(tps) + 2.5, 1.0 * len(pps) + 2)
        image = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:
                    ax.text(j, i, f"{value:,.0f}", ha="center", va="center", fontsize=8,
                            color=_legible_on(image.cmap(image.norm(value))))
        ax.set_xticks(range(len(tps)), [str(t) for t in tps])
        ax.set_yticks(range(len(pps)), [str(p) for p in pps])
        ax.set(xlabel="tensor parallel", ylabel="pipeline parallel",
               title=f"{model}, {counted(nodes, 'node')}: tokens/s")
        fig.colorbar(image, ax=ax, label="tokens/s")
        paths += _save(fig, out_dir, f"heatmap_{model}_n{nodes}", formats)
    return paths


def _legible_on(background) -> str:
    """Black or white, whichever stands out more from the background colour (the contrast ratio of WCAG 2:
    viridis runs from near-black purple, where black text vanishes, to yellow, where white text does)."""
    from matplotlib.colors import to_rgb

    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(background)]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def plot_trace(point: str, records: list[dict[str, Any]], out_dir: Path,
               formats: tuple[str, ...] = FIGURE_FORMATS, run: str | None = None) -> list[Path]:
    """Iteration time of every logged interval; the intervals the summary excludes as warm-up in orange. `run`:
    the point's run, named in the file and under the title where several runs are plotted (one line of both
    ids is wider than the figure)."""
    timed = [r for r in records if r.get("iteration_time_s")]
    if not timed:
        return []
    skip = warmup_count([1.0 / r["iteration_time_s"] for r in timed])
    fig, ax = _figure(6, 3.5)
    its, times = [r["iteration"] for r in timed], [r["iteration_time_s"] for r in timed]
    ax.plot(its, times, "-", color="tab:blue", linewidth=1)
    ax.plot(its[skip:], times[skip:], "o", color="tab:blue", markersize=3, label="steady state")
    if skip:
        ax.plot(its[:skip], times[:skip], "o", color="tab:orange", markersize=5, label=f"warm-up ({skip} excluded)")
    ax.set(xlabel="iteration", ylabel="time per iteration (s)")
    ax.set_title(f"{point}\nrun {run}" if run else point, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, f"trace_{run}_{point}" if run else f"trace_{point}", formats)


def plot_all(rows: list[dict[str, Any]], records: dict[tuple[str, str], list[dict[str, Any]]],
             out_dir: Path, references: list[dict[str, Any]] = (),
             formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """Every figure for the rows, in each of `formats` (records: a completed point's parsed records, by
    (run, point); references: published rows to mark beside the models they share)."""
    import matplotlib

    matplotlib.use("Agg")
    done = _completed(rows)
    if not done:
        raise ResultError("no completed point with a measured Tokens/sec to plot")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (plot_strong_scaling(done, out_dir, references, formats)
             + plot_time_to_report(done, out_dir, references, formats) + plot_heatmaps(done, out_dir, formats))
    several_runs = len({row["run"] for row in done}) > 1  # the same point may then appear twice
    for row in done:
        paths += plot_trace(row["point"], records.get((row["run"], row["point"])) or [], out_dir, formats,
                            run=row["run"] if several_runs else None)
    return paths
