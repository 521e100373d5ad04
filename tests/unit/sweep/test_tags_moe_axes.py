"""Sweep axes ep and etp: the expert layout of an MoE tag swept like tp and pp, every combination Megatron-core
would refuse dropped and counted by its rule (expert tp x ep x pp tiles the devices, ep divides the experts)."""

from __future__ import annotations

import collections

from nlp_bench.spec.layout import RULE_WORDS
from nlp_bench.sweep.grid import expand, load_grid


def _expand(tmp_path, text: str):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return expand(load_grid(path))


def test_ep_and_etp_axes_drop_what_megatron_core_refuses_by_rule(tmp_path):
    # Mixtral's 8 experts on 8 nodes (64 GPUs) at pp 4: etp x ep must divide the 16 devices of a stage
    found = _expand(tmp_path, "tag: mixtral-8x7b\nmatrix: {ep: [4, 8, 16, 32], etp: [1, 2]}\n")
    kept = sorted((p.layout.ep, p.layout.expert_tp) for p in found.points)
    assert kept == [(4, 1), (4, 2), (8, 1), (8, 2)]
    assert {p.id for p in found.points} >= {"mixtral-8x7b_n8_tp1_pp4_vp8_ep8_etp2_mbs1_gas16"}
    counted = collections.Counter(d.rule for d in found.dropped)
    assert counted == {RULE_WORDS["ep-experts"]: 1, RULE_WORDS["ep-world"]: 3}, found.dropped
    (experts,) = [d for d in found.dropped if d.rule == RULE_WORDS["ep-experts"]]
    assert (experts.params["ep"], experts.params["etp"]) == (16, 1)
    assert "ep 16 must divide the 8 experts" in experts.reason


def test_without_an_etp_axis_the_experts_take_tp(tmp_path):
    found = _expand(tmp_path, "tag: smoke-moe\nsystem: local-slurm\nmatrix: {ep: [1, 2, 4]}\n")
    assert [(p.layout.ep, p.layout.etp, p.id) for p in found.points] == [
        (1, None, "moe-tiny_n2_tp1_pp1_mbs2_gas2"), (2, None, "moe-tiny_n2_tp1_pp1_ep2_mbs2_gas2"),
        (4, None, "moe-tiny_n2_tp1_pp1_ep4_mbs2_gas2")]
    assert not found.dropped
