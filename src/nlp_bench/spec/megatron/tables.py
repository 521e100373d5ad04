"""Megatron-LM's flags per version, as its own parser defines them (benchmark/megatron-lm/flags/<version>.tsv,
written by `bench rules flags CHECKOUT`): what a point's arguments are checked against before a job waits
in the queue to find out."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from nlp_bench.errors import SpecError
from nlp_bench.paths import benchmark_dir

#: dest: the argparse attribute the flag sets (two spellings of one switch share it, and a default is its)
COLUMNS = ("name", "dest", "type", "nargs", "choices", "default", "deprecated")
#: the header lines a table keeps about where it came from (`# key: value`)
HEADER_KEYS = ("version", "commit", "source", "generated")


@dataclass(frozen=True)
class Flag:
    name: str
    dest: str
    type: str
    nargs: Any
    choices: tuple[str, ...] | None
    default: Any
    deprecated: bool


@dataclass(frozen=True)
class FlagTable:
    version: str
    commit: str
    source: str
    flags: dict[str, Flag]
    path: Path

    @property
    def label(self) -> str:
        return f"Megatron-LM {self.version} ({self.commit[:10] or 'commit unknown'})"


def tables_dir() -> Path:
    return benchmark_dir() / "megatron-lm" / "flags"


def table_text(version: str, commit: str, source: str, generated: str, flags: list[dict[str, Any]]) -> str:
    """A table as it is kept: `# key: value` lines on where it came from, then one tab-separated row per flag
    (choices and default as JSON, so that a list, a None or a number reads back as itself)."""
    lines = [f"# Megatron-LM's flags as its own argument parser defines them ({len(flags)} names)",
             f"# version: {version}", f"# commit: {commit}", f"# source: {source}", f"# generated: {generated}",
             "\t".join(COLUMNS)]
    for flag in sorted(flags, key=lambda f: f["name"]):
        lines.append("\t".join([flag["name"], flag["dest"], str(flag["type"]), json.dumps(flag["nargs"]),
                                json.dumps(flag["choices"]), json.dumps(flag["default"]),
                                "yes" if flag["deprecated"] else "no"]))
    return "\n".join(lines) + "\n"


def read_table(path: Path) -> FlagTable:
    return _read(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read(path: Path, _mtime_ns: int) -> FlagTable:
    header: dict[str, str] = {}
    flags: dict[str, Flag] = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the Megatron-LM flag table {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if line.startswith("#"):
            key, sep, value = line[1:].strip().partition(": ")
            if sep and key in HEADER_KEYS:
                header[key] = value.strip()
            continue
        cells = line.split("\t")
        if cells == list(COLUMNS) or not line.strip():
            continue
        try:
            if len(cells) != len(COLUMNS):
                raise ValueError(f"{len(cells)} columns, not {len(COLUMNS)}")
            name, dest, kind, nargs, choices, default, deprecated = cells
            options = json.loads(choices)
            if options is not None and not isinstance(options, list):
                raise ValueError(f"choices {choices} is not a list")
            if deprecated not in ("yes", "no"):
                raise ValueError(f"deprecated is {deprecated!r}, not yes or no")
            flags[name] = Flag(name, dest, kind, json.loads(nargs),
                               None if options is None else tuple(str(c) for c in options),
                               json.loads(default), deprecated == "yes")
        except ValueError as exc:
            raise SpecError(f"{path}:{number}: not a flag table row ({exc}); write the table again with "
                            "`bench rules flags CHECKOUT`") from None
    if "version" not in header or not flags:
        raise SpecError(f"{path}: not a Megatron-LM flag table (no '# version:' line or no flags)")
    return FlagTable(header["version"], header.get("commit", ""), header.get("source", ""), flags, path)


def known_tables() -> list[FlagTable]:
    """Every table kept, oldest version first."""
    found = []
    for path in sorted(tables_dir().glob("*.tsv")):
        table = read_table(path)
        try:
            found.append((Version(table.version), table))
        except InvalidVersion:
            raise SpecError(f"{path}: version {table.version!r} is not a version number") from None
    if not found:
        raise SpecError(f"no Megatron-LM flag table in {tables_dir()}; add one with `bench rules flags CHECKOUT`")
    return [table for _, table in sorted(found, key=lambda pair: pair[0])]


def table_for(version: str) -> tuple[FlagTable, bool]:
    """The table of `version`, or the nearest known one (False): of the two kept versions around it, the one
    with the closer (major, minor, patch), the older where both are as close, since flags are mostly added
    and removals are translated; beyond the newest or before the oldest, that one."""
    tables = known_tables()
    want = Version(version)
    for table in tables:
        if Version(table.version) == want:
            return table, True
    older = [t for t in tables if Version(t.version) < want]
    newer = [t for t in tables if Version(t.version) > want]
    if not older or not newer:
        return (older[-1] if older else newer[0]), False

    def gap(table: FlagTable) -> list[int]:
        return [abs(a - b) for a, b in zip(_release(Version(table.version)), _release(want), strict=True)]

    return (newer[0] if gap(newer[0]) < gap(older[-1]) else older[-1]), False


def _release(version: Version) -> tuple[int, int, int]:
    parts = (*version.release, 0, 0, 0)
    return parts[0], parts[1], parts[2]
