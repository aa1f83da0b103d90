"""A lazy Tensor with PyTorch's names and broadcasting rules, on top of the IR.

Every operation builds nodes; nothing runs until a value is asked for (`numpy()`, `item()`,
`realize()`, an optimizer step). Data lives in params: a tensor made from numpy is a param node
with its array attached. `realize` runs many tensors as one compiled program, and before
compiling it renames the graph's params to canonical slots, so a training step that builds the
same graph each time (new batch, new weights) compiles once and replays afterwards.
"""
from __future__ import annotations

import itertools
import math
import time
import weakref
from typing import Any, Iterable, Sequence

import numpy as np

from . import backends, data, ir
from . import dtype as dt
from .dtype import DType
from .ir import IRError, Node, Op

float32, float64, float16, bfloat16 = dt.f32, dt.f64, dt.f16, dt.bf16
int8, int16, int32, int64, uint8, bool_ = dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.bool_
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


# A param's data lives as long as its node: any graph that uses the node keeps the data alive.
_DATA: "weakref.WeakKeyDictionary[Node, np.ndarray]" = weakref.WeakKeyDictionary()
_LEAVES: "weakref.WeakValueDictionary[Node, Tensor]" = weakref.WeakValueDictionary()  # for backward


class ShapeError(ValueError):
    """A call with shapes or dtypes that do not fit; the message names the call and the shapes."""


_ids = itertools.count()
_device = {"name": None}


def default_device() -> str:
    if _device["name"] is None:
        _device["name"] = backends.default()
    return _device["name"]


def _np_dtype(d: DType) -> np.dtype:
    return data.value_dtype(d)


def _to_dtype(x: Any) -> DType:
    if isinstance(x, DType):
        return x
    return {np.dtype(np.float32): dt.f32, np.dtype(np.float64): dt.f64, np.dtype(np.float16): dt.f16,
            np.dtype(np.int32): dt.i32, np.dtype(np.int64): dt.i64, np.dtype(np.int8): dt.i8,
            np.dtype(np.int16): dt.i16, np.dtype(np.uint8): dt.u8, np.dtype(np.bool_): dt.bool_}[np.dtype(x)]


class Tensor:
    """A lazy tensor: an IR node, plus (for leaves) the data of its param."""

    __slots__ = ("node", "requires_grad", "grad", "_value", "__weakref__")

    def __init__(self, value: Any, dtype: DType | None = None, requires_grad: bool = False):
        if isinstance(value, Node):
            self.node = value
            self._value = None
        else:
            arr = np.asarray(value)
            d = dtype or (_to_dtype(arr.dtype) if arr.dtype.kind in "iub" else dt.f32)
            arr = arr.astype(_np_dtype(d)) if d not in (dt.f16, dt.bf16) else data.round_float(arr, d)
            self.node = ir.param(f"t{next(_ids)}", d, tuple(int(s) for s in arr.shape))
            self._value = None
            _DATA[self.node] = np.ascontiguousarray(arr, dtype=_np_dtype(d)).reshape(arr.shape)  # keeps 0-d
            _LEAVES[self.node] = self
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None

    # ------------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.node.numel

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return f"Tensor({self.numpy()!r}, dtype={self.dtype})" if self.numel() <= 64 else \
            f"<Tensor {self.dtype}{list(self.shape)}>"

    def __len__(self) -> int:
        return self.shape[0]

    # -------------------------------------------------------------------------- values
    def realize(self) -> "Tensor":
        realize(self)
        return self

    def value(self) -> np.ndarray | None:
        """The computed value, if there is one (a leaf's data, or a realized result)."""
        return _DATA.get(self.node) if self.is_leaf else self._value

    def numpy(self) -> np.ndarray:
        realize(self)
        v = self.value()
        assert v is not None
        return v.copy()

    def item(self) -> float | int:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor of one element, got shape {list(self.shape)}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, target: Any) -> "Tensor":
        """`.to(dtype)` casts; `.to("cpu"/"cuda")` picks where programs run (one device at a time)."""
        if isinstance(target, DType):
            return self.cast(target)
        name = {"cpu": "c", "cuda": "cuda", "c": "c", "ref": "ref"}.get(str(target).split(":")[0])
        if name is None:
            raise ShapeError(f"to({target!r}): devices are 'cpu' and 'cuda'")
        _device["name"] = name if name in backends.available() else default_device()
        return self

    def detach(self) -> "Tensor":
        return self if self.is_leaf else Tensor(self.numpy(), self.dtype)

    @property
    def is_leaf(self) -> bool:
        return self.node.op is Op.PARAM

    def assign(self, other: "Tensor") -> "Tensor":
        """Give this leaf the value of other (same shape and dtype), keeping its identity, so the
        graphs that use it keep their structure (and their compiled programs)."""
        if not self.is_leaf:
            raise ShapeError("assign: only a tensor made from data can take a new value")
        if other.shape != self.shape or other.dtype is not self.dtype:
            raise ShapeError(f"assign: {self.dtype}{list(self.shape)} from {other.dtype}{list(other.shape)}")
        realize(other)
        _DATA[self.node] = other.value()
        return self

    # -------------------------------------------------------------------------- helpers
    def _const(self, v: float | int | bool, dtype: DType | None = None) -> "Tensor":
        d = dtype or self.dtype
        return Tensor(ir.const(data.literal_value(v, d, truncate=True), d, ()))

    def _wrap(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return other
        if isinstance(other, (bool, int, float)):
            d = self.dtype if not (isinstance(other, float) and not self.dtype.is_float) else dt.f32
            return self._const(other, d)
        return Tensor(np.asarray(other), self.dtype)

    def _binary(self, op: Op, other: Any, reverse: bool = False, name: str = "") -> "Tensor":
        a, b = (self._wrap(other), self) if reverse else (self, self._wrap(other))
        a, b = _promote(a, b)
        a, b = _broadcast(a, b, name or op.name.lower())
        return _call(name or op.name.lower(), lambda: ir.binary(op, a.node, b.node), a, b)

    def _unary(self, op: Op) -> "Tensor":
        x = self if self.dtype.is_float or op is Op.NEG else self.float()
        return Tensor(_call(op.name.lower(), lambda: ir.unary(op, x.node), x).node)

    # ---------------------------------------------------------------------- arithmetic
    def __add__(self, o: Any) -> "Tensor": return self._binary(Op.ADD, o)  # noqa: E704
    def __radd__(self, o: Any) -> "Tensor": return self._binary(Op.ADD, o, True)  # noqa: E704
    def __sub__(self, o: Any) -> "Tensor": return self._binary(Op.SUB, o)  # noqa: E704
    def __rsub__(self, o: Any) -> "Tensor": return self._binary(Op.SUB, o, True)  # noqa: E704
    def __mul__(self, o: Any) -> "Tensor": return self._binary(Op.MUL, o)  # noqa: E704
    def __rmul__(self, o: Any) -> "Tensor": return self._binary(Op.MUL, o, True)  # noqa: E704

    def __truediv__(self, o: Any) -> "Tensor":
        a = self if self.dtype.is_float else self.float()
        return a._binary(Op.DIV, o)

    def __rtruediv__(self, o: Any) -> "Tensor":
        a = self if self.dtype.is_float else self.float()
        return a._binary(Op.DIV, o, True)

    def __floordiv__(self, o: Any) -> "Tensor": return self._binary(Op.IDIV, o)  # noqa: E704
    def __mod__(self, o: Any) -> "Tensor": return self._binary(Op.MOD, o)  # noqa: E704
    def __neg__(self) -> "Tensor": return self._unary(Op.NEG)  # noqa: E704
    def __pow__(self, o: Any) -> "Tensor": return self.pow(o)  # noqa: E704
    def __matmul__(self, o: "Tensor") -> "Tensor": return self.matmul(o)  # noqa: E704
    def __lt__(self, o: Any) -> "Tensor": return self._binary(Op.CMPLT, o)  # noqa: E704
    def __gt__(self, o: Any) -> "Tensor": return self._binary(Op.CMPLT, o, True)  # noqa: E704
    def __le__(self, o: Any) -> "Tensor": return (self > o).logical_not()  # noqa: E704
    def __ge__(self, o: Any) -> "Tensor": return (self < o).logical_not()  # noqa: E704
    def eq(self, o: Any) -> "Tensor": return self._binary(Op.CMPEQ, o)  # noqa: E704
    def ne(self, o: Any) -> "Tensor": return self._binary(Op.CMPNE, o)  # noqa: E704
    def __and__(self, o: Any) -> "Tensor": return self._binary(Op.AND, o)  # noqa: E704
    def __or__(self, o: Any) -> "Tensor": return self._binary(Op.OR, o)  # noqa: E704
    def __xor__(self, o: Any) -> "Tensor": return self._binary(Op.XOR, o)  # noqa: E704
    __hash__ = object.__hash__

    def logical_not(self) -> "Tensor":
        return self._binary(Op.CMPEQ, False) if self.dtype is dt.bool_ else self.eq(0)

    def maximum(self, o: Any) -> "Tensor": return self._binary(Op.MAX, o, name="maximum")  # noqa: E704
    def minimum(self, o: Any) -> "Tensor": return -((-self).maximum(-self._wrap(o)))  # noqa: E704

    # ------------------------------------------------------------------------- math
    def exp(self) -> "Tensor": return (self * LOG2E)._unary(Op.EXP2)  # noqa: E704
    def exp2(self) -> "Tensor": return self._unary(Op.EXP2)  # noqa: E704
    def log(self) -> "Tensor": return self._unary(Op.LOG2) * LN2  # noqa: E704
    def log2(self) -> "Tensor": return self._unary(Op.LOG2)  # noqa: E704
    def sqrt(self) -> "Tensor": return self._unary(Op.SQRT)  # noqa: E704
    def rsqrt(self) -> "Tensor": return self.sqrt()._unary(Op.RECIP)  # noqa: E704
    def reciprocal(self) -> "Tensor": return self._unary(Op.RECIP)  # noqa: E704
    def sin(self) -> "Tensor": return self._unary(Op.SIN)  # noqa: E704
    def cos(self) -> "Tensor": return (self + math.pi / 2)._unary(Op.SIN)  # noqa: E704
    def trunc(self) -> "Tensor": return self._unary(Op.TRUNC)  # noqa: E704
    def relu(self) -> "Tensor": return self.maximum(0)  # noqa: E704
    def sigmoid(self) -> "Tensor": return ((-self).exp() + 1).reciprocal()  # noqa: E704
    def tanh(self) -> "Tensor": return (self * 2).sigmoid() * 2 - 1  # noqa: E704
    def silu(self) -> "Tensor": return self * self.sigmoid()  # noqa: E704
    def square(self) -> "Tensor": return self * self  # noqa: E704
    def abs(self) -> "Tensor": return where(self < 0, -self, self)  # noqa: E704

    def gelu(self) -> "Tensor":
        """The tanh approximation, as GPT-2 uses."""
        return self * 0.5 * ((self + self * self * self * 0.044715) * math.sqrt(2 / math.pi)).tanh().__add__(1)

    def pow(self, e: Any) -> "Tensor":
        if isinstance(e, int) and 0 <= e <= 8:
            out = self._const(1)._broadcast_to(self.shape) if e == 0 else self
            for _ in range(e - 1):
                out = out * self
            return out
        if isinstance(e, (int, float)) and e == 0.5:
            return self.sqrt()
        return (self.log() * e).exp()

    def clamp(self, min: float | None = None, max: float | None = None) -> "Tensor":  # noqa: A002
        out = self
        if min is not None:
            out = out.maximum(min)
        if max is not None:
            out = out.minimum(max)
        return out

    clip = clamp

    def cast(self, d: DType) -> "Tensor":
        return self if d is self.dtype else Tensor(ir.unary(Op.CAST, self.node, d))

    def float(self) -> "Tensor": return self.cast(dt.f32)  # noqa: E704
    def half(self) -> "Tensor": return self.cast(dt.f16)  # noqa: E704
    def long(self) -> "Tensor": return self.cast(dt.i64)  # noqa: E704
    def int(self) -> "Tensor": return self.cast(dt.i32)  # noqa: E704
    def bool(self) -> "Tensor": return self.cast(dt.bool_)  # noqa: E704

    # --------------------------------------------------------------------- movement
    def reshape(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if shape.count(-1) > 1 or known == 0 or self.numel() % known:
                raise ShapeError(f"reshape: cannot reshape {list(self.shape)} to {list(shape)}")
            shape = tuple(self.numel() // known if s == -1 else s for s in shape)
        return _call("reshape", lambda: ir.reshape(self.node, shape), self)

    view = reshape

    def permute(self, *order: Any) -> "Tensor":
        order = tuple(o % self.ndim for o in _shape_arg(order))
        return _call("permute", lambda: ir.permute(self.node, order), self)

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> "Tensor":
        return self.permute(tuple(reversed(range(self.ndim))))

    def expand(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape)
        return self._broadcast_to(tuple(s if s != -1 else self.shape[i - len(shape) + self.ndim]
                                        for i, s in enumerate(shape)))

    def _broadcast_to(self, shape: tuple[int, ...]) -> "Tensor":
        if self.shape == shape:
            return self
        if len(shape) < self.ndim:
            raise ShapeError(f"expand: cannot expand {list(self.shape)} to {list(shape)}")
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if len(shape) > self.ndim else self
        if x.shape == shape:
            return x
        return _call("expand", lambda: ir.expand(x.node, shape), x)

    def flatten(self, start: int = 0, end: int = -1) -> "Tensor":
        start, end = start % max(self.ndim, 1), end % max(self.ndim, 1)
        return self.reshape(self.shape[:start] + (math.prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dim %= self.ndim
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:]) if self.shape[dim] == 1 else self

    def unsqueeze(self, dim: int) -> "Tensor":
        dim = dim % (self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def pad(self, pads: Sequence[int], value: float = 0.0) -> "Tensor":
        """PyTorch's F.pad order: (last_before, last_after, second_last_before, ...)."""
        before, after = [0] * self.ndim, [0] * self.ndim
        for i in range(len(pads) // 2):
            before[self.ndim - 1 - i], after[self.ndim - 1 - i] = pads[2 * i], pads[2 * i + 1]
        v = data.literal_value(value, self.dtype, truncate=True)
        return _call("pad", lambda: ir.pad(self.node, tuple(before), tuple(after), v), self)

    def flip(self, dims: Iterable[int]) -> "Tensor":
        axes = tuple(d % self.ndim for d in ([dims] if isinstance(dims, int) else dims))
        return _call("flip", lambda: ir.flip(self.node, axes), self)

    def repeat(self, *times: Any) -> "Tensor":
        times = _shape_arg(times)
        x = self.reshape((1,) * (len(times) - self.ndim) + self.shape)
        inter = tuple(d for s in x.shape for d in (1, s))
        big = tuple(d for t, s in zip(times, x.shape) for d in (t, s))
        return x.reshape(inter)._broadcast_to(big).reshape(tuple(t * s for t, s in zip(times, x.shape)))

    def __getitem__(self, idx: Any) -> "Tensor":
        if isinstance(idx, Tensor):  # gather rows: x[indices]
            return self.gather_rows(idx)
        idx = idx if isinstance(idx, tuple) else (idx,)
        if any(i is Ellipsis for i in idx):
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (self.ndim - len(idx) + 1) + idx[k + 1:]
        if len(idx) > self.ndim:
            raise ShapeError(f"index {idx!r} has more entries than the {self.ndim} dims of {list(self.shape)}")
        start, end, flips, keep = [], [], [], []
        for d, n in enumerate(self.shape):
            i = idx[d] if d < len(idx) else slice(None)
            if isinstance(i, int):
                if not -n <= i < n:
                    raise ShapeError(f"index {i} is out of range for dim {d} of size {n}")
                i %= n
                start.append(i), end.append(i + 1)
                continue
            if not isinstance(i, slice):
                raise ShapeError(f"unsupported index {i!r} (ints, slices, ... and integer tensors)")
            s, e, step = i.indices(n)
            if step not in (1, -1):
                raise ShapeError(f"slice steps other than 1 and -1 are not supported, got {step}")
            if step == -1:
                s, e = e + 1, s + 1
                flips.append(d)
            if e <= s:
                raise ShapeError(f"empty slice {i} of dim {d} (size {n}): tensors have no empty dims")
            start.append(s), end.append(e), keep.append(d)
        out = _call("index", lambda: ir.shrink(self.node, tuple(start), tuple(end)), self)
        if flips:
            out = out.flip(flips)
        return out.reshape(tuple(out.shape[d] for d in keep))

    def gather_rows(self, index: "Tensor") -> "Tensor":
        """self[index] for an integer tensor: rows of self picked by index, as a one-hot matmul."""
        oh = index.one_hot(self.shape[0]).cast(self.dtype)
        flat = self.reshape(self.shape[0], -1)
        return (oh @ flat).reshape(index.shape + self.shape[1:])

    def split(self, size: int, dim: int = 0) -> list["Tensor"]:
        return split(self, size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> list["Tensor"]:
        return chunk(self, chunks, dim)

    def one_hot(self, num_classes: int) -> "Tensor":
        if self.dtype.is_float:
            raise ShapeError(f"one_hot needs an integer tensor, got {self.dtype}")
        classes = Tensor(ir.iota(self.dtype, (num_classes,), 0))
        return self.unsqueeze(-1).eq(classes)

    # ------------------------------------------------------------------- reductions
    def _axes(self, dim: Any) -> tuple[int, ...]:
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        return tuple(sorted({d % self.ndim for d in dims}))

    def _reduce(self, op: Op, dim: Any, keepdim: bool) -> "Tensor":
        axes = self._axes(dim)
        out = _call("sum" if op is Op.SUM else "max", lambda: ir.reduce(op, self.node, axes), self)
        return out if keepdim else out.reshape(tuple(s for d, s in enumerate(out.shape) if d not in axes))

    def sum(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        x = self if self.dtype is not dt.bool_ else self.cast(dt.i64)
        return x._reduce(Op.SUM, dim, keepdim)

    def max(self, dim: Any = None, keepdim: bool = False) -> "Tensor": return self._reduce(Op.RMAX, dim, keepdim)  # noqa: E704
    def min(self, dim: Any = None, keepdim: bool = False) -> "Tensor": return -((-self).max(dim, keepdim))  # noqa: E704

    def mean(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        n = math.prod(self.shape[d] for d in self._axes(dim))
        return self.sum(dim, keepdim) * (1.0 / n)

    def var(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        n = math.prod(self.shape[d] for d in self._axes(dim))
        d = self - self.mean(dim, keepdim=True)
        return (d * d).sum(dim, keepdim) * (1.0 / max(n - correction, 1))

    def std(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        return self.var(dim, keepdim, correction).sqrt()

    def logsumexp(self, dim: int = -1, keepdim: bool = False) -> "Tensor":
        m = self.max(dim, keepdim=True)
        out = (self - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim else out.squeeze(dim)

    def softmax(self, dim: int = -1) -> "Tensor":
        e = (self - self.max(dim, keepdim=True)).exp()
        return e / e.sum(dim, keepdim=True)

    def log_softmax(self, dim: int = -1) -> "Tensor":
        return self - self.logsumexp(dim, keepdim=True)

    def argmax(self, dim: int = -1, keepdim: bool = False) -> "Tensor":
        """The first index of the maximum along dim."""
        dim %= self.ndim
        n = self.shape[dim]
        hit = self.eq(self.max(dim, keepdim=True))
        idx = Tensor(ir.iota(dt.i32, self.shape, dim))
        first = where(hit, idx, Tensor(ir.const(n, dt.i32, ())))
        return first.min(dim, keepdim)

    def matmul(self, other: "Tensor") -> "Tensor":
        a, b = _promote(self, other)
        if a.ndim == 1:
            return a.unsqueeze(0).matmul(b).squeeze(-2)
        if b.ndim == 1:
            return a.matmul(b.unsqueeze(-1)).squeeze(-1)
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"matmul: {list(a.shape)} @ {list(b.shape)}: "
                             f"inner dims {a.shape[-1]} and {b.shape[-2]} differ")
        batch = _broadcast_shape(a.shape[:-2], b.shape[:-2], "matmul")
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        ae = a._broadcast_to(batch + (m, k)).unsqueeze(-1)._broadcast_to(batch + (m, k, n))
        be = b._broadcast_to(batch + (k, n)).unsqueeze(-3)._broadcast_to(batch + (m, k, n))
        return (ae * be).sum(-2)

    # --------------------------------------------------------------------- autodiff
    def backward(self, gradient: "Tensor | None" = None) -> None:
        """Gradients of this tensor's sum for every leaf that requires grad (lazy: they are
        computed with the next realize, an optimizer step for instance, in one program)."""
        if gradient is not None:
            return (self * gradient).sum().backward()
        if self.numel() != 1:
            raise ShapeError(f"backward() needs a scalar (or a gradient argument), got shape {list(self.shape)}")
        leaves = [t for t in _leaves(self) if t.requires_grad]
        for t in leaves:
            g = Tensor(ir.grad(self.node, t.node))
            t.grad = g if t.grad is None else t.grad + g
        _last_backward["loss"] = self


_last_backward: dict[str, Tensor] = {}


def _leaves(t: Tensor) -> list[Tensor]:
    return [leaf for n in ir.toposort([t.node]) if n.op is Op.PARAM and (leaf := _LEAVES.get(n)) is not None]


# ------------------------------------------------------------------------------- helpers

def _shape_arg(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _call(name: str, build: Any, *tensors: Tensor) -> Tensor:
    """Build a node; a type rule broken by the call becomes a ShapeError naming the call."""
    try:
        return Tensor(build())
    except IRError as e:
        shapes = ", ".join(f"{t.dtype}{list(t.shape)}" for t in tensors)
        raise ShapeError(f"{name}({shapes}): {e}") from None


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...], name: str) -> tuple[int, ...]:
    out = []
    for x, y in itertools.zip_longest(reversed(a), reversed(b), fillvalue=1):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"{name}: shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y))
    return tuple(reversed(out))


def _broadcast(a: Tensor, b: Tensor, name: str) -> tuple[Tensor, Tensor]:
    shape = _broadcast_shape(a.shape, b.shape, name)
    return a._broadcast_to(shape), b._broadcast_to(shape)


_RANK = [dt.bool_, dt.u8, dt.i8, dt.i16, dt.i32, dt.i64, dt.f16, dt.bf16, dt.f32, dt.f64]


def _promote(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """PyTorch-like promotion: the higher dtype wins; a 0-dim constant adopts the other's."""
    if a.dtype is b.dtype:
        return a, b
    if b.node.op is Op.CONST and b.ndim == 0 and (a.dtype.is_float or not b.dtype.is_float):
        return a, b.cast(a.dtype)
    if a.node.op is Op.CONST and a.ndim == 0 and (b.dtype.is_float or not a.dtype.is_float):
        return a.cast(b.dtype), b
    rank = lambda d: _RANK.index(d) if d in _RANK else 4  # noqa: E731
    d = a.dtype if rank(a.dtype) >= rank(b.dtype) else b.dtype
    return a.cast(d), b.cast(d)


def where(cond: Tensor, x: Any, y: Any) -> Tensor:
    xt = x if isinstance(x, Tensor) else (y if isinstance(y, Tensor) else cond)._wrap(x)
    yt = y if isinstance(y, Tensor) else xt._wrap(y)
    xt, yt = _promote(xt, yt)
    shape = _broadcast_shape(_broadcast_shape(cond.shape, xt.shape, "where"), yt.shape, "where")
    c, a, b = cond._broadcast_to(shape), xt._broadcast_to(shape), yt._broadcast_to(shape)
    if c.dtype is not dt.bool_:
        c = c.cast(dt.bool_)
    return _call("where", lambda: ir.where(c.node, a.node, b.node), c, a, b)


# ------------------------------------------------------------------------------ realize

_stats = {"runs": 0, "python_s": 0.0}  # realize calls, and the Python time they spent before running


def realize(*tensors: Tensor) -> None:
    """Compute the tensors in one compiled program and attach their values."""
    todo = [t for t in tensors if t.value() is None]
    if not todo:
        return
    t0 = time.perf_counter()
    outputs = [t.node for t in todo]
    params = [n for n in ir.toposort(outputs) if n.op is Op.PARAM]
    slots = {p: ir.param(f"s{i}", p.dtype, p.shape) for i, p in enumerate(params)}
    from .compiler.rewrite import substitute
    canonical = substitute(outputs, slots)  # same structure, same program: compiled once
    values = {slots[p]: _DATA[p] for p in params}
    _stats["python_s"] += time.perf_counter() - t0
    results = backends.RUNNERS[default_device()](canonical, values)
    _stats["runs"] += 1
    for t, v in zip(todo, results):
        t._value = np.asarray(v)  # the node stays: gradients can still flow through t


# ----------------------------------------------------------------------------- creation

_seed = {"seed": 0, "counter": 0}


def manual_seed(seed: int) -> None:
    _seed["seed"], _seed["counter"] = seed, 0


def _random_bits(shape: tuple[int, ...]) -> Node:
    """splitmix64 of the element index (spec 7), computed in the graph (runs as compiled code)."""
    _seed["counter"] += 1
    seed = (_seed["seed"] * 0x9E3779B97F4A7C15 + _seed["counter"] * 0xD1B54A32D192ED03) & ((1 << 64) - 1)
    n = math.prod(shape)
    u = lambda v: ir.const(v, dt.u64, (n,))  # noqa: E731
    i = ir.binary(Op.ADD, ir.iota(dt.u64, (n,), 0), u(1))
    z = ir.binary(Op.ADD, u(seed), ir.binary(Op.MUL, i, u(0x9E3779B97F4A7C15)))
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ir.binary(Op.MUL, ir.binary(Op.XOR, z, ir.binary(Op.SHR, z, u(shift))), u(mult))
    z = ir.binary(Op.XOR, z, ir.binary(Op.SHR, z, u(31)))
    return ir.reshape(z, shape)


def rand(*shape: Any, dtype: DType = dt.f32) -> Tensor:
    """Uniform in [0, 1), from the seeded counter-based generator."""
    shape = _shape_arg(shape)
    bits = Tensor(_random_bits(shape))
    top = Tensor(ir.binary(Op.SHR, bits.node, ir.const(40, dt.u64, shape)))  # 24 random bits
    return (top.cast(dt.f32) * (2.0 ** -24)).cast(dtype)


def randn(*shape: Any, dtype: DType = dt.f32) -> Tensor:
    """Standard normal, Box-Muller on two uniform draws."""
    shape = _shape_arg(shape)
    u1, u2 = rand(shape), rand(shape)
    r = ((1.0 - u1).log() * -2.0).sqrt()
    return (r * (u2 * (2 * math.pi)).cos()).cast(dtype)


def full(shape: Any, value: float, dtype: DType = dt.f32) -> Tensor:
    return Tensor(ir.const(data.literal_value(value, dtype, truncate=True), dtype, tuple(_shape_arg((shape,)))))


def zeros(*shape: Any, dtype: DType = dt.f32) -> Tensor:
    return full(_shape_arg(shape), 0, dtype)


def ones(*shape: Any, dtype: DType = dt.f32) -> Tensor:
    return full(_shape_arg(shape), 1, dtype)


def arange(start: int, end: int | None = None, step: int = 1, dtype: DType = dt.i32) -> Tensor:
    if end is None:
        start, end = 0, start
    n = max(0, -(-(end - start) // step))
    if n == 0:
        raise ShapeError(f"arange({start}, {end}, {step}) would be empty: tensors have no empty dims")
    idx = Tensor(ir.iota(dtype, (n,), 0))
    return idx * step + start if (step, start) != (1, 0) else idx


def tensor(value: Any, dtype: DType | None = None, requires_grad: bool = False) -> Tensor:
    return Tensor(value, dtype, requires_grad)


def from_numpy(arr: np.ndarray) -> Tensor:
    return Tensor(arr)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along dim: each piece padded to the full length, then added."""
    dim %= tensors[0].ndim
    total = sum(t.shape[dim] for t in tensors)
    out, offset = None, 0
    for t in tensors:
        pads = [0, 0] * (t.ndim - dim - 1) + [offset, total - offset - t.shape[dim]]
        piece = t.pad(pads)
        out = piece if out is None else out + piece
        offset += t.shape[dim]
    assert out is not None
    return out


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def split(t: Tensor, size: int, dim: int = 0) -> list[Tensor]:
    dim %= t.ndim
    out = []
    for s in range(0, t.shape[dim], size):
        idx = [slice(None)] * t.ndim
        idx[dim] = slice(s, min(s + size, t.shape[dim]))
        out.append(t[tuple(idx)])
    return out


def chunk(t: Tensor, chunks: int, dim: int = 0) -> list[Tensor]:
    return split(t, -(-t.shape[dim % t.ndim] // chunks), dim)

