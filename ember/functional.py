"""torch.nn.functional's activations and losses, with its names, arguments and defaults
(`from ember import functional as F`). Each is a composition of Tensor ops, so it compiles and
fuses like any other, and its gradient comes from the compiler's autodiff."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dtype as dt
from . import ir, tensor
from .tensor import ShapeError, Tensor, _axis_windows, _function, cat, einsum, rand, where

# ---------------------------------------------------------------------------- activations
# the Tensor methods of the same names and arguments, as functions
relu, silu, gelu, sigmoid, tanh, softmax, log_softmax = (
    _function(n) for n in ("relu", "silu", "gelu", "sigmoid", "tanh", "softmax", "log_softmax"))


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


def quick_gelu(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 x), CLIP's approximation of gelu."""
    return x * (x * 1.702).sigmoid()


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    if input.shape[-1:] != weight.shape[-1:]:
        raise ShapeError(f"linear: input {list(input.shape)} and weight {list(weight.shape)} (out, in) do not fit")
    low = tensor.autocast_dtype(input)
    if bias is not None and low is not None:
        # as torch.autocast's linear: the bias added in the low precision, and its gradient
        # the sum of the low-precision gradient that the matmuls read (added after the
        # rounding, in f32, the gradient was the f32 one, which GPT-2's fc layer recomputed
        # through GELU' in a kernel of its own)
        with tensor.autocast(enabled=False):
            y = input.cast(low) @ weight.cast(low).T + bias.cast(low)
        return y.cast(input.dtype)
    y = input @ weight.T
    return y + bias if bias is not None else y


def layer_norm(input: Tensor, normalized_shape: Any, weight: Tensor | None = None,  # noqa: A002
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Over the last len(normalized_shape) dims, with the biased variance, as PyTorch."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if input.shape[input.ndim - len(shape):] != shape:
        raise ShapeError(f"layer_norm: input {list(input.shape)} does not end in normalized_shape {list(shape)}")
    dims = tuple(range(-len(shape), 0)) if len(shape) > 1 else -1
    d = input - input.mean(dims, keepdim=True)
    y = d * ((d * d).mean(dims, keepdim=True) + eps).rsqrt()
    y = y * weight if weight is not None else y
    return y + bias if bias is not None else y


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:  # noqa: A002
    """weight's rows at input; the padding row's gets no gradient, as PyTorch's."""
    if input.dtype.is_float:
        raise ShapeError(f"embedding: indices must be integers, got {input.dtype}")
    rows = weight.gather_rows(input)
    if padding_idx is None:
        return rows
    pad = padding_idx % weight.shape[0]
    return where(input.eq(pad).unsqueeze(-1), Tensor(ir.stop_gradient(rows.node)), rows)


def softmin(x: Tensor, dim: int = -1) -> Tensor:
    return (-x).softmax(dim)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(||x||_p, eps) along dim."""
    return x / x.norm(p, dim, keepdim=True).clamp(min=eps)


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
    if target.value() is not None:  # a target that is data (as usual) is checked, as PyTorch does
        t = target.numpy()
        bad = t[(t != ignore_index) & ((t < 0) | (t >= c))]
        if bad.size:
            raise IndexError(f"nll_loss: target {bad.flat[0]} is out of bounds for {c} classes")
    keep = tgt.ne(ignore_index)
    # the target's entry selected with where, as PyTorch gathers it: logp * one_hot would make a
    # -inf elsewhere in the row NaN, and the selection compiles to a load of one entry
    # (lower.selections_to_loads), not a pass over the row
    hit = where(keep, tgt, 0).one_hot(c).cast(dt.bool_)
    w = logp._wrap(1.0) if weight is None else weight.cast(logp.dtype)
    picked_w = where(hit, w, 0.0).sum(-1) * keep.cast(logp.dtype)
    loss = -where(hit, logp * w, 0.0).sum(-1) * keep.cast(logp.dtype)
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
        # PyTorch's xlogy(target, target) - target * input: 0 where target is 0, NaN below
        safe = where(target.eq(0), 1.0, target).cast(target.dtype)
        loss = where(target.eq(0), 0.0, target * safe.log()).cast(input.dtype) - target * input
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
    if not training or p == 0:
        return x
    keep = rand(x.shape) >= p
    return where(keep, x * (1 / (1 - p)), 0.0)


def _grouped(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool, name: str) -> tuple[Tensor, Tensor]:
    """k and v with each of their heads (dim -3) shared by a group of q's heads (enable_gqa)."""
    if not enable_gqa or k.shape[-3] == q.shape[-3]:
        return k, v
    if q.shape[-3] % k.shape[-3]:
        raise ShapeError(f"{name}: {q.shape[-3]} query heads are not a multiple of {k.shape[-3]} key heads")
    return k.repeat_interleave(q.shape[-3] // k.shape[-3], -3), v.repeat_interleave(q.shape[-3] // k.shape[-3], -3)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q k^T * scale + mask) v, with PyTorch's mask conventions (bool: True keeps; else
    added), broadcast against the scores; is_causal keeps j <= i (the top-left diagonal);
    enable_gqa: k and v have fewer heads (dim -3), each shared by a group of q's heads."""
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: an explicit attn_mask must not be set with is_causal=True")
    k, v = _grouped(q, k, v, enable_gqa, "scaled_dot_product_attention")
    s = attention_scores(q, k) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        t, u = q.shape[-2], k.shape[-2]
        rows = Tensor(ir.iota(dt.i64, (t, u), 0))
        cols = Tensor(ir.iota(dt.i64, (t, u), 1))
        s = where(cols <= rows, s, -math.inf)
    if attn_mask is not None:
        s = where(attn_mask, s, -math.inf) if attn_mask.dtype.name == "bool" else s + attn_mask
    p = dropout(s.softmax(-1), dropout_p) if dropout_p else s.softmax(-1)
    return (p.cast(v.dtype) if p.dtype is not v.dtype else p) @ v


def attention_scores(q: Tensor, k: Tensor) -> Tensor:
    """q k^T over the last dim, in f32 where q and k are 16-bit (or autocast makes them so): the
    products of 16-bit values are exact in f32 and summed there, as flash kernels keep them
    (Ember's, and PyTorch's SDPA). A bf16 product's result would round every score to bf16
    first, an error of |s| 2^-9 in each weight's exponent: at peaked attention (q and k of std
    4) 9x PyTorch's error in o and 5x in dq (bench/grad_parity.py --attention-only, CPU)."""
    from .tensor import context
    low = context.autocast
    if q.dtype.is_float and q.dtype.bits > 16 and low is not None:
        q, k = q.cast(low), k.cast(low)   # the operands autocast's product would take
    if not (q.dtype.is_float and q.dtype.bits <= 16):
        return q @ k.transpose(-2, -1)
    return (q.cast(dt.f32).unsqueeze(-2) * k.cast(dt.f32).unsqueeze(-3)).sum(-1)


class BlockMask:
    """What torch.nn.attention.flex_attention.create_block_mask returns, for flex_attention: the
    mask_mod, traced into the graph (the compiler finds the tiles it masks whole itself)."""

    def __init__(self, mask_mod: Any, shape: tuple[int, ...]):
        self.mask_mod, self.shape = mask_mod, shape


def create_block_mask(mask_mod: Any, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int,
                      device: Any = None) -> BlockMask:
    return BlockMask(mask_mod, (B or 1, H or 1, Q_LEN, KV_LEN))


def flex_attention(query: Tensor, key: Tensor, value: Tensor, score_mod: Any = None, block_mask: Any = None,
                   scale: float | None = None, enable_gqa: bool = False, mask_mod: Any = None) -> Tensor:
    """softmax(score_mod(q k^T * scale, b, h, q_idx, kv_idx)) v over [B, H, T, D] operands, the
    scores where mask_mod(b, h, q_idx, kv_idx) (or block_mask's) is false left out, as
    torch.nn.attention.flex_attention defines it. Both functions are traced into the graph on
    int64 index tensors broadcast against the scores ([B, 1, 1, 1], [1, H, 1, 1], [1, 1, T, 1],
    [1, 1, 1, S], from iotas), so the compiler renders them into the flash kernels' tile loop."""
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ShapeError(f"flex_attention: q, k and v must be [B, H, T, D], got {query.shape}, {key.shape}, "
                         f"{value.shape}")
    key, value = _grouped(query, key, value, enable_gqa, "flex_attention")
    if block_mask is not None:
        if mask_mod is not None:
            raise ValueError("flex_attention: give block_mask or mask_mod, not both")
        mask_mod = block_mask.mask_mod if isinstance(block_mask, BlockMask) else block_mask
    # the scores in f32 at least (score_mod sees them so; f64 operands keep f64), the weights in
    # the operands' dtype
    s = query @ key.transpose(-2, -1)
    s = (s.float() if s.dtype.itemsize < 4 else s) * (scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    sizes = s.shape
    idx = [Tensor(ir.iota(dt.i64, tuple(n if a == d else 1 for a, n in enumerate(sizes)), d)) for d in range(4)]
    if score_mod is not None:
        s = score_mod(s, *idx)
        if not isinstance(s, Tensor) or s.shape != sizes:
            raise ShapeError(f"flex_attention: score_mod must return a tensor of the scores' shape {sizes}")
    if mask_mod is not None:
        keep = mask_mod(*idx)
        if not isinstance(keep, Tensor) or keep.dtype is not dt.bool_:
            raise TypeError("flex_attention: mask_mod must return a bool tensor")
        s = where(keep, s, -math.inf)
    return s.softmax(-1).cast(value.dtype) @ value


# ----------------------------------------------------------------- convolution and pooling
# Every spatial op is built from windows: strided slices of the padded input, one per kernel
# offset, stacked at the end. They are movement ops, so the compiler fuses them into the
# reduction that follows (no im2col buffer unless the scheduler decides to keep one).


def _tuple(v: Any, n: int, name: str) -> tuple[int, ...]:
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n:
        raise ShapeError(f"{name}: expected {n} values, got {v!r}")
    return t


def _windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
             pads: list[tuple[int, int]], value: float, ceil_mode: bool = False, first: int = 2) -> Tensor:
    """The input under each kernel offset: [N, C, *spatial] -> [N, C, *out, *kernel], or with
    first=1, channels last: [N, *spatial, C] -> [N, *out, C, *kernel]. Movement ops only, so
    every element is one load at an affine address (see _axis_windows)."""
    nsp = len(kernel)
    sizes = []
    for d in range(nsp):
        length = x.shape[first + d] + pads[d][0] + pads[d][1]
        span = dilation[d] * (kernel[d] - 1) + 1
        if length < span:
            raise ShapeError(f"window of {span} does not fit an input of {length} (padding included)")
        out = (length - span) // stride[d] + 1
        if ceil_mode and (length - span) % stride[d]:
            if (out * stride[d]) < x.shape[first + d] + pads[d][0]:  # a last window must start inside
                out += 1
        sizes.append(out)
    flat = [0, 0] * (x.ndim - first - nsp)  # F.pad order: last dim first
    for d in reversed(range(nsp)):
        extra = max(0, (sizes[d] - 1) * stride[d] + dilation[d] * (kernel[d] - 1) + 1
                    - (x.shape[first + d] + pads[d][0] + pads[d][1]))
        flat += [pads[d][0], pads[d][1] + extra]
    w = x.pad(flat, value=value) if any(flat) else x
    for d in range(nsp):  # axis first + d becomes (out, k); the k axes go last
        w = _axis_windows(w, first + d, kernel[d], stride[d], dilation[d], sizes[d])
        w = w.permute(tuple(i for i in range(w.ndim) if i != first + d + 1) + (first + d + 1,))
    return w


def _pads(padding: Any, kernel: tuple[int, ...], dilation: tuple[int, ...], stride: tuple[int, ...],
          name: str) -> list[tuple[int, int]]:
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ShapeError(f"{name}: padding='same' needs stride 1, as in PyTorch")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [(t // 2, t - t // 2) for t in total]
    return [(p, p) for p in _tuple(padding, len(kernel), name)]


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
          groups: int, nsp: int, name: str) -> Tensor:
    if x.ndim != nsp + 2 or weight.ndim != nsp + 2:
        raise ShapeError(f"{name}: input {list(x.shape)} and weight {list(weight.shape)} need {nsp + 2} dims")
    n, c = x.shape[:2]
    o, cg = weight.shape[:2]
    kernel = weight.shape[2:]
    if c != cg * groups or o % groups:
        raise ShapeError(f"{name}: {c} input channels, weight {list(weight.shape)} and groups={groups} do not fit")
    st, dl = _tuple(stride, nsp, name), _tuple(dilation, nsp, name)
    # windows channels last, [N, *out, C, *k]: each output position's inputs are the padded
    # input's rows of C, so the sum of products is a matmul on tensor cores (section 6 of
    # docs/performance.md)
    xt = x.permute((0,) + tuple(range(2, 2 + nsp)) + (1,))
    win = _windows(xt, kernel, st, dl, _pads(padding, kernel, dl, st, name), 0.0, first=1)
    out_sp = win.shape[1:1 + nsp]
    win = win.reshape((n,) + out_sp + (groups, cg) + kernel)
    # the kernel offsets before the channels, so that K runs (kh, kw, c): the input's channels
    # are contiguous, and the product reads the windows in place (implicit GEMM); the weight
    # is copied once to that order
    win = win.permute(tuple(range(2 + nsp)) + tuple(range(3 + nsp, 3 + 2 * nsp)) + (2 + nsp,))
    w = weight.reshape((groups, o // groups, cg) + kernel)
    sp, ks = "hijklm"[:nsp], "pqrstu"[:nsp]
    y = einsum(f"n{sp}g{ks}c,goc{ks}->ngo{sp}", win, w).reshape((n, o) + out_sp)
    return y + bias.reshape((1, o) + (1,) * nsp) if bias is not None else y


def _spatial(name: str, nsp: int, doc: str, fn: Any) -> Any:
    """torch.nn.functional's NAME1d, NAME2d and NAME3d (nsp spatial dims), each fn with nsp bound."""
    fn.__name__ = fn.__qualname__ = f"{name}{nsp}d"
    fn.__doc__ = doc
    return fn


def _convs(nsp: int) -> Any:
    def conv(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,  # noqa: A002
             padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
        return _conv(input, weight, bias, stride, padding, dilation, groups, nsp, f"conv{nsp}d")
    return _spatial("conv", nsp, f"PyTorch's conv{nsp}d: [N, C, *{nsp} dims] by weight [O, C / groups, *kernel].",
                    conv)


conv1d, conv2d, conv3d = (_convs(n) for n in (1, 2, 3))


def _pool(x: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool, nsp: int,
          name: str, kind: str, count_include_pad: bool = True) -> Tensor:
    if x.ndim == nsp + 1:  # unbatched, as PyTorch allows
        return _pool(x.unsqueeze(0), kernel_size, stride, padding, dilation, ceil_mode, nsp, name, kind,
                     count_include_pad).squeeze(0)
    k = _tuple(kernel_size, nsp, name)
    st = _tuple(stride if stride is not None else kernel_size, nsp, name)
    dl = _tuple(dilation, nsp, name)
    pads = [(p, p) for p in _tuple(padding, nsp, name)]
    if any(p > kk // 2 for (p, _), kk in zip(pads, k)):
        raise ShapeError(f"{name}: padding should be at most half of the kernel size, got {padding}")
    kdims = tuple(range(-nsp, 0))
    if kind == "max":
        lowest = -math.inf if x.dtype.is_float else x.dtype.min
        return _windows(x, k, st, dl, pads, lowest, ceil_mode).amax(kdims)
    total = _windows(x, k, st, dl, pads, 0.0, ceil_mode).sum(kdims)
    # the divisor: the window's cells inside the input (and its padding, with count_include_pad)
    ones = Tensor(np.ones((1, 1) + x.shape[2:], np.float32))
    if count_include_pad:
        ones = ones.pad([p for (a, b) in reversed(pads) for p in (a, b)], value=1.0)
        count = _windows(ones, k, st, dl, [(0, 0)] * nsp, 0.0, ceil_mode)
        count = count.sum(kdims)
        sizes = total.shape[2:]
        count = count[(slice(None), slice(None)) + tuple(slice(0, s) for s in sizes)]
    else:
        count = _windows(ones, k, st, dl, pads, 0.0, ceil_mode).sum(kdims)
    return total / count.cast(total.dtype)


def _pools(nsp: int) -> tuple[Any, Any]:
    def max_pool(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
                 dilation: Any = 1, ceil_mode: bool = False) -> Tensor:
        return _pool(input, kernel_size, stride, padding, dilation, ceil_mode, nsp, f"max_pool{nsp}d", "max")

    def avg_pool(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
                 ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
        return _pool(input, kernel_size, stride, padding, 1, ceil_mode, nsp, f"avg_pool{nsp}d", "avg",
                     count_include_pad)
    return (_spatial("max_pool", nsp, "The maximum of each window (padding is -inf).", max_pool),
            _spatial("avg_pool", nsp, "The mean of each window (count_include_pad: padding counts).", avg_pool))


(max_pool1d, avg_pool1d), (max_pool2d, avg_pool2d), (max_pool3d, avg_pool3d) = (_pools(n) for n in (1, 2, 3))


def _conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, output_padding: Any,
                    groups: int, dilation: Any, nsp: int, name: str) -> Tensor:
    """The transposed convolution as a convolution: stride-1 zeros between the input's elements,
    padding dilation*(k-1) - padding around them, and the kernel flipped with in and out swapped."""
    cin, cog = weight.shape[:2]
    kernel = weight.shape[2:]
    st, pd, op = (_tuple(v, nsp, name) for v in (stride, padding, output_padding))
    dl = _tuple(dilation, nsp, name)
    y = x
    for d in range(nsp):
        axis = 2 + d
        if st[d] > 1:  # zeros between elements: each element followed by stride-1 zeros, the last trimmed
            z = y.unsqueeze(axis + 1)
            pads = [0, 0] * (z.ndim - axis - 2) + [0, st[d] - 1]
            y = z.pad(pads).flatten(axis, axis + 1).narrow(axis, 0, (y.shape[axis] - 1) * st[d] + 1)
    pads = []
    for d in reversed(range(nsp)):
        edge = dl[d] * (kernel[d] - 1) - pd[d]
        pads += [edge, edge + op[d]]
    y = y.pad(pads)
    w = weight.reshape((groups, cin // groups, cog) + kernel).transpose(1, 2)
    w = w.reshape((groups * cog, cin // groups) + kernel)
    w = w.flip(list(range(2, 2 + nsp)))
    return _conv(y, w, bias, 1, 0, dl, groups, nsp, name)


def _conv_transposes(nsp: int) -> Any:
    def conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,  # noqa: A002
                       padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
        return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, nsp,
                               f"conv_transpose{nsp}d")
    return _spatial("conv_transpose", nsp, "PyTorch's transposed convolution, weight [C, O / groups, *kernel].",
                    conv_transpose)


conv_transpose1d, conv_transpose2d, conv_transpose3d = (_conv_transposes(n) for n in (1, 2, 3))


def _adaptive(x: Tensor, output_size: Any, nsp: int, kind: str) -> Tensor:
    """PyTorch's windows [floor(i L / O), ceil((i + 1) L / O)), one spatial dim after another
    (a rectangle's max or mean is that of its rows' maxima or means)."""
    sizes = _tuple(output_size, nsp, f"adaptive_{kind}_pool")
    y = x
    for d, o in enumerate(sizes):
        axis = x.ndim - nsp + d
        n = y.shape[axis]
        o = n if o is None else o
        parts = []
        for i in range(o):
            a, b = (i * n) // o, -(-((i + 1) * n) // o)
            w = y.narrow(axis, a, b - a)
            parts.append(w.amax(axis, keepdim=True) if kind == "max" else w.mean(axis, keepdim=True))
        y = cat(parts, axis) if len(parts) > 1 else parts[0]
    return y


def _adaptives(nsp: int, kind: str) -> Any:
    def adaptive(input: Tensor, output_size: Any) -> Tensor:  # noqa: A002
        return _adaptive(input, output_size, nsp, kind)
    return _spatial(f"adaptive_{kind}_pool", nsp, f"The {kind} of PyTorch's adaptive windows (_adaptive).", adaptive)


adaptive_avg_pool1d, adaptive_avg_pool2d = _adaptives(1, "avg"), _adaptives(2, "avg")
adaptive_max_pool1d, adaptive_max_pool2d = _adaptives(1, "max"), _adaptives(2, "max")


def interpolate(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",  # noqa: A002
                align_corners: bool | None = None) -> Tensor:
    """nearest, nearest-exact, linear (1 spatial dim), bilinear (2) and trilinear (3), one dim at a
    time. The source positions and weights depend only on the sizes, so they are constants of the
    graph. Integer inputs interpolate in f32, rounded half up as PyTorch's uint8 kernels."""
    nsp = input.ndim - 2
    linear = {"linear": 1, "bilinear": 2, "trilinear": 3}
    if mode not in ("nearest", "nearest-exact", *linear) or linear.get(mode, nsp) != nsp:
        raise ValueError(f"interpolate: mode {mode!r} for {nsp} spatial dims (nearest, nearest-exact, linear for 1, "
                         "bilinear for 2, trilinear for 3)")
    if mode in linear and not input.dtype.is_float:
        out = interpolate(input.float(), size, scale_factor, mode, align_corners)
        return (out + 0.5).floor().clamp(input.dtype.min, input.dtype.max).cast(input.dtype)
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    ins = input.shape[2:]
    if size is not None:
        outs, scales = _tuple(size, nsp, "interpolate"), [i / o for i, o in zip(ins, _tuple(size, nsp, "interpolate"))]
    else:
        sf = (scale_factor,) * nsp if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
        outs, scales = tuple(int(math.floor(i * f)) for i, f in zip(ins, sf)), [1 / f for f in sf]
    y = input
    for d in range(nsp):
        axis, n, o = 2 + d, ins[d], outs[d]
        dst = np.arange(o, dtype=np.float64)
        if mode.startswith("nearest"):
            src = np.minimum(np.floor((dst + (0.5 if mode == "nearest-exact" else 0)) * scales[d]).astype(np.int64),
                             n - 1)
            y = y.index_select(axis, Tensor(src))
            continue
        if align_corners:
            pos = dst * ((n - 1) / (o - 1)) if o > 1 else np.zeros(o)
        else:
            pos = np.maximum((dst + 0.5) * scales[d] - 0.5, 0.0)
        i0 = np.minimum(np.floor(pos).astype(np.int64), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        frac = (pos - i0).astype(np.float32)
        view = [1] * y.ndim
        view[axis] = o
        w1 = Tensor(frac.reshape(view)).cast(y.dtype)
        y = y.index_select(axis, Tensor(i0)) * (1 - w1) + y.index_select(axis, Tensor(i1)) * w1
    return y


def max_pool2d_with_indices(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
                            dilation: Any = 1, ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
    """max_pool2d and, for each output, the flat index (h * W + w) of its maximum in the input,
    as return_indices=True gives (the first of equal maxima)."""
    values = max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)
    h, w = input.shape[-2:]
    pos = Tensor(np.arange(h * w, dtype=np.float64).reshape(h, w)).expand(*input.shape)
    k, st, dl = _tuple(kernel_size, 2, "max_pool2d"), _tuple(stride if stride is not None else kernel_size, 2,
                                                             "max_pool2d"), _tuple(dilation, 2, "max_pool2d")
    pads = [(p, p) for p in _tuple(padding, 2, "max_pool2d")]
    win_v = _windows(input, k, st, dl, pads, -math.inf, ceil_mode)
    win_p = _windows(pos, k, st, dl, pads, math.inf, ceil_mode)
    first = where(win_v.eq(values.unsqueeze(-1).unsqueeze(-1)), win_p, math.inf).amin((-2, -1))
    return values, first.cast(dt.i64)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
                 output_size: Any = None) -> Tensor:
    """Each value written at its index of the unpooled plane, zeros elsewhere."""
    k = _tuple(kernel_size, 2, "max_unpool2d")
    st = _tuple(stride if stride is not None else kernel_size, 2, "max_unpool2d")
    pd = _tuple(padding, 2, "max_unpool2d")
    h, w = input.shape[-2:]
    out = tuple(output_size[-2:]) if output_size is not None else \
        ((h - 1) * st[0] - 2 * pd[0] + k[0], (w - 1) * st[1] - 2 * pd[1] + k[1])
    lead = input.shape[:-2]
    flat = input.reshape(lead + (h * w,))
    zeros = Tensor(ir.const(0, input.dtype, lead + (out[0] * out[1],)))
    return zeros.scatter(-1, indices.reshape(lead + (h * w,)), flat).reshape(lead + out)
