"""Grouped-query attention in every parallel layout gives the numbers of the single-rank run (gloo,
multi-process, fp32, dropout 0), with the Llama architecture: 2 query groups for 4 heads, SwiGLU, RMSNorm,
rope with base 500000, untied output weights and no biases. tp 4 exceeds the groups: each pair of ranks
keeps a copy of its group's key and value heads."""

import pytest
from trainer_harness import Launch, close, launch_all, records

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
         "--num-query-groups", "2", "--ffn-hidden-size", "96", "--swiglu", "--normalization", "RMSNorm",
         "--position-embedding-type", "rope", "--rotary-base", "500000", "--untie-embeddings-and-output-weights",
         "--disable-bias-linear", "--seq-length", "32", "--train-iters", "5", "--log-interval", "1", "--lr", "3e-3",
         "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--vocab-size", "1000",
         "--distributed-backend", "gloo", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "11",
         "--global-batch-size", "8", "--clip-grad", "0.5", "--eval-iters", "0"]
LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "8"]),
    "tp4-kv-copies": (4, ["--tensor-model-parallel-size", "4", "--micro-batch-size", "8"]),
    "tp4-sp": (4, ["--tensor-model-parallel-size", "4", "--sequence-parallel", "--micro-batch-size", "4"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]),
    "pp2-interleaved": (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                            "--micro-batch-size", "1"]),
    "dp2": (2, ["--micro-batch-size", "4"]),
    "dp2-zero1": (2, ["--use-distributed-optimizer", "--micro-batch-size", "2"]),
    "tp2-dp2-zero1": (4, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2",
                          "--use-distributed-optimizer"]),
}
#: 6 heads in 2 groups over tp 3, one process told the world is 3: refused before any process group
TP3 = [*MODEL, "--num-attention-heads", "6", "--hidden-size", "96", "--tensor-model-parallel-size", "3",
       "--micro-batch-size", "8"]


@pytest.fixture(scope="module")
def runs():
    """The module's runs, started once and together: the single rank's, every layout's and a refused one."""
    return launch_all({"serial": Launch(1, [*MODEL, "--micro-batch-size", "8"]),
                       "tp3": Launch(1, TP3, {"WORLD_SIZE": "3"}),
                       **{name: Launch(nproc, [*MODEL, *flags]) for name, (nproc, flags) in LAYOUTS.items()}})


def losses_and_norms(proc) -> list[tuple[float, float]]:
    found = records(proc)
    assert [r.iteration for r in found] == [1, 2, 3, 4, 5]
    return [(r.loss, r.grad_norm) for r in found]


@pytest.fixture(scope="module")
def serial(runs) -> list[tuple[float, float]]:
    out = losses_and_norms(runs["serial"])
    assert len({loss for loss, _ in out}) == 5, "the losses must change, or the test proves nothing"
    # the gradient norm is clipped (0.5): a norm that counted the key/value copies twice would change the losses
    assert all(norm > 0.5 for _, norm in out)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gqa_layout_matches_single_rank(runs, serial, layout):
    got = losses_and_norms(runs[layout])
    assert close(got, serial), (got, serial)


def test_tp_neither_dividing_nor_a_multiple_of_the_groups_is_refused_before_any_process_group(runs):
    """6 heads in 2 groups over tp 3: each rank would need one and a half key/value heads."""
    proc = runs["tp3"]
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "tp 3 must divide the 2 query groups or be a multiple of them" in proc.stderr
