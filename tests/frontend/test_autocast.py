"""Mixed precision (issue 10): under ember.autocast, f32 matmuls run on bf16 inputs (tensor
cores on the GPU, forward and backward), and training agrees with f32 within bf16 tolerance."""
from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import optim
from ember import tensor as T
from ember.backend import cuda
from ember.models.gpt import GPT, GPTConfig


def _losses(low: bool, steps: int = 4) -> tuple[list[float], GPT, optim.AdamW]:
    tokens = np.random.default_rng(0).integers(0, 256, (steps, 4, 17)).astype(np.int32)
    T.manual_seed(0)
    model = GPT(GPTConfig(block=16, dim=32, n_layer=1, n_head=2))
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    out = []
    for s in range(steps):
        opt.zero_grad()
        with ember.autocast("bfloat16", enabled=low):
            loss = model.loss(T.Tensor(tokens[s][:, :-1]), T.Tensor(tokens[s][:, 1:]))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, model, opt


def test_autocast_training_agrees_with_f32() -> None:
    full, _, _ = _losses(False)
    mixed, model, _ = _losses(True)
    np.testing.assert_allclose(mixed, full, rtol=2e-3)
    assert all(p.dtype is ember.dtype.f32 for p in model.parameters())  # f32 master weights


def test_autocast_puts_every_matmul_on_tensor_cores() -> None:
    _, model, opt = _losses(True, steps=1)
    tokens = T.Tensor(np.zeros((4, 16), np.int32))
    opt.zero_grad()
    with ember.autocast():
        loss = model.loss(tokens, tokens)
        assert (T.Tensor(np.ones((2, 3), np.float32)) @ T.Tensor(np.ones((3, 2), np.float32))).dtype is ember.dtype.f32
    loss.backward()
    opt.steps += 1
    outs = [loss.node] + [new.node for _, new in opt.updates()]
    kernels = cuda.prepare(outs, "sm_90a").kernels
    plans = [(k.contraction, k.plan) for k in kernels if k.contraction]
    assert len(plans) >= 10 and all(c.dtype is ember.dtype.bf16 and p.instruction != "fma" for c, p in plans)


def test_autocast_dtype_is_checked() -> None:
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        ember.autocast("float64")
