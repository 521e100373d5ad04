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


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for fmt in FIGURE_FORMATS:
        path = out_dir / f"{stem}.{fmt}"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    plt.close(fig)
    return paths


def _references(ax, references: list[dict[str, Any]], models, column: str) -> None:
    for ref in references:
        if ref.get("model") in models and ref.get(column):
            ax.plot([ref["Nodes"]], [ref[column]], "*", markersize=12, color="black",
                    label=f"{ref['model']} reference ({ref['system']}, {ref['Nodes']} nodes)")


def _reference_nodes(references: list[dict[str, Any]], models) -> list[int]:
    return [ref["Nodes"] for ref in references if ref.get("model") in models]


def plot_strong_scaling(rows: list[dict[str, Any]], out_dir: Path, references: list[dict[str, Any]] = ()) -> list[Path]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    models = _best_per_nodes(rows)
    _references(ax, references, models, "Tokens/sec")
    for model, points in models.items():
        nodes = [n for n, _ in points]
        tokens = [r["Tokens/sec"] for _, r in points]
        ax.plot(nodes, tokens, "o-", label=f"{model} (best layout per node count)")
        if len(points) > 1:
            ax.plot(nodes, [tokens[0] * n / nodes[0] for n in nodes], "--", color="grey", linewidth=1,
                    label=f"{model} ideal from {nodes[0]} nodes")
    ax.set(xscale="log", yscale="log", xlabel="nodes", ylabel="tokens/s", title="Strong scaling")
    _node_axis(ax, [n for points in models.values() for n, _ in points] + _reference_nodes(references, models))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "strong_scaling")


def plot_time_to_report(rows: list[dict[str, Any]], out_dir: Path, references: list[dict[str, Any]] = ()) -> list[Path]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
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
    return _save(fig, out_dir, "time_to_report")


def plot_heatmaps(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One TP x PP heatmap per (model, nodes) that a sweep measured in more than one layout."""
    import matplotlib.pyplot as plt

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
        fig, ax = plt.subplots(figsize=(1.2 * len(tps) + 2.5, 1.0 * len(pps) + 2))
        image = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:
                    ax.text(j, i, f"{value:,.0f}", ha="center", va="center", color="white", fontsize=8)
        ax.set_xticks(range(len(tps)), [str(t) for t in tps])
        ax.set_yticks(range(len(pps)), [str(p) for p in pps])
        ax.set(xlabel="tensor parallel", ylabel="pipeline parallel", title=f"{model}, {nodes} nodes: tokens/s")
        fig.colorbar(image, ax=ax, label="tokens/s")
        paths += _save(fig, out_dir, f"heatmap_{model}_n{nodes}")
    return paths


def plot_trace(point: str, records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Iteration time of every logged interval; the intervals the summary excludes as warm-up in orange."""
    import matplotlib.pyplot as plt

    timed = [r for r in records if r.get("iteration_time_s")]
    if not timed:
        return []
    skip = warmup_count([1.0 / r["iteration_time_s"] for r in timed])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    its, times = [r["iteration"] for r in timed], [r["iteration_time_s"] for r in timed]
    ax.plot(its, times, "-", color="tab:blue", linewidth=1)
    ax.plot(its[skip:], times[skip:], "o", color="tab:blue", markersize=3, label="steady state")
    if skip:
        ax.plot(its[:skip], times[:skip], "o", color="tab:orange", markersize=5, label=f"warm-up ({skip} excluded)")
    ax.set(xlabel="iteration", ylabel="time per iteration (s)", title=point)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, f"trace_{point}")


def plot_all(rows: list[dict[str, Any]], records: dict[tuple[str, str], list[dict[str, Any]]],
             out_dir: Path, references: list[dict[str, Any]] = ()) -> list[Path]:
    """Every figure for the rows (records: a completed point's parsed records, by (run, point); references:
    published rows to mark beside the models they share)."""
    import matplotlib

    matplotlib.use("Agg")
    done = _completed(rows)
    if not done:
        raise ResultError("no completed point with a measured Tokens/sec to plot")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (plot_strong_scaling(done, out_dir, references) + plot_time_to_report(done, out_dir, references)
             + plot_heatmaps(done, out_dir))
    several_runs = len({row["run"] for row in done}) > 1  # the same point may then appear twice
    for row in done:
        name = f"{row['run']}_{row['point']}" if several_runs else row["point"]
        paths += plot_trace(name, records.get((row["run"], row["point"])) or [], out_dir)
    return paths
