"""Which global batch a point trains when its layout differs from its tag's: one rule, chosen explicitly, the
same for `bench run`, `bench sweep` and `bench plan`.

- keep-global-batch (the default): the tag's global batch stays; the gradient-accumulation steps follow
  from dp x mbs. Changing nodes, tp, pp or mbs then changes how the batch is computed, not what is trained,
  so layouts compare, and `--nodes` measures strong scaling.
- keep-gas: the tag's gradient-accumulation steps stay and the global batch follows dp x mbs, as the
  JUPITER reference's own scaling rows were made (its Batch_Size column follows the nodes): weak scaling.

Giving the gradient-accumulation steps (`--gas`, a `gas` axis) or the global batch (`--global-batch-size`)
outright decides for that point instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from nlp_bench.errors import LayoutError, SpecError, unknown

KEEP_GLOBAL_BATCH, KEEP_GAS = "keep-global-batch", "keep-gas"
BATCH_RULES = (KEEP_GLOBAL_BATCH, KEEP_GAS)
DEFAULT_BATCH_RULE = KEEP_GLOBAL_BATCH


def check_rule(rule: str, where: str = "--batch") -> str:
    if rule not in BATCH_RULES:
        raise SpecError(f"{where}: {unknown('batch rule', str(rule), BATCH_RULES)}")
    return rule


#: what decided a batch, in the words a summary of many points uses
HOW_WORDS = {KEEP_GLOBAL_BATCH: KEEP_GLOBAL_BATCH, KEEP_GAS: KEEP_GAS, "gas": "gas given, the batch follows dp x mbs",
             "global batch": "global batch given"}


@dataclass(frozen=True)
class BatchChoice:
    """How a point's global batch came about, for the line every command prints."""

    global_batch_size: int
    gas: int
    #: what decided it: one of BATCH_RULES, "gas" (given outright) or "global batch" (given outright)
    how: str
    #: the tag's own global batch (the reference's, for the benchmark's tags) and gradient accumulation
    tag_global_batch_size: int
    tag_gas: int

    def words(self) -> str:
        """E.g. `global batch 96 (the tag's, kept: gas 32 follows from dp 3 x mbs 1)`."""
        if self.how == KEEP_GLOBAL_BATCH:
            said = f"the tag's, kept; gas {self.gas} follows"
        elif self.how == KEEP_GAS:
            said = f"gas {self.gas} kept from the tag (--batch keep-gas), the batch follows dp x mbs"
        elif self.how == "gas":
            said = f"gas {self.gas} as given, the batch follows dp x mbs"
        else:
            said = f"as given; gas {self.gas} follows"
        beside = ("" if self.global_batch_size == self.tag_global_batch_size
                  else f"; the tag's is {self.tag_global_batch_size}")
        return f"global batch {self.global_batch_size} ({said}{beside})"


def choose(rule: str, tag_gbs: int, tag_gas: int, dp: int, mbs: int, gas: int | None = None,
           global_batch_size: int | None = None) -> BatchChoice:
    """The point's gradient-accumulation steps and global batch under `rule`, or a LayoutError that says
    which batch cannot be kept and what to give instead."""
    if gas is not None and global_batch_size is not None:
        raise SpecError("give the gradient-accumulation steps (--gas) or the global batch (--global-batch-size), "
                        "not both: each decides the other")
    if gas is not None:
        return BatchChoice(dp * mbs * gas, gas, "gas", tag_gbs, tag_gas)
    if rule == KEEP_GAS and global_batch_size is None:
        return BatchChoice(dp * mbs * tag_gas, tag_gas, KEEP_GAS, tag_gbs, tag_gas)
    target = global_batch_size or tag_gbs
    if target % (dp * mbs):
        given = "the given" if global_batch_size else "the tag's"
        raise LayoutError(f"{given} global batch {target} is no multiple of dp {dp} x mbs {mbs}: give --gas N (the "
                          "batch then follows), another --global-batch-size, or --batch keep-gas")
    return BatchChoice(target, target // (dp * mbs), "global batch" if global_batch_size else KEEP_GLOBAL_BATCH,
                       tag_gbs, tag_gas)
