"""The trainer with mixture-of-experts layers (gloo, fp32, dropout 0): it trains, prints Megatron-core's
load_balancing_loss field, the aux loss changes the gradients, dp 2, tp 2 (without sequence parallelism:
each tp rank holds its slice of every expert, expert tp = tp) and pp 2 give the single rank's numbers and
load-balancing loss (dropless), and a capacity factor drops tokens and says how many. Expert parallelism:
test_moetrain_experts.py; what the trainer refuses, before any process group:
tests/unit/train/test_moetrain_layer.py."""

import pytest
from trainer_harness import MOE_MODEL, Launch, close, launch_all, records

pytestmark = pytest.mark.slow

LAYOUTS = {"dp2": ["--micro-batch-size", "2"],
           "tp2": ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2"],
           "pp2": ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]}


@pytest.fixture(scope="module")
def runs():
    aux = ["--moe-aux-loss-coeff", "0.5"]
    return launch_all({
        "no-aux": Launch(1, [*MOE_MODEL, "--micro-batch-size", "2"]),
        "aux": Launch(1, [*MOE_MODEL, *aux, "--micro-batch-size", "2"]),
        **{name: Launch(2, [*MOE_MODEL, *aux, *flags]) for name, flags in LAYOUTS.items()},
        "capacity": Launch(1, [*MOE_MODEL, *aux, "--micro-batch-size", "2", "--moe-expert-capacity-factor", "0.5"]),
    })


def test_moe_trains_and_logs_the_load_balancing_loss(runs):
    out = runs["aux"].stdout
    found = records(runs["aux"])
    assert [r.iteration for r in found] == [1, 2, 3] and len({r.loss for r in found}) == 3
    lines = [line for line in out.splitlines() if line.startswith(" iteration ")]
    assert all("| lm loss: " in line and " load_balancing_loss: " in line for line in lines)
    balance = [float(line.split("load_balancing_loss: ")[1].split(" |")[0]) for line in lines]
    assert all(0.5 < b < 2.0 for b in balance)  # E * sum(f * P): 1 when perfectly balanced
    assert "load_balancing_loss" not in runs["no-aux"].stdout  # Megatron logs it only with a coefficient
    # printed as Megatron-LM prints it, so bench's parser reads the trainer's and Megatron-LM's lines alike
    assert [r.load_balancing_loss for r in found] == balance


def test_the_aux_loss_is_in_the_backward_pass(runs):
    aux, plain = [r.loss for r in records(runs["aux"])], [r.loss for r in records(runs["no-aux"])]
    assert aux[0] == pytest.approx(plain[0], rel=1e-5)  # the same forward; the LM loss is logged without the aux loss
    assert not close(aux[1:], plain[1:], rel=1e-4)


def _balance(proc) -> list[float]:
    """The load-balancing loss of each iteration as bench's parser reads it (the ranks' lines share one
    output, so a line is not always whole at its start)."""
    return [r.load_balancing_loss for r in records(proc)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_gives_the_single_rank_numbers(runs, layout):
    one = [(r.loss, r.grad_norm) for r in records(runs["aux"])]
    got = [(r.loss, r.grad_norm) for r in records(runs[layout])]
    assert close(got, one), (got, one)
    assert close(_balance(runs[layout]), _balance(runs["aux"]))


def test_a_capacity_factor_drops_tokens_and_says_how_many(runs):
    proc = runs["capacity"]
    assert len(records(proc)) == 3
    said = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "capacity dropped" in line]
    assert said and int(said[0].split("capacity dropped ")[1].split()[0]) > 0

