"""Write benchmark/data/sample.jsonl: a small, deterministic English corpus for the real-data path.

The documents are generated from a small grammar about running benchmarks on clusters, so the project
ships its own text (no third-party data) and a tiny GPT can visibly learn from it. Run it again to
rebuild the file byte for byte: `python benchmark/data/make_sample_corpus.py`.
"""

import json
import random
from pathlib import Path

SUBJECTS = ["The scheduler", "A benchmark team", "The trainer", "Every rank", "The pipeline stage", "The operator",
            "Our harness", "The first node", "The parser", "A careful engineer", "The data loader", "The optimizer"]
VERBS = ["starts", "measures", "reports", "waits for", "records", "checks", "compares", "writes", "reads",
         "cancels", "resumes", "splits"]
OBJECTS = ["the job on four nodes", "the tokens per second", "the time to report", "the global batch",
           "the loss of every iteration", "a new jobscript", "the result table", "the gradient buckets",
           "the checkpoint of the last stage", "the micro batches in flight", "the learning rate schedule",
           "the memory of each device"]
TAILS = ["before the time limit ends", "after the warm-up", "when the queue is short", "with tensor parallelism",
         "across the pipeline", "so that nothing is lost", "for the reference run", "on the booster partition",
         "every ten iterations", "without a single retry"]
OPENERS = ["Today", "In the morning", "After the update", "During the night", "On the new system", "Once again"]


def sentence(rng: random.Random) -> str:
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
    if rng.random() < 0.3:
        opener = rng.choice(OPENERS)
        text = f"{opener}, {text[0].lower()}{text[1:]}"
    return text


def main() -> None:
    rng = random.Random(2026)
    out = Path(__file__).with_name("sample.jsonl")
    with out.open("w", encoding="utf-8") as fh:
        for i in range(400):
            body = " ".join(sentence(rng) for _ in range(rng.randint(3, 8)))
            fh.write(json.dumps({"id": i, "text": body}) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
