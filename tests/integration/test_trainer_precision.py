"""Mixed precision: bf16 trains, fp16 skips an overflowing step and lowers its loss scale; the trainer's
TensorBoard scalars and its refusals.

The module's runs start once, together, from one launcher (`runs`); each test reads its own."""

import shutil

import pytest
from conftest import ROOT
from trainer_harness import Launch, launch_all, records, succeeded

DATA = ROOT / "benchmark" / "data"

pytestmark = pytest.mark.slow

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "8", "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine",
         "--position-embedding-type", "rope", "--mock-data", "--vocab-size", "256", "--distributed-backend", "gloo",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3", "--eval-iters", "0"]


@pytest.fixture(scope="module")
def sample_corpus(tmp_path_factory):
    """The shipped sample corpus, tokenized with GPT-2 BPE into an indexed dataset."""
    from nlp_bench.data.preprocess import preprocess

    prefix, _, _ = preprocess(DATA / "sample.jsonl", tmp_path_factory.mktemp("corpus") / "sample",
                              DATA / "gpt2-vocab.json", DATA / "gpt2-merges.txt", append_eod=True)
    return prefix


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: tmp_path_factory.mktemp(name) for name in ("corrupt", "tb", "tb-optional")}


@pytest.fixture(scope="module")
def runs(sample_corpus, folders):
    corrupt = folders["corrupt"]
    for ext in (".bin", ".idx"):
        shutil.copy(f"{sample_corpus}{ext}", corrupt / f"d{ext}")
    (corrupt / "d.idx").write_bytes(b"garbage!!" + (corrupt / "d.idx").read_bytes()[9:])
    corpus = [f for f in MODEL if f not in ("--mock-data", "--vocab-size", "256")]
    return launch_all({
        # bf16 matrix products with the 50k vocabulary are slow on CPUs (about 2 s an iteration on the CI machine)
        "bf16": Launch(1, [*corpus, "--bf16", "--train-iters", "50", "--log-interval", "10",
                           "--data-path", str(sample_corpus), "--split", "7,3,1", "--vocab-file",
                           str(DATA / "gpt2-vocab.json"), "--merge-file", str(DATA / "gpt2-merges.txt")]),
        "corrupt": Launch(1, [*[f for f in MODEL if f != "--mock-data"], "--train-iters", "5",
                              "--data-path", str(corrupt / "d")]),
        "fp16": Launch(1, [*MODEL, "--fp16", "--train-iters", "5", "--log-interval", "1", "--initial-loss-scale",
                           "4096", "--hysteresis", "1", "--inject-inf-grad-at-iteration", "3"]),
        "tb": Launch(1, [*MODEL, "--train-iters", "4", "--log-interval", "2", "--tensorboard-dir", str(folders["tb"]),
                         "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard",
                         "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                         "--eval-interval", "2", "--eval-iters", "1"]),
        "tb optional": Launch(1, [*MODEL, "--train-iters", "3", "--log-interval", "2", "--tensorboard-dir",
                                  str(folders["tb-optional"]), "--eval-iters", "1", "--eval-interval", "2"]),
        "sgd": Launch(1, [*MODEL, "--train-iters", "2", "--optimizer", "sgd"]),
    })


def test_bf16_lowers_the_loss_on_the_sample_corpus_over_50_iterations(runs, sample_corpus):
    proc = succeeded(runs["bf16"])
    assert "bf16" in proc.stdout and str(sample_corpus) in proc.stdout
    found = records(proc)
    first, last = found[0].loss, found[-1].loss
    assert last < 0.6 * first, (first, last)


def test_corrupt_dataset_stops_the_trainer_with_one_line(runs):
    proc = runs["corrupt"]
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("nlp_bench.train: error: ") and "not a Megatron indexed dataset" in proc.stderr


def test_fp16_overflow_is_skipped_and_lowers_the_scale(runs):
    found = records(runs["fp16"])
    assert [r.skipped_iterations for r in found] == [0, 0, 1, 0, 0]
    assert [r.loss_scale for r in found] == [4096.0, 4096.0, 2048.0, 2048.0, 2048.0]
    # a skipped step leaves the weights and the learning-rate schedule alone
    assert found[2].learning_rate == found[1].learning_rate


def test_tensorboard_scalars_load_with_tensorboards_reader(runs, folders):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    succeeded(runs["tb"])
    acc = EventAccumulator(str(folders["tb"]))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"lm loss", "learning-rate", "loss-scale", "grad-norm", "iteration-time", "tokens-per-second",
            "TFLOPs", "batch-size", "lm loss validation", "lm loss validation ppl"} <= tags
    assert [e.value for e in acc.Scalars("batch-size")] == [8.0, 8.0]
    assert [e.step for e in acc.Scalars("lm loss validation ppl")] == [2, 4]
    assert [e.step for e in acc.Scalars("lm loss")] == [2, 4]
    assert all(e.value > 0 for e in acc.Scalars("tokens-per-second"))


def test_optional_tensorboard_scalars_follow_megatrons_flags(runs, folders):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    succeeded(runs["tb optional"])
    acc = EventAccumulator(str(folders["tb-optional"]))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "lm loss validation" in tags
    assert not {"iteration-time", "batch-size", "lm loss validation ppl"} & tags


def test_a_flag_the_trainer_cannot_honour_is_one_line_and_exit_2(runs):
    proc = runs["sgd"]
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--optimizer" in proc.stderr and "sgd" in proc.stderr
