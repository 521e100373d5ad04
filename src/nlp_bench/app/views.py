"""What the commands that show runs share: the runs asked for, each point's state brought up to date, and
everything that could not be shown (a damaged record, a gone folder, a scheduler that did not answer)
collected to be said after the output, so that one bad file never hides the rest."""

from __future__ import annotations

import sys
from pathlib import Path

from nlp_bench.analysis.results import Problems, run_results, run_rows
from nlp_bench.app.record_checks import COPY, marked, marks, unmarked
from nlp_bench.errors import BenchError
from nlp_bench.launch.refresher import Refresher
from nlp_bench.report.status import missing_status, point_status
from nlp_bench.store import states, unkept
from nlp_bench.store.files import naming
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import Run, find_run, list_runs


class View:
    def __init__(self, results_dir: Path) -> None:
        self.results_dir = Path(results_dir)
        self.refresher = Refresher()
        self.problems = Problems()

    def refreshed(self, run: Run) -> Run:
        """The run, with the state of every unfinished job asked of its executor first. A state that cannot
        be written (a read-only results folder) is still worked out, shown by every view of this process, and
        said not to be kept."""
        present = [point for point in run.points() if point.exists()]
        self.refresher.prefetch([point.path for point in present])
        with unkept.shown() as not_kept:
            for point in present:
                try:
                    self.refresher.refresh(point.path)
                except BenchError as exc:  # a damaged record, an executor this bench does not know
                    self.problems.add(naming(point.path, exc))
        for line in not_kept.values():
            self.problems.add(line)
        return run

    def status_rows(self, run: Run) -> list[dict]:
        """Where every point of the run stands, its state asked of its executor first (`bench status`); a
        point that cannot be read is named among the problems, one whose folder is gone shows as MISSING."""
        self.refreshed(run)
        rows = []
        for point in run.points():
            if not point.exists():
                rows.append(missing_status(point.id))
                continue
            try:
                rows.append(point_status(point.path, self.problems.lines))
            except BenchError as exc:
                self.problems.add(naming(point.path, exc))
        return self.marked(run, rows)

    def marked(self, run: Run, rows: list[dict]) -> list[dict]:
        """The rows with their states marked where a point's records disagree with what runs (a copy of a
        run, a point.json that is not its jobscript's layout), each disagreement said among the problems."""
        for row in rows:
            if row.get("state") == states.MISSING or not row.get("point"):
                continue
            point = PointDir(run.path / row["point"])
            try:
                found = marks(point)
            except BenchError as exc:
                self.problems.add(naming(point.path, exc))
                continue
            row["state"] = marked(row["state"], found)
            for mark in found:
                self.problems.add(mark.line)
        return rows

    @staticmethod
    def all_ended(rows: list[dict]) -> bool:
        """Nothing left to watch: every point ended, was never submitted, or is gone, or is a copy (its job
        is the original's: nothing the copy shows changes)."""
        return all(unmarked(r["state"]) in states.TERMINAL | {states.NOT_SUBMITTED, states.MISSING}
                   or COPY in r["state"].partition(" (")[2] for r in rows)

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

    def rows(self, run: Run) -> list[dict]:
        """The run's result table rows, marked as status_rows marks them; what cannot be read is among the
        problems."""
        return self.marked(run, run_rows(run, self.problems))

    def table_rows(self, refs: tuple[str, ...], every: bool = False, reference: bool = False) -> list[dict]:
        """The rows of `bench result table`: the runs named (default: the newest; `every`: all of them),
        after the published reference rows where asked (alone only where there is no run yet). A table with
        nothing to show says why."""
        rows = []
        if reference:
            from nlp_bench.analysis.reference import reference_rows

            rows = reference_rows()
        if every:
            runs = self.every_run()
        elif refs or not reference or list_runs(self.results_dir).runs:
            runs = [self.run(ref) for ref in refs or (None,)]
        else:
            runs = []
        for run in runs:
            rows += self.rows(run)
        if not rows and self.problems.lines:
            raise BenchError(self.problems.lines[0])
        return rows

    def gathered(self, refs: tuple[str, ...]) -> tuple[list[str], list[dict], dict]:
        """Run ids, table rows and analysed results (keyed by (run, point)) of the runs named (default: the
        newest), for the figures and the report."""
        ids, rows, results = [], [], {}
        for ref in refs or (None,):
            run = self.run(ref)
            ids.append(run.id)
            for row, result in run_results(run, self.problems):
                rows.append(self.marked(run, [row])[0])
                results[(row["run"], row["point"])] = result
        return ids, rows, results

    def warnings(self) -> list[str]:
        return [*self.refresher.silences, *dict.fromkeys(self.problems.lines)]

    def tell(self) -> None:
        """Say on stderr what could not be shown; a command that showed something still exits 0."""
        for line in self.warnings():
            print(f"bench: warning: {line}", file=sys.stderr)
