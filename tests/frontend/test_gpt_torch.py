"""The GPT against PyTorch on the CPU (PyTorch as a test-only oracle): same weights, same
batch, one forward and backward; the loss and every gradient must agree."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ember.tensor as et
from ember import runners
from ember.models.gpt import GPT, GPTConfig

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")


def torch_gpt_loss(params: dict[str, "torch.Tensor"], x: np.ndarray, y: np.ndarray, c: GPTConfig) -> "torch.Tensor":
    F = torch.nn.functional
    idx, tgt = torch.from_numpy(x).long(), torch.from_numpy(y).long()
    b, t = idx.shape
    h = params["tok.weight"][idx] + params["pos.weight"][torch.arange(t)]
    for i in range(c.n_layer):
        p = lambda name: params[f"blocks.{i}.{name}"]  # noqa: E731
        a = F.layer_norm(h, (c.dim,), p("ln1.weight"), p("ln1.bias"))
        q, k, v = (a @ p("attn.qkv.weight").T + p("attn.qkv.bias")).split(c.dim, -1)
        q, k, v = (z.reshape(b, t, c.n_head, -1).transpose(1, 2) for z in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(c.dim // c.n_head)
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -1e9)
        att = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c.dim)
        h = h + att @ p("attn.proj.weight").T + p("attn.proj.bias")
        m = F.layer_norm(h, (c.dim,), p("ln2.weight"), p("ln2.bias"))
        m = F.gelu(m @ p("fc.weight").T + p("fc.bias"), approximate="tanh")
        h = h + m @ p("proj.weight").T + p("proj.bias")
    h = F.layer_norm(h, (c.dim,), params["ln.weight"], params["ln.bias"])
    logits = h @ params["head.weight"].T
    return F.cross_entropy(logits.reshape(-1, c.vocab), tgt.reshape(-1))


def compare_with_pytorch(c: GPTConfig, batch: int) -> tuple[float, dict[str, float]]:
    """One forward and backward in Ember and in PyTorch (float64) with the same weights and
    batch: the loss's relative difference, and max |diff| / max |grad| of every gradient."""
    et.manual_seed(3)
    model = GPT(c)
    rng = np.random.default_rng(0)
    x, y = (rng.integers(0, 256, (batch, c.block)).astype(np.int32) for _ in range(2))
    loss = model.loss(et.tensor(x), et.tensor(y))
    loss.backward()
    named = dict(model.named_parameters())
    et.realize(loss, *[p.grad for p in named.values()])
    params = {k: torch.tensor(v.numpy(), dtype=torch.float64, requires_grad=True) for k, v in named.items()}
    ref = torch_gpt_loss(params, x, y, c)
    ref.backward()
    grads = {k: float(np.max(np.abs(p.grad.numpy() - params[k].grad.numpy())) /
                      (np.max(np.abs(params[k].grad.numpy())) + 1e-30)) for k, p in named.items()}
    return abs(loss.item() - ref.item()) / abs(ref.item()), grads


def test_gpt_forward_backward_matches_pytorch() -> None:
    loss_diff, grads = compare_with_pytorch(GPTConfig(block=16, dim=32, n_layer=2, n_head=4), batch=4)
    assert loss_diff < 1e-5
    assert max(grads.values()) < 1e-3, f"max relative gradient difference {max(grads.values()):.2e}"


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_loss_in_chunks_of_rows_matches_pytorch(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """Logits over LOGITS_CHUNK elements are made chunk by chunk (a power of two of rows: 32 and
    16 of the 48 here, a tied head): the loss and every gradient are the whole batch's."""
    from ember.models import gpt
    monkeypatch.setattr(gpt, "LOGITS_CHUNK", 40 * 256)
    c = GPTConfig(block=16, dim=32, n_layer=1, n_head=4, arch=arch, tied=arch == "gpt")
    et.manual_seed(3)
    model = gpt.build(c)
    rng = np.random.default_rng(0)
    x, y = (et.tensor(rng.integers(0, 256, (3, 16)).astype(np.int32)) for _ in range(2))
    loss = model.loss(x, y)
    loss.backward()
    named = dict(model.named_parameters())
    et.realize(loss, *[p.grad for p in named.values()])
    got = [loss.item()] + [p.grad.numpy() for p in named.values()]
    for p in named.values():
        p.grad = None
    whole = et.tensor(0.0) + model(x).reshape(-1, 256).log_softmax(-1).gather(1, y.reshape(-1, 1)).mean() * -1.0
    whole.backward()
    et.realize(whole, *[p.grad for p in named.values()])
    want = [whole.item()] + [p.grad.numpy() for p in named.values()]
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6 * np.abs(w).max())
