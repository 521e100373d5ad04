"""Megatron's learning-rate schedule: linear warm-up from 0, then constant, linear or cosine decay to
min-lr, counted in samples (with --train-samples) or iterations (with --train-iters)."""

from __future__ import annotations

import math
from argparse import Namespace

from nlp_bench.train.args import UsageError


class LRSchedule:
    def __init__(self, max_lr: float, min_lr: float, warmup: int, decay: int, style: str) -> None:
        if decay <= warmup and style != "constant":
            raise ValueError(f"lr decay length {decay} must exceed the warm-up {warmup}")
        self.max_lr, self.min_lr, self.warmup, self.decay, self.style = max_lr, min_lr, warmup, decay, style

    def at(self, step: int) -> float:
        """The learning rate after `step` samples or iterations."""
        if self.warmup > 0 and step <= self.warmup:
            return self.max_lr * step / self.warmup
        if self.style == "constant":
            return self.max_lr
        if step > self.decay:
            return self.min_lr
        ratio = (step - self.warmup) / (self.decay - self.warmup)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


def from_args(args: Namespace, global_batch: int) -> tuple[LRSchedule, int, bool]:
    """The schedule, the number of iterations to train, and whether steps count samples."""
    try:
        return _from_args(args, global_batch)
    except ValueError as exc:
        raise UsageError(f"learning-rate schedule: {exc} (see --lr-warmup-*, --lr-decay-*, --train-*)") from None


def _from_args(args: Namespace, global_batch: int) -> tuple[LRSchedule, int, bool]:
    if args.train_samples is not None:
        iters = args.train_samples // global_batch
        decay = args.lr_decay_samples or args.train_samples
        warmup = args.lr_warmup_samples
        if args.lr_warmup_fraction is not None:
            warmup = int(args.lr_warmup_fraction * decay)
        return LRSchedule(args.lr, args.min_lr, warmup, decay, args.lr_decay_style), iters, True
    decay = args.lr_decay_iters or args.train_iters
    warmup = args.lr_warmup_iters
    if args.lr_warmup_fraction is not None:
        warmup = int(args.lr_warmup_fraction * decay)
    return LRSchedule(args.lr, args.min_lr, warmup, decay, args.lr_decay_style), args.train_iters, False
