"""`bench plan predict ROWS.yaml` (and `bench plan --predict`, `bench plan --model`): layouts and models a
user states outright, as when checking a published figure, with grouped-query attention, context
parallelism, FP8, uneven pipeline stages and tensor-parallel overlap; a row that cannot be laid out or timed
is answered with the reason, never ignored."""

import json

import pytest


def _rows(tmp_path, rows, name="rows.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps({"rows": rows}))  # JSON is YAML
    return path

@pytest.mark.parametrize("row,needle", [
    ({"model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8}, "every row needs an id"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 12, "global_batch_size": 8},
     "gpus 12 is not a whole number of h100-8's 8-device nodes"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "nodes": 1, "global_batch_size": 8},
     "give exactly one of gpus and nodes"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8, "tensor": 2},
     "unknown key(s) tensor"),
    ({"id": "a", "model": {"num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 64,
                           "vocab-size": 100, "heads": 4}, "system": "h100-8", "gpus": 8, "global_batch_size": 8},
     "unknown model flag(s) heads"),
    ({"id": "a", "model": {"num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "num-query-groups": 3,
                           "seq-length": 64, "vocab-size": 100}, "system": "h100-8", "gpus": 8, "global_batch_size": 8},
     "4 attention heads do not split into 3 query groups"),
    ({"id": "a", "model": "gpt-13b", "system": "nowhere/else.yaml", "gpus": 8, "global_batch_size": 8},
     "nowhere/else.yaml not found"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8, "precision": "fp4"},
     "precision must be one of bf16, fp16, fp8"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "tp": 8, "global_batch_size": 8,
      "tp_comm_overlap": True}, "tp_comm_overlap needs sequence_parallel"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8,
      "fp8_param_gather": True, "distributed_optimizer": True}, "fp8_param_gather needs precision fp8"),
    ({"id": "a", "model": "gpt-13b", "system": "h100-8", "gpus": 8, "global_batch_size": 8,
      "gradient_accumulation_fusion": "no"}, "gradient_accumulation_fusion"),
])
def test_a_faulty_row_is_one_line_naming_the_file_and_the_row(tmp_path, row, needle):
    from conftest import run_bench

    path = _rows(tmp_path, [row])
    proc = run_bench("--results-dir", str(tmp_path / "r"), "plan", "predict", str(path), cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and needle in lines[0], lines[0]
