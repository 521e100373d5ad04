"""The flags a mixture-of-experts or latent-attention model writes, in Megatron-LM 0.20's own parse_args and
validate_args (one process of its own parser for every model): the spec says each model as that version takes
it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from nlp_bench.app.megatron_flags import own_parser_command
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import read_checkout
from nlp_bench.spec.megatron.target import for_megatron

#: model, nodes, tp, pp: layouts the models' layer counts and heads allow
MODELS = [("moe-tiny", 1, 1, 1), ("mixtral-8x7b", 8, 8, 1), ("qwen3-30b-a3b", 2, 2, 2), ("gpt-oss-20b", 1, 2, 2),
          ("deepseek-v3", 8, 8, 1)]


@pytest.mark.slow
def test_megatron_lm_0_20_parses_every_moe_presets_flags(unpacked, tmp_path, monkeypatch):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("Megatron-LM's parser needs torch")
    snapshot = unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz")
    monkeypatch.setenv("MEGATRON_LM_REPO", str(snapshot))
    server = subprocess.Popen(own_parser_command(sys.executable, "serve", str(snapshot)), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for model, nodes, tp, pp in MODELS:
            path = tmp_path / f"{model}.yaml"
            path.write_text(f"name: b\ntags:\n  t:\n    model: {model}\n    system: h100-8\n    nodes: {nodes}\n"
                            f"    tp: {tp}\n    pp: {pp}\n    train: {{train-iters: 2, lr: 0.1, mock-data: true}}\n")
            point = for_megatron(load_benchmark(str(path)).point("t", trainer="megatron-lm"), read_checkout(snapshot))
            argv = jobscript_args(render_jobscript(point), point.id)
            assert "--num-experts" in argv
            request = {"argv": argv, "world_size": nodes * 8, "env": {k: str(v) for k, v in point.env.items()}}
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            line = server.stdout.readline()
            assert line, f"Megatron-LM's parser stopped (exit {server.poll()})"
            reply = json.loads(line)
            assert reply["ok"], f"{model}: {reply.get('error', '')[-2000:]}"
    finally:
        server.stdin.close()
        server.wait(timeout=60)
