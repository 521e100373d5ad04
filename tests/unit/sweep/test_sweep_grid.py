"""Grid files: expansion semantics, every dropped point with its reason, safe expressions, rules."""



import pytest

from nlp_bench.errors import SpecError
from nlp_bench.sweep.expr import Expression
from nlp_bench.sweep.grid import expand, load_grid


def grid(tmp_path, text: str):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return load_grid(path)

def test_matrix_zip_derived_exclude_constraints(tmp_path):
    g = grid(tmp_path, """
tag: "13"
matrix: {tp: [1, 2, 4], mbs: [1, 2]}
zip: {nodes: [8, 16], pp: [4, 2]}
derived: {gas: "1024 // (nodes * 4 // (tp * pp) * mbs)"}
exclude: ["tp == 4 and mbs == 2"]
constraints: ["gas <= 128"]
""")
    e = expand(g)
    assert e.combinations == 3 * 2 * 2
    kept = {(p.layout.nodes, p.layout.tp, p.layout.pp, p.layout.mbs, p.layout.gas) for p in e.points}
    assert all(p.layout.global_batch_size == 1024 for p in e.points)
    assert (8, 2, 4, 2, 128) in kept and (16, 1, 2, 2, 16) in kept and (8, 4, 4, 1, 512) not in kept
    reasons = [d.reason for d in e.dropped]
    assert sum("excluded by 'tp == 4 and mbs == 2'" in r for r in reasons) == 2
    assert any("constraint 'gas <= 128' does not hold" in r for r in reasons)
    assert len(e.points) + len(e.dropped) == e.combinations

def test_layout_rules_and_duplicates_are_reasons(tmp_path):
    e = expand(grid(tmp_path, 'tag: "13"\nmatrix: {tp: [3, 2, 2]}\n'))
    assert [p.layout.tp for p in e.points] == [2]
    assert "tp 3 must divide the number of attention heads 32" in e.dropped[0].reason
    assert e.dropped[1].reason.startswith("duplicate of point gpt-13b_n8_tp2")

@pytest.mark.parametrize("text,message", [
    ("matrix: {tpp: [1]}", r"unknown parameter 'tpp' \(did you mean 'tp'\?\)"),
    ("matrix: {tp: 1,2}", "must be a YAML list"),
    ("matrix: {tp: '1,2'}", "not a comma string"),
    ("zip: {tp: [1, 2], pp: [1]}", "equal lengths"),
    ("derived: {gas: 'tp +'}", "cannot parse"),
    ("derived: {gas: \"__import__('os').system('touch PWNED')\"}", "only min, max, abs, int may be called"),
    ("derived: {gas: 'tp.__class__'}", "Attribute is not allowed"),
    ("derived: {gas: 'tpp * 2'}", "unknown parameter 'tpp'"),
    ("exclude: tp == 1", "must be a list"),
    ("matrixx: {tp: [1]}", r"unknown key 'matrixx' \(did you mean 'matrix'\?\)"),
    ("train: {'lr; touch x': 1}", "not a Megatron flag name"),
])
def test_grid_errors_are_clear(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        expand(grid(tmp_path, 'tag: "13"\n' + text + "\n"))
    assert not list(tmp_path.glob("PWNED"))

def test_benchmark_rules_need_no_rules(tmp_path):
    g = grid(tmp_path, 'tag: "175"\nmatrix: {hidden_size: [12288, 6144], precision: [bf16]}\n')
    with pytest.raises(SpecError, match="rules fix hidden_size.*--no-rules"):
        expand(g)
    e = expand(g, no_rules=True)
    assert {p.model.hidden_size for p in e.points} == {12288, 6144}
    assert len({p.id for p in e.points}) == 2
    smoke = expand(grid(tmp_path, "tag: smoke\nmatrix: {precision: [fp32, bf16]}\n"))
    assert [bool(p.train.get("bf16")) for p in smoke.points] == [False, True]

def test_expressions_are_safe_and_total():
    e = Expression("max(1, a // b) if b else -1", "t")
    assert e({"a": 7, "b": 2}) == 3 and e({"a": 7, "b": 0}) == -1 and e.names == {"a", "b"}
    with pytest.raises(SpecError, match="too large"):
        Expression("2 ** 100000", "t")({})

def test_a_grid_over_the_combination_limit_is_refused_before_the_stream_starts(tmp_path):
    from nlp_bench.sweep.grid import MAX_COMBINATIONS, check_size, outcomes

    g = grid(tmp_path, 'tag: "13"\nmatrix: {tp: [1, 2, 4], pp: [1, 2], mbs: [1]}\nzip: {nodes: [8, 16], gas: [2, 1]}\n')
    message = (r"grid.yaml spans 12 combinations \(tp 3 x pp 2 x zip of nodes, gas 2\), more than the 10 a sweep "
               r"expands; narrow its lists or use zip$")
    with pytest.raises(SpecError, match=message):
        outcomes(g, limit=10)  # at the call: no item asked for, no benchmark loaded
    with pytest.raises(SpecError, match=message):
        expand(g, limit=10)
    assert expand(g, limit=12).combinations == 12
    check_size(g)
    assert MAX_COMBINATIONS == 10_000_000

def test_a_replica_larger_than_the_allocation_is_said_before_a_derived_value_divides_by_zero(tmp_path):
    """The shipped 13B grid derives gas from dp, which is 0 where tp x pp exceeds the devices: the point was
    dropped for "integer division or modulo by zero"."""
    e = expand(grid(tmp_path, 'tag: "13"\nmatrix: {tp: [8], pp: [8]}\nderived: {gas: "1024 // (nodes * 4 // (tp * pp))"}\n'))
    assert not e.points
    (dropped,) = e.dropped
    assert dropped.reason == "tp 8 x pp 8 = 64 devices per replica, more than the 32 that 8 node(s) have"
    assert dropped.rule == "replica larger than the allocation"
