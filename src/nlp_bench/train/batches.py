"""Mock data: learnable token sequences addressed by global sample index.

Each sample is an arithmetic progression modulo the vocabulary (random start and stride), so the loss
falls visibly and a run shows that training works. Addressing by global index makes the data
independent of the layout: dp 2 sees exactly the samples dp 1 sees, split differently.
"""

from __future__ import annotations

import torch


class MockData:
    def __init__(self, vocab_size: int, seq_length: int, seed: int) -> None:
        self.vocab_size, self.seq_length, self.seed = vocab_size, seq_length, seed

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start = torch.randint(self.vocab_size, (1,), generator=g)
        stride = torch.randint(1, 8, (1,), generator=g)
        return (start + stride * torch.arange(self.seq_length + 1)) % self.vocab_size

    def batch(self, first: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and labels [size, seq] for samples first .. first+size-1."""
        seqs = torch.stack([self.sample(first + i) for i in range(size)])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


class IndexedData:
    """Samples of one split of a Megatron indexed dataset, addressed by global sample index like MockData."""

    def __init__(self, prefix: str, split: str, which: str, seq_length: int, num_samples: int, seed: int) -> None:
        from nlp_bench.data.gpt_dataset import GPTDataset
        from nlp_bench.data.indexed import IndexedDataset

        self.dataset = GPTDataset(IndexedDataset(prefix), split, which, seq_length, num_samples, seed)

    def batch(self, first: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = torch.stack([torch.from_numpy(self.dataset[first + i]) for i in range(size)])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
