"""The points a sweep dropped, streamed to a compressed CSV in the run: a grid of millions of combinations
is never held in memory."""

from __future__ import annotations

import collections
import csv
import gzip
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nlp_bench.store.names import DROPPED_CSV


class DroppedLog:
    """Dropped points counted by rule and written as they come. The file waits in a temporary folder until
    the run is written (keep) or the sweep is refused (discard), so a refused sweep writes nothing."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.counts: collections.Counter[str] = collections.Counter()
        self._folder = tempfile.mkdtemp(prefix="nlp-bench-dropped-")
        self._path = Path(self._folder) / DROPPED_CSV
        # level 1: most of the time goes to writing rows, and dropped rows compress well at any level
        self._file = gzip.open(self._path, "wt", compresslevel=1, newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow([*self.columns, "reason", "rule"])

    def add(self, params: dict[str, Any], reason: str, rule: str) -> None:
        self.counts[rule] += 1
        self._writer.writerow([*(params.get(c) for c in self.columns), reason, rule])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def keep(self, run_folder: Path) -> Path:
        """Move the log into the run's folder (while the run is being written)."""
        self._file.close()
        target = Path(run_folder) / DROPPED_CSV
        shutil.move(str(self._path), target)
        shutil.rmtree(self._folder, ignore_errors=True)
        return target

    def discard(self) -> None:
        self._file.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def dropped_rows(run_folder: Path) -> Iterator[dict[str, str]]:
    """The run's dropped points, one dict per CSV row, read as a stream."""
    path = Path(run_folder) / DROPPED_CSV
    if not path.is_file():
        return
    with gzip.open(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)
