"""One module per log format, each a scan class marked @register_format (see nlp_bench.registry for why), with
the same five duties, fed whole lines by `parsers`:

- `feed(text, start, end)`: read the lines text[start:end] (a block of whole lines, each ending with `\\n`;
  a carriage return has already become a line break, so a progress bar's redraw is a line of its own);
- `finish(torn)`: the last line of a log that does not end with a line break (it may be cut anywhere);
- `found()`: whether any record was found yet (detection stops feeding the formats after the first that has);
- `result()`: the records in iteration order and the format's name (None without records);
- `part()` / `join(part)`: what the scan of one byte range found, to merge ranges read by parallel workers
  in the log's order, as one pass would have left them;
- `warnings`: what the format recognised but could not read (`log_record.Warnings`).

A scan costs time in proportion to the text it is fed, however its lines are crafted: no pattern scans a
part of a line again and again (no lazy gap or unbounded `key: value` search restarted at every position).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nlp_bench.analysis.log_record import ParseError
from nlp_bench.registry import Registry

#: every log format, tried in rank order to detect a log's format (`bench parse --format` takes a name or alias)
FORMATS: Registry[type] = Registry("log format", __name__, ParseError)


def register_format(rank: int, variants: Iterable[str] = ()) -> Callable[[type], type]:
    """Class decorator: the scan reads the format of its `NAME`, tried after those of lower `rank` (a format whose
    lines another's pattern could read too comes first); `variants` are the names it reports of the logs it
    reads (which `--format` accepts as the format itself)."""
    return lambda scan: FORMATS.add(scan.NAME, scan, rank, tuple(variants))
