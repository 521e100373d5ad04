import pytest

from nlp_bench.errors import LayoutError, SpecError
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.layout import Layout, problems, valid_layout
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import load_system


def test_presets_match_the_benchmark():
    m13, m175 = get_model("gpt-13b"), get_model("gpt-175b")
    assert (m13.hidden_size, m13.num_layers, m13.num_attention_heads, m13.ffn_hidden_size) == (5120, 40, 32, 20480)
    assert (m175.hidden_size, m175.num_layers, m175.num_attention_heads, m175.ffn_hidden_size) == (12288, 96, 96, 49152)
    assert m13.seq_length == m175.seq_length == 2048 and m13.vocab_size == 50257
    assert 12.5e9 < m13.parameters(50432) < 13.5e9
    assert 170e9 < m175.parameters(51200) < 180e9

@pytest.mark.parametrize("tp,padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_vocab_padded_as_megatron_pads(tp, padded):
    assert pad_vocab(50257, tp) == padded

def test_layout_derivation():
    lay = Layout(nodes=96, devices_per_node=4, tp=8, pp=8, mbs=1, gas=16)
    assert (lay.world, lay.dp, lay.global_batch_size) == (384, 6, 96)
    lay = Layout(nodes=8, devices_per_node=4, tp=2, pp=4, mbs=1, gas=256)
    assert (lay.dp, lay.global_batch_size) == (4, 1024)

def test_layout_reasons_are_in_words():
    m = get_model("gpt-13b")
    found = problems(m, Layout(nodes=3, devices_per_node=4, tp=3, pp=3, mbs=1, gas=1))
    text = " ".join(found)
    assert "tp 3 must divide the number of attention heads 32" in text
    assert "pp 3 must divide the number of layers 40" in text
    assert any("tp x pp = 9 must divide the 12 devices" in f for f in found)
    with pytest.raises(LayoutError, match="impossible layout for gpt-13b"):
        valid_layout(m, Layout(nodes=1, devices_per_node=4, tp=8, pp=1, mbs=1, gas=1))
    assert problems(m, Layout(nodes=0, devices_per_node=4, tp=1, pp=1, mbs=1, gas=1)) == [
        "nodes must be a positive integer, got 0"]

def test_benchmark_tags_reproduce_the_reference():
    bench = load_benchmark("nlp")
    assert bench.default_tag == "175"
    p175 = bench.point()
    assert p175.tag == "175" and p175.layout.nodes == 96 and p175.layout.global_batch_size == 96
    assert p175.train["bf16"] is True and p175.train["init-method-std"] == 0.0048 and not p175.train["fp16"]
    p13 = bench.point("13")
    assert (p13.layout.tp, p13.layout.pp, p13.layout.gas, p13.layout.global_batch_size) == (2, 4, 256, 1024)
    assert p13.train["fp16"] is True and p13.train["lr-warmup-samples"] == 216320
    smoke = bench.point("smoke")
    assert smoke.system.name == "local" and smoke.layout.world == 2 and smoke.layout.tp == 2
    assert smoke.train["mock-data"] is True

def test_layout_overrides_and_their_errors():
    bench = load_benchmark("nlp")
    p = bench.point("13", nodes=16, gas=128)
    assert p.layout.dp == 8 and p.layout.global_batch_size == 1024
    with pytest.raises(LayoutError, match="tp 5 must divide"):
        bench.point("13", tp=5)
    with pytest.raises(SpecError, match="has 1"):
        bench.point("smoke", nodes=2)

def test_benchmark_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tags: {x: {model: gpt-tiny, system: local, nodes: 1, tpp: 2}}\n")
    with pytest.raises(SpecError, match=r"unknown key 'tpp' \(did you mean 'tp'\?\)"):
        load_benchmark(str(bad))
    bad.write_text("tags: [1, 2\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_benchmark(str(bad))
    with pytest.raises(SpecError, match="benchmark file not found"):
        load_benchmark(str(tmp_path / "missing.yaml"))
    bad.write_text("tags: {x: {model: gpt-tiny, system: local, nodes: 1, train: {num-layers: 3}}}\n")
    with pytest.raises(SpecError, match="may not set num-layers"):
        load_benchmark(str(bad)).point("x")

def test_one_home_for_the_layout_rules():
    """The spec, the planner and the trainer ask the same function, so the same sizes break the same rules."""
    from nlp_bench.plan.candidate import Candidate
    from nlp_bench.spec.layout import parallel_violations, violations

    m = get_model("gpt-13b")
    layout = Layout(nodes=3, devices_per_node=4, tp=3, pp=3, mbs=1, gas=1)
    by_spec = [v.rule for v in violations(m, layout)]
    by_flags = [v.rule for v in parallel_violations(world=12, tp=3, pp=3, num_layers=40, num_attention_heads=32,
                                                    ffn_hidden_size=20480, hidden_size=5120, seq_length=2048)]
    assert by_spec == by_flags == ["tp-pp-world", "tp-heads", "tp-ffn", "pp-layers"]
    # interleaving: vp as chunks per rank (planner) and as layers per chunk (Megatron's flag) agree
    chunks = parallel_violations(world=64, tp=1, pp=8, num_layers=96, num_attention_heads=96, ffn_hidden_size=4,
                                 chunks=2, micro_batches=12)
    per_chunk = parallel_violations(world=64, tp=1, pp=8, num_layers=96, num_attention_heads=96, ffn_hidden_size=4,
                                    layers_per_chunk=6, micro_batches=12)
    assert [v.rule for v in chunks] == [v.rule for v in per_chunk] == ["vp-microbatches"]
    assert Candidate.of(16, 4, 1, 8, 1, 12, vp=2).problems(m)[-1] == chunks[0].message.replace("(12)", "(12)")

BOMB = "\n".join(["train:", '  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
                 + [f"  {n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)])

def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    from nlp_bench.spec.yamlio import load_yaml

    path = tmp_path / "grid.yaml"
    path.write_text('tag: "13"\nmatrix:\n  tp: [1]\n  pp: [2]\n  tp: [2]\n')
    with pytest.raises(SpecError, match=r"grid.yaml: key 'tp' appears twice \(lines 3 and 5\)$"):
        load_yaml(path, "grid")
    path.write_text('matrix: {tp: [1]}\ntag: "13"\nmatrix: {pp: [2]}\n')
    with pytest.raises(SpecError, match=r"key 'matrix' appears twice \(lines 1 and 3\)"):
        load_yaml(path, "grid")
    path.write_text("x: {a: 1, a: 2}\n")
    with pytest.raises(SpecError, match=r"key 'a' appears twice \(both on line 1\)"):
        load_yaml(path, "grid")

def test_a_key_given_twice_in_a_benchmark_tag_or_a_system_profile_is_refused(tmp_path, site):

    bench = tmp_path / "b.yaml"
    bench.write_text("tags:\n  x:\n    model: gpt-tiny\n    system: local\n    nodes: 1\n    train:\n"
                     "      lr: 1.0e-3\n      log-interval: 5\n      lr: 1.0e-4\n")
    with pytest.raises(SpecError, match=r"b.yaml: key 'lr' appears twice \(lines 7 and 9\)"):
        load_benchmark(str(bench))
    profile = site / "slurm" / "systems" / "local.yaml"
    lines = profile.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("devices_per_node:")) + 1
    profile.write_text("\n".join([*lines, "devices_per_node: 4", ""]))
    with pytest.raises(SpecError, match=rf"local.yaml: key 'devices_per_node' appears twice \(lines {first} and "
                                        rf"{len(lines) + 1}\)"):
        load_system("local")

def test_anchors_and_merge_keys_of_modest_use_still_load(tmp_path):
    """The shipped benchmark and rules share blocks with `<<: *name`; a key after the merge overrides the
    merged one (that is not a key given twice)."""
    from nlp_bench.spec.yamlio import load_yaml

    path = tmp_path / "b.yaml"
    path.write_text("base: &base {lr: 1.0e-3, log-interval: 5}\nsizes: &sizes [1, 2, 4]\n"
                    "a: {<<: *base, lr: 2.0e-3}\nb:\n  <<: *base\n  seq: *sizes\n")
    assert load_yaml(path, "benchmark") == {"base": {"lr": 1e-3, "log-interval": 5}, "sizes": [1, 2, 4],
                                            "a": {"lr": 2e-3, "log-interval": 5},
                                            "b": {"lr": 1e-3, "log-interval": 5, "seq": [1, 2, 4]}}
    assert load_benchmark("nlp").point("175").train["bf16"] is True

@pytest.mark.parametrize("what", ["grid", "benchmark"])
def test_an_alias_bomb_is_refused_at_its_alias(tmp_path, what):
    """A few hundred bytes that alias 9 lists of 9 nine levels deep stand for 9^9 strings; the loader
    refuses them at the alias that takes the document past its bound, not after building them."""
    from nlp_bench.spec.yamlio import load_yaml
    from nlp_bench.sweep.grid import load_grid

    path = tmp_path / f"{what}.yaml"
    path.write_text(('tag: "13"\n' if what == "grid" else "tags: {}\n") + BOMB + "\n")
    assert len(path.read_bytes()) < 600
    pattern = rf"{what}.yaml line \d+: the alias \*[a-i] expands the document past 100 times its own size"
    with pytest.raises(SpecError, match=pattern):
        load_grid(path) if what == "grid" else load_benchmark(str(path))
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(SpecError, match=r"line 1: the alias \*a stands inside the node it names"):
        load_yaml(path, what)

def test_text_that_is_not_utf8_and_deep_or_badly_tagged_values_are_one_line(tmp_path):
    from nlp_bench.spec.yamlio import load_yaml

    path = tmp_path / "grid.yaml"
    path.write_bytes(b'tag: "13"\n# caf\xe9 au lait\nmatrix: {tp: [1]}\n')
    with pytest.raises(SpecError, match=r"grid.yaml line 2: not UTF-8 text: byte 0xe9 at offset 15"):
        load_yaml(path, "grid")
    path.write_text("a: " + "[" * 150 + "]" * 150 + "\n")
    with pytest.raises(SpecError, match="grid.yaml line 1: nested more than 100 levels deep"):
        load_yaml(path, "grid")
    # libyaml's composer crashes the interpreter here; libyaml's scanner (PyYAML 6.0.4) refuses past 1,000 levels
    # before any event reaches the checks, in its own words: one line either way
    path.write_text("a: " + "[" * 30_000 + "]" * 30_000 + "\n")
    with pytest.raises(SpecError, match="grid.yaml line 1: (nested more than 100 levels deep|invalid YAML: exceeded "
                                        "maximum nesting depth)$"):
        load_yaml(path, "grid")
    for text, shown in [("a: !!int abc", "'abc' as !!int"), ("a: !!timestamp soon", "'soon' as !!timestamp"),
                        ("a: !!bool maybe", "'maybe' as !!bool"), ("a: " + "9" * 5000, r"'9{40}\.\.\.' as !!int")]:
        path.write_text(text + "\n")
        with pytest.raises(SpecError, match=rf"grid.yaml line 1: invalid YAML: cannot read {shown}"):
            load_yaml(path, "grid")

def test_a_path_that_cannot_be_read_is_one_line_with_the_reason(tmp_path, monkeypatch):
    import errno
    import os

    from nlp_bench.spec.yamlio import load_yaml

    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(SpecError, match=r"folder.yaml: cannot read the grid file: Is a directory$"):
        load_yaml(folder, "grid")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it for reading as usual would wait for a writer for ever
    with pytest.raises(SpecError, match=r"fifo.yaml: not a regular file, so not a grid file"):
        load_yaml(fifo, "grid")
    with pytest.raises(SpecError, match=r"^grid file not found: .*missing.yaml$"):
        load_yaml(tmp_path / "missing.yaml", "grid")
    readable = tmp_path / "g.yaml"
    readable.write_text("tag: smoke\n")
    for code in (errno.EACCES, errno.EIO):  # as root, a file without read permission is still read

        def refuse(path, flags, *args, code=code, **kwargs):
            raise OSError(code, os.strerror(code), str(path))

        with monkeypatch.context() as patch:
            patch.setattr(os, "open", refuse)
            with pytest.raises(SpecError, match=rf"g.yaml: cannot read the grid file: {os.strerror(code)}$"):
                load_yaml(readable, "grid")

def test_a_tag_whose_layout_does_not_fit_the_system_says_its_batch_is_undefined_there(bench):
    """smoke lays out tp 2 on one node; on a one-device system its global batch (dp x mbs x gas) has no dp. This
    was `gas must be a positive integer, got 0`."""
    result = bench("run", "--tag", "smoke", "--system", "local-gpu", "--tp", "1", "--dry-run")
    assert result.exit_code == 2
    assert ("tag 'smoke': its layout (tp 2 x pp 1 on 1 node(s) of 1 devices) does not fit system 'local-gpu', so "
            "its global batch is not defined there: give --gas or --global-batch-size") in result.output
    assert bench("run", "--tag", "smoke", "--system", "local-gpu", "--tp", "1", "--gas", "2", "--dry-run").exit_code == 0
