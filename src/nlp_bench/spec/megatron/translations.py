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
        """Whether `checkout` has the change: its git history says so where it can, else its version."""
        held = checkout.contains(self.commit)
        return held if held is not None else checkout.parsed_version >= Version(self.since)

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


def load_translations() -> dict[str, Translation]:
    path = translations_path()
    return _load(path, path.stat().st_mtime_ns if path.exists() else 0)


@functools.lru_cache(maxsize=4)
def _load(path: Path, _mtime_ns: int) -> dict[str, Translation]:
    data = load_yaml(path, "Megatron-LM translations")
    check_keys(data, {"source", "translations"}, str(path))
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
    return out


def named(names: list[str], where: str) -> list[Translation]:
    """The translations a point records it was rendered through (point.json's megatron_lm.translations)."""
    known = load_translations()
    missing = [n for n in names if n not in known]
    if missing:
        raise SpecError(f"{where}: rendered through translations {', '.join(missing)}, which "
                        f"{translations_path()} no longer has")
    return [known[n] for n in names]


def for_checkout(checkout: Checkout) -> list[Translation]:
    """The translations `checkout` needs: those whose change it has."""
    return [t for t in load_translations().values() if t.applies_to(checkout)]


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
