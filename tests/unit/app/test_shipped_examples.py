"""The list of shipped examples and the refusal a fresh clone may end in, checked in-process: the glob finds
every grid, benchmark and tag (shipped_examples.py), and only a refusal that names what the machine lacks and
the setting that gives it counts as one."""

from __future__ import annotations

import pytest
from shipped_examples import BENCHMARKS, GRIDS, NEEDS, shipped_tags

from nlp_bench.errors import SpecError
from nlp_bench.spec.trainers import REPO_ENV, megatron_checkout


def test_the_shipped_examples_are_found():
    """A glob that found nothing would pass every check below by having none."""
    assert GRIDS and BENCHMARKS and len(shipped_tags()) > len(BENCHMARKS)

def test_a_refusal_passes_only_where_it_names_what_is_needed(monkeypatch):
    """The machine's refusal (no checkout where one is required) passes; the example's own fault, such as the
    refusal of gpu-small's --mock-data for the reference's Megatron-LM this test was written on, does not."""
    monkeypatch.delenv(REPO_ENV, raising=False)
    with pytest.raises(SpecError) as needed:
        megatron_checkout("", "local")
    assert NEEDS.match(f"bench: error: {needed.value}")
    assert not NEEDS.match("bench: error: tag 'gpu-small' on local-gpu (no Megatron-LM checkout here, so for the "
                           "reference's version; set MEGATRON_LM_REPO): Megatron-LM 0.4.0rc0 (f772743329) has no "
                           "flag --mock-data (its flags: flags/0.4.0rc0.tsv); drop it for --trainer megatron-lm")
