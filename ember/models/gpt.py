"""A small GPT: token and position embeddings, pre-norm blocks (causal self-attention, MLP),
a final norm and a linear head. Byte-level by default (vocab 256). With arch "llama" the same
size class the LLaMA way: RMSNorm, rotary position embeddings (RoPE), a SwiGLU MLP, no biases
and no position table."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

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
    arch: str = "gpt"     # or "llama"
    tied: bool = False    # the head shares the token embedding's weights (GPT-2's 124M count)

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        self.ln1, self.attn = nn.LayerNorm(c.dim), nn.CausalSelfAttention(c.dim, c.n_head)
        self.ln2, self.fc, self.proj = nn.LayerNorm(c.dim), nn.Linear(c.dim, 4 * c.dim), nn.Linear(4 * c.dim, c.dim)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: Tensor, cache: "nn.KVCache | None" = None) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x), cache))
        return x + self.drop(self.proj(self.fc(self.ln2(x)).gelu(approximate="tanh")))  # GPT-2's


LOGITS_CHUNK = 1 << 28   # logits of at most this many elements at once in the loss (GPT-2 at B = 16: 4 chunks)


class LanguageModel(nn.Module):
    """What the GPT and the LLaMA share: the next-token loss over their logits."""
    config: GPTConfig
    head: nn.Linear

    def hidden(self, idx: Tensor) -> Tensor:
        """The last layer's normalized features [B, T, dim], which the head turns into logits."""
        raise NotImplementedError

    def forward(self, idx: Tensor) -> Tensor:
        """Logits [B, T, vocab] for token ids [B, T]."""
        return self.head(self.hidden(idx))

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """The mean cross-entropy of the next tokens. Logits of more than LOGITS_CHUNK elements
        are made in chunks of rows, each with its own cross-entropy (summed): a chunk's logits
        and their gradient die before the next chunk's are made, instead of all B T rows of
        vocab-wide f32 or bf16 values at once (GPT-2's at B = 16: 1.5 GiB in bf16). A chunk's rows
        are a power of two, whole tiles for the head's products: at B = 32, 7 chunks of 4682 rows
        left the head's dX 148 tiles of 128 x 192 for 132 SMs (split K, 0.70 ms a chunk on an
        H100); 8 of 4096 fill them in one round."""
        h = self.hidden(idx)
        n, vocab = h.shape[0] * h.shape[1], self.config.vocab
        rows = 1 << max(0, (LOGITS_CHUNK // vocab).bit_length() - 1)
        if n * vocab <= LOGITS_CHUNK:
            return nn.cross_entropy(self.head(h).reshape(-1, vocab), targets.reshape(-1))
        h, t = h.reshape(n, -1), targets.reshape(-1)
        total = None
        for i in range(0, n, rows):
            part = nn.cross_entropy(self.head(h[i:i + rows]), t[i:i + rows], reduction="sum")
            total = part if total is None else total + part
        assert total is not None
        return total * (1.0 / n)


class GPT(LanguageModel):
    def __init__(self, c: GPTConfig):
        self.config = c
        self.tok, self.pos = nn.Embedding(c.vocab, c.dim), nn.Embedding(c.block, c.dim)
        self.blocks = [Block(c) for _ in range(c.n_layer)]
        self.ln, self.head = nn.LayerNorm(c.dim), nn.Linear(c.dim, c.vocab, bias=False)
        if c.tied:   # GPT-2's init of the shared rows, N(0, 0.02): with N(0, 1) rows the first logits had a
            # std of sqrt(dim), a first loss near 130 at GPT-2's size instead of ln(vocab) = 10.8
            self.tok.weight = nn.parameter(self.tok.weight * 0.02)
            self.head.weight = self.tok.weight

    def hidden(self, idx: Tensor) -> Tensor:
        _, t = idx.shape
        # the first t rows of the position table: pos(arange(t)) is the same, but a gather by
        # data costs a comparison of every position with every row, forward and backward
        x = self.tok(idx) + self.pos.weight[:t]
        for block in self.blocks:
            x = block(x)
        return self.ln(x)

    def decode(self, token: Tensor, caches: list[nn.KVCache]) -> Tensor:
        """Logits [B, vocab] of the token after token [B, 1], which sits at caches[0].pos."""
        x = self.tok(token) + self.pos(caches[0].pos).reshape(1, 1, -1)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache)
        return self.head(self.ln(x))[:, 0]


def kv_caches(model: "GPT | Llama", batch: int) -> list[nn.KVCache]:
    """A cache per layer for generation, sharing one position tensor (int64 [1], data)."""
    c = model.config
    pos = T.Tensor(np.zeros(1, np.int64))
    return [nn.KVCache(batch, c.n_head, c.block, c.dim // c.n_head, pos) for _ in range(c.n_layer)]


class LlamaBlock(nn.Module):
    def __init__(self, c: GPTConfig):
        self.n_head = c.n_head
        self.norm1, self.norm2 = nn.RMSNorm(c.dim), nn.RMSNorm(c.dim)
        self.qkv, self.out = nn.Linear(c.dim, 3 * c.dim, bias=False), nn.Linear(c.dim, c.dim, bias=False)
        hidden = 64 * -(-(8 * c.dim // 3) // 64)   # LLaMA's 2/3 of 4 * dim, to a multiple of 64
        self.gate, self.up = nn.Linear(c.dim, hidden, bias=False), nn.Linear(c.dim, hidden, bias=False)
        self.down = nn.Linear(hidden, c.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: "nn.KVCache | None" = None) -> Tensor:
        b, t, c = x.shape
        h = self.n_head
        q, k, v = (y.reshape(b, t, h, c // h).transpose(1, 2) for y in T.split(self.qkv(self.norm1(x)), c, -1))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = (nn.causal_attention(q, k, v) if cache is None else cache.attend(q, k, v)).transpose(1, 2).reshape(b, t, c)
        x = x + self.out(y)
        z = self.norm2(x)
        return x + self.down(self.gate(z).silu() * self.up(z))


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of [..., T, d]: the pairs (x[i], x[i + d/2]) turned by the
    angle of their position and frequency (the rotate-half form)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return T.cat([a * cos - b * sin, b * cos + a * sin], -1)


class Llama(LanguageModel):
    def __init__(self, c: GPTConfig):
        if (c.dim // c.n_head) % 2:
            raise ValueError(f"llama: the head size {c.dim // c.n_head} must be even (RoPE turns pairs)")
        self.config = c
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.blocks = [LlamaBlock(c) for _ in range(c.n_layer)]
        self.norm, self.head = nn.RMSNorm(c.dim), nn.Linear(c.dim, c.vocab, bias=False)
        half = c.dim // c.n_head // 2
        angles = np.outer(np.arange(c.block), 10000.0 ** (-np.arange(half) / half))  # [T, d/2]
        self.cos, self.sin = T.Tensor(np.cos(angles).astype(np.float32)), T.Tensor(np.sin(angles).astype(np.float32))

    def hidden(self, idx: Tensor) -> Tensor:
        _, t = idx.shape
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)

    def decode(self, token: Tensor, caches: list[nn.KVCache]) -> Tensor:
        """Logits [B, vocab] of the token after token [B, 1], which sits at caches[0].pos."""
        pos = caches[0].pos
        cos, sin = self.cos.gather_rows(pos), self.sin.gather_rows(pos)
        x = self.tok(token)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cos, sin, cache)
        return self.head(self.norm(x))[:, 0]


def build(c: GPTConfig) -> GPT | Llama:
    """The model a config describes."""
    if c.arch not in ("gpt", "llama"):
        raise ValueError(f"unknown model architecture {c.arch!r} (gpt, llama)")
    return Llama(c) if c.arch == "llama" else GPT(c)
