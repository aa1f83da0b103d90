"""Layers with PyTorch's names, and state dicts in the safetensors format."""
from __future__ import annotations

import json
import math
import os
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from . import data, functional, init
from . import dtype as dt
from . import tensor as T
from .tensor import ShapeError, Tensor


class Parameter(Tensor):
    """nn.Parameter: a leaf that requires grad (by default), its value computed now (random
    inits run as compiled code); a Module registers it as a parameter."""
    __slots__ = ()

    def __init__(self, data: Any = None, requires_grad: bool = True):
        data = np.zeros(0, np.float32) if data is None else data
        if isinstance(data, Tensor):
            T.realize(data)
            super().__init__(data.value(), data.dtype, requires_grad)
        else:
            super().__init__(data, None, requires_grad)


parameter = Parameter


class Module:
    """PyTorch's Module: attributes that are Parameters (or leaves that require grad), Modules
    (also in lists) and registered buffers make up its parameters and state dict."""
    training = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                yield from ((f"{name}.{i}", m) for i, m in enumerate(value) if isinstance(m, Module))

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def named_parameters(self, prefix: str = "", _seen: set[int] | None = None) -> Iterator[tuple[str, Tensor]]:
        """Each parameter once, as PyTorch: a tensor shared by two modules (tied embeddings)
        under its first name."""
        seen = set() if _seen is None else _seen
        yield from self._own_parameters(prefix, seen)
        for name, m in self.named_children():
            yield from m.named_parameters(f"{prefix}{name}.", seen)

    def _own_parameters(self, prefix: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
        for name, value in vars(self).items():
            if isinstance(value, Parameter) or isinstance(value, Tensor) and value.is_leaf and value.requires_grad:
                if id(value) not in seen:
                    seen.add(id(value))
                    yield prefix + name, value

    def parameters(self, recurse: bool = True) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        setattr(self, name, tensor)
        if persistent:
            self.__dict__.setdefault("_buffer_names", []).append(name)

    def register_parameter(self, name: str, param: Tensor | None) -> None:
        setattr(self, name, param)

    def add_module(self, name: str, module: "Module") -> None:
        setattr(self, name, module)

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for name in vars(self).get("_buffer_names", []):
            if isinstance(getattr(self, name), Tensor):
                yield prefix + name, getattr(self, name)
        for name, m in self.named_children():
            yield from m.named_buffers(f"{prefix}{name}.")

    def buffers(self) -> list[Tensor]:
        return [b for _, b in self.named_buffers()]

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator["Module"]:
        return (m for _, m in self.named_modules())

    def apply(self, fn: Any) -> "Module":
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            p.grad = None if set_to_none or p.grad is None else T.zeros_like(p.grad)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def to(self, *args: Any, dtype: Any = None, device: Any = None, **_: Any) -> "Module":
        """Module.to(device) picks where programs run (as Tensor.to); to(dtype) casts the floating
        point parameters and buffers, in place."""
        for a in args:
            if isinstance(a, str) and a.removeprefix("torch.") not in T._NAMES:
                device = a
            else:
                dtype = a
        if device is not None:
            T.zeros(()).to(device)
        if dtype is not None:
            with T.no_grad():
                for t in self.parameters() + self.buffers():
                    if t.dtype.is_float:
                        t._rebind(t.cast(dtype))
        return self

    def cuda(self, device: Any = None) -> "Module":
        return self.to("cuda")

    def cpu(self) -> "Module":
        return self

    def float(self) -> "Module": return self.to(dt.f32)  # noqa: E704
    def double(self) -> "Module": return self.to(dt.f64)  # noqa: E704
    def half(self) -> "Module": return self.to(dt.f16)  # noqa: E704

    def state_dict(self, prefix: str = "", _seen: set[int] | None = None) -> dict[str, Tensor]:
        """Each module's parameters, then its buffers, then its children's, as PyTorch orders them."""
        seen = set() if _seen is None else _seen
        out = dict(self._own_parameters(prefix, seen))
        out.update({prefix + n: b for n, b in self.named_buffers() if "." not in n})
        for name, m in self.named_children():
            out.update(m.state_dict(f"{prefix}{name}.", seen))
        return out

    def load_state_dict(self, state: dict[str, Tensor | np.ndarray], strict: bool = True) -> None:
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or (strict and unexpected):
            raise KeyError(f"load_state_dict: missing {', '.join(missing) or 'nothing'}; "
                           f"unexpected {', '.join(unexpected) or 'nothing'}")
        for name, p in own.items():
            value = state[name]
            arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if tuple(arr.shape) != p.shape:
                raise ShapeError(f"load_state_dict: {name} is {list(p.shape)}, the state has {list(arr.shape)}")
            p.assign(Tensor(arr, p.dtype))


def _uniform(fan_in: int, *shape: int) -> Parameter:
    """PyTorch's default init of weights and biases: uniform in +-1/sqrt(fan_in)."""
    bound = 1 / math.sqrt(fan_in)
    return parameter(T.rand(*shape) * (2 * bound) - bound)


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        self.weight = _uniform(in_features, out_features, in_features)
        self.bias = _uniform(in_features, out_features) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != self.weight.shape[1:]:
            raise ShapeError(f"Linear({self.weight.shape[1]}, {self.weight.shape[0]}) got input {list(x.shape)}")
        return functional.linear(x, self.weight, self.bias)


class ModuleList(Module):
    def __init__(self, modules: Any = ()):
        self.items = list(modules)

    def __getitem__(self, i: int) -> Module:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.items)

    def append(self, m: Module) -> "ModuleList":
        self.items.append(m)
        return self

    def named_children(self) -> Iterator[tuple[str, Module]]:   # PyTorch's names: "0.weight"
        return ((str(i), m) for i, m in enumerate(self.items))


class Sequential(ModuleList):
    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for m in self.items:
            x = m(x)
        return x


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


class Identity(Module):
    def forward(self, x: Any) -> Any:
        return x


def _activation(cls: str, name: str, ignored: tuple[str, ...] = (), **defaults: Any) -> type:
    """The module class `cls` around ember.functional.<name>, taking that function's options
    (and accepting the deprecated ones in ignored)."""
    def __init__(self: Module, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(defaults) or set(kwargs) - set(defaults) - set(ignored):
            raise TypeError(f"{cls} takes {list(defaults) or 'no options'}, got {args} {kwargs}")
        self.options = {**defaults, **dict(zip(defaults, args)), **{k: v for k, v in kwargs.items() if k in defaults}}

    def forward(self: Module, *inputs: Tensor) -> Tensor:
        return getattr(functional, name)(*inputs, **self.options)  # type: ignore[attr-defined]
    return type(cls, (Module,), {"__init__": __init__, "forward": forward, "__doc__": f"F.{name} as a module."})


ReLU, ReLU6, SELU, SiLU = _activation("ReLU", "relu"), _activation("ReLU6", "relu6"), \
    _activation("SELU", "selu"), _activation("SiLU", "silu")
Sigmoid, Tanh, Softsign = _activation("Sigmoid", "sigmoid"), _activation("Tanh", "tanh"), \
    _activation("Softsign", "softsign")
Hardsigmoid, Hardswish = _activation("Hardsigmoid", "hardsigmoid"), _activation("Hardswish", "hardswish")
Mish, LogSigmoid = _activation("Mish", "mish"), _activation("LogSigmoid", "logsigmoid")
LeakyReLU = _activation("LeakyReLU", "leaky_relu", negative_slope=0.01)
ELU, CELU = _activation("ELU", "elu", alpha=1.0), _activation("CELU", "celu", alpha=1.0)
GELU = _activation("GELU", "gelu", approximate="none")
Softplus = _activation("Softplus", "softplus", beta=1.0, threshold=20.0)
Hardtanh = _activation("Hardtanh", "hardtanh", min_val=-1.0, max_val=1.0)
Softmax, LogSoftmax = _activation("Softmax", "softmax", dim=-1), _activation("LogSoftmax", "log_softmax", dim=-1)
Softmin = _activation("Softmin", "softmin", dim=-1)


class _ConvNd(Module):
    nsp = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True):
        k = functional._tuple(kernel_size, self.nsp, type(self).__name__)
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"{type(self).__name__}: channels {in_channels} and {out_channels} are not divisible "
                             f"by groups={groups}")
        fan_in = in_channels // groups * math.prod(k)
        self.weight = _uniform(fan_in, out_channels, in_channels // groups, *k)
        self.bias = _uniform(fan_in, out_channels) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x: Tensor) -> Tensor:
        conv = getattr(functional, f"conv{self.nsp}d")
        return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


Conv1d, Conv2d, Conv3d = (type(f"Conv{n}d", (_ConvNd,), {"nsp": n}) for n in (1, 2, 3))


class _ConvTransposeNd(Module):
    nsp = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1):
        k = functional._tuple(kernel_size, self.nsp, type(self).__name__)
        fan_in = out_channels // groups * math.prod(k)
        self.weight = _uniform(fan_in, in_channels, out_channels // groups, *k)
        self.bias = _uniform(fan_in, out_channels) if bias else None
        self.options = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                            dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        return getattr(functional, f"conv_transpose{self.nsp}d")(x, self.weight, self.bias, **self.options)


ConvTranspose1d, ConvTranspose2d, ConvTranspose3d = (type(f"ConvTranspose{n}d", (_ConvTransposeNd,), {"nsp": n})
                                                     for n in (1, 2, 3))


class Upsample(Module):
    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None):
        self.options = dict(size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners)

    def forward(self, x: Tensor) -> Tensor:
        return functional.interpolate(x, **self.options)


class _Pool2d(Module):
    kind = "max"

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False, **options: Any):
        self.kernel_size, self.stride, self.padding, self.ceil_mode, self.options = \
            kernel_size, stride, padding, ceil_mode, options

    def forward(self, x: Tensor) -> Tensor:
        pool = functional.max_pool2d if self.kind == "max" else functional.avg_pool2d
        return pool(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode, **self.options)


MaxPool2d, AvgPool2d = type("MaxPool2d", (_Pool2d,), {"kind": "max"}), type("AvgPool2d", (_Pool2d,), {"kind": "avg"})


class _BatchNorm(Module):
    """Batch statistics in training (running statistics updated, with the unbiased variance),
    running statistics in eval, as PyTorch."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True):
        self.eps, self.momentum = eps, momentum
        self.weight = parameter(np.ones(num_features, np.float32)) if affine else None
        self.bias = parameter(np.zeros(num_features, np.float32)) if affine else None
        self.register_buffer("running_mean", Tensor(np.zeros(num_features, np.float32)))
        self.register_buffer("running_var", Tensor(np.ones(num_features, np.float32)))

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.running_mean.shape[0]:
            raise ShapeError(f"{type(self).__name__}({self.running_mean.shape[0]}) got input {list(x.shape)}")
        axes = [0] + list(range(2, x.ndim))
        view = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        if self.training:
            mean = x.mean(axes)
            var = x.var(axes, correction=0)
            n = x.numel() // x.shape[1]
            m = self.momentum
            # with the step's program (lazy); nothing differentiates them, so no detach is needed
            self.running_mean.assign(self.running_mean * (1 - m) + mean * m, lazy=True)
            self.running_var.assign(self.running_var * (1 - m) + var * (m * n / max(n - 1, 1)), lazy=True)
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean.reshape(view)) * (var.reshape(view) + self.eps).rsqrt()
        if self.weight is not None and self.bias is not None:
            y = y * self.weight.reshape(view) + self.bias.reshape(view)
        return y


BatchNorm1d, BatchNorm2d = type("BatchNorm1d", (_BatchNorm,), {}), type("BatchNorm2d", (_BatchNorm,), {})


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ShapeError(f"GroupNorm: {num_channels} channels are not divisible into {num_groups} groups")
        self.num_groups, self.eps = num_groups, eps
        self.weight = parameter(np.ones(num_channels, np.float32)) if affine else None
        self.bias = parameter(np.zeros(num_channels, np.float32)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        n, c = x.shape[:2]
        g = x.reshape((n, self.num_groups, -1))
        mu = g.mean(-1, keepdim=True)
        y = ((g - mu) * (g.var(-1, keepdim=True, correction=0) + self.eps).rsqrt()).reshape(x.shape)
        view = (1, c) + (1,) * (x.ndim - 2)
        if self.weight is not None and self.bias is not None:
            y = y * self.weight.reshape(view) + self.bias.reshape(view)
        return y


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
        self.weight = parameter(T.randn(num_embeddings, embedding_dim))
        self.padding_idx = padding_idx
        if padding_idx is not None:   # its row starts at zero, as PyTorch's
            with T.no_grad():
                self.weight[padding_idx] = 0.0

    def forward(self, idx: Tensor) -> Tensor:
        return functional.embedding(idx, self.weight, self.padding_idx)


class LayerNorm(Module):
    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        self.shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.weight = parameter(np.ones(self.shape, np.float32)) if elementwise_affine else None
        self.bias = parameter(np.zeros(self.shape, np.float32)) if elementwise_affine and bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return functional.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        self.weight, self.eps = parameter(np.ones(dim, np.float32)), eps

    def forward(self, x: Tensor) -> Tensor:
        return x * ((x * x).mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


class Dropout(Module):
    def __init__(self, p: float = 0.1):
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return functional.dropout(x, self.p, self.training)


def _loss(cls: str, name: str, **defaults: Any) -> type:
    """The loss module `cls` around ember.functional.<name>(input, target, **options)."""
    return _activation(cls, name, ("size_average", "reduce"), **defaults)


MSELoss, L1Loss = _loss("MSELoss", "mse_loss", reduction="mean"), _loss("L1Loss", "l1_loss", reduction="mean")
CrossEntropyLoss = _loss("CrossEntropyLoss", "cross_entropy", weight=None, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0)
NLLLoss = _loss("NLLLoss", "nll_loss", weight=None, ignore_index=-100, reduction="mean")
BCELoss = _loss("BCELoss", "binary_cross_entropy", weight=None, reduction="mean")
BCEWithLogitsLoss = _loss("BCEWithLogitsLoss", "binary_cross_entropy_with_logits", weight=None, reduction="mean",
                          pos_weight=None)
SmoothL1Loss = _loss("SmoothL1Loss", "smooth_l1_loss", reduction="mean", beta=1.0)
HuberLoss = _loss("HuberLoss", "huber_loss", reduction="mean", delta=1.0)
KLDivLoss = _loss("KLDivLoss", "kl_div", reduction="mean", log_target=False)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0, eps: float = 1e-6) -> Tensor:
    """torch.nn.utils.clip_grad_norm_: scale every gradient by min(1, max_norm / (norm + eps)),
    the norm taken over all of them together; returns that norm. Lazy like the gradients: the
    next optimizer step computes the norm and the scaled updates in its one program."""
    grads = [p for p in ([parameters] if isinstance(parameters, Tensor) else parameters) if p.grad is not None]
    if not grads:
        return Tensor(np.array(0.0, np.float32))
    if norm_type == math.inf:
        total = T.stack([p.grad.float().abs().amax() for p in grads]).amax()
    else:
        total = T.stack([p.grad.float().abs().pow(norm_type).sum() for p in grads]).sum().pow(1 / norm_type)
    scale = (max_norm / (total + eps)).clamp(max=1.0)
    for p in grads:
        p.grad = p.grad * scale.to(p.grad.dtype)
    return total


def clip_grad_value_(parameters: Any, clip_value: float) -> None:
    for p in ([parameters] if isinstance(parameters, Tensor) else parameters):
        if p.grad is not None:
            p.grad = p.grad.clamp(-clip_value, clip_value)


def _submodule(name: str, **members: Any) -> types.ModuleType:
    """ember.nn.<name> as an importable module (`import ember.nn.functional as F`)."""
    module = types.ModuleType(f"{__name__}.{name}")
    module.__dict__.update(members)
    sys.modules[module.__name__] = module
    return module


utils = _submodule("utils", clip_grad_norm_=clip_grad_norm_, clip_grad_value_=clip_grad_value_)
sys.modules[f"{__name__}.functional"] = functional
sys.modules[f"{__name__}.init"] = init


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d), masked so a position sees itself and the past) v; [..., T, d].
    Of 16-bit q, k and v (or under autocast) the scores and the softmax are f32
    (functional.attention_scores), the weights are rounded to v's dtype, and so is the result."""
    t, d = q.shape[-2], q.shape[-1]
    scores = functional.attention_scores(q, k) * (1 / math.sqrt(d))
    rows = T.Tensor(T.ir.iota(dt.i32, (t, t), 0))
    cols = T.Tensor(T.ir.iota(dt.i32, (t, t), 1))
    scores = T.where(cols <= rows, scores, -1e9)
    p = scores.softmax(-1)
    return (p.cast(v.dtype) if p.dtype is not v.dtype else p) @ v


class CausalSelfAttention(Module):
    def __init__(self, dim: int, n_head: int):
        if dim % n_head:
            raise ShapeError(f"CausalSelfAttention: dim {dim} is not divisible by n_head {n_head}")
        self.n_head = n_head
        self.qkv = Linear(dim, 3 * dim)
        self.proj = Linear(dim, dim)

    def forward(self, x: Tensor, cache: "KVCache | None" = None) -> Tensor:
        """x [B, T, C]; with a cache, x is the token at cache.pos ([B, 1, C]) and attends to the
        cached keys and values of the positions before it (the cache takes its own)."""
        b, t, c = x.shape
        h = self.n_head
        qkv, wide, low = self.qkv(x), None, T.context.autocast
        if cache is None and low is not None and qkv.dtype.is_float and qkv.dtype.bits > low.bits:
            # autocast casts q, k and v for the products anyway: cast the projection once, before
            # the heads are split (the same values), so that they are views of one narrow buffer,
            # which the flash kernels read in place; the scores stay f32 (causal_attention)
            wide, qkv = qkv.dtype, qkv.cast(low)
        q, k, v = (y.reshape(b, t, h, c // h).transpose(1, 2) for y in T.split(qkv, c, -1))
        if cache is not None:
            y = cache.attend(q, k, v)
        else:
            y = causal_attention(q, k, v)
            y = y.cast(wide) if wide is not None else y
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class KVCache:
    """One attention layer's keys and values of the positions generated so far, [B, H, T, d],
    for generation one token at a time: the position is data (a tensor), so every position runs
    the same compiled program. attend() writes the new token's key and value at pos and attends
    over positions up to pos; the new cache tensors take effect when the step's program runs."""

    def __init__(self, batch: int, heads: int, block: int, head_dim: int, pos: Tensor):
        self.k = Tensor(np.zeros((batch, heads, block, head_dim), np.float32))
        self.v = Tensor(np.zeros((batch, heads, block, head_dim), np.float32))
        self.pos = pos   # int64 [1], shared by the layers

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        block = self.k.shape[2]
        here = T.Tensor(T.ir.iota(dt.i64, (1, 1, block, 1), 2)).eq(self.pos.reshape(1, 1, 1, 1))
        keys, values = T.where(here, k, self.k), T.where(here, v, self.v)
        self.k.assign(keys, lazy=True)
        self.v.assign(values, lazy=True)
        scores = functional.attention_scores(q, keys) * (1 / math.sqrt(q.shape[-1]))
        seen = T.Tensor(T.ir.iota(dt.i64, (1, 1, 1, block), 3)) <= self.pos.reshape(1, 1, 1, 1)
        p = T.where(seen, scores, -1e9).softmax(-1)
        return (p.cast(values.dtype) if p.dtype is not values.dtype else p) @ values


def cross_entropy(logits: Tensor, target: Tensor, **options: Any) -> Tensor:
    """Mean negative log-likelihood of integer targets under softmax(logits); logits [N, C]
    (ember.functional.cross_entropy, which takes PyTorch's options)."""
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ShapeError(f"cross_entropy: logits {list(logits.shape)} and target {list(target.shape)} "
                         "(expected [N, C] and [N])")
    return functional.cross_entropy(logits, target, **options)


# --------------------------------------------------------------------------- safetensors

# The files go through the safetensors library, which checks a header before anything is read:
# the offsets tile the data exactly (no tensor reads another's bytes), each size is its dtype's.
_ST_BACK = {"F32": dt.f32, "F64": dt.f64, "F16": dt.f16, "BF16": dt.bf16, "I64": dt.i64, "I32": dt.i32,
            "I16": dt.i16, "I8": dt.i8, "U8": dt.u8, "BOOL": dt.bool_}


def save_safetensors(tensors: dict[str, Tensor | np.ndarray], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file, atomically: an interrupted save never leaves a broken one."""
    import safetensors
    arrays, specs = [], {}
    for name, value in tensors.items():
        if isinstance(value, Tensor):
            d, arr = value.dtype, data.to_storage(value.numpy(), value.dtype)
        else:
            arr = np.asarray(value)
            d = T.as_dtype(arr.dtype)
        if d not in _ST_BACK.values():
            raise ValueError(f"save_safetensors: {name} is {d}, which safetensors does not hold")
        arr = arr.astype(arr.dtype.newbyteorder("<"), order="C")  # (a copy that stays alive while written)
        arrays.append(arr)
        specs[name] = safetensors.TensorSpec(dtype="bfloat16" if d is dt.bf16 else arr.dtype.name,
                                             shape=list(arr.shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    safetensors.serialize_file(specs, str(tmp), metadata)
    tmp.replace(path)


def load_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Arrays by name (f16 and bf16 as float32 values) and the metadata. A file that is not a
    valid safetensors file raises one ValueError line naming it and the problem."""
    import safetensors
    try:
        with safetensors.safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
        items = safetensors.deserialize(Path(path).read_bytes())
    except safetensors.SafetensorError as e:
        raise ValueError(f"{path}: not a valid safetensors file: {str(e).removeprefix('Error while ')}") from None
    out = {}
    for name, info in items:
        if info["dtype"] not in _ST_BACK:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, which Ember does not read")
        d = _ST_BACK[info["dtype"]]
        arr = np.frombuffer(info["data"], dtype=np.dtype(d.np_name).newbyteorder("<")).reshape(info["shape"])
        out[name] = data.from_storage(arr, d)
    return out, meta


def save(obj: Any, path: str | Path) -> None:
    """ember.save: a state dict (tensors, arrays, numbers; dicts of them nested, an optimizer's
    with its param_groups) as safetensors; the nesting and the numbers go in the metadata."""
    tensors: dict[str, Any] = {}

    def flatten(value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {"dict": {str(k): flatten(v, f"{key}{k}.") for k, v in value.items()}}
        if isinstance(value, (list, tuple)):
            return {"list": [flatten(v, f"{key}{i}.") for i, v in enumerate(value)]}
        if isinstance(value, (Tensor, np.ndarray)):
            tensors[key[:-1]] = value
            return {"tensor": key[:-1]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        raise TypeError(f"ember.save: cannot save a {type(value).__name__} (tensors, arrays, numbers, "
                        "strings and dicts or lists of them)")
    skeleton = flatten(obj, "")
    save_safetensors(tensors, path, {"ember.save": json.dumps(skeleton)})


def load(path: str | Path) -> Any:
    """ember.load of ember.save's file (tensors as Tensors), or of any safetensors file (a dict)."""
    arrays, meta = load_safetensors(path)

    def build(node: dict) -> Any:
        if "dict" in node:
            return {k: build(v) for k, v in node["dict"].items()}
        if "list" in node:
            return [build(v) for v in node["list"]]
        if "tensor" in node:
            return Tensor(arrays[node["tensor"]])
        return node["value"]
    if "ember.save" not in meta:
        return {k: Tensor(v) for k, v in arrays.items()}
    return build(json.loads(meta["ember.save"]))
