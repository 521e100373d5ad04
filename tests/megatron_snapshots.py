"""What the Megatron-LM version tests share beside conftest's `unpacked` and `snapshot` fixtures: what each
snapshot's own parser needs, and a shipped tag's point aimed at a Megatron-LM checkout."""

from __future__ import annotations

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.target import for_megatron

#: what each snapshot's own parser needs beyond torch (f7727433's imports its tokenizers at once)
NEEDS = {"0.4.0rc0": ("six", "regex"), "0.20.0": ()}


def megatron_point(tag: str, checkout: Checkout | None):
    """The shipped tag's point for Megatron-LM, translated for `checkout` (None: the reference's version)."""
    return for_megatron(load_benchmark().point(tag, trainer="megatron-lm"), checkout)
