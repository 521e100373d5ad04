"""Reference flags that a later Megatron-LM removed, renamed or stopped reading, and what that version takes
instead (benchmark/megatron-lm/translations.yaml). A point is rendered through this table for the checkout
it will run, so the job passes what that version accepts and means what the reference meant; the rules
check reads a translated flag back as the reference's own."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from nlp_bench.errors import SpecError
from nlp_bench.paths import benchmark_dir
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.tables import FlagTable, table_for, tables_dir
from nlp_bench.spec.yamlio import check_keys, load_yaml

_KEYS = {"since", "commit", "date", "does", "becomes"}
#: in a `becomes` value: the translated flag's own value
VALUE = "{value}"


@dataclass(frozen=True)
class Translation:
    flag: str
    since: str
    commit: str
    date: str
    does: str
    #: flag -> True (a switch) or a value ("{value}" stands for the old flag's); None: no equivalent
    becomes: dict[str, Any] | None

    def applies_to(self, checkout: Checkout) -> bool:
        """Whether `checkout` has the change: a release at or after `since` has it (on a release branch it may
        have come by cherry-pick, under another hash); a checkout between releases, where its git history
        holds the commit."""
        return checkout.parsed_version >= Version(self.since) or checkout.contains(self.commit) is True

    def spelled(self, value: Any) -> dict[str, Any]:
        """The flags that say what `--flag value` said, for a version with the change."""
        assert self.becomes is not None
        return {name: value if new == VALUE else new for name, new in self.becomes.items()}

    @property
    def text(self) -> str:
        if self.becomes is None:
            instead = "no equivalent"
        elif not self.becomes:
            instead = "(dropped)"
        else:
            instead = " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in self.becomes.items())
        return f"--{self.flag} -> {instead}: {self.does} (since {self.since}, commit {self.commit[:10]})"


def translations_path() -> Path:
    return benchmark_dir() / "megatron-lm" / "translations.yaml"


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def load_translations() -> dict[str, Translation]:
    return _load(translations_path(), _mtime(translations_path()))[1]


def reference_table() -> FlagTable:
    """The flag table of the Megatron-LM the benchmark's reference pins (translations.yaml names its version)."""
    version = _load(translations_path(), _mtime(translations_path()))[0]
    table, exact = table_for(version)
    if not exact:
        raise SpecError(f"{translations_path()}: reference_version {version} has no flag table in {tables_dir()}")
    return table


@functools.lru_cache(maxsize=4)
def _load(path: Path, _mtime_ns: int) -> tuple[str, dict[str, Translation]]:
    data = load_yaml(path, "Megatron-LM translations")
    check_keys(data, {"source", "reference_version", "translations", "default_changes"}, str(path))
    if not isinstance(data.get("reference_version"), str):
        raise SpecError(f"{path}: reference_version must name the reference's Megatron-LM version, quoted")
    out = {}
    for flag, entry in (data.get("translations") or {}).items():
        where = f"{path}: {flag}"
        if not isinstance(entry, dict):
            raise SpecError(f"{where} must be a mapping")
        check_keys(entry, _KEYS, where)
        missing = _KEYS - {"becomes"} - set(entry)
        if missing or "becomes" not in entry:
            raise SpecError(f"{where} is missing {', '.join(sorted(missing | ({'becomes'} - set(entry))))}")
        try:
            Version(str(entry["since"]))
        except InvalidVersion:
            raise SpecError(f"{where}: since {entry['since']!r} is not a version number") from None
        becomes = entry["becomes"]
        if becomes is not None and not (isinstance(becomes, dict) and all(
                v is True or isinstance(v, str) for v in becomes.values())):
            raise SpecError(f"{where}: becomes must be null or a mapping of flags to true or a string")
        out[str(flag)] = Translation(str(flag), str(entry["since"]), str(entry["commit"]), str(entry["date"]),
                                     str(entry["does"]), None if becomes is None else dict(becomes))
    return data["reference_version"], out


def default_changes() -> dict[str, str]:
    """Destinations whose default differs between the reference's table and the newest one, each with why the
    reference's tags need no translation for it (translations.yaml's default_changes)."""
    data = load_yaml(translations_path(), "Megatron-LM translations")
    return {str(k): str(v) for k, v in (data.get("default_changes") or {}).items()}


def named(names: list[str], where: str) -> list[Translation]:
    """The translations a point records it was rendered through (point.json's megatron_lm.translations)."""
    known = load_translations()
    missing = [n for n in names if n not in known]
    if missing:
        raise SpecError(f"{where}: rendered through translations {', '.join(missing)}, which "
                        f"{translations_path()} no longer has")
    return [known[n] for n in names]


def for_checkout(checkout: Checkout) -> list[Translation]:
    """The translations `checkout` needs: those whose change it has (asked once per checkout: each may be a
    git call, and a sweep renders many points for one checkout)."""
    return list(_needed(checkout, _mtime(translations_path())))


def for_release(version: str) -> list[Translation]:
    """The translations a release of `version` needs: every change that came in it or before. Without a
    checkout there is no git history to ask, so a release's number is all that decides."""
    return [t for t in load_translations().values() if Version(t.since) <= Version(version)]


@functools.lru_cache(maxsize=8)
def _needed(checkout: Checkout, _mtime_ns: int) -> tuple[Translation, ...]:
    return tuple(t for t in load_translations().values() if t.applies_to(checkout))


def translate(flags: dict[str, Any], needed: list[Translation], where: str) -> tuple[dict[str, Any], list[Translation]]:
    """`flags` (flag -> value, True for a switch) as the version with `needed` takes them, in their order,
    and the translations used. A flag that version has no equivalent for is refused with the reason."""
    by_flag = {t.flag: t for t in needed}
    out: dict[str, Any] = {}
    used = []
    for flag, value in flags.items():
        found = by_flag.get(flag)
        if found is None or value is False or value is None:
            out[flag] = value
            continue
        if found.becomes is None:
            raise SpecError(f"{where}: {found.text}; drop --{flag} for this Megatron-LM")
        out.update({k: v for k, v in found.spelled(value).items() if k not in flags})  # a flag set outright wins
        used.append(found)
    return out, used
