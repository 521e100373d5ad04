"""The common ground of the formats that log one line per step: lines of a few kinds (the step line, a
start-up line naming the batch, sequence length or world size) are matched in the log's order, kept as
items, and turned into records at the end (some need what came before them: a clock read twice, a batch
size printed once at start)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from nlp_bench.analysis.log_record import Record, Warnings

#: ANSI colour codes (torchtitan colours every field; nanotron dims its prefix)
ANSI = re.compile(r"\x1b\[[0-9;]{0,20}m")
SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


class ItemScan:
    """A scan that keeps what each matching line says and makes records from them all at the end.
    Subclasses list `KINDS`: (literal, pattern, method) where the pattern starts with the literal (so a
    block without it is skipped at C speed and a match is tried only where the literal stands) and the
    method turns a match into an item (or None); then `records` makes the records of all items."""

    NAME = ""
    KINDS: tuple[tuple[str, re.Pattern, str], ...] = ()

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.warnings = Warnings()
        self._kinds: list[tuple[str, re.Pattern, Callable[[re.Match], Any]]] = [
            (literal, pattern, getattr(self, method)) for literal, pattern, method in self.KINDS]

    def feed(self, text: str, start: int, end: int) -> None:
        found = []
        for literal, pattern, read in self._kinds:
            if text.find(literal, start, end) < 0:
                continue
            for match in pattern.finditer(text, start, end):
                item = read(match)
                if item is not None:
                    found.append((match.start(), item))
        if len(found) > 1 and len(self._kinds) > 1:
            found.sort(key=lambda pair: pair[0])
        self.items.extend(item for _, item in found)

    def records(self, items: list[Any]) -> list[Record]:
        """The records of all items, in iteration order, each iteration once."""
        raise NotImplementedError

    def finish(self, torn: str) -> None:
        """A last line without its line break is not read: its last number may have lost digits."""

    def found(self) -> bool:
        return any(isinstance(item, Record) for item in self.items)

    def result(self) -> tuple[list[Record], str | None]:
        records = self.records(self.items) if self.found() else []
        return records, (self.NAME if records else None)

    def part(self) -> tuple[list[Any], Warnings]:
        return self.items, self.warnings

    def join(self, part: tuple[list[Any], Warnings]) -> None:
        items, warnings = part
        self.items.extend(items)
        self.warnings.update(warnings)


def first_of_each(records: list[Record]) -> list[Record]:
    """Records in iteration order, the first line of each iteration counting (several ranks print one)."""
    seen: dict[int, Record] = {}
    for record in records:
        seen.setdefault(record.iteration, record)
    return [seen[i] for i in sorted(seen)]


def line_start(text: str, at: int) -> int:
    """Where the line holding position `at` begins."""
    return text.rfind("\n", 0, at) + 1
