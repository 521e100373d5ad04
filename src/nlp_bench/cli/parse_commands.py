"""`bench parse`: any training log read into iteration records and summarised, without a run around it."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("parse")
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help="The log's format (default: detected); a name bench does not know is answered with those it does.")
@click.option("--seq-length", type=click.IntRange(min=1), default=None,
              help="Sequence length, for tokens/s from logs that do not print it (all of them).")
@click.option("--tokens", type=click.IntRange(min=1), default=20_000_000, show_default=True,
              help="Tokens of the hypothetical training that time_to_report_s is for.")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON (records and summary).")
def bench_parse(log: Path, fmt: str | None, seq_length: int | None, tokens: int, as_json: bool) -> None:
    """Read the iteration records of a training LOG and summarise them (warm-up excluded, spread reported)."""
    import json

    from nlp_bench.analysis import metrics, parsers
    from nlp_bench.report.parsed import render_parsed

    try:
        parsed = parsers.parse_log(log, fmt)
    except parsers.NoRecords as exc:
        raise parsers.ParseError(f"{log}: {exc}") from None
    records, summary = metrics.steady_summary(parsed.records, seq_length, tokens)
    if as_json:
        # allow_nan=False: a NaN or Infinity is no JSON, and a figure that overflowed must fail here, loudly
        click.echo(json.dumps({"format": parsed.format, "records": records, "summary": summary,
                               "skipped_long_lines": parsed.skipped_long_lines, "warnings": parsed.warnings,
                               "nul_runs": parsed.nul_runs},
                              indent=2, allow_nan=False))
        return
    click.echo(render_parsed(parsed.format, records, summary), nl=False)
    for note in parsed.notes():
        click.echo(f"warning: {note}")
