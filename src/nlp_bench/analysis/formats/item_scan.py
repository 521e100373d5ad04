"""The common ground of the formats that log one line per step (or per logged interval): the step lines'
fields are kept as the raw strings a findall gives (all in C, the parse speed goal), start-up lines (the
batch, the sequence length, the world size) as settings, and records are made of both at the end."""

from __future__ import annotations

import functools
import re
from typing import Any

from nlp_bench.analysis.log_record import Record, Warnings

#: ANSI colour codes (torchtitan colours every field; nanotron dims its prefix)
ANSI = re.compile(r"\x1b\[[0-9;]{0,20}m")
SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
#: step lines converted to see whether a block's lines are really this format's records
_PROBE = 64


class ItemScan:
    """Subclasses give `STEP` (a literal every step line holds, so a block without it is skipped at C
    speed, and the pattern whose groups are kept), `SETUP` ((literal, pattern, method) for start-up lines:
    the method turns a match into settings), and `records`, which makes the records of all rows."""

    NAME = ""
    STEP: tuple[str, re.Pattern]
    SETUP: tuple[tuple[str, re.Pattern, str], ...] = ()
    #: removed from a block before its step lines are matched (colour codes inside a line)
    CLEAN: re.Pattern | None = None
    #: a row's record needs no other row nor setting: a parallel worker makes its range's records itself
    LOCAL = False

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.setup: dict[str, Any] = {}
        self.warnings = Warnings()
        self._found = False
        self._result: tuple[list[Record], str | None] | None = None  # made once: it counts its warnings
        self.made: list[Record] = []  # records the workers made of earlier byte ranges (LOCAL formats)

    def feed(self, text: str, start: int, end: int) -> None:
        for literal, pattern, method in self.SETUP:
            if text.find(literal, start, end) >= 0:
                for match in pattern.finditer(text, start, end):
                    self.settle(getattr(self, method)(match))
        literal, pattern = self.STEP
        if text.find(literal, start, end) < 0:
            return
        if self.CLEAN is not None and text.find("\x1b", start, end) >= 0:
            text, start, end = self.CLEAN.sub("", text[start:end]), 0, None
        rows = self.rows_of(pattern, text, start, end)
        self.rows += rows
        if rows and not self._found:
            self._found = bool(self.records(rows[:_PROBE], Warnings()))

    @staticmethod
    def rows_of(pattern: re.Pattern, text: str, start: int, end: int | None) -> list[Any]:
        """The step lines' groups (a format that needs more of a line than its pattern reads overrides it)."""
        return pattern.findall(text, start, len(text) if end is None else end)

    def settle(self, found: dict[str, Any] | None) -> None:
        """Settings from a start-up line: the first value of each counts (a log of several runs)."""
        for key, value in (found or {}).items():
            if key not in self.setup:
                self.setup[key] = value
            elif self.setup[key] != value:
                self.warnings[f"start-up lines disagree on the {key} (several runs in one log?): the first counts"] += 1

    def records(self, rows: list[Any], warnings: Warnings) -> list[Record]:
        """The records of these rows, in iteration order, each iteration once; what a row lacks, warned."""
        raise NotImplementedError

    def finish(self, torn: str) -> None:
        """A last line without its line break is not read: its last number may have lost digits."""

    def found(self) -> bool:
        return self._found

    def result(self) -> tuple[list[Record], str | None]:
        if self._result is None:
            records = self.records(self.rows, self.warnings) if self.rows else []
            if self.made:
                records = first_of_each(self.made + records, self.warnings)  # the earlier range's line first
            self._result = records, (self.NAME if records else None)
        return self._result

    def part(self) -> tuple[list[Any] | None, list[list] | None, dict[str, Any], Warnings, bool]:
        """The rows, or (LOCAL formats) the records already made, as columns: they cross a pipe faster."""
        if self.LOCAL:
            made = self.records(self.rows, self.warnings) if self.rows else []
            return None, [list(column) for column in zip(*made, strict=False)], self.setup, self.warnings, self._found
        return self.rows, None, self.setup, self.warnings, self._found

    def join(self, part: tuple[list[Any] | None, list[list] | None, dict[str, Any], Warnings, bool]) -> None:
        rows, columns, setup, warnings, found = part
        if columns is not None:
            self.made += map(MAKE_RECORD, zip(*columns, strict=True))
        else:
            self.rows += rows
        self.settle(setup)
        self.warnings.update(warnings)
        self._found = self._found or found


#: Record._make without its Python frame: a C call per record
MAKE_RECORD = functools.partial(tuple.__new__, Record)


#: a Warnings reason: an iteration logged again with other figures
AGAIN = "iterations logged again with other figures (a restarted run?): the first line of each counts"


def first_of_each(records: list[Record], warnings: Warnings | None = None) -> list[Record]:
    """Records in iteration order, the first line of each iteration counting (several ranks print one; a
    run restarted from a checkpoint logs its steps again, which is counted where `warnings` is given)."""
    seen: dict[int, Record] = {}
    for record in records:
        first = seen.setdefault(record.iteration, record)
        if warnings is not None and first is not record and first.iteration_time_s != record.iteration_time_s:
            warnings[AGAIN] += 1
    return [seen[i] for i in sorted(seen)]
