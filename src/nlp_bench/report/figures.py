"""How each figure is written wherever it is shown: one number of decimals per figure, so that one log's
tokens/s, samples/s, time to report and TFLOPs read the same to the last digit in `bench parse`, the result
table, `bench status` and the report (the JSON and CSV files keep every digit)."""

from __future__ import annotations

#: decimals per figure: two for rates and seconds, three for samples/s (a few sequences per second on CPUs)
DECIMALS = {"tokens_per_s": 2, "samples_per_s": 3, "time_to_report_s": 2, "tflops_per_gpu": 2}


def figure_text(figure: str, value: float | None, empty: str = "-") -> str:
    """`value` rounded as DECIMALS says for `figure`, thousands grouped; `empty` where there is none."""
    if value is None:
        return empty
    return f"{value:,.{DECIMALS[figure]}f}"
