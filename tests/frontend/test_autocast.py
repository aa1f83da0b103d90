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


@pytest.mark.parametrize("form", ["causal_attention", "sdpa_bf16", "sdpa_autocast"])
def test_attention_scores_are_not_rounded_to_bf16(form: str) -> None:
    """Attention of 16-bit q and k (or under autocast) takes f32 scores of their exact products,
    as flash kernels keep them: a bf16 product would round each score first, and at peaked
    attention (q and k of std 4) o was 8x further from the f64 truth (1.2e-2 against 1.4e-3)."""
    import torch

    from ember import functional as F
    from ember import nn
    rng = np.random.default_rng(0)
    # bf16 values already: the error measured is the attention's own, not the inputs' rounding
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 2, 96, 64)) * s).bfloat16().double() for s in (4, 4, 1))
    truth = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    a, b, c = (T.Tensor(x.float().numpy()) for x in (q, k, v))
    if form == "sdpa_bf16":
        o = F.scaled_dot_product_attention(a.cast("bfloat16"), b.cast("bfloat16"), c.cast("bfloat16"), is_causal=True)
        assert o.dtype.name == "bf16"   # PyTorch's: the operands' dtype
    else:
        with ember.autocast("bfloat16"):
            o = nn.causal_attention(a, b, c) if form == "causal_attention" else \
                F.scaled_dot_product_attention(a, b, c, is_causal=True)
    err = np.linalg.norm(o.cast("float32").numpy() - truth) / np.linalg.norm(truth)
    assert err < 3e-3, err


def test_a_linear_with_a_bias_is_torch_autocasts() -> None:
    """nn.Linear under autocast as torch.autocast's: the bias added in bf16 to the bf16 product
    (torch rounds once, Ember twice: within a bf16 ulp), given back as f32; the bias gradient
    is the sum of the bf16 gradient that the matmuls read, not of an f32 one."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x, w, b, dy = (rng.standard_normal(s).astype(np.float32) for s in ((48, 64), (96, 64), (96,), (48, 96)))
    xe, we, be = T.Tensor(x), T.Tensor(w, requires_grad=True), T.Tensor(b, requires_grad=True)
    with ember.autocast("bfloat16"):
        y = ember.functional.linear(xe, we, be)
    assert y.dtype is ember.dtype.f32
    (y * T.Tensor(dy)).sum().backward()
    xt, wt, bt = torch.tensor(x), torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt = torch.nn.functional.linear(xt, wt, bt)
    (yt.float() * torch.tensor(dy)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.float().detach().numpy(), rtol=8e-3, atol=8e-3)
    for got, want in ((be.grad, bt.grad), (we.grad, wt.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=8e-3, atol=3e-2)
    from ember.compiler import autodiff
    (g,) = autodiff.expand_grads([be.grad.node])   # f32(reshape(sum of the bf16 gradient over rows))
    assert g.op is ember.ir.Op.CAST and g.srcs[0].srcs[0].op is ember.ir.Op.SUM
    assert g.srcs[0].srcs[0].srcs[0].dtype is ember.dtype.bf16
