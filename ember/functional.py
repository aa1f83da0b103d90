"""torch.nn.functional's activations and losses, with its names, arguments and defaults
(`from ember import functional as F`). Each is a composition of Tensor ops, so it compiles and
fuses like any other, and its gradient comes from the compiler's autodiff."""
from __future__ import annotations

import math
from typing import Any

from . import dtype as dt
from . import ir
from .tensor import ShapeError, Tensor, where

# ---------------------------------------------------------------------------- activations


def relu(x: Tensor) -> Tensor:
    return x.relu()


def relu6(x: Tensor) -> Tensor:
    return hardtanh(x, 0.0, 6.0)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    return where(x > 0, x, x * negative_slope)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return where(x > 0, x, x.clamp(max=0).expm1() * alpha)  # clamped: exp never overflows in the unused branch


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return where(x > 0, x, (x.clamp(max=0) / alpha).expm1() * alpha)


def selu(x: Tensor) -> Tensor:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return elu(x, alpha) * scale


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """Its gradient is 0 at the bounds (PyTorch's; clamp's is 1 there)."""
    lo, hi = x._wrap(min_val), x._wrap(max_val)
    return where(x <= lo, lo, where(x >= hi, hi, x))


def hardsigmoid(x: Tensor) -> Tensor:
    return where(x <= -3, 0.0, where(x >= 3, 1.0, x / 6 + 0.5)).cast(x.dtype)


def hardswish(x: Tensor) -> Tensor:
    return where(x <= -3, 0.0, where(x >= 3, x, x * (x + 3) / 6)).cast(x.dtype)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x itself where beta x exceeds threshold (PyTorch's)."""
    bx = x * beta
    safe = where(bx > threshold, 0.0, bx).cast(x.dtype)
    return where(bx > threshold, x, safe.exp().log1p() / beta)


def softsign(x: Tensor) -> Tensor:
    return x / (x.abs() + 1)


def logsigmoid(x: Tensor) -> Tensor:
    """-softplus(-x), as min(x, 0) - log1p(exp(-|x|)): finite for every x."""
    return where(x < 0, x, 0.0).cast(x.dtype) - (-where(x >= 0, x, -x)).exp().log1p()


def mish(x: Tensor) -> Tensor:
    return x * softplus(x).tanh()


def silu(x: Tensor) -> Tensor:
    return x.silu()


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return x.gelu(approximate)


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.softmax(dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.log_softmax(dim)


def softmin(x: Tensor, dim: int = -1) -> Tensor:
    return (-x).softmax(dim)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(||x||_p, eps) along dim."""
    norm = x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p) if p != 2 else (x * x).sum(dim, keepdim=True).sqrt()
    return x / norm.clamp(min=eps)


# --------------------------------------------------------------------------------- losses


def _reduce(loss: Tensor, reduction: str, weight_sum: Tensor | None = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / weight_sum if weight_sum is not None else loss.mean()
    raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _classes_last(x: Tensor) -> Tensor:
    """[N, C, d1, ...] -> [N, d1, ..., C]: the class dim last, as the ops below want it."""
    if x.ndim <= 2:
        return x
    return x.permute(0, *range(2, x.ndim), 1)


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: A002
             reduction: str = "mean") -> Tensor:
    """-input[target] per element, weighted; ignored targets count neither in the sum nor the mean."""
    logp = _classes_last(input if input.ndim > 1 else input.unsqueeze(0))
    tgt = target if input.ndim > 1 else target.reshape(1)
    c = logp.shape[-1]
    if logp.shape[:-1] != tgt.shape:
        raise ShapeError(f"nll_loss: input {list(input.shape)} and target {list(target.shape)} do not match "
                         "([N, C, ...] and [N, ...])")
    keep = tgt.ne(ignore_index)
    onehot = where(keep, tgt, 0).one_hot(c).cast(logp.dtype)
    w = onehot if weight is None else onehot * weight
    picked_w = w.sum(-1) * keep.cast(logp.dtype)
    loss = -(logp * w).sum(-1) * keep.cast(logp.dtype)
    out = _reduce(loss, reduction, picked_w.sum())
    return out if input.ndim > 1 or reduction != "none" else out.reshape(())


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: A002
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy over the class dim (1, or the only dim) with class indices or
    class probabilities as target, PyTorch's weights, ignore_index and label smoothing."""
    logp = input.log_softmax(1 if input.ndim > 1 else 0)
    if target.dtype.is_float:  # probabilities, the same shape as input
        if target.shape != input.shape:
            raise ShapeError(f"cross_entropy: probability target {list(target.shape)} must match input "
                             f"{list(input.shape)}")
        cdim = 1 if input.ndim > 1 else 0
        c = input.shape[cdim]
        t = target * (1 - label_smoothing) + label_smoothing / c if label_smoothing else target
        w = logp if weight is None else logp * weight.reshape((c,) + (1,) * (input.ndim - cdim - 1))
        return _reduce(-(w * t).sum(cdim), reduction)
    nll = nll_loss(logp, target, weight, ignore_index, reduction)
    if not label_smoothing:
        return nll
    # the smoothed part: -mean over classes of logp (weighted), over the same kept elements
    lp = _classes_last(logp if logp.ndim > 1 else logp.unsqueeze(0))
    tgt = target if input.ndim > 1 else target.reshape(1)
    c = lp.shape[-1]
    keep = tgt.ne(ignore_index).cast(lp.dtype)
    smooth = -(lp if weight is None else lp * weight).sum(-1) * keep
    if reduction == "none":
        smooth = smooth if input.ndim > 1 else smooth.reshape(())
        return nll * (1 - label_smoothing) + smooth * (label_smoothing / c)
    if reduction == "sum":
        return nll * (1 - label_smoothing) + smooth.sum() * (label_smoothing / c)
    onehot = where(tgt.ne(ignore_index), tgt, 0).one_hot(c).cast(lp.dtype)
    denom = keep.sum() if weight is None else ((onehot * weight).sum(-1) * keep).sum()
    return nll * (1 - label_smoothing) + smooth.sum() / denom * (label_smoothing / c)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    d = input - target
    return _reduce(d * d, reduction)


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:  # noqa: A002
    d = (input - target).abs()
    if beta == 0:
        return _reduce(d, reduction)
    return _reduce(where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta), reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:  # noqa: A002
    return smooth_l1_loss(input, target, reduction, delta) * delta


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                         reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)), each log clamped at -100 as PyTorch does."""
    logp = input.log().clamp(min=-100)
    log1mp = (1 - input).log().clamp(min=-100)
    loss = -(target * logp + (1 - target) * log1mp)
    return _reduce(loss if weight is None else loss * weight, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """Through logsigmoid, stable for any logit."""
    ls_pos, ls_neg = logsigmoid(input), logsigmoid(-input)
    pos = ls_pos * target if pos_weight is None else ls_pos * target * pos_weight
    loss = -(pos + (1 - target) * ls_neg)
    return _reduce(loss if weight is None else loss * weight, reduction)


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:  # noqa: A002
    """target * (log target - input) pointwise (0 where target is 0); input holds log-probabilities."""
    if log_target:
        loss = target.exp() * (target - input)
    else:
        safe = where(target > 0, target, 1.0).cast(target.dtype)
        loss = where(target > 0, target * (safe.log() - input), 0.0).cast(input.dtype)
    if reduction == "batchmean":
        return loss.sum() / input.shape[0]
    return _reduce(loss, reduction)


def one_hot(x: Tensor, num_classes: int = -1) -> Tensor:
    if num_classes < 0:
        num_classes = int(x.max().item()) + 1
    return x.one_hot(num_classes)


def pad(x: Tensor, pad: Any, mode: str = "constant", value: float = 0.0) -> Tensor:
    return x.pad(pad, mode, value)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    from .nn import Dropout
    d = Dropout(p)
    d.training = training
    return d(x)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 is_causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v, with PyTorch's mask conventions (bool: True keeps)."""
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        t, u = q.shape[-2], k.shape[-2]
        rows = Tensor(ir.iota(dt.i64, (t, u), 0))
        cols = Tensor(ir.iota(dt.i64, (t, u), 1))
        s = where(cols <= rows, s, -math.inf)
    if attn_mask is not None:
        s = where(attn_mask, s, -math.inf) if attn_mask.dtype.name == "bool" else s + attn_mask
    return s.softmax(-1) @ v
