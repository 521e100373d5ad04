"""The published reference rows (results/reference/jupiter.csv), as rows of the result table.

The CSV keeps only what was published (layout and tokens/s); TFLOPs and the time to report are
derived here with the same functions a measured run uses, which is what makes the comparison fair.
"""

from __future__ import annotations

import csv
from typing import Any

from nlp_bench import flops
from nlp_bench.analysis.results import COLUMNS
from nlp_bench.paths import reference_dir
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import load_system

REFERENCE_CSV = "jupiter.csv"


def reference_rows() -> list[dict[str, Any]]:
    rows = []
    with (reference_dir() / REFERENCE_CSV).open(newline="") as fh:
        for rec in csv.DictReader(fh):
            model, system = get_model(rec["model"]), load_system(rec["system"])
            devices = int(rec["Nodes"]) * system.devices_per_node
            tp, gbs, nodes = int(rec["Tensor_Parallel"]), int(rec["Batch_Size"]), int(rec["Nodes"])
            tokens_per_s = float(rec["Tokens/sec"])
            seconds = gbs * model.seq_length / tokens_per_s
            # the reference runs use selective recompute, which the JUPITER convention counts (k = 4)
            shape = flops.Shape(gbs, model.seq_length, model.num_layers, model.hidden_size,
                                pad_vocab(model.vocab_size, tp), model.ffn_hidden_size, recompute=True)
            row = dict.fromkeys(COLUMNS)
            row.update({
                "system": rec["system"], "version": "reference", "queue": system.partition,
                "Model_Size": model.nominal_billions, "Nodes": nodes, "Batch_Size": gbs,
                "Pipeline_Parallel": int(rec["Pipeline_Parallel"]), "Tensor_Parallel": tp,
                "Avg_TFLOPs/GPU": flops.tflops_per_device(flops.jupiter_flops(shape), seconds, devices),
                "Tokens/sec": tokens_per_s, "time_to_report_in_seconds": flops.time_to_report(tokens_per_s),
                "DP": int(rec["DP"]), "MBS": int(rec["MBS"]), "GAS": int(rec["GAS"]),
                "MFU": flops.tflops_per_device(flops.megatron_model_flops(shape), seconds, devices)
                / system.peak_tflops,
                "state": "REFERENCE", "point": rec["model"],
            })
            rows.append(row)
    return rows
