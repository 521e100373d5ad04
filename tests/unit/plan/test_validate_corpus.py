"""The corpus rows of Fujii et al. 2024: TFLOP/s as their Megatron-LM 0.9 counted them, on ABCI's A100 nodes."""

from __future__ import annotations

import pytest

from nlp_bench.plan.corpus import load_corpus
from nlp_bench.spec.systems import load_system


def test_megatron_0_9_tflops_count_the_whole_score_matrix_and_the_padded_vocabulary():
    """num_floating_point_operations of the authors' fork (Megatron-LM 0.9), written out for Llama-3.1-8B:
    12·B·s·L·h²·((1 + g/n + s/h) + 1.5·ffn/h + V/(2·L·h)), V padded to a multiple of 128·tp."""
    rows = {r.id: r for r in load_corpus()}
    b, s, layers, h, heads, groups, ffn = 1024, 8192, 32, 4096, 32, 8, 14336
    for row_id, tp, gpus, tflops in (("fujii-tp4-cp1-pp2-mbs1-8", 4, 8, 182.6),
                                     ("fujii-tp2-cp2-pp2-mbs1-256", 2, 256, 142.61)):
        vocab = {4: 128512, 2: 128256}[tp]
        count = 12 * b * s * layers * h * h * ((1 + groups / heads + s / h) + 1.5 * ffn / h + vocab / (2 * layers * h))
        row = rows[row_id]
        assert row.tokens_per_s == pytest.approx(b * s / (count / (gpus * tflops * 1e12)))
        assert row.candidate.layout.global_batch_size == b and row.candidate.layout.world == gpus
    fujii = [r for r in rows.values() if r.publication == "Fujii et al. 2024 (4D parallelism)"]
    # the table gives layouts alone, the switches come from a job script: predicted and checked, never fitted
    assert len(fujii) == 13 and not any(r.fitted for r in fujii)
    assert {r.candidate.layout.cp for r in fujii} == {1, 2}


def test_the_abci_profile_has_what_its_documentation_says():
    abci = load_system("abci-a100")
    assert (abci.devices_per_node, abci.device_memory_gib, abci.inter_node_gbps) == (8, 40, 100)
