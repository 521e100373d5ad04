"""The iteration log line, in the shape of Megatron-LM with the JUPITER benchmark's TFLOPs patch.

Writing the exact shape the reference logs have means one parser reads our runs and theirs, and a
reader can put our job.out beside a Megatron one.
"""

from __future__ import annotations


def iteration_line(*, iteration: int, total: int, consumed: int, seconds: float, lr: float, global_batch: int,
                   seq_length: int, loss: float, loss_scale: float, grad_norm: float, skipped: int, nan: int,
                   tflops: float) -> str:
    """Megatron's fields in Megatron's order, plus tokens per second (Megatron never prints it)."""
    return (
        f" iteration {iteration:8d}/{total:8d} | consumed samples: {consumed:12d} |"
        f" elapsed time per iteration (s): {seconds:.4f} | learning rate: {lr:.3E} |"
        f" global batch size: {global_batch:5d} | lm loss: {loss:.6E} | loss scale: {loss_scale:.1f} |"
        f" grad norm: {grad_norm:.3f} | number of skipped iterations: {skipped:3d} |"
        f" number of nan iterations: {nan:3d} | samples per second: {global_batch / seconds:.3f} |"
        f" tokens per second: {global_batch * seq_length / seconds:.1f} | TFLOPs: {tflops:.2f} |"
    )
