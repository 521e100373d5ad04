"""What the commands that show runs share: the runs asked for, each point's state brought up to date, and
everything that could not be shown (a damaged record, a gone folder, a scheduler that did not answer)
collected to be said after the output, so that one bad file never hides the rest."""

from __future__ import annotations

import sys
from pathlib import Path

from nlp_bench.analysis.results import Problems
from nlp_bench.errors import BenchError
from nlp_bench.launch.executors import Refresher
from nlp_bench.store.files import naming
from nlp_bench.store.runs import Run, find_run, list_runs


class View:
    def __init__(self, results_dir: Path) -> None:
        self.results_dir = Path(results_dir)
        self.refresher = Refresher()
        self.problems = Problems()

    def refreshed(self, run: Run) -> Run:
        """The run, with the state of every unfinished job asked of its executor first."""
        present = [point for point in run.points() if point.exists()]
        self.refresher.prefetch([point.path for point in present])
        for point in present:
            try:
                self.refresher.refresh(point.path)
            except BenchError as exc:  # a damaged record, an executor this bench does not know
                self.problems.add(naming(point.path, exc))
        return run

    def run(self, ref: str | None) -> Run:
        return self.refreshed(find_run(self.results_dir, ref))

    def every_run(self) -> list[Run]:
        """Every readable run, oldest first; damaged ones are named among the problems."""
        listing = list_runs(self.results_dir)
        for line in listing.broken.values():
            self.problems.add(line)
        if not listing.runs:
            find_run(self.results_dir, None)  # says where it looked, and why nothing is there
        return [self.refreshed(run) for run in listing.runs]

    def warnings(self) -> list[str]:
        return [*self.refresher.silences, *dict.fromkeys(self.problems.lines)]

    def tell(self) -> None:
        """Say on stderr what could not be shown; a command that showed something still exits 0."""
        for line in self.warnings():
            print(f"bench: warning: {line}", file=sys.stderr)
