"""Mixed precision: bf16 trains, fp16 skips an overflowing step and lowers its loss scale."""

import subprocess
import sys

import pytest
from conftest import ROOT

from nlp_bench.analysis.parsers import parse_text

DATA = ROOT / "benchmark" / "data"

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "8", "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine",
         "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "256", "--distributed-backend", "gloo",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3"]


def run(*flags: str):
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *MODEL, *flags], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, parse_text(proc.stdout)


@pytest.fixture(scope="module")
def sample_corpus(tmp_path_factory):
    """The shipped sample corpus, tokenized with GPT-2 BPE into an indexed dataset."""
    from nlp_bench.data.preprocess import preprocess

    prefix, _, _ = preprocess(DATA / "sample.jsonl", tmp_path_factory.mktemp("corpus") / "sample",
                              DATA / "gpt2-vocab.json", DATA / "gpt2-merges.txt", append_eod=True)
    return prefix


def test_bf16_lowers_the_loss_on_the_sample_corpus_over_50_iterations(sample_corpus):
    flags = [f for f in MODEL if f not in ("--mock-data", "--vocab-size", "256")]
    # no validation (it would add 100 forward passes); bf16 matrix products with the 50k vocabulary are slow on
    # CPUs (about 2 s an iteration on the CI machine), so the bound leaves room for a busy machine
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *flags, "--bf16", "--train-iters", "50",
                           "--log-interval", "10", "--eval-iters", "0", "--data-path", str(sample_corpus), "--split",
                           "7,3,1", "--vocab-file", str(DATA / "gpt2-vocab.json"), "--merge-file",
                           str(DATA / "gpt2-merges.txt")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bf16" in proc.stdout and str(sample_corpus) in proc.stdout
    records = parse_text(proc.stdout)
    first, last = records[0].loss, records[-1].loss
    assert last < 0.6 * first, (first, last)


def test_corrupt_dataset_stops_the_trainer_with_one_line(sample_corpus, tmp_path):
    import shutil

    for ext in (".bin", ".idx"):
        shutil.copy(f"{sample_corpus}{ext}", tmp_path / f"d{ext}")
    (tmp_path / "d.idx").write_bytes(b"garbage!!" + (tmp_path / "d.idx").read_bytes()[9:])
    flags = [f for f in MODEL if f not in ("--mock-data",)]
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *flags, "--train-iters", "5",
                           "--data-path", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("nlp_bench.train: error: ") and "not a Megatron indexed dataset" in proc.stderr


def test_fp16_overflow_is_skipped_and_lowers_the_scale():
    _, records = run("--fp16", "--train-iters", "5", "--log-interval", "1", "--initial-loss-scale", "4096",
                     "--hysteresis", "1", "--inject-inf-grad-at-iteration", "3")
    assert [r.skipped_iterations for r in records] == [0, 0, 1, 0, 0]
    assert [r.loss_scale for r in records] == [4096.0, 4096.0, 2048.0, 2048.0, 2048.0]
    # a skipped step leaves the weights and the learning-rate schedule alone
    assert records[2].learning_rate == records[1].learning_rate


def test_tensorboard_scalars_load_with_tensorboards_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run("--train-iters", "4", "--log-interval", "2", "--tensorboard-dir", str(tmp_path / "tb"),
        "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
        "--log-validation-ppl-to-tensorboard", "--eval-interval", "2", "--eval-iters", "1")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"lm loss", "learning-rate", "loss-scale", "grad-norm", "iteration-time", "tokens-per-second",
            "TFLOPs", "batch-size", "lm loss validation", "lm loss validation ppl"} <= tags
    assert [e.value for e in acc.Scalars("batch-size")] == [8.0, 8.0]
    assert [e.step for e in acc.Scalars("lm loss validation ppl")] == [2, 4]
    assert [e.step for e in acc.Scalars("lm loss")] == [2, 4]
    assert all(e.value > 0 for e in acc.Scalars("tokens-per-second"))


def test_optional_tensorboard_scalars_follow_megatrons_flags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run("--train-iters", "3", "--log-interval", "2", "--tensorboard-dir", str(tmp_path / "tb"), "--eval-iters", "1",
        "--eval-interval", "2")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "lm loss validation" in tags
    assert not {"iteration-time", "batch-size", "lm loss validation ppl"} & tags


def test_a_flag_the_trainer_cannot_honour_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *MODEL, "--train-iters", "2", "--optimizer", "sgd"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--optimizer" in proc.stderr and "sgd" in proc.stderr
