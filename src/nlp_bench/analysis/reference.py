"""Published reference rows (results/reference/<name>.csv) as rows of the result table, and the
comparison of measured rows with them.

A CSV keeps only what was published (layout and tokens/s); TFLOPs and the time to report are derived
here with the same functions a measured run uses, which is what makes the comparison fair.
"""

from __future__ import annotations

import csv
from typing import Any

from nlp_bench import flops
from nlp_bench.analysis.results import RESULT_COLUMNS
from nlp_bench.errors import ResultError
from nlp_bench.paths import reference_dir
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import load_system
from nlp_bench.store import states
from nlp_bench.words import counted

DEFAULT_REFERENCE = "jupiter"
#: The benchmark's rule: a 175B submission must report at most this many seconds (the JUPITER baseline
#: is 554.70 s on 96 JUWELS Booster nodes).
BASELINE_S = {"gpt-175b": 560.0}
_LAYOUT = ("Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS")


def known_references() -> list[str]:
    return sorted(p.stem for p in reference_dir().glob("*.csv"))


def reference_rows(name: str = DEFAULT_REFERENCE) -> list[dict[str, Any]]:
    path = reference_dir() / f"{name}.csv"
    if not path.is_file():
        raise ResultError(f"unknown reference {name!r}; references: {', '.join(known_references()) or 'none'} "
                          f"(CSV files in {reference_dir()})")
    rows = []
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh):
            model, system = get_model(rec["model"]), load_system(rec["system"])
            devices = int(rec["Nodes"]) * system.devices_per_node
            tp, gbs, nodes = int(rec["Tensor_Parallel"]), int(rec["Batch_Size"]), int(rec["Nodes"])
            tokens_per_s = float(rec["Tokens/sec"])
            seconds = gbs * model.seq_length / tokens_per_s
            # the reference runs use selective recompute, which the JUPITER convention counts (k = 4)
            shape = model.flops_shape(gbs, pad_vocab(model.vocab_size, tp), recompute=True)
            row = dict.fromkeys(RESULT_COLUMNS)
            row.update({
                "system": rec["system"], "version": "reference", "queue": system.partition,
                "Model_Size": model.nominal_billions, "Nodes": nodes, "Batch_Size": gbs,
                "Pipeline_Parallel": int(rec["Pipeline_Parallel"]), "Tensor_Parallel": tp,
                "Avg_TFLOPs/GPU": flops.tflops_per_device(flops.jupiter_flops(shape), seconds, devices),
                "Tokens/sec": tokens_per_s, "time_to_report_in_seconds": flops.time_to_report(tokens_per_s),
                "DP": int(rec["DP"]), "MBS": int(rec["MBS"]), "GAS": int(rec["GAS"]),
                "MFU": flops.tflops_per_device(flops.megatron_model_flops(shape), seconds, devices)
                / system.peak_tflops,
                "state": states.REFERENCE, "point": rec["model"], "model": rec["model"],
            })
            rows.append(row)
    return rows


def verdict(model: str | None, time_to_report_s: float | None) -> str | None:
    """"pass" or "fail" against the benchmark's baseline, for the models that have one."""
    if model not in BASELINE_S or time_to_report_s is None:
        return None
    return "pass" if time_to_report_s <= BASELINE_S[model] else "fail"


def compare(rows: list[dict[str, Any]], references: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each completed row beside the reference row of its model (the same layout when there is one):
    the tokens/s ratio, the ratio per device (fair across node counts), and the baseline verdict."""
    done = [r for r in rows if r.get("state") in (states.COMPLETED, states.REFERENCE) and r.get("Tokens/sec")]
    if not done:
        raise ResultError("no completed point with a measured Tokens/sec to compare")
    out = []
    for row in done:
        same_model = [ref for ref in references if ref["model"] == row["model"]]
        exact = [ref for ref in same_model if all(ref[k] == row[k] for k in _LAYOUT)]
        ref = (exact or same_model or [None])[0]
        entry = {"point": row["point"], "model": row["model"], "system": row["system"],
                 **{k: row[k] for k in _LAYOUT},
                 "Tokens/sec": row["Tokens/sec"], "time_to_report_in_seconds": row["time_to_report_in_seconds"],
                 "reference": None, "ref_Tokens/sec": None, "ratio": None, "ratio_per_device": None,
                 "verdict": verdict(row["model"], row["time_to_report_in_seconds"])}
        if ref is not None:
            ratio = row["Tokens/sec"] / ref["Tokens/sec"]
            entry.update({"reference": "same layout" if exact else _layout(ref),
                          "ref_Tokens/sec": ref["Tokens/sec"], "ratio": ratio,
                          "ratio_per_device": ratio * _devices(ref) / _devices(row)})
        out.append(entry)
    return out


def _layout(ref: dict[str, Any]) -> str:
    return f"{counted(ref['Nodes'], 'node')}, tp {ref['Tensor_Parallel']}, pp {ref['Pipeline_Parallel']}"


def _devices(row: dict[str, Any]) -> int:
    return row["DP"] * row["Tensor_Parallel"] * row["Pipeline_Parallel"]
