"""The GPT model, one pipeline stage at a time: pre-LayerNorm decoder blocks with tensor-parallel
attention and MLP, embeddings on the first stage, the output layer and loss on the last.

Activations are [sequence, batch, hidden] as in Megatron, so sequence parallelism splits the leading
dimension. The blocks know nothing of pipelining; the schedule moves activations between stages.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from nlp_bench import kernels
from nlp_bench.train import collectives, layers
from nlp_bench.train.config import GPTConfig
from nlp_bench.train.layers import TensorParallel, mark
from nlp_bench.train.moe import MoELayer
from nlp_bench.train.process_groups import ExpertGroups
from nlp_bench.train.rng import ParallelRNG, recompute


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # [seq, head_dim]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on x [batch, heads, seq, head_dim] in the rotate-half convention."""
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-second, first], dim=-1) * sin.to(x.dtype)


class Norm(nn.Module):
    """LayerNorm (weight and bias) or RMSNorm (weight only) through nlp_bench.kernels; parameter names
    as torch's nn.LayerNorm, so checkpoints read the same."""

    def __init__(self, cfg: GPTConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.rms, self.eps = cfg.normalization == "RMSNorm", cfg.layernorm_epsilon
        self.weight = nn.Parameter(torch.ones(cfg.hidden_size))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(cfg.hidden_size))
        mark(*[p for p in (self.weight, self.bias) if p is not None], sequence_parallel=tp.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return kernels.rms_norm(x, self.weight, self.eps)
        return kernels.layer_norm(x, self.weight, self.bias, self.eps)


def _sdpa_backend(flash: bool, device: torch.device):
    """With --use-flash-attn on a GPU, insist on the flash kernel; elsewhere let SDPA choose."""
    if flash and device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    return contextlib.nullcontext()


class Attention(nn.Module):
    """Causal self-attention with grouped-query attention: n query heads share g key/value heads (g = n is
    multi-head attention).

    The whole qkv weight has its rows in groups, each group's query heads then its key and its value head
    (Megatron's layout). With g a multiple of tp, a rank holds g/tp whole groups; with tp a multiple of g,
    tp/g neighbouring ranks share one group: each holds its own query heads and a copy of the group's key
    and value heads, whose gradients those ranks sum (layers.mark's copies).
    """

    def __init__(self, cfg: GPTConfig, tp: TensorParallel, rng: ParallelRNG, index: int) -> None:
        super().__init__()
        self.cfg, self.rng = cfg, rng
        n, g, h = cfg.num_attention_heads, cfg.num_query_groups, cfg.hidden_size
        d = self.head_dim = h // n
        self.heads = n // tp.size
        per_group = n // g  # query heads per group
        key, std, bias = f"layers.{index}.qkv", cfg.init_method_std, cfg.add_bias_linear
        out = (n + 2 * g) * d
        self.kv = None
        if g % tp.size == 0:
            self.groups, self.queries = g // tp.size, per_group
            self.qkv = layers.ColumnParallelLinear(h, out, std, key, cfg.seed, tp, bias=bias)
        else:
            copies = tp.size // g
            self.groups, self.queries = 1, self.heads
            start = (tp.rank // copies) * (per_group + 2) * d
            first_query = start + (tp.rank % copies) * self.heads * d
            self.qkv = layers.ColumnParallelLinear(h, out, std, key, cfg.seed, tp, bias=bias,
                                                   rows=torch.arange(first_query, first_query + self.heads * d))
            kv_rows = torch.arange(start + per_group * d, start + (per_group + 2) * d)
            self.kv = layers.ColumnParallelLinear(h, out, std, key, cfg.seed, tp, bias=bias, rows=kv_rows,
                                                  copies=copies)
        self.proj = layers.RowParallelLinear(h, h, layers.scaled_std(std, cfg.num_layers), f"layers.{index}.proj",
                                             cfg.seed, tp, bias=bias)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.cfg.attention_dropout if self.training else 0.0
        if not self.cfg.masked_softmax_fusion:  # Megatron's --no-masked-softmax-fusion: each step its own op
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu_(1)
            probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1, dtype=torch.float32)
            return torch.matmul(F.dropout(probs.to(v.dtype), p, training=p > 0), v)
        with _sdpa_backend(self.cfg.use_flash_attn, q.device):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [b, heads, s, d], keys and values [b, groups, s, d] of this rank."""
        x = self.qkv.gather(x)  # full sequence: under sequence parallelism this gathers it
        y = self.qkv.multiply(x)
        if self.kv is not None:
            y = torch.cat([y, self.kv.multiply(x)], dim=-1)
        s, b, _ = y.shape
        # the columns are (group, query heads | key | value, head_dim)
        y = y.view(s, b, self.groups, self.queries + 2, self.head_dim).permute(1, 2, 3, 0, 4)
        q = y[:, :, 0] if self.queries == 1 else y[:, :, :self.queries].flatten(1, 2)
        return q, y[:, :, self.queries], y[:, :, self.queries + 1]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        q, k, v = self._qkv(x)
        s, b = q.shape[2], q.shape[0]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.queries > 1:  # each key/value head serves its group's query heads
            k, v = k.repeat_interleave(self.queries, dim=1), v.repeat_interleave(self.queries, dim=1)
        with self.rng.fork():  # a rank's own heads draw their own dropout masks
            if self.cfg.recompute == "selective":
                out = recompute(self._core, q, k, v, rng=self.rng)
            else:
                out = self._core(q, k, v)
        out = out.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)
        return self.proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig, tp: TensorParallel, index: int, name: str = "") -> None:
        super().__init__()
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        self.swiglu = cfg.swiglu
        key = f"layers.{index}.{name}"
        # GeLU: the bias is added inside the fused bias-gelu (Megatron's skip_bias_add)
        self.fc1 = layers.ColumnParallelLinear(h, f, cfg.init_method_std, f"{key}fc1", cfg.seed, tp,
                                               parts=2 if cfg.swiglu else 1, skip_bias_add=not cfg.swiglu,
                                               bias=cfg.add_bias_linear)
        self.fc2 = layers.RowParallelLinear(f, h, layers.scaled_std(cfg.init_method_std, cfg.num_layers),
                                            f"{key}fc2", cfg.seed, tp, bias=cfg.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y = kernels.swiglu(y) if self.swiglu else kernels.bias_gelu(y, self.fc1.bias)
        return self.fc2(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, tp: TensorParallel, rng: ParallelRNG, index: int,
                 grid: ExpertGroups | None = None) -> None:
        super().__init__()
        self.ln1 = Norm(cfg, tp)
        self.attn = Attention(cfg, tp, rng, index)
        self.ln2 = Norm(cfg, tp)
        if cfg.moe is not None and cfg.moe.layers[index]:
            size = cfg.moe.shared_ffn_hidden_size
            shared = None if size is None else MLP(replace(cfg, ffn_hidden_size=size), tp, index, "shared_experts.")
            self.mlp = MoELayer(cfg, tp, index, shared, grid)
        else:
            self.mlp = MLP(cfg, tp, index)
        self.p = cfg.hidden_dropout
        # under sequence parallelism each rank holds other tokens: dropout must differ between ranks
        self.region = rng.fork if tp.sequence_parallel else contextlib.nullcontext

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        with self.region():
            return F.dropout(x, self.p, training=True)

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        x = x + self._drop(self.attn(self.ln1(x), rope))
        return x + self._drop(self.mlp(self.ln2(x)))


class GPTStage(nn.Module):
    """Layers [first_layer, first_layer + num_layers) of the model, plus the embedding (first stage)
    and the output layer and loss (last stage)."""

    def __init__(self, cfg: GPTConfig, tp: TensorParallel, rng: ParallelRNG, first_layer: int, num_layers: int,
                 pre_process: bool, post_process: bool, grid: ExpertGroups | None = None) -> None:
        super().__init__()
        self.cfg, self.tp, self.rng = cfg, tp, rng
        self.pre_process, self.post_process = pre_process, post_process
        h, std = cfg.hidden_size, cfg.init_method_std
        if pre_process:
            self.embedding = layers.VocabParallelEmbedding(cfg.vocab_padded, h, std, "embedding.word", cfg.seed, tp)
            if cfg.position_embedding_type == "learned_absolute":
                self.position = nn.Parameter(layers.master_normal("embedding.position",
                                                                  (cfg.max_position_embeddings, h), std, cfg.seed))
                # replicated, and not summed over tp under sequence parallelism: the scatter's backward
                # (an all-gather) already hands every rank the gradient of every position
                mark(self.position)
        if cfg.position_embedding_type == "rope":
            cos, sin = rope_tables(cfg.seq_length, h // cfg.num_attention_heads, cfg.rotary_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.blocks = nn.ModuleList(Block(cfg, tp, rng, first_layer + i, grid) for i in range(num_layers))
        if post_process:
            self.final_ln = Norm(cfg, tp)
            if cfg.untie_embeddings:
                self.output = layers.VocabParallelEmbedding(cfg.vocab_padded, h, std, "output", cfg.seed, tp)
            elif not pre_process:
                # the last stage keeps its own copy of the word embedding; the two are kept equal by
                # summing their gradients over the embedding group
                self.output = layers.VocabParallelEmbedding(cfg.vocab_padded, h, std, "embedding.word", cfg.seed,
                                                            tp, shared=True)
            else:
                self.output = self.embedding

    def tied_weights(self) -> list[nn.Parameter]:
        """The word-embedding copies that live on the first and last stage of a pipeline."""
        if self.cfg.untie_embeddings:
            return []
        if self.pre_process and not self.post_process:
            return [self.embedding.weight]
        if self.post_process and not self.pre_process:
            return [self.output.weight]
        return []

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens.t())  # [s(/tp), b, h]
        if self.cfg.position_embedding_type == "learned_absolute":
            pos = self.position[: tokens.shape[1]].unsqueeze(1)
            if self.tp.sequence_parallel:
                pos = collectives.scatter_sequence(pos, self.tp.group)
            x = x + pos
        if self.training and self.cfg.hidden_dropout > 0:
            region = self.rng.fork if self.tp.sequence_parallel else contextlib.nullcontext
            with region():
                x = F.dropout(x, self.cfg.hidden_dropout, training=True)
        return x

    def _run_blocks(self, x: torch.Tensor, rope) -> torch.Tensor:
        if self.cfg.recompute != "full":
            for block in self.blocks:
                x = block(x, rope)
            return x
        n = self.cfg.recompute_num_layers
        if self.cfg.recompute_method == "block":  # recompute the first n layers of the stage, keep the rest
            for i, block in enumerate(self.blocks):
                x = recompute(block, x, rope, rng=self.rng) if i < n else block(x, rope)
            return x
        for start in range(0, len(self.blocks), n):  # uniform: checkpoint every group of n layers
            group = self.blocks[start:start + n]

            def run(y, r=rope, group=group):
                for block in group:
                    y = block(y, r)
                return y

            x = recompute(run, x, rng=self.rng)
        return x

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """First stage: token ids [batch, seq]; otherwise the previous stage's activations. Returns the
        mean loss on the last stage, activations elsewhere."""
        x = self._embed(inputs) if self.pre_process else inputs
        rope = None
        if self.cfg.position_embedding_type == "rope":
            rope = (self.rope_cos, self.rope_sin)
        x = self._run_blocks(x, rope)
        if not self.post_process:
            return x
        logits = self.output.logits(self.final_ln(x))
        # the logits exist for the loss alone: the fused kernel may write their gradient over them
        loss = kernels.vocab_parallel_cross_entropy(logits, labels.t(), self.output.vocab_start, self.tp.group,
                                                    inplace_backward=True)
        return loss.float().mean()


class ModelChunks(nn.ModuleList):
    """The stages a rank holds: one, or v of them under the interleaved schedule (virtual stage c·pp + rank)."""

    def tied_weights(self) -> list[nn.Parameter]:
        return [p for chunk in self for p in chunk.tied_weights()]
