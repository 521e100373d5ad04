"""Iteration logs of every training stack the benchmark meets, read into one record type.

This module reads a log (a string or a file, streamed in chunks, a large file in byte ranges by parallel
workers), cuts it into lines and feeds them to the format scans of `formats/`, one module per framework;
detection takes the first format, in the registry's rank order, whose scan finds records.

Lines are found wherever they sit in a job.out full of NCCL, Slurm and Python noise; an iteration
printed by several ranks counts once. What a format recognises but cannot read (a line cut in a field, a
field it expects and cannot read) is a warning, counted by reason in `Parsed.warnings`.

A job.out is written by programs that can print anything, so reading one must cost time in proportion to
its size and memory in proportion to its records, whatever it holds. A log is read in chunks and cut into
lines at `\n` and at `\r` (a progress bar's redraw is a line of its own; a carriage return ends a Megatron
line as it ends what the terminal shows); a line longer than MAX_LINE characters is skipped and counted,
and never held whole: no training stack prints one. A run of NUL bytes ends a line too, and is counted: it
is a hole in the file (a log truncated while its writer went on, a crash before the data reached the disk),
and glued to the line after it, it would make that line too long to read.
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import multiprocessing
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nlp_bench.analysis.formats import FORMATS
from nlp_bench.analysis.formats.megatron import MEGATRON, parse_line
from nlp_bench.analysis.log_record import MAX_LINE, NoRecords, ParseError, Record, Warnings

__all__ = ["MEGATRON", "NoRecords", "ParseError", "Record", "parse_line"]

#: Bytes read from a log file at a time: large enough that the per-chunk work is noise, small enough
#: that the text held at once is a few MB whatever the log's size.
CHUNK_BYTES = 1 << 22


@contextlib.contextmanager
def _collector_paused():
    """Parsing builds hundreds of thousands of tuples that all stay alive; the cyclic garbage collector
    would scan them again and again for nothing (a fifth of the parse time of a large log)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --- lines -------------------------------------------------------------------------------------------


#: whole lines of a log: text[start:end], which ends with a line break (a view, to copy no text)
_Span = tuple[str, int, int]
_NULS = re.compile("\x00+")


class _Holes:
    """Runs of NUL bytes in text fed in pieces, each made one line break and counted once, even where it
    spans pieces."""

    def __init__(self) -> None:
        self.runs = 0
        self._open = False  # the last piece ended inside a run

    def fill(self, text: str) -> str:
        if "\x00" not in text:
            self._open = False
            return text
        continued = self._open and text[0] == "\x00"
        self._open = text[-1] == "\x00"
        text, runs = _NULS.subn("\n", text)
        self.runs += runs - continued
        return text


class _Lines:
    """Text fed in pieces, handed on as spans of whole lines: the unfinished last line is held back until
    its line break comes, and a line longer than `limit` is dropped (and counted) as soon as it is known to
    be, so no more than `limit` characters of it are ever held. Spans point into the pieces themselves:
    copying a chunk of text costs as much as reading it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.skipped = 0
        self._pieces: list[str] = []  # the unfinished line, in pieces: joining once costs less than growing
        self._held = 0
        self._skipping = False  # inside a line already known to be too long

    def feed(self, text: str) -> list[_Span]:
        """The whole lines this piece completes ([] when it completes none)."""
        cut = text.rfind("\n")
        if cut < 0:
            self._hold(text)
            return []
        first = text.find("\n") + 1
        if self._skipping:  # the piece ends the long line
            self.skipped += 1
            self._skipping = False
            spans, start = [], first
        elif self._pieces:  # the piece ends the held line
            head = "".join(self._pieces) + text[:first]
            spans, start = self._short(head, 0, len(head)), first
        else:
            spans, start = [], 0
        spans += self._short(text, start, cut + 1)
        self._pieces, self._held = [], 0
        self._hold(text[cut + 1:])
        return spans

    def finish(self) -> str:
        """The last line when the text does not end with a line break: it may have been cut anywhere."""
        if self._skipping:
            self.skipped += 1
            self._skipping = False
            return ""
        torn = "".join(self._pieces)
        self._pieces, self._held = [], 0
        return torn

    def _hold(self, text: str) -> None:
        if self._skipping or not text:
            return
        self._held += len(text)
        if self._held > self.limit:
            self._pieces, self._held, self._skipping = [], 0, True
        else:
            self._pieces.append(text)

    def _short(self, text: str, start: int, end: int) -> list[_Span]:
        """text[start:end] as spans without its lines longer than the limit. Any such line holds one of the
        positions start + limit, start + 2·limit, ... (or the first `limit` after the end of a long one), so
        looking at the line around each of those finds them all while reading every other line not at all."""
        limit = self.limit
        if end - start <= limit:
            return [(text, start, end)] if end > start else []
        spans: list[_Span] = []
        keep, at = start, start + limit
        while at < end:
            before = text.rfind("\n", start, at)
            begin = start if before < 0 else before + 1
            stop = text.find("\n", at, end)  # the span ends with a line break: always found
            if stop - begin > limit:
                if begin > keep:
                    spans.append((text, keep, begin))
                self.skipped += 1
                keep, at = stop + 1, stop + 1 + limit
            else:
                at += limit
        if keep < end:
            spans.append((text, keep, end))
        return spans


class LineFeed:
    """The lines of a text fed in pieces, cut as a parse cuts them (at `\n`, at `\r` and at runs of NULs; a
    line longer than `limit` skipped): what follows a growing job.out holds no more of it than one line."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.lines, self.holes = _Lines(limit), _Holes()

    def spans(self, piece: str) -> list[_Span]:
        """The whole lines this piece completes, as spans."""
        return self.lines.feed(self.holes.fill(piece).replace("\r", "\n"))

    def feed(self, piece: str) -> list[str]:
        """The whole lines this piece completes, without their line breaks."""
        return [line for text, start, end in self.spans(piece) for line in text[start:end - 1].split("\n")]


def _text_pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start:start + size]


def _file_pieces(fh: IO[bytes], size: int, end: int | None = None) -> Iterator[str]:
    """A file's text a chunk at a time, up to byte `end`; bytes that are not UTF-8 (a torn multi-byte
    character) become U+FFFD, exactly as decoding the whole file at once would make them."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    left = None if end is None else end - fh.tell()
    while left is None or left > 0:
        data = fh.read(size if left is None else min(size, left))
        if not data:
            break
        if left is not None:
            left -= len(data)
        yield decoder.decode(data)
    yield decoder.decode(b"", final=True)


# --- detection and the public entry points -----------------------------------------------------------

@dataclass
class Parsed:
    format: str | None
    records: list[Record]
    #: lines longer than MAX_LINE characters, not read (a log is cut into lines at `\n` and `\r`)
    skipped_long_lines: int = 0
    #: what the format recognised but could not read: {reason: lines}
    warnings: dict[str, int] = field(default_factory=dict)
    #: runs of NUL bytes (holes in the file), each read as a line break
    nul_runs: int = 0

    def notes(self) -> list[str]:
        """Each kind of line that was not read, or was read only in part, in one line: what `bench parse`
        says, and the table and status beside the figures the lines are missing from."""
        found = [f"skipped {self.skipped_long_lines:,} line(s) longer than {MAX_LINE:,} characters (no training "
                 "stack prints one; not read)"] if self.skipped_long_lines else []
        if self.nul_runs:
            found.append(f"{self.nul_runs:,} run(s) of NUL bytes, a hole in the file where what was written is "
                         "lost (read as line breaks)")
        return found + [f"{reason} ({times:,}x)" for reason, times in self.warnings.items()]


def _parsers(fmt: str | None) -> list[str]:
    """The formats to read a log as: the one `fmt` names (a format or a variant it reports), else every format in
    detection order."""
    return FORMATS.names() if fmt is None else [FORMATS.resolve(fmt)]


def _read(pieces: Iterable[str], names: list[str], limit: int | None = None) -> tuple[list, int, int]:
    """The named parsers' scans of a text given in pieces, all fed in one pass, the count of lines
    skipped for being longer than `limit` (default MAX_LINE) and that of the runs of NUL bytes."""
    scans = [FORMATS.get(name)() for name in names]
    feed = LineFeed(MAX_LINE if limit is None else limit)
    feeding = scans
    for piece in pieces:
        for text, start, end in feed.spans(piece):
            for scan in feeding:
                scan.feed(text, start, end)
            # detection takes the first format with records: those after it cannot win, and need not read on
            winner = next((k for k, scan in enumerate(feeding) if scan.found()), len(feeding))
            feeding = feeding[:winner + 1]
    torn = feed.lines.finish()
    if torn:
        for scan in feeding:
            scan.finish(torn)
    return scans, feed.lines.skipped, feed.holes.runs


def _result(scans: list, skipped: int, nul_runs: int, fmt: str | None) -> Parsed:
    """The first scan with records (detection order), or NoRecords."""
    for scan in scans:
        records, found = scan.result()
        if records:
            name = found if fmt is None or fmt in FORMATS.names() else fmt
            return Parsed(name, records, skipped, dict(scan.warnings), nul_runs)
    heard = Warnings()
    for scan in scans:
        heard.update(scan.warnings)
    unread = Parsed(None, [], skipped, dict(heard.most_common(3)), nul_runs).notes()
    note = "".join(f"; {line}" for line in unread)
    if fmt is not None:
        raise NoRecords(f"no {fmt} iteration records in the log{note}")
    raise NoRecords("no iteration records in the log (formats tried: " + ", ".join(FORMATS.names()) + ")" + note)


def _scan(pieces: Iterable[str], fmt: str | None) -> Parsed:
    """Records of a text given in pieces (see parse)."""
    return _result(*_read(pieces, _parsers(fmt)), fmt)


@_collector_paused()
def parse(text: str, fmt: str | None = None) -> Parsed:
    """Records of a log in the given format, or in the format the text shows (the one yielding records,
    Megatron first). Raises ParseError when there are none."""
    return _scan(_text_pieces(text, CHUNK_BYTES), fmt)


def parse_text(text: str) -> list[Record]:
    """All iteration records of a log, in iteration order, each iteration once ([] when there are none)."""
    try:
        return parse(text).records
    except NoRecords:
        return []


def read_log(path: Path) -> str:
    """A log's whole text, for callers that search it for more than records (parse_log reads a log for its
    records in bounded memory); bytes that are not UTF-8 (a torn multi-byte character) become U+FFFD."""
    with _opened(path) as fh:
        return fh.read().decode("utf-8", errors="replace")


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[IO[bytes]]:
    """A log opened for reading; what goes wrong reading it is one line."""
    try:
        fh = Path(path).open("rb")
    except FileNotFoundError:
        raise ParseError(f"log not found: {path}") from None
    except IsADirectoryError:
        raise ParseError(f"{path} is a folder, not a log") from None
    except OSError as exc:
        raise ParseError(f"cannot read {path}: {exc.strerror}") from None
    with fh:
        try:
            yield fh
        except OSError as exc:
            raise ParseError(f"cannot read {path}: {exc.strerror}") from None


#: Log files at least this large are parsed in byte ranges by forked workers, one per core (up to 8),
#: each streaming its own range.
PARALLEL_BYTES = 32_000_000


@_collector_paused()
def _read_range(task: tuple[str, int, int, list[str], int]) -> tuple:
    """What the parsers found in one byte range of a file (which starts just after a line break)."""
    path, start, end, names, chunk_bytes = task
    with _opened(Path(path)) as fh:
        fh.seek(start)
        scans, skipped, holes = _read(_file_pieces(fh, chunk_bytes, end), names)
    return [scan.part() for scan in scans], skipped, holes


def _cuts(path: Path, size: int, workers: int) -> list[int]:
    """Byte offsets that split a file into ranges, each just after a line break so no line is split; where
    the first MiB past a split point holds no line break there is no cut."""
    cuts = [0]
    with _opened(path) as fh:
        for k in range(1, workers):
            fh.seek(size * k // workers)
            window = fh.read(1 << 20)
            breaks = [b for b in (window.find(b"\n"), window.find(b"\r")) if b >= 0]
            if breaks and size * k // workers + min(breaks) + 1 > cuts[-1]:
                cuts.append(size * k // workers + min(breaks) + 1)
    cuts.append(size)
    return cuts


def _parallel(path: Path, names: list[str], chunk_bytes: int) -> tuple[list, int, int] | None:
    """The scans of a large file read in byte ranges by forked workers, merged as one pass would have left
    them (an earlier range's line comes first); None where the file is small or there is one core."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    workers = min(os.cpu_count() or 1, 8, size // PARALLEL_BYTES)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    cuts = _cuts(path, size, workers)
    if len(cuts) < 3:  # no line break to cut at (a hole of NULs, one long line): one range, read here
        return None
    with ProcessPoolExecutor(len(cuts) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(_read_range, [(str(path), a, b, names, chunk_bytes)
                                            for a, b in zip(cuts, cuts[1:], strict=False)]))
    scans = [FORMATS.get(name)() for name in names]
    for found, _, _ in parts:
        for scan, part in zip(scans, found, strict=True):
            scan.join(part)
    return scans, sum(skipped for _, skipped, _ in parts), sum(holes for _, _, holes in parts)


@_collector_paused()
def parse_log(path: Path, fmt: str | None = None, chunk_bytes: int = CHUNK_BYTES) -> Parsed:
    """parse() for a log file, read `chunk_bytes` at a time: its text is never held whole, only its
    records. A large log is read in byte ranges by parallel workers."""
    path = Path(path)
    names = _parsers(fmt)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    found = _parallel(path, names, chunk_bytes)
    if found is None:
        with _opened(path) as fh:
            found = _read(_file_pieces(fh, chunk_bytes), names)
    return _result(*found, fmt)


def parse_file(path: Path) -> list[Record]:
    """All iteration records of a log file ([] when there are none)."""
    return parsed_file(path).records


def parsed_file(path: Path) -> Parsed:
    """parse_log of a log file, with no records where there are none."""
    try:
        return parse_log(path)
    except NoRecords:
        return Parsed(None, [])
