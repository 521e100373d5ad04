"""What bench says on the terminal while it works: answers on stdout (plain, so scripts can read them),
warnings on stderr, and progress bars on stderr, all made by `progress_bar`."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def progress_bar(what: str, total: int | None, *, threshold: int = 0, info: bool = False,
                 transient: bool = False) -> Iterator[Bar]:
    """A bar on stderr while the block runs. With a `threshold`, only for work of at least that many items
    and only on a terminal; `info`: a text column after the bar (Bar.update(info=...))."""
    if threshold and ((total or 0) < threshold or not console.is_terminal):
        yield Bar()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=console, transient=transient) as progress:
        yield Bar(progress, progress.add_task(what, total=total, info=""), total)
