"""What the report's figures and headline say, read from the figure itself: every heatmap number legible on
its cell's colour (white on viridis' yellow was not), and one node called one node."""

import pytest

from nlp_bench.report.headline import headline


def _row(tp: int, pp: int, tokens: float, nodes: int = 1) -> dict:
    return {"run": "r", "point": f"tp{tp}_pp{pp}", "model": "gpt-tiny", "Model_Size": 0, "state": "COMPLETED",
            "Nodes": nodes, "Tensor_Parallel": tp, "Pipeline_Parallel": pp, "MBS": 1, "GAS": 4,
            "Tokens/sec": tokens, "time_to_report_in_seconds": 20e6 / tokens}


def _contrast(first, second) -> float:
    """WCAG 2's contrast ratio of two colours (1: the same, 21: black on white)."""
    from matplotlib.colors import to_rgb

    def luminance(colour):
        r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour))
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


@pytest.fixture
def kept_figures(monkeypatch):
    """The figures a plot function makes, kept open (it closes them once saved) to be read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    monkeypatch.setattr(plt, "close", lambda *_: None)
    yield lambda: [plt.figure(n) for n in plt.get_fignums()]
    monkeypatch.undo()
    plt.close("all")


def test_every_heatmap_number_stands_out_from_its_cell(kept_figures, tmp_path):
    from nlp_bench.report.plots import plot_heatmaps

    rows = [_row(tp, pp, 100.0 * (1 + tp * pp) + tp) for tp in (1, 2, 4) for pp in (1, 2, 4)]
    assert [p.name for p in plot_heatmaps(rows, tmp_path)] == ["heatmap_gpt-tiny_n1.png", "heatmap_gpt-tiny_n1.svg"]
    (figure,) = kept_figures()
    ax = figure.axes[0]
    (image,) = ax.images
    assert ax.get_title() == "gpt-tiny, 1 node: tokens/s"
    assert len(ax.texts) == 9
    for text in ax.texts:
        column, row = text.get_position()
        cell = image.cmap(image.norm(image.get_array()[row][column]))
        assert _contrast(text.get_color(), cell) >= 4.5, f"{text.get_text()} is {text.get_color()} on {cell}"


@pytest.mark.parametrize("nodes,said", [(1, "1 node,"), (2, "2 nodes,")])
def test_the_headline_counts_nodes_and_points_in_words(nodes, said):
    found = headline([_row(2, 1, 500.0, nodes)], {})
    assert said in found.title and "fastest of 1 point:" in found.title, found.title
