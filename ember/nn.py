"""Layers with PyTorch's names, and state dicts in the safetensors format."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from . import data
from . import dtype as dt
from . import tensor as T
from .tensor import ShapeError, Tensor


def parameter(value: Tensor | np.ndarray) -> Tensor:
    """A trainable leaf: the value is computed now (random inits run as compiled code)."""
    arr = value.numpy() if isinstance(value, Tensor) else value
    return Tensor(arr, requires_grad=True)


class Module:
    training = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def named_parameters(self, prefix: str = "", _seen: set[int] | None = None) -> Iterator[tuple[str, Tensor]]:
        """Each parameter once, as PyTorch: a tensor shared by two modules (tied embeddings)
        under its first name."""
        seen = set() if _seen is None else _seen
        for name, value in vars(self).items():
            if isinstance(value, Tensor) and value.requires_grad:
                if id(value) not in seen:
                    seen.add(id(value))
                    yield prefix + name, value
            elif isinstance(value, Module):
                yield from value.named_parameters(f"{prefix}{name}.", seen)
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield from item.named_parameters(f"{prefix}{name}.{i}.", seen)

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def modules(self) -> Iterator["Module"]:
        yield self
        for value in vars(self).values():
            items = value if isinstance(value, (list, tuple)) else [value]
            for item in items:
                if isinstance(item, Module):
                    yield from item.modules()

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.named_parameters())

    def load_state_dict(self, state: dict[str, Tensor | np.ndarray]) -> None:
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        if missing:
            raise KeyError(f"load_state_dict: missing {', '.join(missing)}")
        for name, p in own.items():
            value = state[name]
            arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if tuple(arr.shape) != p.shape:
                raise ShapeError(f"load_state_dict: {name} is {list(p.shape)}, the state has {list(arr.shape)}")
            p.assign(Tensor(arr, p.dtype))


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = parameter(T.rand(out_features, in_features) * (2 * bound) - bound)
        self.bias = parameter(T.rand(out_features) * (2 * bound) - bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.weight.shape[1]:
            raise ShapeError(f"Linear({self.weight.shape[1]}, {self.weight.shape[0]}) got input {list(x.shape)}")
        y = x @ self.weight.T
        return y + self.bias if self.bias is not None else y


class Sequential(Module):
    def __init__(self, *modules: Module):
        self.layers = list(modules)

    def forward(self, x: Any) -> Any:
        for m in self.layers:
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)


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


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


class Identity(Module):
    def forward(self, x: Any) -> Any:
        return x


def _activation(cls: str, name: str, **defaults: Any) -> type:
    """The module class `cls` around ember.functional.<name>, taking that function's options."""
    def __init__(self: Module, *args: Any, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(defaults)
        if len(args) > len(defaults) or unknown:
            raise TypeError(f"{cls} takes {list(defaults) or 'no options'}, got {args} {kwargs}")
        self.options = {**defaults, **dict(zip(defaults, args)), **kwargs}

    def forward(self: Module, x: Tensor) -> Tensor:
        from . import functional
        return getattr(functional, name)(x, **self.options)  # type: ignore[attr-defined]
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
        from .functional import _tuple
        k = _tuple(kernel_size, self.nsp, type(self).__name__)
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"{type(self).__name__}: channels {in_channels} and {out_channels} are not divisible "
                             f"by groups={groups}")
        bound = 1 / math.sqrt(in_channels // groups * math.prod(k))  # PyTorch's default init range
        self.weight = parameter(T.rand(out_channels, in_channels // groups, *k) * (2 * bound) - bound)
        self.bias = parameter(T.rand(out_channels) * (2 * bound) - bound) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x: Tensor) -> Tensor:
        from . import functional
        conv = getattr(functional, f"conv{self.nsp}d")
        return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(_ConvNd):
    nsp = 1


class Conv2d(_ConvNd):
    nsp = 2


class Conv3d(_ConvNd):
    nsp = 3


class _ConvTransposeNd(Module):
    nsp = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1):
        from .functional import _tuple
        k = _tuple(kernel_size, self.nsp, type(self).__name__)
        bound = 1 / math.sqrt(out_channels // groups * math.prod(k))  # PyTorch's default init range
        self.weight = parameter(T.rand(in_channels, out_channels // groups, *k) * (2 * bound) - bound)
        self.bias = parameter(T.rand(out_channels) * (2 * bound) - bound) if bias else None
        self.options = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                            dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        from . import functional
        return getattr(functional, f"conv_transpose{self.nsp}d")(x, self.weight, self.bias, **self.options)


class ConvTranspose1d(_ConvTransposeNd):
    nsp = 1


class ConvTranspose2d(_ConvTransposeNd):
    nsp = 2


class Upsample(Module):
    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None):
        self.options = dict(size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners)

    def forward(self, x: Tensor) -> Tensor:
        from .functional import interpolate
        return interpolate(x, **self.options)


class _Pool2d(Module):
    kind = "max"

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False, **options: Any):
        self.kernel_size, self.stride, self.padding, self.ceil_mode, self.options = \
            kernel_size, stride, padding, ceil_mode, options

    def forward(self, x: Tensor) -> Tensor:
        from . import functional
        pool = functional.max_pool2d if self.kind == "max" else functional.avg_pool2d
        return pool(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode, **self.options)


class MaxPool2d(_Pool2d):
    kind = "max"


class AvgPool2d(_Pool2d):
    kind = "avg"


class _BatchNorm(Module):
    """Batch statistics in training (running statistics updated, with the unbiased variance),
    running statistics in eval, as PyTorch."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True):
        self.eps, self.momentum = eps, momentum
        self.weight = parameter(np.ones(num_features, np.float32)) if affine else None
        self.bias = parameter(np.zeros(num_features, np.float32)) if affine else None
        self.running_mean = Tensor(np.zeros(num_features, np.float32))
        self.running_var = Tensor(np.ones(num_features, np.float32))

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


class BatchNorm1d(_BatchNorm):
    pass


class BatchNorm2d(_BatchNorm):
    pass


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
    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.weight = parameter(T.randn(num_embeddings, embedding_dim))

    def forward(self, idx: Tensor) -> Tensor:
        return self.weight.gather_rows(idx)


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        self.weight, self.bias = parameter(np.ones(dim, np.float32)), parameter(np.zeros(dim, np.float32))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mu = x.mean(-1, keepdim=True)
        d = x - mu
        return d * ((d * d).mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight + self.bias


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        self.weight, self.eps = parameter(np.ones(dim, np.float32)), eps

    def forward(self, x: Tensor) -> Tensor:
        return x * ((x * x).mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


class Dropout(Module):
    def __init__(self, p: float = 0.1):
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        from .functional import dropout
        return dropout(x, self.p, self.training)


def clip_grad_norm_(parameters: Any, max_norm: float, eps: float = 1e-6) -> Tensor:
    """torch.nn.utils.clip_grad_norm_: scale every gradient by min(1, max_norm / (norm + eps)),
    the norm taken over all of them together; returns that norm. Lazy like the gradients: the
    next optimizer step computes the norm and the scaled updates in its one program."""
    grads = [p for p in parameters if p.grad is not None]
    if not grads:
        return Tensor(np.array(0.0, np.float32))
    total = T.stack([(p.grad.float() * p.grad.float()).sum() for p in grads]).sum().sqrt()
    scale = (max_norm / (total + eps)).clamp(max=1.0)
    for p in grads:
        p.grad = p.grad * scale.to(p.grad.dtype)
    return total


def causal_attention(q: Tensor, k: Tensor, v: Tensor, wide: "dt.DType | None" = None) -> Tensor:
    """softmax(q k^T / sqrt(d), masked so a position sees itself and the past) v; [..., T, d].
    wide: q, k and v are autocast's narrow dtype and the scores and softmax are in this one
    (CausalSelfAttention); the result is then narrow too."""
    t, d = q.shape[-2], q.shape[-1]
    qk = q @ k.transpose(-2, -1)
    scores = (qk.cast(wide) if wide is not None else qk) * (1 / math.sqrt(d))
    rows = T.Tensor(T.ir.iota(dt.i32, (t, t), 0))
    cols = T.Tensor(T.ir.iota(dt.i32, (t, t), 1))
    scores = T.where(cols <= rows, scores, -1e9)
    p = scores.softmax(-1)
    return p.cast(v.dtype) @ v if wide is not None else p @ v


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
            # which the flash kernels read in place; the scores and the output stay wide, as before
            wide, qkv = qkv.dtype, qkv.cast(low)
        q, k, v = (y.reshape(b, t, h, c // h).transpose(1, 2) for y in T.split(qkv, c, -1))
        if cache is not None:
            y = cache.attend(q, k, v)
        else:
            y = causal_attention(q, k, v, wide)
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
        scores = (q @ keys.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]))
        seen = T.Tensor(T.ir.iota(dt.i64, (1, 1, 1, block), 3)) <= self.pos.reshape(1, 1, 1, 1)
        return T.where(seen, scores, -1e9).softmax(-1) @ values


def cross_entropy(logits: Tensor, target: Tensor, **options: Any) -> Tensor:
    """Mean negative log-likelihood of integer targets under softmax(logits); logits [N, C]
    (ember.functional.cross_entropy, which takes PyTorch's options)."""
    from . import functional
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
