"""A benchmark's submission rules (benchmark/rules/<name>.yaml) and the check of a trainer's arguments
against them: what the rules fix, what they leave free, and every training flag of the reference.

The check works on the arguments as a trainer gets them (a list of words), not on our own point
description, so that a script edited by hand, a run made with --no-rules or a jobscript written by
someone else is judged by what it actually runs."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench.errors import SpecError, unknown
from nlp_bench.paths import benchmark_dir
from nlp_bench.spec.layout import Layout
from nlp_bench.spec.megatron.translations import VALUE, Translation
from nlp_bench.spec.switches import PRECISION_FLAGS, precision_of
from nlp_bench.spec.yamlio import check_keys, load_yaml

_KEYS = {"name", "source", "free", "fixed", "paths", "technical", "tags"}
_TAG_KEYS = {"model", "reference", "args", "defaults"}
#: an expected value that only asks for the flag to be there (a site's path)
PATH = "path"


@dataclass(frozen=True)
class TagRules:
    model: dict[str, Any]
    reference: dict[str, int]
    #: flag -> expected value: a string compared by value, True for a switch, "path", or None for "absent"
    args: dict[str, Any]
    defaults: dict[str, str]


@dataclass(frozen=True)
class Rules:
    name: str
    source: str
    free: dict[str, str | None]
    fixed: dict[str, list[str]]
    paths: frozenset[str]
    technical: frozenset[str]
    tags: dict[str, TagRules]
    path: Path

    def tag(self, tag: str) -> TagRules:
        if tag not in self.tags:
            raise SpecError(f"the {self.name} rules ({self.path}) define no tag {tag!r}; they cover "
                            f"{', '.join(self.tags)}")
        return self.tags[tag]

    def check(self, tag: str, argv: list[str], nodes: int | None,
              translations: Sequence[Translation] = ()) -> Verdict:
        """Every deviation of `argv` (a trainer's arguments) from the rules and the reference of `tag`.
        `translations` are those the arguments were rendered through for a later Megatron-LM: what they
        say instead of a reference flag counts as that flag."""
        want = self.tag(tag)
        found, translated = _as_reference(parse_argv(argv), want.args, translations)
        deviations: list[Deviation] = []
        fixed_flags = {f for flags in self.fixed.values() for f in flags}
        for name, flags in self.fixed.items():
            if name == "precision":
                try:
                    got = precision_of(found)
                except SpecError:  # both: no precision is what the rules fix
                    got = None
                if got != want.model["precision"]:
                    shown = " ".join(f"--{p}" for p in PRECISION_FLAGS if p in found) or "neither --bf16 nor --fp16"
                    deviations.append(Deviation("--bf16/--fp16", f"--{want.model['precision']}", shown,
                                                "fixed by the rules: precision"))
                continue
            for flag in flags:
                expected = want.args.get(flag)
                if not _same(expected, found.get(flag)):
                    deviations.append(Deviation(f"--{flag}", _shown(expected), _shown(found.get(flag)),
                                                f"fixed by the rules: {name}"))
        free_flags = {f for f in self.free.values() if f}
        for flag in sorted(set(want.args) | set(found), key=_order(want.args)):
            if flag in fixed_flags or flag in free_flags or flag in self.technical:
                continue
            expected, got = want.args.get(flag), found.get(flag)
            if flag in want.defaults and (got is None or _same(want.defaults[flag], got)) and expected is None:
                continue
            if expected == PATH and flag in self.paths:
                if got is None or got is True:
                    deviations.append(Deviation(f"--{flag}", "a path", _shown(got), "training argument"))
                continue
            if not _same(expected, got):
                rule = "not in the reference" if expected is None else "training argument"
                deviations.append(Deviation(f"--{flag}", _shown(expected), _shown(got), rule))
        free = {name: Free(want.reference.get(name) if name != "global_batch_size" else _reference_gbs(want),
                           nodes if flag is None else _int(found.get(flag)))
                for name, flag in self.free.items()}
        return Verdict(self.name, tag, deviations, free, [t.text for t in translated])


def _as_reference(found: dict[str, Any], expected: dict[str, Any],
                  translations: Sequence[Translation]) -> tuple[dict[str, Any], list[Translation]]:
    """`found` with each translated reference flag read back as the reference wrote it, where the arguments
    say exactly what the translation puts instead; and the translations so read."""
    out, used = dict(found), []
    for t in translations:
        if t.becomes is None or expected.get(t.flag) is None or t.flag in found:
            continue
        value: Any = True
        fits = True
        for name, new in t.becomes.items():
            got = found.get(name)
            if new == VALUE:
                fits, value = fits and got is not None and got is not True, got
            else:
                fits = fits and _same(new, got)
        if not fits:
            continue
        for name in t.becomes:
            if name not in expected:
                out.pop(name, None)
        out[t.flag] = value
        used.append(t)
    return out, used


def _reference_gbs(want: TagRules) -> int | None:
    """The reference's global batch: its data-parallel size times micro batch times accumulation steps."""
    ref = want.reference
    try:
        return Layout(ref["nodes"], ref["devices_per_node"], ref["tp"], ref["pp"], ref["mbs"], ref["gas"]).global_batch_size
    except KeyError:
        return None


def _order(args: dict[str, Any]):
    """The reference's flags in its order, then the others alphabetically."""
    index = {flag: i for i, flag in enumerate(args)}
    return lambda flag: (index.get(flag, len(index)), flag)


def _int(value: Any) -> int | None:
    try:
        return int(str(value).replace("_", ""))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Deviation:
    flag: str
    expected: str
    found: str
    rule: str

    def to_dict(self) -> dict[str, str]:
        return {"flag": self.flag, "expected": self.expected, "found": self.found, "rule": self.rule}


@dataclass(frozen=True)
class Free:
    reference: int | None
    found: int | None

    @property
    def changed(self) -> bool:
        return self.found is not None and self.found != self.reference


@dataclass(frozen=True)
class Verdict:
    rules: str
    tag: str
    deviations: list[Deviation]
    free: dict[str, Free] = field(default_factory=dict)
    #: the Megatron-LM translations read back as reference flags (spec.megatron.translations), as text
    translations: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.deviations

    @property
    def text(self) -> str:
        return "valid submission" if self.valid else f"not a submission ({len(self.deviations)} deviations)"

    def to_dict(self) -> dict[str, Any]:
        return {"rules": self.rules, "tag": self.tag, "valid": self.valid, "verdict": self.text,
                "deviations": [d.to_dict() for d in self.deviations], "translations": self.translations,
                "free": {k: {"reference": v.reference, "found": v.found, "changed": v.changed}
                         for k, v in self.free.items()}}


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """Flags to values as argparse would see them: a flag's words up to the next flag (one word a string,
    several joined by a space), a flag without words True; a flag given twice keeps its last value."""
    out: dict[str, Any] = {}
    flag: str | None = None
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            flag = None if eq else name
            out[name] = value if eq else True
        elif flag is not None:
            out[flag] = word if out[flag] is True else f"{out[flag]} {word}"
    return out


def _number(text: str) -> float | None:
    try:
        return float(text.replace("_", ""))
    except ValueError:
        return None


def _same(expected: Any, found: Any) -> bool:
    if expected is None or found is None or expected is True or found is True:
        return expected == found
    if expected == PATH:
        return found is not True
    a, b = _number(str(expected)), _number(str(found))
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return str(expected) == str(found)


def _shown(value: Any) -> str:
    return "(absent)" if value is None else "(switch)" if value is True else str(value)


def rules_dir() -> Path:
    return benchmark_dir() / "rules"


def known_rules() -> list[str]:
    return sorted(p.stem for p in rules_dir().glob("*.yaml"))


def load_rules(name: str) -> Rules:
    path = rules_dir() / f"{name}.yaml"
    if not path.is_file():
        raise SpecError(unknown("rules", name, known_rules()))
    return _parse(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parse(path: Path, _mtime_ns: int) -> Rules:
    data = load_yaml(path, "rules")
    check_keys(data, _KEYS, str(path))
    tags = {}
    for tag, spec in (data.get("tags") or {}).items():
        if not isinstance(spec, dict):
            raise SpecError(f"{path}: tag {tag!r} must be a mapping")
        check_keys(spec, _TAG_KEYS, f"{path}: tag {tag!r}")
        args = spec.get("args") or {}
        for flag, value in args.items():
            if value is not None and value is not True and not isinstance(value, str):
                raise SpecError(f"{path}: tag {tag!r}: {flag} must be a quoted string, true or null, got {value!r}")
        model = spec.get("model") or {}
        if model.get("precision") not in PRECISION_FLAGS:
            raise SpecError(f"{path}: tag {tag!r}: model.precision must be one of {', '.join(PRECISION_FLAGS)}")
        tags[str(tag)] = TagRules(dict(model), dict(spec.get("reference") or {}), dict(args),
                                  {k: str(v) for k, v in (spec.get("defaults") or {}).items()})
    if not tags:
        raise SpecError(f"{path}: no tags")
    return Rules(str(data.get("name", path.stem)), str(data.get("source", "")), dict(data.get("free") or {}),
                 {k: list(v) for k, v in (data.get("fixed") or {}).items()}, frozenset(data.get("paths") or ()),
                 frozenset(data.get("technical") or ()), tags, path)
