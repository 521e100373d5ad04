"""What the Megatron-LM version tests share beside conftest's `unpacked` and `snapshot` fixtures: what each
snapshot's own parser needs, a shipped tag's point aimed at a Megatron-LM checkout, and a snapshot's own
model FLOPs function."""

from __future__ import annotations

from pathlib import Path

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.target import for_megatron

#: what each snapshot's own parser needs beyond torch (f7727433's imports its tokenizers at once)
NEEDS = {"0.4.0rc0": ("six", "regex"), "0.20.0": ()}


def megatron_point(tag: str, checkout: Checkout | None):
    """The shipped tag's point for Megatron-LM, translated for `checkout` (None: the reference's version)."""
    return for_megatron(load_benchmark().point(tag, trainer="megatron-lm"), checkout)


def megatrons_flops_function(snapshot: Path):
    """num_floating_point_operations as the snapshot's training.py defines it, run as it is: the function alone,
    with the model-kind predicates it calls answering for a transformer (no hybrid, no linear attention)."""
    import ast

    source = (snapshot / "megatron" / "training" / "training.py").read_text()
    (node,) = [n for n in ast.parse(source).body
               if isinstance(n, ast.FunctionDef) and n.name == "num_floating_point_operations"]
    space = {"is_hybrid_model": lambda args: False, "is_linear_attention_variant": lambda variant: False,
             "is_gated_delta_net_variant": lambda variant: False}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "training.py", "exec"), space)
    return space["num_floating_point_operations"]
