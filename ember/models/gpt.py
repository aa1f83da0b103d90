"""A small GPT: token and position embeddings, pre-norm blocks (causal self-attention, MLP),
a final norm and a linear head. Byte-level by default (vocab 256)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .. import nn
from .. import tensor as T
from ..tensor import Tensor


@dataclass
class GPTConfig:
    vocab: int = 256
    block: int = 64       # context length
    dim: int = 96
    n_layer: int = 2
    n_head: int = 4
    dropout: float = 0.0

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        self.ln1, self.attn = nn.LayerNorm(c.dim), nn.CausalSelfAttention(c.dim, c.n_head)
        self.ln2, self.fc, self.proj = nn.LayerNorm(c.dim), nn.Linear(c.dim, 4 * c.dim), nn.Linear(4 * c.dim, c.dim)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.proj(self.fc(self.ln2(x)).gelu(approximate="tanh")))  # GPT-2's


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        self.config = c
        self.tok, self.pos = nn.Embedding(c.vocab, c.dim), nn.Embedding(c.block, c.dim)
        self.blocks = [Block(c) for _ in range(c.n_layer)]
        self.ln, self.head = nn.LayerNorm(c.dim), nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        """Logits [B, T, vocab] for token ids [B, T]."""
        _, t = idx.shape
        x = self.tok(idx) + self.pos(T.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        logits = self(idx)
        return nn.cross_entropy(logits.reshape(-1, self.config.vocab), targets.reshape(-1))
