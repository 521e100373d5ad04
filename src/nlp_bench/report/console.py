"""What bench says on the terminal while it works: answers on stdout (plain, so scripts can read them),
warnings on stderr, and progress bars on stderr, all made by `progress_bar`."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from rich.console import Console

#: stderr, with no markup guessing: a log line's `[default0]` is text
console = Console(stderr=True, highlight=False, soft_wrap=True)


def say(text: str) -> None:
    """What the user asked for goes to stdout, plainly, so scripts can read it; progress goes to stderr."""
    print(text, flush=True)


def warn(text: str) -> None:
    """What went wrong, plainly on stderr."""
    print(text, file=sys.stderr, flush=True)


class Bar:
    """One progress bar; where none is shown (small work, no terminal) every method does nothing."""

    def __init__(self, progress=None, task=None, total: int | None = None) -> None:
        self._progress, self._task = progress, task
        self._count = self._shown = 0
        self._every = max(1, min(10_000, (total or 0) // 100))

    def update(self, *, completed: int | None = None, total: int | None = None, info: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, total=total,
                                  **({} if info is None else {"info": info}))

    def advance(self, items: int = 1) -> None:
        """`items` more done; cheap for millions of calls (the bar is redrawn every 1% or 10,000 items)."""
        self._count += items
        if self._progress is not None and self._count - self._shown >= self._every:
            self._shown = self._count
            self._progress.update(self._task, completed=self._count)


#: the width of a progress line written to a file or a pipe, where no terminal says one (COLUMNS still does):
#: room for the point, the bar, the count, the time and the figures after them
FILE_WIDTH = 160


def line_width() -> int:
    """The width a progress line fits: COLUMNS where set, else the terminal's, else FILE_WIDTH."""
    value = os.environ.get("COLUMNS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    if console.is_terminal:
        with contextlib.suppress(OSError, ValueError):
            return os.get_terminal_size(sys.stderr.fileno()).columns
    return FILE_WIDTH


def _columns(what: str, total: int | None, info: bool, width: int) -> list:
    """The progress line's columns, each given its width, so that the bar, the count and the elapsed time
    always show: the description and the info text share what is left, cut with an ellipsis (rich would
    otherwise squeeze every column alike, the bar and the count to nothing)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    count = 2 * len(str(total)) + 1 if total else 12
    bar = max(10, min(40, width // 6))
    room = width - bar - count - len("0:00:00") - (4 if info else 3) - 1
    named = min(len(what), max(8, room // 3 if info else room))
    columns = [TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis",
                                                                          max_width=named)),
               BarColumn(bar_width=bar), MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=count)),
               TimeElapsedColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}", markup=False, table_column=Column(
            no_wrap=True, overflow="ellipsis", max_width=max(8, room - named - 1))))
    return columns


@contextlib.contextmanager
def progress_bar(what: str, total: int | None, *, threshold: int = 0, info: bool = False,
                 transient: bool = False) -> Iterator[Bar]:
    """A bar on stderr while the block runs, as wide as line_width(). With a `threshold`, only for work of at
    least that many items and only on a terminal; `info`: a text column after the bar (Bar.update(info=...))."""
    if threshold and ((total or 0) < threshold or not console.is_terminal):
        yield Bar()
        return
    from rich.progress import Progress

    width = line_width()
    line = Console(stderr=True, highlight=False, soft_wrap=True, width=width)
    with Progress(*_columns(what, total, info, width), console=line, transient=transient) as progress:
        yield Bar(progress, progress.add_task(what, total=total, info=""), total)
