"""A grid's axes for what `bench plan` ranks beside the sizes: vp, recompute and the distributed optimizer, each
point named by them where they are not the tag's (issue 53, finding 1)."""

from __future__ import annotations

import pytest

from nlp_bench.errors import SpecError
from nlp_bench.spec.switches import decode
from nlp_bench.sweep.grid import expand, load_grid


def _grid(tmp_path, text: str):
    path = tmp_path / "grid.yaml"
    path.write_text('tag: "175"\n' + text)
    return load_grid(path)


def test_vp_and_recompute_axes_make_the_plans_rows(tmp_path):
    found = expand(_grid(tmp_path, "matrix: {pp: [8, 16], vp: [1, 4, 6], recompute: [none, selective, full]}\n"))
    ids = sorted(p.id for p in found.points)
    assert "gpt-175b_n96_tp8_pp16_vp6_mbs1_gas32_rc-none" in ids
    assert "gpt-175b_n96_tp8_pp8_mbs1_gas16" in ids  # the tag's own point keeps its id
    assert "gpt-175b_n96_tp8_pp16_vp6_mbs1_gas32_rc-full" in ids
    assert len(ids) == len(set(ids)) == 2 * 3 * 3 - 3  # pp 16 x vp 4 = 64 does not divide the 96 layers
    assert len(found.dropped) == 3 and all("pp x vp = 64" in d.reason for d in found.dropped)
    for point in found.points:  # the tag recomputes selectively
        on = decode(point.train).recompute
        assert point.id.endswith(f"_rc-{on}") if on != "selective" else "_rc-" not in point.id


def test_a_distributed_optimizer_axis_and_a_setting_that_cannot_be(tmp_path):
    found = expand(_grid(tmp_path, "matrix: {distributed_optimizer: [true, false], recompute: [none, some]}\n"))
    assert [p.id for p in found.points] == ["gpt-175b_n96_tp8_pp8_mbs1_gas16_rc-none",
                                           "gpt-175b_n96_tp8_pp8_mbs1_gas16_rc-none_dist-opt-off"]
    assert [d.reason for d in found.dropped] == ["recompute must be one of none, selective, full, got 'some'"] * 2


def test_an_axis_and_the_flags_it_writes_are_not_both_given(tmp_path):
    with pytest.raises(SpecError, match="has a vp axis and sets num-layers-per-virtual-pipeline-stage in train"):
        expand(_grid(tmp_path, "matrix: {vp: [1, 2]}\ntrain: {num-layers-per-virtual-pipeline-stage: 2}\n"))
