"""A Megatron-LM point made concrete for the checkout it will run: its flags translated for that version and
checked against that version's own flag table, and what it was made for kept in the point's provenance."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from packaging.version import Version

from nlp_bench.errors import SpecError
from nlp_bench.spec.benchmark import EXPERT_FLAGS, Point, rendered_derived_flags
from nlp_bench.spec.megatron.checkout import Checkout, read_checkout
from nlp_bench.spec.megatron.tables import FlagTable, known_tables, table_for
from nlp_bench.spec.megatron.translations import (
    Translation,
    for_checkout,
    for_release,
    named,
    reference_table,
    translate,
)
from nlp_bench.spec.models import ModelSpec
from nlp_bench.spec.systems import System
from nlp_bench.spec.trainers import MEGATRON_LM, REPO_ENV, megatron_checkout


def checkout_for(system: System, required: bool) -> Checkout | None:
    """The checkout a submission on `system` will run ($MEGATRON_LM_REPO, else the profile's). Where the
    profile's is not here, a dry run (not `required`) gets None and renders for a kept release; a checkout
    named by $MEGATRON_LM_REPO that cannot be read is an error either way."""
    try:
        return read_checkout(megatron_checkout(system.megatron_lm_repo, system.name))
    except SpecError:
        if required or os.environ.get(REPO_ENV):
            raise
        return None


def for_megatron(point: Point, checkout: Checkout | None) -> Point:
    """`point` as `checkout` takes it; a point of the built-in trainer as it is. Without a checkout (a dry
    run on a machine that has none) the version is not known, so the point is made for a kept release that
    takes its flags (see _for_a_release); a submission needs the checkout and checks again against it."""
    if point.trainer != MEGATRON_LM:
        return point
    where = f"tag {point.tag!r} on {point.system.name}"
    if checkout is None:
        return _for_a_release(point, where)
    (table, exact), needed = table_for(checkout.version), for_checkout(checkout)
    return _made(point, table, exact, needed, f"{where}, {checkout.label}", where, checkout.to_dict())


def _for_a_release(point: Point, where: str) -> Point:
    """`point` made for the reference's Megatron-LM where that version takes its flags (the benchmark's own
    tags), else for the oldest later release with a flag table that does: a tag written for a newer
    Megatron-LM (mock data, which the reference's version does not have) is not refused for a flag its
    checkout will have. A flag no kept version takes is refused with the newest's answer (what a site would
    check out today)."""
    reference = reference_table()
    later = [t for t in known_tables() if Version(t.version) > Version(reference.version)]
    versions = ", ".join(t.version for t in [reference, *later])
    where = (f"{where} (no Megatron-LM checkout here, and no kept version takes these flags: {versions}; set "
             f"{REPO_ENV})")
    unknown: dict[str, Any] = {"repo": None, "version": None, "commit": None, "modified": False}
    *older, newest = [reference, *later]
    for table in older:
        try:
            return _made(point, table, True, for_release(table.version), f"{where}, {table.label}", where, unknown)
        except SpecError:
            continue
    return _made(point, newest, True, for_release(newest.version), f"{where}, {newest.label}", where, unknown)


def _made(point: Point, table: FlagTable, exact: bool, needed: list[Translation], where_translated: str,
          where: str, made_for: dict[str, Any]) -> Point:
    train, used = translate(point.train, needed, where_translated)
    # a translation's own flags are the newer spelling: a nearest table older than the change lacks them
    # (the tests hold each one to the newest table)
    spelled = set() if exact else {flag for t in used for flag in t.becomes or {}}
    check_flags(table, [k for k, v in train.items() if v is not False and v is not None and k not in spelled], where,
                rendered_derived_flags(point.layout), point.model if point.model.moe else None)
    provenance: dict[str, Any] = {
        **made_for,
        "flag_table": table.path.name, "flag_table_version": table.version, "flag_table_exact": exact,
        # every change of the reference's flags this version has (the rules check reads them back), and those
        # this point's flags went through
        "translations": [t.flag for t in needed], "translated": [t.flag for t in used],
    }
    return dataclasses.replace(point, train=train, megatron_lm=provenance)


def table_note(point: Point) -> str | None:
    """One line where a point's flags were checked against another version's table than the one it runs."""
    made = point.megatron_lm
    if not made:
        return None
    if made["version"] is None:
        reference = reference_table()
        if made["flag_table_version"] == reference.version:
            return (f"no Megatron-LM checkout here: the arguments are the reference's, checked against the flags "
                    f"of Megatron-LM {made['flag_table_version']}")
        return (f"no Megatron-LM checkout here, and the reference's Megatron-LM {reference.version} has no "
                f"{', '.join('--' + f for f in _lacking(point, reference))}: the arguments are made for "
                f"Megatron-LM {made['flag_table_version']}, the oldest kept version that takes them; set "
                f"{REPO_ENV} to make them for the checkout that will run")
    if not made["flag_table_exact"]:
        return (f"Megatron-LM {made['version']} has no flag table here: checked against the nearest known, "
                f"{made['flag_table_version']} ({made['flag_table']}); add its own with `bench rules flags "
                f"{made['repo']}`")
    return None


def _lacking(point: Point, table: FlagTable) -> list[str]:
    """The flags of `point` that `table` does not have, leaving out the newer spellings a translation put in
    place of a flag the table does have."""
    spelled = {flag for t in named(point.megatron_lm["translated"], point.id) for flag in t.becomes or {}}
    return sorted(f for f, v in point.train.items() if v is not False and v is not None and f not in table.flags
                  and f not in spelled)


def check_flags(table: FlagTable, flags: list[str], where: str, derived: set[str],
                moe: ModelSpec | None = None) -> None:
    """Refuse a flag this Megatron-LM would stop on, before a job waits in the queue to find out (`derived`: the
    flags the jobscript derives from the model and layout, rendered_derived_flags). For a mixture-of-experts
    `moe` model the flags of its experts and their layout are not the user's to drop: the line says that this
    version lacks them and which kept versions have them."""
    strange = sorted({f for f in [*flags, *derived] if f not in table.flags})
    if not strange:
        return
    experts = [f for f in strange if moe is not None and _expert_flag(f)]
    rest = [f for f in strange if f not in experts]
    lacks = f"{where}: {table.label} has no"
    if experts:
        having = [t.version for t in known_tables() if all(f in t.flags for f in experts)]
        lacks += (f" mixture of experts as model {moe.name} needs it (no {', '.join('--' + f for f in experts)}): use a "
                  f"Megatron-LM that has it ({', '.join(having) or 'none kept here'}; set {REPO_ENV} to its checkout)")
        lacks += "; nor" if rest else f" (its flags: {table.path})"
    if rest:
        lacks += (f" flag {', '.join('--' + f for f in rest)} (its flags: {table.path}); drop it for --trainer "
                  "megatron-lm")
    raise SpecError(lacks)


def _expert_flag(flag: str) -> bool:
    """Whether `flag` is one of Megatron-LM's mixture-of-experts flags (its names say so)."""
    return flag.startswith("moe-") or flag in ("num-experts", *EXPERT_FLAGS.values())
