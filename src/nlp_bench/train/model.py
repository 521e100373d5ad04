"""The GPT model: pre-LayerNorm decoder blocks with tensor-parallel attention and MLP, tied embeddings.

Activations are [sequence, batch, hidden] as in Megatron, so sequence-parallel regions can later split
the leading dimension without a transpose.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nlp_bench.train import collectives, layers
from nlp_bench.train.grid import Grid
from nlp_bench.train.rng import ParallelRNG


@dataclass(frozen=True)
class GPTConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    vocab_padded: int
    position_embedding_type: str = "learned_absolute"
    init_method_std: float = 0.02
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-5
    use_flash_attn: bool = False


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # [seq, head_dim]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on x [batch, heads, seq, head_dim] in the rotate-half convention."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, grid: Grid, rng: ParallelRNG) -> None:
        super().__init__()
        self.cfg, self.rng = cfg, rng
        self.heads = cfg.num_attention_heads // grid.tp
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        h = cfg.hidden_size
        self.qkv = layers.ColumnParallelLinear(h, 3 * h, cfg.init_method_std, grid.tp, grid.tp_rank, grid.tp_group)
        self.proj = layers.RowParallelLinear(h, h, layers.scaled_std(cfg.init_method_std, cfg.num_layers),
                                             grid.tp, grid.tp_rank, grid.tp_group)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        s, b, _ = x.shape
        # rows of the qkv weight are ordered (head, q|k|v, head_dim): a tp shard holds whole heads
        qkv = self.qkv(x).view(s, b, self.heads, 3, self.head_dim).permute(3, 1, 2, 0, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [b, heads, s, head_dim]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        p = self.cfg.attention_dropout if self.training else 0.0
        with self.rng.fork(), _sdpa_backend(self.cfg.use_flash_attn, x.device):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        out = out.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)
        return self.proj(out)


def _sdpa_backend(flash: bool, device: torch.device):
    """With --use-flash-attn on a GPU, insist on the flash kernel; elsewhere let SDPA choose."""
    if flash and device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    return contextlib.nullcontext()


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig, grid: Grid) -> None:
        super().__init__()
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        self.fc1 = layers.ColumnParallelLinear(h, f, cfg.init_method_std, grid.tp, grid.tp_rank, grid.tp_group)
        self.fc2 = layers.RowParallelLinear(f, h, layers.scaled_std(cfg.init_method_std, cfg.num_layers),
                                            grid.tp, grid.tp_rank, grid.tp_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # tanh-approximated GeLU, as Megatron's fused bias-gelu computes it
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, grid: Grid, rng: ParallelRNG) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.attn = Attention(cfg, grid, rng)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.mlp = MLP(cfg, grid)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.ln1(x), rope))
        return x + self.dropout(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, grid: Grid, rng: ParallelRNG) -> None:
        super().__init__()
        self.cfg, self.grid = cfg, grid
        self.embedding = layers.VocabParallelEmbedding(cfg.vocab_padded, cfg.hidden_size, cfg.init_method_std,
                                                       grid.tp, grid.tp_rank, grid.tp_group)
        if cfg.position_embedding_type == "learned_absolute":
            self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
            nn.init.normal_(self.position.weight, 0.0, cfg.init_method_std)
            self.rope = None
        else:
            self.position = None
            cos, sin = rope_tables(cfg.seq_length, cfg.hidden_size // cfg.num_attention_heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.blocks = nn.ModuleList(Block(cfg, grid, rng) for _ in range(cfg.num_layers))
        self.final_ln = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss for tokens and labels of shape [batch, seq]."""
        x = self.embedding(tokens.t())  # [s, b, h]
        s = x.shape[0]
        if self.position is not None:
            x = x + self.position(torch.arange(s, device=x.device)).unsqueeze(1)
            rope = None
        else:
            rope = (self.rope_cos[:s], self.rope_sin[:s])
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x, rope)
        x = self.final_ln(x)
        # tied output layer: logits for this rank's vocabulary range only
        logits = F.linear(collectives.copy_to_group(x, self.grid.tp_group), self.embedding.weight)
        loss = layers.vocab_parallel_cross_entropy(logits, labels.t(), self.embedding.vocab_start, self.grid.tp_group)
        return loss.mean()
