"""The built-in trainer beside Megatron-LM on the same layout: which of the two trains faster, and by
how much, from rows measured in the same run (the same nodes, the same day)."""

from __future__ import annotations

from typing import Any

from nlp_bench.errors import ResultError
from nlp_bench.spec.trainers import BUILTIN, MEGATRON_LM
from nlp_bench.store import states

_SAME = ("model", "system", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS")
TRAINER_COLUMNS = ["model", "system", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS", "builtin_Tokens/sec",
           "megatron-lm_Tokens/sec", "builtin/megatron-lm"]


def pair_trainers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per layout that both trainers completed: both tokens/s and their ratio (built-in over
    Megatron-LM: above 1, the built-in trainer is faster)."""
    pairs: dict[tuple, dict[str, float]] = {}
    for row in rows:
        if row.get("state") == states.COMPLETED and row.get("Tokens/sec"):
            pairs.setdefault(tuple(row[k] for k in _SAME), {})[row.get("trainer") or BUILTIN] = row["Tokens/sec"]
    out = []
    for key, by in pairs.items():
        if {BUILTIN, MEGATRON_LM} <= set(by):
            out.append({**dict(zip(_SAME, key, strict=True)), "builtin_Tokens/sec": by[BUILTIN],
                        "megatron-lm_Tokens/sec": by[MEGATRON_LM], "builtin/megatron-lm": by[BUILTIN] / by[MEGATRON_LM]})
    if not out:
        raise ResultError("no layout completed with both trainers; run a grid with the axis "
                          "`trainer: [builtin, megatron-lm]`")
    return out
