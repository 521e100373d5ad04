"""A Megatron-LM point made concrete for the checkout it will run: its flags translated for that version and
checked against that version's own flag table, and what it was made for kept in the point's provenance."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from nlp_bench.errors import SpecError
from nlp_bench.spec.benchmark import DERIVED_FLAGS, Point
from nlp_bench.spec.megatron.checkout import Checkout, read_checkout
from nlp_bench.spec.megatron.tables import FlagTable, table_for
from nlp_bench.spec.megatron.translations import for_checkout, reference_table, translate
from nlp_bench.spec.systems import System
from nlp_bench.spec.trainers import MEGATRON_LM, REPO_ENV, megatron_checkout


def checkout_for(system: System, required: bool) -> Checkout | None:
    """The checkout a submission on `system` will run ($MEGATRON_LM_REPO, else the profile's). Where the
    profile's is not here, a dry run (not `required`) gets None and renders the reference's flags; a checkout
    named by $MEGATRON_LM_REPO that cannot be read is an error either way."""
    try:
        return read_checkout(megatron_checkout(system.megatron_lm_repo, system.name))
    except SpecError:
        if required or os.environ.get(REPO_ENV):
            raise
        return None


def for_megatron(point: Point, checkout: Checkout | None) -> Point:
    """`point` as `checkout` takes it; a point of the built-in trainer as it is. Without a checkout (a dry
    run on a machine that has none) the flags are the reference's, checked against its version's table."""
    if point.trainer != MEGATRON_LM:
        return point
    where = f"tag {point.tag!r} on {point.system.name}"
    if checkout is None:
        table, exact, needed = reference_table(), True, []
        where += " (no Megatron-LM checkout here, so for the reference's version; set MEGATRON_LM_REPO)"
    else:
        (table, exact), needed = table_for(checkout.version), for_checkout(checkout)
    train, used = translate(point.train, needed, f"{where}, {checkout.label if checkout else table.label}")
    # a translation's own flags are the newer spelling: a nearest table older than the change lacks them
    # (the tests hold each one to the newest table)
    spelled = set() if exact else {flag for t in used for flag in t.becomes or {}}
    check_flags(table, [k for k, v in train.items() if v is not False and v is not None and k not in spelled], where)
    provenance: dict[str, Any] = {
        **(checkout.to_dict() if checkout else {"repo": None, "version": None, "commit": None, "modified": False}),
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
        return (f"no Megatron-LM checkout here: the arguments are the reference's, checked against the flags of "
                f"Megatron-LM {made['flag_table_version']}")
    if not made["flag_table_exact"]:
        return (f"Megatron-LM {made['version']} has no flag table here: checked against the nearest known, "
                f"{made['flag_table_version']} ({made['flag_table']}); add its own with `bench rules flags "
                f"{made['repo']}`")
    return None


def check_flags(table: FlagTable, flags: list[str], where: str) -> None:
    """Refuse a flag this Megatron-LM would stop on, before a job waits in the queue to find out."""
    strange = sorted({f for f in [*flags, *DERIVED_FLAGS] if f not in table.flags})
    if strange:
        raise SpecError(f"{where}: {table.label} has no flag {', '.join('--' + f for f in strange)} (its flags: "
                        f"{table.path}); drop it for --trainer megatron-lm")
