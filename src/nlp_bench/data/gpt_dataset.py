"""GPT training samples from an indexed dataset: documents split into train/valid/test by `--split`,
shuffled per epoch with the seed, cut into samples of seq_length + 1 tokens that run across document
boundaries (as Megatron's GPTDataset does), and the samples shuffled."""

from __future__ import annotations

import numpy as np

from nlp_bench.data.indexed import IndexedDataset
from nlp_bench.errors import BenchError

SPLITS = ("train", "valid", "test")


def split_ranges(split: str, documents: int) -> list[tuple[int, int]]:
    """Document ranges for train, valid and test from weights like "7,3,1" or "969,30,1"."""
    try:
        weights = [float(w) for w in split.replace("/", ",").split(",")]
    except ValueError:
        raise BenchError(f"--split {split!r} must be comma-separated numbers, like 7,3,1") from None
    weights += [0.0] * (3 - len(weights))
    if len(weights) != 3 or min(weights) < 0 or sum(weights) <= 0:
        raise BenchError(f"--split {split!r} must be up to three non-negative weights with a positive sum")
    total = sum(weights)
    bounds = [0]
    for w in weights:
        bounds.append(bounds[-1] + int(round(w / total * documents)))
    shift = bounds[-1] - documents
    bounds = [0] + [b - shift for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


class GPTDataset:
    def __init__(self, indexed: IndexedDataset, split: str, which: str, seq_length: int, num_samples: int,
                 seed: int) -> None:
        lo, hi = split_ranges(split, len(indexed.document_index) - 1)[SPLITS.index(which)]
        if hi <= lo:
            raise BenchError(f"the {which} split of {indexed.prefix} is empty (--split {split})")
        self.indexed, self.seq_length = indexed, seq_length
        documents = np.arange(lo, hi, dtype=np.int64)
        # one sequence per document (Megatron's preprocessing); the sequence of document d is doc_index[d]
        sequences = indexed.document_index[documents]
        tokens_per_epoch = int(indexed.sizes[sequences].sum())
        if tokens_per_epoch <= seq_length:
            raise BenchError(f"the {which} split of {indexed.prefix} holds {tokens_per_epoch} tokens, too few for "
                             f"one sample of {seq_length + 1}")
        epochs = max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))
        rng = np.random.RandomState(seed)
        order = np.concatenate([rng.permutation(sequences) for _ in range(epochs)])
        # sample i starts at token position i * seq_length of the concatenated epochs
        lengths = indexed.sizes[order].astype(np.int64)
        self.order, self.starts = order, np.concatenate([[0], np.cumsum(lengths)])
        available = (int(self.starts[-1]) - 1) // seq_length
        self.shuffle = rng.permutation(available)
        self.num_samples = available

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> np.ndarray:
        """seq_length + 1 token ids of sample `index` (wrapping around after the last sample)."""
        begin = int(self.shuffle[index % self.num_samples]) * self.seq_length
        end = begin + self.seq_length + 1
        first = int(np.searchsorted(self.starts, begin, side="right")) - 1
        pieces, pos, k = [], begin, first
        while pos < end:
            seq = int(self.order[k])
            offset = pos - int(self.starts[k])
            take = min(int(self.indexed.sizes[seq]) - offset, end - pos)
            pieces.append(self.indexed.get(seq, offset, take))
            pos += take
            k += 1
        return np.concatenate(pieces).astype(np.int64)
