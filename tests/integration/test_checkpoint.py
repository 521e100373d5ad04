"""Checkpoints: exact resume, a different data-parallel size, clear errors, and saving on a signal.

The module's runs start once, in order (a save before the load that reads it), from one launcher (`runs`);
each test reads its own and the checkpoints they left."""

import signal
import subprocess
import sys
import time

import pytest
from trainer_harness import Launch, launch_all, records, succeeded

from nlp_bench.analysis.parsers import parse_text

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
         "--seq-length", "32", "--log-interval", "1", "--lr", "1e-3", "--lr-warmup-iters", "1",
         "--lr-decay-style", "cosine", "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "1000",
         "--distributed-backend", "gloo", "--seed", "7", "--global-batch-size", "8", "--train-iters", "10",
         "--eval-iters", "0"]
TP2_PP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]
DISTOPT = ["--use-distributed-optimizer", "--hidden-dropout", "0", "--attention-dropout", "0", "--bf16"]
#: on xla the update is DeviceAdamW's; the CPU stand-in runs that code with the distributed optimizer over dp 2
XLA = ["--distributed-backend", "xla", "--micro-batch-size", "4", "--use-distributed-optimizer", "--hidden-dropout",
       "0", "--attention-dropout", "0"]
STAND_IN = {"NLP_BENCH_XLA_CPU": "1"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint folder for each test."""
    return {name: tmp_path_factory.mktemp(name) for name in ("tp2pp2", "distopt", "model", "finished", "xla")}


@pytest.fixture(scope="module")
def runs(saved):
    one = [*MODEL, "--micro-batch-size", "8"]
    return launch_all({
        # dropout stays on (0.1): the random streams must be restored too
        "tp2pp2 whole": Launch(4, [*MODEL, *TP2_PP2]),
        "tp2pp2 first": Launch(4, [*MODEL, *TP2_PP2, "--save", str(saved["tp2pp2"]), "--exit-interval", "5"]),
        "tp2pp2 resumed": Launch(4, [*MODEL, *TP2_PP2, "--load", str(saved["tp2pp2"])]),
        "distopt whole": Launch(2, [*MODEL, *DISTOPT, "--micro-batch-size", "4"]),
        "distopt first": Launch(2, [*MODEL, *DISTOPT, "--micro-batch-size", "4", "--save", str(saved["distopt"]),
                                    "--exit-interval", "4"]),
        "distopt dp1": Launch(1, [*MODEL, *DISTOPT, "--micro-batch-size", "8", "--load", str(saved["distopt"])]),
        "model saved": Launch(1, [*one, "--save", str(saved["model"]), "--exit-interval", "1"]),
        "model 2 layers": Launch(1, [*one, "--load", str(saved["model"]), "--num-layers", "2"]),
        "model 2 groups": Launch(1, [*one, "--load", str(saved["model"]), "--group-query-attention",
                                     "--num-query-groups", "2"]),
        "finished saved": Launch(1, [*one, "--train-iters", "2", "--save", str(saved["finished"])]),
        "finished again": Launch(1, [*one, "--train-iters", "2", "--load", str(saved["finished"])]),
        "xla whole": Launch(2, [*MODEL, *XLA], STAND_IN),
        "xla first": Launch(2, [*MODEL, *XLA, "--save", str(saved["xla"]), "--exit-interval", "4"], STAND_IN),
        "xla resumed": Launch(2, [*MODEL, *XLA, "--load", str(saved["xla"])], STAND_IN),
    })


def losses(proc) -> dict[int, float]:
    return {r.iteration: r.loss for r in records(proc)}


def test_tp2_pp2_resume_equals_an_uninterrupted_run(runs, saved):
    whole = losses(runs["tp2pp2 whole"])
    first = succeeded(runs["tp2pp2 first"])
    assert "stopping after iteration 5: --exit-interval 5" in first.stdout
    assert (saved["tp2pp2"] / "latest_checkpointed_iteration.txt").read_text() == "5\n"
    assert sorted(p.name for p in (saved["tp2pp2"] / "iter_0000005").iterdir()) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    resumed = succeeded(runs["tp2pp2 resumed"])
    assert "resumed from" in resumed.stdout
    again = losses(resumed)
    assert sorted(again) == [6, 7, 8, 9, 10]
    for i in range(6, 11):
        assert abs(again[i] - whole[i]) <= 1e-6 * abs(whole[i]), (i, again[i], whole[i])


def test_distributed_optimizer_resumes_on_another_dp_size(runs, saved):
    whole = losses(runs["distopt whole"])
    succeeded(runs["distopt first"])
    assert len(list((saved["distopt"] / "iter_0000004" / "mp_rank_00_000").glob("optim_dp*.pt"))) == 2
    again = losses(runs["distopt dp1"])
    for i in range(5, 11):
        assert abs(again[i] - whole[i]) <= 1e-2 * abs(whole[i]), (i, again[i], whole[i])  # bf16 arithmetic


def test_loading_another_model_is_one_clear_line(runs, saved):
    succeeded(runs["model saved"])
    bad = runs["model 2 layers"]
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().startswith("nlp_bench.train: error: checkpoint ")
    assert "--num-layers 4 (now 2)" in bad.stderr
    # the attention's query groups are part of the model a checkpoint holds
    bad = runs["model 2 groups"]
    assert bad.returncode == 2 and "--num-query-groups 4 (now 2)" in bad.stderr, bad.stderr[-2000:]
    # a checkpoint from before the groups, biases, rotary base and norm were recorded: what it was saved with is
    # implied, and weights of another norm are one line too
    import torch

    (shard,) = saved["model"].glob("iter_*/mp_rank_*/model_rng.pt")
    old = torch.load(shard, weights_only=False)
    for key in ("num_query_groups", "add_bias_linear", "rotary_base", "normalization"):
        del old["shape"][key]
    torch.save(old, shard)
    cases = {words: Launch(1, [*MODEL, "--micro-batch-size", "8", "--load", str(saved["model"]), *flags])
             for flags, words in ((["--group-query-attention", "--num-query-groups", "2"],
                                   "--num-query-groups 4 (now 2)"),
                                  (["--disable-bias-linear"], "--add-bias-linear True (now False)"),
                                  (["--normalization", "RMSNorm"], "holds another model's weights"))}
    for words, bad in launch_all(cases).items():
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr[-2000:]
        assert "Traceback" not in bad.stderr


def test_signal_saves_and_exits_cleanly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "nlp_bench.train", *MODEL, "--micro-batch-size", "8",
                             "--train-iters", "100000", "--save", str(tmp_path), "--exit-signal-handler"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline and " iteration        2/" not in seen:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGUSR2)  # what the JUPITER jobscripts send two minutes before the time limit
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "signal SIGUSR2" in out and "saved checkpoint" in out
    saved = int((tmp_path / "latest_checkpointed_iteration.txt").read_text())
    assert saved >= 2 and f"stopping after iteration {saved}" in out


def test_loading_a_finished_run_trains_nothing_and_says_so(runs):
    succeeded(runs["finished saved"])
    again = succeeded(runs["finished again"])
    assert "resumed from" in again.stdout and "finished at iteration 2 of 2" in again.stdout
    assert not parse_text(again.stdout)


def test_the_xla_paths_device_side_optimizer_resumes_exactly(runs):
    """On xla the update is DeviceAdamW's (its moments and step count saved and loaded apart from torch's
    AdamW); the CPU stand-in runs that code with the distributed optimizer over dp 2."""
    whole = losses(runs["xla whole"])
    succeeded(runs["xla first"])
    again = losses(runs["xla resumed"])
    assert sorted(again) == [5, 6, 7, 8, 9, 10]
    for i in range(5, 11):
        assert abs(again[i] - whole[i]) <= 1e-6 * abs(whole[i]), (i, again[i], whole[i])
