"""`bench plan --ep/--etp`: the experts' layout pinned like tp and pp; a dense model has none to pin."""

import json


def test_ep_and_etp_pins_keep_only_those_expert_layouts(bench):
    out = bench("plan", "--tag", "deepseek-v3", "--tp", "2", "--pp", "16", "--mbs", "1", "--recompute", "none",
                "--ep", "32", "--ep", "64", "--etp", "1", "--top", "4", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert rows and {(r["ep"], r["etp"]) for r in rows} <= {(32, 1), (64, 1)}
    assert {r["ep"] for r in rows} == {32, 64}


def test_a_dense_model_refuses_expert_pins_in_one_line(bench):
    out = bench("plan", "--tag", "13", "--ep", "2")
    assert out.exit_code == 2
    assert out.output.strip().splitlines() == [
        "bench: error: --ep/--etp pin the experts' layout, and model gpt-13b has no experts"]
