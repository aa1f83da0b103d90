"""A lazy Tensor with PyTorch's names and broadcasting rules, on top of the IR.

Every operation builds nodes; nothing runs until a value is asked for (`numpy()`, `item()`,
`realize()`, an optimizer step). Data lives in params: a tensor made from numpy is a param node
with its array attached. `realize` runs many tensors as one compiled program, and before
compiling it renames the graph's params to canonical slots, so a training step that builds the
same graph each time (new batch, new weights) compiles once and replays afterwards.
"""
from __future__ import annotations

import builtins
import functools
import itertools
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

from . import data, ir, runners
from . import dtype as dt
from .dtype import DType
from .ir import IRError, Node, Op

float32, float64, float16, bfloat16 = dt.f32, dt.f64, dt.f16, dt.bf16
int8, int16, int32, int64, uint8, bool_ = dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.bool_
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


# A param's data lives as long as its node: any graph that uses the node keeps the data alive.
_DATA: "weakref.WeakKeyDictionary[Node, np.ndarray]" = weakref.WeakKeyDictionary()
_LEAVES: "weakref.WeakValueDictionary[Node, Tensor]" = weakref.WeakValueDictionary()  # for backward


class IntegerDivisionByZero(ZeroDivisionError, RuntimeError):
    """PyTorch's RuntimeError('ZeroDivisionError'), and Python's exception for it."""


def _nonzero_divisor(o: Any) -> None:
    """Integer division by zero is undefined in the IR (spec section 6); PyTorch raises, so a
    divisor whose values are known (a number, a tensor's data) is checked here."""
    v = o.value() if isinstance(o, Tensor) else o
    if v is not None and not np.all(_host(v) if isinstance(o, Tensor) else v):
        raise IntegerDivisionByZero("ZeroDivisionError: integer division by zero")


class ShapeError(ValueError):
    """A call with shapes or dtypes that do not fit; the message names the call and the shapes."""


_ids = itertools.count()


def new_name() -> str:
    """A fresh leaf name, t0, t1, ...: in creation order (ember.jit tells the leaves a step made
    from those it found)."""
    return f"t{next(_ids)}"


class ValuesIndices(NamedTuple):
    """PyTorch's torch.return_types of max, min, sort, topk...: unpacks as (values, indices)."""
    values: "Tensor"
    indices: "Tensor"


@dataclass
class Context:
    """The frontend's state, in one place: where programs run, the random stream, statistics,
    and the loss whose backward() the next optimizer step uses."""
    device: str | None = None          # backend name: 'c', 'cuda' or 'ref' (None: the default)
    seed: int = 0
    draws: int = 0                     # random tensors drawn since manual_seed
    runs: int = 0                      # realize calls that ran a program
    python_s: float = 0.0              # Python time those calls spent before running
    pending_loss: "Tensor | None" = None
    autocast: "DType | None" = None    # matmuls run in this dtype (ember.autocast)
    pending_assigns: dict = field(default_factory=dict)  # leaf node -> (leaf, value): assign(lazy=True)
    trace: Any = None                  # ember.jit's record of the step being captured
    averaged: set = field(default_factory=set)  # params whose gradients are all-reduced (DataParallel)
    grad_enabled: bool = True          # False under no_grad: results carry no gradient path


context = Context()


def autocast_dtype(x: "Tensor") -> "DType | None":
    """The low dtype an autocast region runs x's matmuls in (None: x's own)."""
    low = context.autocast
    return low if low is not None and x.dtype.is_float and x.dtype.bits > low.bits else None


class autocast:
    """`with ember.autocast("bfloat16"):` matmuls of f32 tensors run on bf16 (or f16) inputs,
    like torch.autocast: their products go to tensor cores with f32 accumulation, the result is
    rounded to the low dtype and given back as f32, so everything else (norms, softmax, losses,
    the weights and the optimizer) stays f32. Gradients flow through the casts, so the backward
    pass's matmuls run in the low dtype too."""

    def __init__(self, dtype: Any = "bfloat16", enabled: bool = True):
        self.dtype = as_dtype(dtype) if enabled else None
        if self.dtype is not None and self.dtype not in (dt.bf16, dt.f16):
            raise ValueError(f"autocast: dtype must be bfloat16 or float16, got {self.dtype}")

    def __enter__(self) -> "autocast":
        self.saved, context.autocast = context.autocast, self.dtype
        return self

    def __exit__(self, *exc: Any) -> None:
        context.autocast = self.saved


class set_grad_enabled:
    """torch.set_grad_enabled, and the base of no_grad, enable_grad and inference_mode: a context
    manager or a decorator. Results computed with gradients off have requires_grad False and
    pass no gradient back (their nodes are wrapped in ir.stop_gradient), as in PyTorch."""
    mode = True

    def __init__(self, mode: Any = None):
        self.fn = mode if callable(mode) else None   # a bare @no_grad, as PyTorch allows
        if mode is not None and self.fn is None:
            self.mode = bool(mode)
        self.saved: list[bool] = []
        self.applied = type(self) is set_grad_enabled and self.fn is None
        if self.applied:   # set_grad_enabled(False) as a call acts at once, as in PyTorch
            self.saved.append(context.grad_enabled)
            context.grad_enabled = self.mode

    def __enter__(self) -> "set_grad_enabled":
        if not self.applied:
            self.saved.append(context.grad_enabled)
            context.grad_enabled = self.mode
        self.applied = False
        return self

    def __exit__(self, *exc: Any) -> None:
        context.grad_enabled = self.saved.pop()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is not None:   # this is the decorated function
            with self:
                return self.fn(*args, **kwargs)
        fn = args[0]

        @functools.wraps(fn)
        def wrapped(*a: Any, **k: Any) -> Any:
            with self:
                return fn(*a, **k)
        return wrapped


class no_grad(set_grad_enabled):
    mode = False


class enable_grad(set_grad_enabled):
    mode = True


class inference_mode(no_grad):
    def __init__(self, mode: Any = True):
        super().__init__(mode if callable(mode) else None)
        self.mode = self.mode if callable(mode) else not mode


def is_grad_enabled() -> bool:
    return context.grad_enabled


class device(str):
    """torch.device: a name ("cpu", "cuda", "cuda:0") with .type and .index; equal to its string."""

    @property
    def type(self) -> str:
        return self.split(":")[0]

    @property
    def index(self) -> int | None:
        return int(self.split(":")[1]) if ":" in self else None


def default_device() -> str:
    if context.device is None:
        context.device = runners.default()
    return context.device


def set_default_device(device: str) -> None:
    """Where programs run from now on: "cpu" (the C backend), "cuda", or "ref" (as torch's
    set_default_device; "cuda" without a GPU is an error naming why)."""
    name = runners.backend_of(device)
    if name is None:
        raise ValueError(f"set_default_device({device!r}): devices are 'cpu', 'cuda' and 'ref'")
    if name not in runners.available():
        raise RuntimeError(f"set_default_device({device!r}): {runners.BACKENDS[name].why_unavailable()}")
    context.device = name


def _np_dtype(d: DType) -> np.dtype:
    return data.value_dtype(d)


_NAMES = {"float": dt.f32, "double": dt.f64, "half": dt.f16, "long": dt.i64, "int": dt.i32, "short": dt.i16,
          "bool": dt.bool_, "float32": dt.f32, "float64": dt.f64, "float16": dt.f16, "bfloat16": dt.bf16,
          "int8": dt.i8, "int16": dt.i16, "int32": dt.i32, "int64": dt.i64, "uint8": dt.u8, "uint16": dt.u16,
          "uint32": dt.u32, "uint64": dt.u64, **dt.BY_NAME}


def as_dtype(x: Any) -> DType:
    """A dtype given as ember.float32, a name ("float32", "f32", "long") or a numpy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x.removeprefix("torch.") in _NAMES:
            return _NAMES[x.removeprefix("torch.")]
        raise TypeError(f"unknown dtype name {x!r} (names: {', '.join(sorted(_NAMES))})")
    try:
        name = np.dtype(x).name
    except TypeError:
        name = None
    if name in _NAMES:
        return _NAMES[name]
    raise TypeError(f"dtype: expected an ember dtype, a name such as 'float32' or a numpy dtype, got {x!r}")


def _dim(d: int, ndim: int, name: str = "dim") -> int:
    """A dim in [-ndim, ndim) as a non-negative index (PyTorch: a 0-d tensor takes -1 and 0)."""
    n = max(ndim, 1)
    if not isinstance(d, (int, np.integer)) or not -n <= d < n:
        raise IndexError(f"{name} out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return int(d) % n


def _half_in_f32(f: Callable[..., "Tensor"]) -> Callable[..., "Tensor"]:
    """A method of a tensor whose f16/bf16 values are computed in f32 and rounded once, as
    PyTorch's kernels compute half types: rounding each of a GELU's dozen ops made it slower
    (bound by the rounding instructions, 1.2 of 4 TB/s in GPT-2's MLP) and farther from PyTorch."""
    @functools.wraps(f)
    def method(self: "Tensor", *args: Any, **kwargs: Any) -> "Tensor":
        if self.dtype in (dt.f16, dt.bf16):
            return f(self.float(), *args, **kwargs).cast(self.dtype)
        return f(self, *args, **kwargs)
    return method


class Tensor:
    """A lazy tensor: an IR node, plus (for leaves) the data of its param."""

    __slots__ = ("node", "_rg", "grad", "_value", "__weakref__")

    def __init__(self, value: Any, dtype: DType | None = None, requires_grad: bool = False):
        self._value = None
        if isinstance(value, Node):
            self._rg = None if context.grad_enabled else False
            if not context.grad_enabled and value.dtype.is_float and value.op not in (Op.PARAM, Op.CONST) \
                    and ir.stopped(value) is None:
                value = ir.stop_gradient(value)
            self.node = value
        else:
            if hasattr(value, "ptr"):  # a DeviceArray: a value that stays on the GPU
                d, held = value.dtype, value
            else:
                arr = np.asarray(value)
                d = as_dtype(dtype if dtype is not None else arr.dtype if arr.dtype.kind in "iub" else dt.f32)
                arr = arr.astype(_np_dtype(d)) if d not in (dt.f16, dt.bf16) else data.round_float(arr, d)
                held = np.ascontiguousarray(arr, dtype=_np_dtype(d)).reshape(arr.shape)  # keeps 0-d
            self.node = ir.param(new_name(), d, tuple(int(s) for s in held.shape))
            _DATA[self.node], _LEAVES[self.node] = held, self
        if self.is_leaf and (requires_grad or not isinstance(value, Node)):
            self._rg = bool(requires_grad)   # (a param node wrapped again asks its leaf: requires_grad)
        elif requires_grad:
            self.requires_grad = True
        self.grad: Tensor | None = None

    @property
    def requires_grad(self) -> bool:
        """A leaf's flag; for a result, whether a leaf that requires grad is in its graph (as
        PyTorch's, and False for what no_grad computed)."""
        if self._rg is None:
            self._rg = _needs_grad(self.node)
        return self._rg

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        if not self.is_leaf and flag != self.requires_grad:
            if not flag:
                raise RuntimeError("you can only change requires_grad flags of leaf variables (use detach())")
            self._rebind(self)   # a result that needs no gradient becomes a leaf, as in PyTorch
        self._rg = bool(flag)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        self.requires_grad = requires_grad
        return self

    def _rebind(self, new: "Tensor") -> "Tensor":
        """This tensor takes new's value as a leaf of its own (in-place ops on leaves, requires_grad_
        on results): graphs built before keep the old value, as PyTorch's version counters demand."""
        realize(new)
        node = ir.param(new_name(), new.dtype, new.shape)
        _DATA[node], _LEAVES[node] = new.value(), self
        self.node, self._value = node, None
        return self

    def _inplace(self, new: "Tensor", reshapes: bool = False) -> "Tensor":
        """x.add_(y) and friends: x becomes the result, in x's dtype and shape (reshapes: t_,
        squeeze_ and the like, in the result's shape). A leaf takes the value now (computed); a
        result takes the new node, so gradients flow through it."""
        if self.is_leaf and self.requires_grad and context.grad_enabled:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        new = self._wrap(new)
        if new.dtype.is_float and not self.dtype.is_float:
            raise TypeError(f"in-place op: result type {new.dtype} can't be cast to the desired output type "
                            f"{self.dtype}")
        new = new.cast(self.dtype)
        if not reshapes and _broadcast_shape(self.shape, new.shape, "in-place op") != self.shape:
            raise ShapeError(f"in-place op: the result's shape {list(new.shape)} does not fit {list(self.shape)}")
        new = new if reshapes else new._broadcast_to(self.shape)
        if self.is_leaf:
            return self._rebind(new)
        self.node, self._value, self._rg = new.node, None, None
        return self

    def new_zeros(self, *size: Any, dtype: Any = None) -> "Tensor": return zeros(*size, dtype=dtype or self.dtype)  # noqa: E704,E501
    def new_ones(self, *size: Any, dtype: Any = None) -> "Tensor": return ones(*size, dtype=dtype or self.dtype)  # noqa: E704,E501
    def new_full(self, size: Any, v: Any, dtype: Any = None) -> "Tensor": return full(size, v, dtype or self.dtype)  # noqa: E704,E501
    def new_tensor(self, v: Any, dtype: Any = None) -> "Tensor": return Tensor(v, dtype or self.dtype)  # noqa: E704
    def zero_(self) -> "Tensor": return self._inplace(zeros_like(self))  # noqa: E704
    def fill_(self, v: Any) -> "Tensor":
        if isinstance(v, Tensor) and v.ndim:
            raise ShapeError(f"fill_ only supports 0-dimension value tensor but got tensor with {v.ndim} dimensions")
        return self._inplace(self._wrap(v).cast(self.dtype))

    def copy_(self, src: Any) -> "Tensor": return self._inplace(src)  # noqa: E704

    def uniform_(self, a: float = 0.0, b: float = 1.0) -> "Tensor":
        return self._inplace(rand(self.shape, dtype=self.dtype) * (b - a) + a)

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> "Tensor":
        return self._inplace(randn(self.shape, dtype=self.dtype) * std + mean)

    @property
    def data(self) -> "Tensor":
        return self.detach()

    @data.setter
    def data(self, value: "Tensor") -> None:
        self._rebind(value)

    @property
    def device(self) -> device:
        return device("cuda" if default_device() == "cuda" else "cpu")

    @property
    def is_cuda(self) -> bool:
        return default_device() == "cuda"

    def cuda(self, device: Any = None) -> "Tensor":
        return self.to("cuda")

    def cpu(self) -> "Tensor":
        """The tensor itself: values come to the host when they are read (numpy(), item()), and
        the device is one for all tensors, so this does not move the others' programs."""
        return self

    def __float__(self) -> float: return float(self._one("float"))  # noqa: E704

    def __index__(self) -> int:   # an integer tensor of one element as a Python index (a[t:t + 3])
        if self.dtype.is_float or self.dtype is dt.bool_:
            raise TypeError(f"only integer tensors of a single element can be converted to an index, got {self.dtype}")
        return int(self._one("index"))
    def __int__(self) -> int: return int(self._one("int"))  # noqa: E704

    def _one(self, name: str) -> Any:
        if self.numel() != 1:
            raise ValueError(f"only one element tensors can be converted to Python scalars ({name}() of a tensor "
                             f"of shape {list(self.shape)})")
        return self.item()

    def __format__(self, spec: str) -> str:
        return format(self.item(), spec) if self.ndim == 0 else object.__format__(self, spec)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

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
        return _host(v).copy()

    def item(self) -> float | int:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor of one element, got shape {list(self.shape)}")
        if self.value() is None and context.trace is None and len(ir.toposort([self.node])) <= 8 \
                and default_device() != "cuda":
            # a scalar of a few ops (a[i:i + 16] with a tensor i) by the reference evaluator, the
            # spec's semantics exactly: a compiled program's call costs more than the arithmetic
            saved, context.device = context.device, "ref"
            try:
                realize(self)
            finally:
                context.device = saved
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, *args: Any, dtype: Any = None, device: Any = None, **_: Any) -> "Tensor":
        """`.to(dtype)` casts; `.to("cuda")` picks where programs run (one device for all tensors;
        "cuda" without a GPU is a RuntimeError saying why; unlike cpu(), which moves nothing);
        `.to(other)` takes other's dtype. Both, and keywords, as PyTorch."""
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif isinstance(a, DType) or (isinstance(a, str) and a.removeprefix("torch.") in _NAMES) \
                    or isinstance(a, (np.dtype, type)):
                dtype = a
            else:
                device = a
        if device is not None:
            name = runners.backend_of(str(device).split(":")[0])
            if name is None:
                raise ShapeError(f"to({device!r}): devices are 'cpu' and 'cuda'")
            set_default_device(str(device).split(":")[0])
        return self.cast(as_dtype(dtype)) if dtype is not None else self

    def detach(self) -> "Tensor":
        """The same value with no gradient path to this tensor (a leaf shares its data)."""
        if self.is_leaf:
            out = Tensor(ir.param(new_name(), self.dtype, self.shape))
            _DATA[out.node] = _DATA[self.node]
            _LEAVES[out.node] = out
            return out
        realize(self)
        value = self.value()
        return Tensor(value) if hasattr(value, "ptr") else Tensor(value, self.dtype)   # a GPU's stays there

    @property
    def is_leaf(self) -> bool:
        return self.node.op is Op.PARAM

    def assign(self, other: "Tensor", lazy: bool = False) -> "Tensor":
        """Give this leaf the value of other (same shape and dtype), keeping its identity, so the
        graphs that use it keep their structure (and their compiled programs). lazy: at the next
        realize, in its program (batch norm's running statistics join the training step's
        program instead of running the forward pass again in programs of their own)."""
        if not self.is_leaf:
            raise ShapeError("assign: only a tensor made from data can take a new value")
        if other.shape != self.shape or other.dtype is not self.dtype:
            raise ShapeError(f"assign: {self.dtype}{list(self.shape)} from {other.dtype}{list(other.shape)}")
        if self.node in context.pending_assigns:  # the pending value first: other may read it
            realize()
        if lazy:
            context.pending_assigns[self.node] = (self, other)
        else:
            if other.value() is None:  # (data already there: no program, pending assigns stay pending)
                realize(other)
            _DATA[self.node] = other.value()
            if context.trace is not None:
                context.trace.on_assign(self, other)
        return self

    # -------------------------------------------------------------------------- helpers
    def _const(self, v: float | int | bool, dtype: DType | None = None) -> "Tensor":
        d = dtype or self.dtype
        return Tensor(ir.const(data.literal_value(v, d, truncate=True), d, ()))

    def _wrap(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return other
        if isinstance(other, (bool, int, float, np.number)):
            other = other.item() if isinstance(other, np.number) else other
            if isinstance(other, float) and not self.dtype.is_float:
                return self._const(other, dt.f32)
            if isinstance(other, int) and not isinstance(other, bool) and self.dtype is dt.bool_:
                return self._const(other, dt.i64)
            return self._const(other, self.dtype)
        return Tensor(np.asarray(other), self.dtype)

    def _binary(self, op: Op, other: Any, reverse: bool = False, name: str = "") -> "Tensor":
        a, b = (self._wrap(other), self) if reverse else (self, self._wrap(other))
        a, b = _promote(a, b)
        if a.dtype is dt.bool_ and op in (Op.CMPLT, Op.MAX):   # the IR orders numbers: bools as 0 and 1
            out = a.cast(dt.u8)._binary(op, b.cast(dt.u8), name=name)
            return out.cast(dt.bool_) if op is Op.MAX else out
        a, b = _broadcast(a, b, name or op.name.lower())
        return _call(name or op.name.lower(), lambda: ir.binary(op, a.node, b.node), a, b)

    def _unary(self, op: Op) -> "Tensor":
        x = self if self.dtype.is_float or op is Op.NEG else self.float()
        return Tensor(_call(op.name.lower(), lambda: ir.unary(op, x.node), x).node)

    # ---------------------------------------------------------------------- arithmetic
    # (+, -, * and the bitwise operators, with their reflected forms, are set after the class)
    def __truediv__(self, o: Any, reverse: bool = False) -> "Tensor":
        return (self if self.dtype.is_float else self.float())._binary(Op.DIV, o, reverse)

    __rtruediv__ = functools.partialmethod(__truediv__, reverse=True)

    def __floordiv__(self, o: Any) -> "Tensor": return self.div(o, rounding_mode="floor")  # noqa: E704
    def __rfloordiv__(self, o: Any) -> "Tensor": return self._wrap(o).div(self, rounding_mode="floor")  # noqa: E704
    def __mod__(self, o: Any) -> "Tensor": return self.remainder(o)  # noqa: E704
    def __rmod__(self, o: Any) -> "Tensor": return self._wrap(o).remainder(self)  # noqa: E704

    def div(self, o: Any, rounding_mode: str | None = None) -> "Tensor":
        """True division, or rounded toward zero ('trunc') or down ('floor'), as PyTorch."""
        if rounding_mode is None:
            return self / o
        a, b = _broadcast(*_promote(self, self._wrap(o)), "div")
        if rounding_mode not in ("trunc", "floor"):
            raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if not a.dtype.is_float:
            _nonzero_divisor(o)
            q = Tensor(ir.binary(Op.IDIV, a.node, b.node))  # C's division truncates
            if rounding_mode == "trunc":
                return q
            r = Tensor(ir.binary(Op.MOD, a.node, b.node))
            return where(r.ne(0) & ((r < 0).ne(b < 0)), q - 1, q)
        if rounding_mode == "trunc":
            return (a / b).trunc()
        m = a.fmod(b)  # PyTorch's floor division: exact through fmod, not floor(a / b)
        d = (a - m) / b
        d = where(m.ne(0) & ((b < 0).ne(m < 0)), d - 1, d)
        fl = d.floor()
        fl = where(d - fl > 0.5, fl + 1, fl)
        return where(d.eq(0), (a / b) * 0, where(b.eq(0), a / b, fl))

    def fmod(self, o: Any) -> "Tensor":
        """C's fmod: the remainder with the dividend's sign (computed in f64 for narrower floats)."""
        a, b = _broadcast(*_promote(self, self._wrap(o)), "fmod")
        if not a.dtype.is_float:
            _nonzero_divisor(o)
            return Tensor(ir.binary(Op.MOD, a.node, b.node))
        wa, wb = a.cast(dt.f64), b.cast(dt.f64)
        r = wa - (wa / wb).trunc() * wb
        r = where(wa.isinf() | wb.eq(0), math.nan, where(wb.isinf(), wa, r)).cast(dt.f64)
        # a zero remainder keeps the dividend's sign, and r's gradient (wa * 0 has none)
        return where(r.eq(0), wa * 0 - (_stopped(r) - r), r).cast(a.dtype)

    def remainder(self, o: Any) -> "Tensor":
        """Python's %: the remainder with the divisor's sign."""
        a, b = _broadcast(*_promote(self, self._wrap(o)), "remainder")
        if not a.dtype.is_float:
            _nonzero_divisor(o)
        r = a.fmod(b)
        return where(r.ne(0) & ((r < 0).ne(b < 0)), r + b, r)  # a zero keeps fmod's sign, as PyTorch
    def __neg__(self) -> "Tensor": return self._unary(Op.NEG)  # noqa: E704
    neg = negative = __neg__
    def __pow__(self, o: Any) -> "Tensor": return self.pow(o)  # noqa: E704
    def __matmul__(self, o: "Tensor") -> "Tensor": return self.matmul(o)  # noqa: E704
    __lt__ = lt = functools.partialmethod(_binary, Op.CMPLT)
    __gt__ = gt = functools.partialmethod(_binary, Op.CMPLT, reverse=True)
    __eq__ = eq = functools.partialmethod(_binary, Op.CMPEQ)  # type: ignore[assignment]
    __ne__ = ne = functools.partialmethod(_binary, Op.CMPNE)  # type: ignore[assignment]
    def __le__(self, o: Any, reverse: bool = False) -> "Tensor":
        """x <= y (reverse: x >= y): not (x > y) for integers, the form the compiler's patterns
        know (a causal mask); (x < y) | (x == y) for floats, False at NaN, as PyTorch."""
        if _promote(self, self._wrap(o))[0].dtype.is_float:
            return self._binary(Op.CMPLT, o, reverse) | self.eq(o)
        return self._binary(Op.CMPLT, o, not reverse).logical_not()

    __ge__ = functools.partialmethod(__le__, reverse=True)
    le, ge = __le__, __ge__

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor of {self.numel()} elements is ambiguous "
                               "(use .any() or .all())")
        return bool(self.item())
    def __invert__(self) -> "Tensor":
        if self.dtype.is_float:
            raise TypeError(f"~ (bitwise_not) needs an integer or bool tensor, got {self.dtype}")
        return self._flip_order()

    bitwise_not = __invert__

    def _bitwise(self, op: Op, o: Any, reverse: bool = False) -> "Tensor":
        other = o if isinstance(o, Tensor) else _scalar(o)
        if self.dtype.is_float or other.dtype.is_float:
            raise TypeError(f"{op.name.lower()}: bitwise ops need integer or bool tensors, got "
                            f"{self.dtype} and {other.dtype}")
        if op in (Op.SHL, Op.SHR):  # C's shift of a negative or too wide amount is undefined: PyTorch's 0 or sign
            a, b = (other, self) if reverse else (self, other)
            a, b = _broadcast(*_promote(a, b), "shift")
            width = a.dtype.bits
            safe = where((b < 0) | (b >= width), 0, b).cast(b.dtype)
            out = Tensor(ir.binary(op, a.node, safe.node))
            over = (a < 0).cast(a.dtype) * -1 if op is Op.SHR and a.dtype.is_signed else a._const(0)
            return where((b < 0) | (b >= width), over, out)
        return self._binary(op, other, reverse)
    __hash__ = object.__hash__

    # PyTorch's other spellings of the ops above
    def add(self, o: Any, alpha: float = 1) -> "Tensor": return self + (o * alpha if alpha != 1 else o)  # noqa: E704
    def sub(self, o: Any, alpha: float = 1) -> "Tensor": return self - (o * alpha if alpha != 1 else o)  # noqa: E704
    def positive(self) -> "Tensor": return self  # noqa: E704
    def logical_and(self, o: Any) -> "Tensor": return self.bool() & self._wrap(o).bool()  # noqa: E704
    def logical_or(self, o: Any) -> "Tensor": return self.bool() | self._wrap(o).bool()  # noqa: E704
    def logical_xor(self, o: Any) -> "Tensor": return self.bool() ^ self._wrap(o).bool()  # noqa: E704
    def clamp_min(self, m: Any) -> "Tensor": return self.clamp(min=m)  # noqa: E704
    def clamp_max(self, m: Any) -> "Tensor": return self.clamp(max=m)  # noqa: E704
    def type_as(self, o: "Tensor") -> "Tensor": return self.cast(o.dtype)  # noqa: E704
    def dim(self) -> int: return self.ndim  # noqa: E704
    def element_size(self) -> int: return self.dtype.itemsize  # noqa: E704
    def t(self) -> "Tensor": return self if self.ndim < 2 else self.transpose(0, 1)  # noqa: E704
    def view_as(self, o: "Tensor") -> "Tensor": return self.reshape(o.shape)  # noqa: E704
    def expand_as(self, o: "Tensor") -> "Tensor": return self.expand(o.shape)  # noqa: E704
    def mm(self, o: "Tensor") -> "Tensor": return self._ranked("mm", o, 2, 2).matmul(o)  # noqa: E704
    def bmm(self, o: "Tensor") -> "Tensor": return self._ranked("bmm", o, 3, 3).matmul(o)  # noqa: E704
    def mv(self, o: "Tensor") -> "Tensor": return self._ranked("mv", o, 2, 1).matmul(o)  # noqa: E704
    def dot(self, o: "Tensor") -> "Tensor": return self._ranked("dot", o, 1, 1).matmul(o)  # noqa: E704
    def outer(self, o: "Tensor") -> "Tensor":  # noqa: E704
        return self._ranked("outer", o, 1, 1).reshape(-1, 1) * o.reshape(1, -1)

    def _ranked(self, name: str, o: Any, ra: int, rb: int) -> "Tensor":
        if not isinstance(o, Tensor) or self.ndim != ra or o.ndim != rb:
            got = f"{self.ndim}-D and {o.ndim}-D tensors" if isinstance(o, Tensor) else f"a {type(o).__name__}"
            raise ShapeError(f"{name}: expected {ra}-D and {rb}-D tensors, got {got}")
        return self
    def hypot(self, o: Any) -> "Tensor":
        """sqrt(a^2 + b^2) scaled by the larger (no overflow at 1e30), inf where either is, NaN included."""
        a, b = _broadcast(*_promote(self.abs(), self._wrap(o).abs()), "hypot")
        big, small = a.maximum(b), a.minimum(b)
        r = small / where(big.eq(0) | big.isinf(), 1.0, big).cast(big.dtype)
        return where(a.isinf() | b.isinf(), math.inf, big * (r * r + 1).sqrt()).cast(big.dtype)
    def deg2rad(self) -> "Tensor": return self * (math.pi / 180)  # noqa: E704
    def rad2deg(self) -> "Tensor": return self * (180 / math.pi)  # noqa: E704
    def xlogy(self, o: Any) -> "Tensor":
        x = self if self.dtype.is_float else self.cast(dt.f32)  # ints give float32, as PyTorch
        return where(x.eq(0), 0.0, x * x._wrap(o).float().log()).cast(x.dtype)

    def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> "Tensor":
        if not self.dtype.is_float:
            return self
        big = float(np.finfo(np.dtype(self.dtype.np_name) if self.dtype is not dt.bf16 else np.float32).max)
        big = 3.3895313892515355e38 if self.dtype is dt.bf16 else big
        out = where(self.isnan(), nan, self)
        out = where(out.eq(math.inf), big if posinf is None else posinf, out)
        return where(out.eq(-math.inf), -big if neginf is None else neginf, out).cast(self.dtype)

    def logical_not(self) -> "Tensor":
        return self._binary(Op.CMPEQ, False) if self.dtype is dt.bool_ else self.eq(0)

    def maximum(self, o: Any) -> "Tensor": return self._binary(Op.MAX, o, name="maximum")  # noqa: E704

    def minimum(self, o: Any) -> "Tensor":
        a, b = _promote(self, self._wrap(o))
        if a.dtype.is_float:
            return -((-a).maximum(-b))
        return a._flip_order().maximum(b._flip_order())._flip_order()

    def _flip_order(self) -> "Tensor":
        """An order-reversing bijection of ints (bitwise not; bool: not), exact at the extremes."""
        ones = 1 if self.dtype is dt.bool_ else (-1 if self.dtype.is_signed else self.dtype.max)
        return Tensor(ir.binary(Op.XOR, self.node, ir.const(ones, self.dtype, self.shape)))

    # ------------------------------------------------------------------------- math
    def exp(self) -> "Tensor": return (self * LOG2E)._unary(Op.EXP2)  # noqa: E704
    def exp2(self) -> "Tensor": return self._unary(Op.EXP2)  # noqa: E704
    def log(self) -> "Tensor": return self._unary(Op.LOG2) * LN2  # noqa: E704
    def log2(self) -> "Tensor": return self._unary(Op.LOG2)  # noqa: E704
    def sqrt(self) -> "Tensor": return self._unary(Op.SQRT)  # noqa: E704
    def rsqrt(self) -> "Tensor": return self.sqrt()._unary(Op.RECIP)  # noqa: E704
    def reciprocal(self) -> "Tensor": return self._unary(Op.RECIP)  # noqa: E704
    def sin(self) -> "Tensor": return self._unary(Op.SIN)  # noqa: E704
    def cos(self) -> "Tensor":
        """cos x = +-sin(r) or +-sin(r + pi/2) of r = x - k pi/2, |r| <= pi/4, reduced in f64 with
        pi/2 in three parts (Cody-Waite): sin(x + pi/2) in x's precision lost x's low bits
        (cos(1e6) in f32 was off by 3e-3)."""
        x = self if self.dtype.is_float else self.float()
        w = x.cast(dt.f64)
        k = (w * (2 / math.pi)).round()
        r = w - k * 1.57079632673412561417 - k * 6.07710050630396597660e-11 - k * 2.02226624871116645580e-21
        q = k - (k * 0.25).floor() * 4    # k mod 4: cos r, -sin r, -cos r, sin r
        s = (r + where(q.eq(0) | q.eq(2), r._const(math.pi / 2), r._const(0.0)))._unary(Op.SIN)
        return where(q.eq(1) | q.eq(2), -s, s).cast(x.dtype)
    def trunc(self) -> "Tensor": return self._unary(Op.TRUNC) if self.dtype.is_float else self  # noqa: E704
    def frac(self) -> "Tensor": return self - self.trunc()  # noqa: E704

    def floor(self) -> "Tensor":
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return where(self < t, t - 1, t)

    def ceil(self) -> "Tensor":
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return where(self > t, t + 1, t)

    def round(self, decimals: int = 0) -> "Tensor":
        """Half to even, as PyTorch; decimals scale by 10**decimals first."""
        if not self.dtype.is_float:
            return self
        if decimals:
            return (self * 10.0 ** decimals).round() / 10.0 ** decimals
        t = self.trunc()
        a = (self - t).abs()
        odd = (t * 0.5).trunc().ne(t * 0.5)
        return where((a > 0.5) | (a.eq(0.5) & odd), t + where(self < 0, -1.0, 1.0).cast(self.dtype), t)

    def sign(self) -> "Tensor":
        """1, -1 or 0 (PyTorch: 0 for -0.0 and NaN too)."""
        if self.dtype is dt.bool_:
            return self
        one, zero = self._const(1), self._const(0)
        return where(self > 0, one, where(self < 0, -one if self.dtype.is_signed or self.dtype.is_float else one, zero))


    def copysign(self, o: Any) -> "Tensor":
        a = self if self.dtype.is_float else self.float()
        a, b = _broadcast(*_promote(a, a._wrap(o)), "copysign")
        return where(b.signbit(), -a.abs(), a.abs())

    def log10(self) -> "Tensor": return self.log2() * math.log10(2)  # noqa: E704

    def _formula(self, value: Callable[["Tensor"], "Tensor"], grad: Callable[["Tensor"], "Tensor"]) -> "Tensor":
        """value(x) of this tensor as floats, with the gradient PyTorch's formula grad(x) gives:
        differentiating value's own expression gave NaN or 0 at the domain's edges (asin at 1,
        acos at 0) and outside it, where PyTorch's formula is finite."""
        x = self if self.dtype.is_float else self.float()
        if not x.requires_grad:
            return value(x)
        xs = _stopped(x)
        return _with_gradients(value(xs), [(x, grad(xs))])

    def log1p(self) -> "Tensor":
        """log(1 + x) accurate near 0: log(u) * x / (u - 1) with u = 1 + x (Goldberg)."""
        def value(x: Tensor) -> Tensor:
            u = x + 1
            d = u - 1
            safe = where(d.eq(0) | u.isinf(), 1.0, d).cast(x.dtype)
            return where(d.eq(0), x, where(u.isinf(), u.log(), u.log() * (x / safe)))
        return self._formula(value, lambda x: (x + 1).reciprocal())

    def expm1(self) -> "Tensor":
        """exp(x) - 1 accurate near 0: (u - 1) * x / log(u) with u = exp(x) (Kahan)."""
        x = self if self.dtype.is_float else self.float()
        u = x.exp()
        near = x.abs() < 1  # Kahan's form only where u - 1 would cancel
        us = where(u.eq(1) | near.logical_not(), 2.0, u).cast(x.dtype)  # its input where it is not used
        return where(u.eq(1), x, where(near, (us - 1) * (x / us.log()), u - 1))

    def erfc(self) -> "Tensor": return 1 - self.erf()  # noqa: E704

    def logaddexp(self, o: Any) -> "Tensor":
        a, b = _broadcast(*_promote(self, self._wrap(o)), "logaddexp")
        m = a.maximum(b)
        d = where(a.eq(b), 0.0, (a - b).abs()).cast(m.dtype)  # equal infinities: no inf - inf
        return m + (-d).exp().log1p()

    def lerp(self, end: Any, weight: Any) -> "Tensor":
        """start + weight * (end - start), from the nearer end as PyTorch computes it."""
        end, w = self._wrap(end), self._wrap(weight)
        diff = end - self
        return where(w.abs() < 0.5, self + w * diff, end - diff * (1 - w))

    def tan(self) -> "Tensor": return self.sin() / self.cos()  # noqa: E704

    def sinh(self) -> "Tensor":
        x = self if self.dtype.is_float else self.float()
        return (x.expm1() - (-x).expm1()) * 0.5

    def cosh(self) -> "Tensor":
        x = (self if self.dtype.is_float else self.float()).abs()
        e = (x - math.log(2)).exp()  # exp(x)/2 without overflowing before exp(x) does
        return e + 0.25 / e

    def asinh(self) -> "Tensor":
        x = self if self.dtype.is_float else self.float()
        sgn = x._sign_factor()
        a = x * sgn
        big = a > 2 ** 28
        s = where(big, 1.0, a).cast(x.dtype)
        small = (s + s * s / ((s * s + 1).sqrt() + 1)).log1p()
        y = where(big, where(big, a, 1.0).cast(x.dtype).log() + math.log(2), small)  # log of a safe input:
        return sgn * y  # a masked branch's infinite derivative times 0 would be NaN

    def acosh(self) -> "Tensor":
        def value(x: Tensor) -> Tensor:
            big = x > 2 ** 28
            t = where(big, 2.0, x).cast(x.dtype) - 1
            y = (t + (t * 2 + t * t).sqrt()).log1p()  # NaN below 1
            return where(big, x.log() + math.log(2), y)
        return self._formula(value, lambda x: (x * x - 1).rsqrt())

    def atanh(self) -> "Tensor":
        return self._formula(lambda x: ((x * 2) / (1 - x)).log1p() * 0.5, lambda x: (1 - x * x).reciprocal())

    def atan(self) -> "Tensor":
        """Reduced to |t| <= tan(pi/12) (1/|x| above 1, then a pi/6 step), then its odd series
        to t^23: error under 1e-15 relative."""
        x = self if self.dtype.is_float else self.float()
        sgn = x._sign_factor()
        a = x * sgn
        inv = a > 1
        r = where(inv, where(inv, a, 1.0).cast(x.dtype).reciprocal(), a)
        step = r > 2 - math.sqrt(3)
        rs = where(step, (r * math.sqrt(3) - 1) / (r + math.sqrt(3)), r)
        t2 = rs * rs
        series = 0.0
        for k in range(23, 0, -2):
            series = (1 / k if (k // 2) % 2 == 0 else -1 / k) + t2 * series
        y = rs * series
        y = where(step, y + math.pi / 6, y)
        y = where(inv, math.pi / 2 - y, y)
        return sgn * y

    def atan2(self, o: Any) -> "Tensor":
        """atan2(self, other) with C's rules for zeros and infinities."""
        y, x = _broadcast(*_promote(self if self.dtype.is_float else self.float(), self._wrap(o)), "atan2")
        y, x = (y, x) if y.dtype.is_float else (y.float(), x.float())
        sy, sx = y._sign_factor(), x._sign_factor()
        ay, ax = y * sy, x * sx
        both_inf, both_zero = ay.isinf() & ax.isinf(), ay.eq(0) & ax.eq(0)
        safe_x = where(both_inf | both_zero | ax.eq(0), 1.0, ax).cast(y.dtype)
        ratio = where(both_inf, 1.0, where(both_zero, 0.0, where(ax.eq(0), math.inf, ay / safe_x))).cast(y.dtype)
        base = ratio.atan()
        base = where(x.signbit(), math.pi - base, base)
        return where(y.isnan() | x.isnan(), y + x, sy * base)


    def asin(self) -> "Tensor":
        return self._formula(lambda x: x.atan2(((1 - x) * (1 + x)).sqrt()), lambda x: (1 - x * x).rsqrt())

    def acos(self) -> "Tensor":
        return self._formula(lambda x: ((1 - x) * (1 + x)).sqrt().atan2(x), lambda x: -(1 - x * x).rsqrt())

    def isclose(self, o: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> "Tensor":
        a, b = _broadcast(*_promote(self, self._wrap(o)), "isclose")
        close = a.eq(b)
        if a.dtype.is_float:
            close = close | (a.isfinite() & b.isfinite() & ((a - b).abs() <= atol + rtol * b.abs()))
            if equal_nan:
                close = close | (a.isnan() & b.isnan())
        return close
    def allclose(self, o: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        return bool(self.isclose(o, rtol, atol, equal_nan).all())

    def relu(self) -> "Tensor":
        """PyTorch's: -0.0 and NaN pass through, and the gradient at 0 is 0."""
        if not self.dtype.is_float:
            return self.maximum(0)
        return where((self > 0) | self.isnan(), self, where(self.eq(0), self * 0, 0.0).cast(self.dtype))
    @_half_in_f32
    def sigmoid(self) -> "Tensor":
        """exp(-|x|) never overflows, so the value and its gradient stay finite for any x."""
        x = self if self.dtype.is_float else self.float()
        z = (-where(x >= 0, x, -x)).exp()  # exp(-|x|), with the gradient of |x| right at 0 too
        return where(x >= 0, (z + 1).reciprocal(), z / (z + 1))

    @_half_in_f32
    def tanh(self) -> "Tensor":
        """(1 - e)/(1 + e) with e = exp(-2|x|), finite everywhere; a series near 0, where that
        form would cancel."""
        x = self if self.dtype.is_float else self.float()
        sgn = x._sign_factor()
        a = x * sgn
        e = (a * -2).exp()
        big = (1 - e) / (1 + e)
        s = where(a < 0.25, a, 0.0).cast(x.dtype)   # the series' input where it is used: finite gradients
        x2 = s * s
        small = s * (1 + x2 * (-1 / 3 + x2 * (2 / 15 + x2 * (-17 / 315 + x2 * (62 / 2835)))))
        return sgn * where(a < 0.25, small, big)
    @_half_in_f32
    def silu(self) -> "Tensor": return self * self.sigmoid()  # noqa: E704
    def square(self) -> "Tensor":
        x = self.cast(dt.i64) if self.dtype is dt.bool_ else self  # bools square to int64, as PyTorch
        return x * x
    def abs(self) -> "Tensor":
        """|x|: +0.0 for -0.0, with PyTorch's gradient sign(x) (0 at 0)."""
        if not self.dtype.is_float:
            return where(self < 0, -self, self)
        return where(self > 0, self, where(self < 0, -self, where(self.eq(0), 0.0, self).cast(self.dtype)))

    @_half_in_f32
    def gelu(self, approximate: str = "none") -> "Tensor":
        """x * Phi(x); approximate='tanh' is GPT-2's form."""
        if approximate == "tanh":
            # 0.5 (1 + tanh(u)) is 1 / (1 + exp(-2u)): one exp and one reciprocal, where tanh's
            # two branches cost GPT-2's MLP its time; exp's argument is capped so that the
            # gradient stays finite for very negative x (exp(80) is finite in f32). x times the
            # reciprocal, not x over the sum: the gradient of x / d divides three times, and
            # GPT-2's bias gradient, which recomputes it, was bound by those divisions
            u = (self + self * self * self * 0.044715) * (-2 * math.sqrt(2 / math.pi))
            return self * (where(u > 80.0, 80.0, u).cast(u.dtype).exp() + 1).reciprocal()
        if approximate != "none":
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        # x/2 (1 + erf(x/sqrt2)), the order of PyTorch's CPU and CUDA kernels: x << 0 gives -0
        return self * 0.5 * ((self * (1 / math.sqrt(2))).erf() + 1)

    @_half_in_f32
    def erf(self) -> "Tensor":
        """Its Taylor series below 0.5, else Abramowitz and Stegun 7.1.26 with the exp of -x^2:
        absolute error under 1.5e-7 (f32's resolution; f64 gets the same, not f64's)."""
        x = self if self.dtype.is_float else self.float()
        a = x.abs()
        c = where(a > 10, 10.0, a).cast(x.dtype)   # erf(10) is 1: an infinite x's gradient stays 0, not NaN
        t = (c * 0.3275911 + 1).reciprocal()
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        y = 1 - poly * (-(c * c)).exp()
        s = where(a < 0.5, x, 0.0).cast(x.dtype)   # below 0.5 its Taylor series, which keeps the relative
        x2 = s * s                                  # precision of small values
        small = s * (2 / math.sqrt(math.pi)) * (1 + x2 * (-1 / 3 + x2 * (1 / 10 + x2 * (-1 / 42 + x2 * (
            1 / 216 + x2 * (-1 / 1320 + x2 / 9360))))))
        return where(a < 0.5, small, where(x.signbit(), -y, y))

    def pow(self, e: Any) -> "Tensor":
        """PyTorch's pow: non-negative integer exponents by repeated squaring (exact signs of
        negative bases, integer results for integer tensors, x**0 == 1 with gradient 0), others
        as _pow computes them."""
        if isinstance(e, Tensor):
            return _pow(self, e)
        e = e.item() if isinstance(e, np.number) else e
        e = int(e) if isinstance(e, bool) else e
        if not self.dtype.is_float and isinstance(e, float):
            return self.float().pow(e)
        if (isinstance(e, int) or float(e).is_integer() and abs(e) < 2 ** 31) and e >= 0:
            n, out, base = int(e), None, self
            while n:
                if n & 1:
                    out = base if out is None else out * base
                n >>= 1
                if n:
                    base = base * base
            if out is None:  # x ** 0 is 1, NaN included; still a function of x, whose gradient is 0
                one = self._const(1)._broadcast_to(self.shape)
                out = where(self.isnan(), one, one)
            return out
        if not self.dtype.is_float:
            raise ValueError(f"pow: integers to negative integer powers are not allowed (exponent {e})")
        return _pow(self, self._wrap(float(e)), e)

    def __rpow__(self, base: Any) -> "Tensor":
        b = _scalar(base)
        if b.dtype.is_float or self.dtype.is_float:
            b = b.cast(self.dtype if self.dtype.is_float else dt.f32)
        else:
            b = b.cast(self.dtype)
        return _pow(b, self)

    def clamp(self, min: Any = None, max: Any = None) -> "Tensor":  # noqa: A002
        """PyTorch's clamp: NaN stays NaN, and the gradient is 1 on [min, max], bounds included."""
        if min is None and max is None:
            raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
        out = where(self.isnan(), _stopped(self), self) if self.dtype.is_float else self
        for bound, over in ((min, Tensor.__lt__), (max, Tensor.__gt__)):
            if bound is not None:
                b = out._wrap(bound)
                out = where(over(out, b) | b.isnan(), b, out)
        return out


    def cast(self, d: Any) -> "Tensor":
        d = as_dtype(d)
        return self if d is self.dtype else Tensor(ir.unary(Op.CAST, self.node, d))



    # --------------------------------------------------------------------- movement
    def reshape(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if shape.count(-1) > 1 or known == 0 or self.numel() % known:
                raise ShapeError(f"reshape: cannot reshape {list(self.shape)} to {list(shape)}")
            shape = tuple(self.numel() // known if s == -1 else s for s in shape)
        if self.is_leaf and context.trace is None and isinstance(self.value(), np.ndarray) \
                and math.prod(shape) == self.numel() and not self.requires_grad:
            return Tensor(self.value().reshape(shape), self.dtype)   # data reshaped is data (see __getitem__)
        return _call("reshape", lambda: ir.reshape(self.node, shape), self)

    def view(self, *shape: Any) -> "Tensor":
        """reshape, or with a dtype of the same width, the same bits read as that dtype."""
        if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list)):
            d = as_dtype(shape[0])
            if d.itemsize != self.dtype.itemsize or dt.bool_ in (d, self.dtype):
                raise ShapeError(f"view({d}): only a dtype of the same width as {self.dtype} (and not bool)")
            return self if d is self.dtype else Tensor(ir.unary(Op.BITCAST, self.node, d))
        return self.reshape(*shape)

    def permute(self, *order: Any) -> "Tensor":
        order = tuple(_dim(o, self.ndim) for o in _shape_arg(order))
        return _call("permute", lambda: ir.permute(self.node, order), self)

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        order = list(range(self.ndim))
        a, b = _dim(a, self.ndim), _dim(b, self.ndim)
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
        if self.ndim == 0:
            return self.reshape(1)
        start, end = _dim(start, self.ndim), _dim(end, self.ndim)
        return self.reshape(self.shape[:start] + (math.prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if self.ndim == 0:
            _dim(dim, 0)
            return self
        dim = _dim(dim, self.ndim)
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:]) if self.shape[dim] == 1 else self

    def unsqueeze(self, dim: int) -> "Tensor":
        dim = _dim(dim, self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def pad(self, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> "Tensor":
        """F.pad's order, (last_before, last_after, second_last_before, ...), and its modes:
        constant (negative pads crop), reflect, replicate and circular."""
        if len(pads) % 2 or len(pads) // 2 > self.ndim:
            raise ShapeError(f"pad: {list(pads)} needs pairs for at most {self.ndim} dims")
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise ValueError(f"pad: mode must be constant, reflect, replicate or circular, got {mode!r}")
        out = self
        for i in range(len(pads) // 2):
            d, lo, hi = self.ndim - 1 - i, pads[2 * i], pads[2 * i + 1]
            n = out.shape[d]
            if mode == "constant":
                if lo < 0 or hi < 0:  # crop first
                    out = out.narrow(d, max(-lo, 0), n - max(-lo, 0) - max(-hi, 0))
                    lo, hi = max(lo, 0), max(hi, 0)
                if lo or hi:
                    before, after = [0] * self.ndim, [0] * self.ndim
                    before[d], after[d] = lo, hi
                    v = data.literal_value(value, out.dtype, truncate=True)
                    node = out.node
                    if node.numel == 0:  # padding nothing: the value everywhere (when anything is left)
                        shape = tuple(s + b + a for s, b, a in zip(node.shape, before, after))
                        out = _from_empty(Tensor(ir.const(v, out.dtype, shape)), out)
                        continue
                    out = _call("pad", lambda: ir.pad(node, tuple(before), tuple(after), v), out)
                continue
            if lo < 0 or hi < 0:   # each output position's source in the input, as PyTorch maps it
                src = np.arange(n + lo + hi) - lo
                if mode == "reflect":
                    period = max(2 * (n - 1), 1)
                    src = np.abs(src) % period
                    src = np.where(src >= n, period - src, src)
                if mode == "circular":   # PyTorch crops first and wraps around what is left
                    cut = n - max(-lo, 0) - max(-hi, 0)
                    src = max(-lo, 0) + (np.arange(n + lo + hi) - max(lo, 0)) % cut
                out = out.index_select(d, Tensor(np.clip(src, 0, n - 1)))
                continue
            limit = n - 1 if mode == "reflect" else n
            if mode != "replicate" and (lo > limit or hi > limit):
                raise ShapeError(f"pad: {mode} padding of {lo} and {hi} needs a dim larger than them (size {n})")

            def part(a: int, b: int, flip: bool = False) -> "Tensor":
                p = out.narrow(d, a, b - a)
                return p.flip(d) if flip else p
            pieces = []
            if lo:
                pieces.append(part(1, lo + 1, True) if mode == "reflect" else part(n - lo, n) if mode == "circular"
                              else part(0, 1).repeat_interleave(lo, d))
            pieces.append(out)
            if hi:
                pieces.append(part(n - 1 - hi, n - 1, True) if mode == "reflect" else part(0, hi) if mode == "circular"
                              else part(n - 1, n).repeat_interleave(hi, d))
            out = cat(pieces, d) if len(pieces) > 1 else out
        return out

    def unfold(self, dimension: int, size: int, step: int) -> "Tensor":
        """Windows of size along dimension, step apart: that dim becomes their count, and a last
        dim of size is added (movement ops only, as the convolutions' windows)."""
        d = _dim(dimension, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if size > n or step < 1:
            raise ShapeError(f"unfold: size {size} (at most {n}) and step {step} (at least 1) for dim {d}")
        x = self if self.ndim else self.reshape(1)
        w = _axis_windows(x, d, size, step, 1, (n - size) // step + 1)
        return w.movedim(d + 1, -1) if self.ndim else w.reshape(size)

    def flip(self, dims: Iterable[int]) -> "Tensor":
        axes = tuple(_dim(d, self.ndim) for d in ([dims] if isinstance(dims, int) else dims))
        return _call("flip", lambda: ir.flip(self.node, axes), self) if self.ndim else self

    def repeat(self, *times: Any) -> "Tensor":
        times = _shape_arg(times)
        x = self.reshape((1,) * (len(times) - self.ndim) + self.shape)
        inter = tuple(d for s in x.shape for d in (1, s))
        big = tuple(d for t, s in zip(times, x.shape) for d in (t, s))
        return x.reshape(inter)._broadcast_to(big).reshape(tuple(t * s for t, s in zip(times, x.shape)))

    def __getitem__(self, idx: Any) -> "Tensor":
        """ints, slices (any positive step, or -1), `...`, None, and one integer list or tensor
        (or a bool mask over the leading dims)."""
        if isinstance(idx, Tensor) and idx.dtype is dt.bool_:
            return self._masked(idx)
        idx = idx if isinstance(idx, tuple) else (idx,)
        idx = tuple(Tensor(np.asarray(i)) if isinstance(i, (list, tuple)) else i for i in idx)
        # a 0-d integer tensor indexes as its int (PyTorch's rule: a basic index, not an advanced one)
        idx = tuple(int(i.item()) if isinstance(i, Tensor) and i.ndim == 0 and not i.dtype.is_float
                    and i.dtype is not dt.bool_ else i for i in idx)
        used = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if any(i is Ellipsis for i in idx):
            k = next(j for j, i in enumerate(idx) if i is Ellipsis)   # (index() would call Tensor.__eq__)
            idx = idx[:k] + (slice(None),) * (self.ndim - used) + idx[k + 1:]
            used = self.ndim
        if used > self.ndim:
            raise IndexError(f"too many indices for a tensor of {self.ndim} dims: {idx!r}")
        tensors = [k for k, i in enumerate(idx) if isinstance(i, Tensor)]
        if tensors:
            return self._advanced(idx, tensors)
        start, end, flips, steps, shape = [], [], [], [], []
        d = 0
        for i in idx + (slice(None),) * (self.ndim - used):
            if i is None:
                shape.append(1)
                continue
            n = self.shape[d]
            if isinstance(i, (int, np.integer)):
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of range for dim {d} of size {n}")
                start.append(int(i) % n), end.append(int(i) % n + 1)
                d += 1
                continue
            if not isinstance(i, slice):
                raise ShapeError(f"unsupported index {i!r} (ints, slices, ..., None, lists and integer tensors)")
            s, e, step = i.indices(n)
            if step == -1:
                s, e = e + 1, s + 1
                flips.append(d)
            elif step < 1:
                raise ValueError(f"slice step must be positive (or -1), got {step}")
            e = max(e, s)  # an empty slice: an empty dim
            start.append(s), end.append(e)
            steps.append((len(shape), abs(step), d))
            shape.append(-(-(e - s) // abs(step)))
            d += 1
        if self.is_leaf and context.trace is None and isinstance(self.value(), np.ndarray) and not self.requires_grad:
            # a slice of data is data: a loop's batches x[i:i + 64] are not constants of its program
            return Tensor(np.array(self.value()[idx]).reshape(shape), self.dtype)
        out = _call("index", lambda: ir.shrink(self.node, tuple(start), tuple(end)), self)
        if flips:
            out = out.flip(flips)
        for _, step, dim in steps:  # every step-th element: pad to whole groups, keep each group's first
            if step > 1:
                n = out.shape[dim]
                groups = -(-n // step)
                pads = [0, 0] * (out.ndim - dim - 1) + [0, groups * step - n]
                g = out.pad(pads).unflatten(dim, (groups, step))
                out = g[tuple([slice(None)] * (dim + 1) + [slice(0, 1)])].squeeze(dim + 1)
        return out.reshape(tuple(shape))

    def _advanced(self, idx: tuple, tensors: list[int]) -> "Tensor":
        """Integer tensors (and lists) in an index, as PyTorch (numpy's rules): broadcast together,
        they pick elements of their dims, whose result dims stand where the first of them stood
        when they are adjacent, else first. Negative entries count from the end."""
        for k in tensors:
            if idx[k].dtype is dt.bool_ or idx[k].dtype.is_float:
                raise IndexError(f"tensors used as indices must be integer (or a bool mask alone), got {idx[k].dtype}")
        out = self[tuple(slice(None) if k in tensors else i for k, i in enumerate(idx))]
        pos = [sum(1 for i in idx[:k] if not isinstance(i, (int, np.integer))) for k in tensors]  # their dims in out
        shape = functools.reduce(lambda a, b: _broadcast_shape(a, b, "index"), [idx[k].shape for k in tensors])
        flat = None
        for k, p in zip(tensors, pos):   # one flat index over the indexed dims, row-major
            n, i = out.shape[p], idx[k].cast(dt.i64)
            i = where(i < 0, i + n, i)._broadcast_to(shape)
            flat = i if flat is None else flat * n + i
        rest = [d for d in range(out.ndim) if d not in pos]
        moved = out.permute(pos + rest)
        picked = moved.reshape((math.prod(out.shape[p] for p in pos),) + moved.shape[len(pos):]).gather_rows(flat)
        at = pos[0] if tensors == list(range(tensors[0], tensors[-1] + 1)) else 0
        b = len(shape)
        return picked.permute(list(range(b, b + at)) + list(range(b)) + list(range(b + at, picked.ndim)))

    def gather_rows(self, index: "Tensor") -> "Tensor":
        """self[index] for an integer tensor: rows of self picked by index (_pick: the gradient goes
        to the picked row alone). An index out of range gives -0.0 (floats) or the lowest value."""
        if self.dtype is dt.bool_:
            return self.cast(dt.u8).gather_rows(index).cast(dt.bool_)
        n = self.shape[0]
        picked = index.one_hot(n).cast(dt.bool_).unsqueeze(-1)
        return _pick(picked, self.reshape(n, -1), -2).reshape(index.shape + self.shape[1:])

    def _masked(self, mask: "Tensor") -> "Tensor":
        """self[mask] for a bool mask over the leading dims. The result's length depends on the
        data, so the mask is computed first (the values stay lazy and differentiable)."""
        if mask.shape != self.shape[:mask.ndim]:
            raise IndexError(f"the shape of the mask {list(mask.shape)} does not match the shape of the "
                             f"indexed tensor {list(self.shape)}")
        rows = self.reshape((math.prod(mask.shape),) + self.shape[mask.ndim:])
        return rows.gather_rows(_true_positions(mask.reshape(-1)))

    def split(self, size: Any, dim: int = 0) -> list["Tensor"]:
        return split(self, size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> list["Tensor"]:
        return chunk(self, chunks, dim)

    def one_hot(self, num_classes: int) -> "Tensor":
        if self.dtype.is_float:
            raise ShapeError(f"one_hot needs an integer tensor, got {self.dtype}")
        classes = Tensor(ir.iota(self.dtype, (num_classes,), 0))
        return self.unsqueeze(-1).eq(classes).cast(dt.i64)

    # ------------------------------------------------------------------- reductions
    def _axes(self, dim: Any) -> tuple[int, ...]:
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        axes = tuple(sorted({_dim(d, self.ndim) for d in dims}))
        return axes if self.ndim else ()  # a 0-d tensor takes dim 0 or -1: nothing to reduce

    def _reduce(self, op: Op, dim: Any, keepdim: bool) -> "Tensor":
        axes = self._axes(dim)
        if any(self.shape[a] == 0 for a in axes):  # over nothing: the identity, or no maximum
            if op is Op.RMAX:
                raise ShapeError(f"max/min over an empty dim of shape {list(self.shape)} has no value (as PyTorch)")
            out = _from_empty(Tensor(ir.const(0, self.dtype, tuple(1 if d in axes else n
                                                               for d, n in enumerate(self.shape)))), self)
        else:
            out = _call("sum" if op is Op.SUM else "max", lambda: ir.reduce(op, self.node, axes), self)
        return out if keepdim else out.reshape(tuple(s for d, s in enumerate(out.shape) if d not in axes))

    def sum(self, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        """PyTorch's: bool and integer tensors sum in int64 unless dtype says otherwise."""
        x = self.cast(as_dtype(dtype)) if dtype is not None else self if self.dtype.is_float else self.cast(dt.i64)
        return x._reduce(Op.SUM, dim, keepdim)

    def prod(self, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        """Products as a tree of pairwise multiplies over the reduced elements (int64 for ints)."""
        x = self.cast(as_dtype(dtype)) if dtype is not None else self if self.dtype.is_float else self.cast(dt.i64)
        axes = x._axes(dim)
        keep = [d for d in range(x.ndim) if d not in axes]
        if x.numel() == 0:  # the empty product, or an empty result
            return x.sum(dim, keepdim) + 1
        flat = x.permute(keep + list(axes)).reshape([x.shape[d] for d in keep] + [-1]) if x.ndim else x.reshape(1)
        while flat.shape[-1] > 1:
            n = flat.shape[-1]
            if n % 2:
                flat = flat.pad([0, 1], value=1)
            half = flat.shape[-1] // 2
            flat = flat[..., :half] * flat[..., half:]
        out = flat.reshape([x.shape[d] for d in keep])
        return out.reshape([1 if d in axes else x.shape[d] for d in range(x.ndim)]) if keepdim else out

    def any(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return self.ne(0).cast(dt.i64).sum(dim, keepdim).ne(0)

    def all(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return self.eq(0).cast(dt.i64).sum(dim, keepdim).eq(0)

    def aminmax(self, dim: Any = None, keepdim: bool = False) -> tuple["Tensor", "Tensor"]:
        return self.amin(dim, keepdim), self.amax(dim, keepdim)

    def amax(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        if self.dtype is dt.bool_:  # the IR's max takes numbers: bools as 0 and 1
            return self.cast(dt.u8).amax(dim, keepdim).cast(dt.bool_)
        return self._reduce(Op.RMAX, dim, keepdim)

    def amin(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        if self.dtype.is_float:
            return -((-self).amax(dim, keepdim))
        return self._flip_order().amax(dim, keepdim)._flip_order()

    def var_mean(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> tuple["Tensor", "Tensor"]:
        return self.var(dim, keepdim, correction), self.mean(dim, keepdim)

    def std_mean(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> tuple["Tensor", "Tensor"]:
        return self.std(dim, keepdim, correction), self.mean(dim, keepdim)

    def masked_fill(self, mask: "Tensor", value: Any) -> "Tensor":
        return where(mask, self._wrap(value).cast(self.dtype), self)

    def masked_select(self, mask: "Tensor") -> "Tensor":
        """The elements where mask (broadcast) is true, as 1-D; the count is computed first."""
        if mask.dtype is not dt.bool_:
            raise TypeError(f"masked_select: expected a bool mask, got {mask.dtype}")
        shape = _broadcast_shape(self.shape, mask.shape, "masked_select")
        return self._broadcast_to(shape).reshape(-1)[mask._broadcast_to(shape).reshape(-1)]

    def nonzero(self, as_tuple: bool = False) -> Any:
        """[count, ndim] int64 indices of the nonzero elements (computed first: the count is the shape)."""
        if self.numel() == 0:
            return tuple(zeros(0, dtype=dt.i64) for _ in self.shape) if as_tuple else zeros(0, self.ndim, dtype=dt.i64)
        flat = _true_positions(self.ne(0).reshape(-1))
        cols, rest = [], flat
        for n in reversed(self.shape):
            cols.append(rest % n)
            rest = rest // n
        cols = cols[::-1]
        if not cols:   # a 0-d tensor: a row of no indices if it is nonzero
            return (flat,) if as_tuple else zeros(flat.shape[0], 0, dtype=dt.i64)
        return tuple(cols) if as_tuple else stack(cols, 1)

    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        d = _dim(dim, self.ndim)
        return self.movedim(d, 0).gather_rows(index.reshape(-1)).movedim(0, d)

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        """out[..., j, ...] = self[..., index[..., j, ...], ...] along dim (torch.gather)."""
        d = _dim(dim, self.ndim)
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, input {self.ndim}")
        _check_index(index, self.shape[d] if self.ndim else 1, "gather")
        src = self[tuple(slice(0, index.shape[k]) if k != d else slice(None) for k in range(self.ndim))]
        return _take_along_last(src.movedim(d, -1), index.movedim(d, -1)).movedim(-1, d)

    def scatter_add(self, dim: int, index: "Tensor", src: "Tensor") -> "Tensor":
        """self with src added at index along dim (torch.scatter_add)."""
        return self._scatter(dim, index, src, "sum", include_self=True)

    def scatter(self, dim: int, index: "Tensor", src: Any = None, value: Any = None,
                reduce: str | None = None) -> "Tensor":
        """torch.scatter: src (or value) written at index along dim; reduce='add' or 'multiply'
        combines instead. Repeated indices: PyTorch leaves the winner unspecified, Ember writes
        the largest of them."""
        values = src if src is not None else self._wrap(value).cast(self.dtype)._broadcast_to(index.shape)
        if reduce is not None:
            return self.scatter_reduce(dim, index, values, {"add": "sum", "multiply": "prod"}[reduce])
        return self._scatter(dim, index, values, "amax", include_self=False)

    def scatter_reduce(self, dim: int, index: "Tensor", src: "Tensor", reduce: str,
                       include_self: bool = True) -> "Tensor":
        """torch.scatter_reduce with reduce in sum, prod, mean, amax, amin."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ValueError(f"scatter_reduce: reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
        return self._scatter(dim, index, src, reduce, include_self)

    def _scatter(self, dim: int, index: "Tensor", src: "Tensor", reduce: str, include_self: bool) -> "Tensor":
        d = _dim(dim, self.ndim)
        if src.dtype is not self.dtype:
            raise TypeError(f"scatter: expected self.dtype to be equal to src.dtype, got {self.dtype} and {src.dtype}")
        _check_index(index, self.shape[d] if self.ndim else 1, "scatter")
        x = self.movedim(d, -1)
        idx = index.movedim(d, -1)
        val = src[tuple(slice(0, index.shape[k]) for k in range(src.ndim))].movedim(d, -1).cast(self.dtype)
        lead = idx.shape[:-1]
        n = x.shape[-1]
        hit = idx.unsqueeze(-1).eq(Tensor(ir.iota(dt.i64, (n,), 0)))            # [..., j, i]
        v = val.unsqueeze(-1)
        count = hit.cast(dt.i64).sum(-2)
        big = math.inf if self.dtype.is_float else self.dtype.max
        ident, over, combine = {"sum": (0, Tensor.sum, Tensor.__add__), "mean": (0, Tensor.sum, Tensor.__add__),
                                "prod": (1, Tensor.prod, Tensor.__mul__), "amax": (-big, Tensor.amax, Tensor.maximum),
                                "amin": (big, Tensor.amin, Tensor.minimum)}[reduce]
        got = over(where(hit, v, ident).cast(self.dtype), -2).cast(self.dtype)
        x_part = x[tuple(slice(0, m) for m in lead)]
        if include_self:
            got = combine(got, x_part)
        if reduce == "mean":
            denom = count + (1 if include_self else 0)
            got = got / where(denom.eq(0), 1, denom).cast(got.dtype) if self.dtype.is_float else \
                got.div(where(denom.eq(0), 1, denom), rounding_mode="floor").cast(self.dtype)
        new = where(count > 0, got, x_part)
        if new.shape != x.shape:  # index covers only the leading part: the rest stays
            pads = [0, 0] + [p for k in reversed(range(len(lead))) for p in (0, x.shape[k] - lead[k])]
            inside = Tensor(ir.const(1, dt.bool_, new.shape)).pad(pads, value=False)
            new = where(inside, new.pad(pads), x)
        return new.movedim(-1, d)

    def __setitem__(self, idx: Any, value: Any) -> None:
        """x[idx] = value, functionally: x becomes a new lazy value (the old one is unchanged for
        whoever holds it). Selected positions are found by indexing a tensor of positions."""
        pos = Tensor(ir.iota(dt.i64, (self.numel(),), 0)).reshape(self.shape) if self.ndim else \
            Tensor(ir.const(0, dt.i64, ()))
        sel = pos[idx]
        v = (value if isinstance(value, Tensor) else self._wrap(value)).cast(self.dtype)._broadcast_to(sel.shape)
        flat_sel, flat_v = sel.reshape(-1, 1), v.reshape(-1, 1)
        slots = Tensor(ir.iota(dt.i64, (1, self.numel()), 1))
        hit = flat_sel.eq(slots)                                                  # [selected, numel]
        written = _pick(hit, flat_v, 0) if self.dtype is not dt.bool_ else \
            where(hit, flat_v.cast(dt.u8), 0).amax(0).cast(dt.bool_)
        new = where(hit.cast(dt.u8).amax(0).cast(dt.bool_), written, self.reshape(-1)).reshape(self.shape)
        self._inplace(new)

    def tril(self, diagonal: int = 0) -> "Tensor":
        return where(self._band() <= diagonal, self, self._const(0))

    def triu(self, diagonal: int = 0) -> "Tensor":
        return where(self._band() >= diagonal, self, self._const(0))

    def _band(self) -> "Tensor":
        """column - row over the last two dims."""
        shape = self.shape[-2:]
        return Tensor(ir.iota(dt.i64, shape, 1)) - Tensor(ir.iota(dt.i64, shape, 0))

    def clone(self) -> "Tensor":
        return Tensor(ir.reshape(self.node, self.shape))

    def contiguous(self) -> "Tensor":
        return self

    def unflatten(self, dim: int, sizes: Sequence[int]) -> "Tensor":
        d = _dim(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])

    def roll(self, shifts: Any, dims: Any = None) -> "Tensor":
        if dims is None:
            return self.reshape(-1).roll(shifts, 0).reshape(self.shape) if self.numel() else self
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: shifts and dimensions must align, got {len(shifts)} shifts and {len(dims)} dims")
        if self.numel() == 0:
            return self
        out = self
        for sh, dm in zip(shifts, dims):
            d = _dim(dm, self.ndim)
            n = self.shape[d]
            k = sh % n
            if k:
                out = cat([out.narrow(d, n - k, k), out.narrow(d, 0, n - k)], d)
        return out

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        """The length elements from start along dim."""
        return self[(slice(None),) * _dim(dim, self.ndim) + (slice(start, start + length),)]

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> "Tensor":
        a, b = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
        if a == b:
            raise ValueError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
        x = self.movedim(a, -1).movedim(b if b < a else b - 1, -1) if a != b else self
        rows, cols = x.shape[-2], x.shape[-1]
        n = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
        r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
        sq = x[..., r0:r0 + n, c0:c0 + n]
        hit = Tensor(ir.iota(dt.i64, (n, n), 0)).eq(Tensor(ir.iota(dt.i64, (n, n), 1)))
        if self.dtype is dt.bool_:
            return sq.cast(dt.u8).diagonal(0, -2, -1).cast(dt.bool_)
        return _pick(hit, sq, -1)

    def diag(self, diagonal: int = 0) -> "Tensor":
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ShapeError(f"diag: expected 1 or 2 dims, got {self.ndim}")
        n = self.shape[0] + abs(diagonal)
        band = Tensor(ir.iota(dt.i64, (n, n), 1)) - Tensor(ir.iota(dt.i64, (n, n), 0))
        col = Tensor(ir.iota(dt.i64, (n, n), 1)) if diagonal >= 0 else Tensor(ir.iota(dt.i64, (n, n), 0))
        pos = (col - abs(diagonal)).clamp(0, self.shape[0] - 1)
        vals = _take_along_last(self.unsqueeze(0).expand(n, self.shape[0]), pos)
        return where(band.eq(diagonal), vals, self._const(0))

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape(-1).repeat_interleave(repeats, 0)
        d = _dim(dim, self.ndim)
        x = self.unsqueeze(d + 1)
        shape = list(x.shape)
        shape[d + 1] = repeats
        return x.expand(*shape).flatten(d, d + 1)

    def tensor_split(self, sections: Any, dim: int = 0) -> list["Tensor"]:
        d = _dim(dim, self.ndim)
        n = self.shape[d]
        if isinstance(sections, int):
            q, r = divmod(n, sections)
            cuts = list(itertools.accumulate([q + 1] * r + [q] * (sections - r)))[:-1]
        else:
            cuts = list(sections)
        bounds = [0] + cuts + [n]
        return [self.narrow(d, a, b - a) for a, b in zip(bounds, bounds[1:])]

    # ------------------------------------------------------------------------ scans
    def _scan(self, kind: str, dim: int) -> "Tensor":
        """Inclusive scan along dim ("sum", "prod", "max" or "lse", log-sum-exp): blocks of up to
        128 elements each scanned by one masked reduction over [..., B, B] (j <= i), the blocks'
        totals scanned the same way and combined in. The depth is log_128(n), and so is the
        backward pass's, which autodiff gives as the transposed reductions (a sum's gradient is
        a reversed cumsum). A doubling scan's log2(n) steps, fused, made gradients whose code
        grew as 2^steps (a cumprod of 128 took 277 s to compile)."""
        dim = _dim(dim, self.ndim)
        if self.numel() == 0:
            return self
        x = self.movedim(dim, -1) if self.ndim else self.reshape(1)
        out = _block_scan(x, kind)
        return out.movedim(-1, dim) if self.ndim else out.reshape(())

    def cumsum(self, dim: int, dtype: Any = None) -> "Tensor":
        x = self.cast(as_dtype(dtype)) if dtype is not None else self if self.dtype.is_float else self.cast(dt.i64)
        return x._scan("sum", dim)

    def cumprod(self, dim: int, dtype: Any = None) -> "Tensor":
        x = self.cast(as_dtype(dtype)) if dtype is not None else self if self.dtype.is_float else self.cast(dt.i64)
        return x._scan("prod", dim)

    def logcumsumexp(self, dim: int) -> "Tensor":
        return (self if self.dtype.is_float else self.float())._scan("lse", dim)

    def cummax(self, dim: int) -> tuple["Tensor", "Tensor"]:
        """Running maximum and the index where it was (last) attained, as PyTorch."""
        return ValuesIndices(*self._cum_extreme(dim, True))

    def cummin(self, dim: int) -> tuple["Tensor", "Tensor"]:
        return ValuesIndices(*self._cum_extreme(dim, False))

    def _cum_extreme(self, dim: int, largest: bool) -> tuple["Tensor", "Tensor"]:
        """The indices from a running max of the keys (negated or order-flipped for a minimum);
        the values are x at them, so the gradient goes to those elements, as PyTorch's."""
        d = _dim(dim, self.ndim)
        if self.ndim == 0 or self.numel() == 0:
            return self, zeros(self.shape, dtype=dt.i64)
        x = self.cast(dt.u8) if self.dtype is dt.bool_ else self
        key = x if largest else -x if x.dtype.is_float else x._flip_order()
        best = Tensor(ir.stop_gradient(key._scan("max", d).node))
        reached = key.eq(best) | (key.isnan() & best.isnan()) if key.dtype.is_float else key.eq(best)
        idx = where(reached, Tensor(ir.iota(dt.i64, self.shape, d)), -1)._scan("max", d)
        return _take_along_last(self.movedim(d, -1), idx.movedim(d, -1)).movedim(-1, d), idx

    def movedim(self, source: int, destination: int) -> "Tensor":
        s, d = _dim(source, self.ndim), _dim(destination, self.ndim)
        order = [i for i in range(self.ndim) if i != s]
        order.insert(d, s)
        return self.permute(order)

    # ---------------------------------------------------------------------- sorting
    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple["Tensor", "Tensor"]:
        """Values and int64 indices, stable (ties keep their order), NaN largest: a bitonic network."""
        return ValuesIndices(*_sort(self, dim, descending))

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> "Tensor":
        return _sort(self, dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple["Tensor", "Tensor"]:  # noqa: A002
        d = _dim(dim, self.ndim)
        if not 0 <= k <= (self.shape[d] if self.ndim else 1):
            raise IndexError(f"topk: k={k} is out of range for dim {d} of size {self.shape[d] if self.ndim else 1}")
        values, idx = _sort(self, d, largest)
        pick = tuple(slice(0, k) if a == d else slice(None) for a in range(self.ndim))
        return ValuesIndices(values[pick], idx[pick])

    def kthvalue(self, k: int, dim: int = -1, keepdim: bool = False) -> tuple["Tensor", "Tensor"]:
        """The k-th smallest (1-based) along dim, and its index."""
        d = _dim(dim, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if not 1 <= k <= n:
            raise IndexError(f"kthvalue: k={k} is out of range for dim {d} of size {n}")
        values, idx = _sort(self, d, False)
        pick = tuple(slice(k - 1, k) if a == d else slice(None) for a in range(self.ndim))
        v, i = values[pick], idx[pick]
        return ValuesIndices(v, i) if keepdim or not self.ndim else ValuesIndices(v.squeeze(d), i.squeeze(d))

    def median(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """The lower median (PyTorch's), and with a dim its index; NaN, and the first NaN's index,
        where the values have a NaN (empty: NaN)."""
        if dim is None:
            return full((), math.nan, self.dtype) if self.numel() == 0 else self.reshape(-1).median(0)[0]
        d = _dim(dim, self.ndim)
        v, i = self.kthvalue(((self.shape[d] if self.ndim else 1) + 1) // 2, d, keepdim=True)
        if self.dtype.is_float and self.ndim:
            nan = self.isnan()
            i = where(nan.any(d, keepdim=True), nan.cast(dt.u8).argmax(d, keepdim=True), i)
            v = self.gather(d, i)
        return ValuesIndices(v, i) if keepdim or not self.ndim else ValuesIndices(v.squeeze(d), i.squeeze(d))

    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """As PyTorch: the maximum of everything; with a dim, (values, indices); with a tensor,
        the elementwise maximum."""
        if dim is None:
            return self.amax()
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        return self._extreme_at(self.argmax(dim, keepdim=True), dim, keepdim)

    def _extreme_at(self, i: "Tensor", dim: int, keepdim: bool) -> ValuesIndices:
        """max(dim) and min(dim): the values at the indices i (keepdim), so that the gradient goes
        to the element each index names, as PyTorch's (amax shares it among ties)."""
        v = self.gather(dim, i) if self.ndim else self
        return ValuesIndices(v, i) if keepdim or not self.ndim else ValuesIndices(v.squeeze(dim), i.squeeze(dim))

    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        if dim is None:
            return self.amin()
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        return self._extreme_at(self.argmin(dim, keepdim=True), dim, keepdim)

    def mean(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        if not self.dtype.is_float:
            raise TypeError(f"mean needs a floating point tensor, got {self.dtype} (as PyTorch; use .float())")
        n = math.prod(self.shape[d] for d in self._axes(dim))
        return self.sum(dim, keepdim) * (1.0 / n) if n else self.sum(dim, keepdim) * math.nan

    def var(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        n = math.prod(self.shape[d] for d in self._axes(dim))
        d = self - self.mean(dim, keepdim=True)
        # n <= correction divides by zero, as PyTorch does: inf, or NaN where all values are equal
        return (d * d).sum(dim, keepdim) / float(max(n - correction, 0))

    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> "Tensor":
        """The vector p-norm over dim (all of it by default): 2 ('fro'), inf, -inf, 0 (the count of
        nonzeros) or any other p, as torch.norm."""
        if p in ("fro", 2):
            s = (self * self).sum(dim, keepdim)
            return where(s.eq(0), _stopped(s), s).sqrt()   # PyTorch's gradient at 0 is 0
        if p in (math.inf, -math.inf):
            return self.abs().amax(dim, keepdim) if p > 0 else self.abs().amin(dim, keepdim)
        if p == 0:
            return self.ne(0).sum(dim, keepdim).cast(self.dtype)
        return self.abs().pow(p).sum(dim, keepdim).pow(1 / p)

    def std(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        v = self.var(dim, keepdim, correction)
        return where(v.eq(0), _stopped(v), v).sqrt()   # PyTorch's gradient at 0 is 0, not 0 * inf

    def logsumexp(self, dim: int = -1, keepdim: bool = False) -> "Tensor":
        m = self._stable_max(dim)
        out = (self - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim else out.squeeze(dim)

    def softmax(self, dim: int = -1) -> "Tensor":
        e = (self - self._stable_max(dim)).exp()
        return e / e.sum(dim, keepdim=True)

    def _stable_max(self, dim: int) -> "Tensor":
        """The max along dim that softmax and logsumexp subtract to stay in range. Their value
        does not depend on it, so neither does their gradient, as in PyTorch: no gradient flows
        through it (ir.stop_gradient), which spares the backward pass two passes over the input."""
        if self.numel() == 0:   # nothing to keep in range: softmax of nothing is empty, logsumexp -inf
            d = _dim(dim, self.ndim)
            return zeros(tuple(1 if a == d else n for a, n in enumerate(self.shape)), dtype=self.dtype)
        m = self.amax(dim, keepdim=True)
        return Tensor(ir.stop_gradient(m.node)) if self.dtype.is_float else m

    def log_softmax(self, dim: int = -1) -> "Tensor":
        return self - self.logsumexp(dim, keepdim=True)

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """The first index (int64) of the maximum along dim, or in the flattened tensor without
        one; NaN counts as the largest value, as in PyTorch."""
        return self._arg("max", dim, keepdim)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """The first index (int64) of the minimum along dim (of the flattened tensor without one)."""
        return self._arg("min", dim, keepdim)

    def _arg(self, extreme: str, dim: int | None, keepdim: bool) -> "Tensor":
        if dim is None:
            out = self.reshape(-1)._arg(extreme, 0, False)
            return out.reshape((1,) * self.ndim) if keepdim else out
        if self.ndim == 0:
            _dim(dim, 0)
            return Tensor(ir.const(0, dt.i64, ()))
        dim = _dim(dim, self.ndim)
        m = getattr(self, "a" + extreme)(dim, keepdim=True)
        hit = self.eq(m)
        if self.dtype.is_float:
            hit = hit | (self.isnan() & m.isnan())
        idx = Tensor(ir.iota(dt.i64, self.shape, dim))
        first = where(hit, idx, Tensor(ir.const(self.shape[dim], dt.i64, ())))
        return first.amin(dim, keepdim)

    def _sign_factor(self) -> "Tensor":
        """-1.0 where the sign bit is set, else 1.0: for odd functions f(x) = s * g(s * x), whose
        gradient is then g'(|x|) at 0 too (abs has gradient 0 there, as in PyTorch)."""
        return where(self.signbit(), -1.0, 1.0).cast(self.dtype)

    def isnan(self) -> "Tensor":
        return self.ne(self) if self.dtype.is_float else full(self.shape, False, dt.bool_)

    def isinf(self) -> "Tensor":
        return self.abs().eq(math.inf) if self.dtype.is_float else full(self.shape, False, dt.bool_)

    def isfinite(self) -> "Tensor":
        return (self - self).eq(0) if self.dtype.is_float else full(self.shape, True, dt.bool_)

    def signbit(self) -> "Tensor":
        """True for negative values, -0.0 and NaNs with the sign bit set, as C's signbit."""
        if not self.dtype.is_float:
            return self < 0 if self.dtype.is_signed else full(self.shape, False, dt.bool_)
        bits = {dt.f64: dt.i64, dt.f32: dt.i32, dt.f16: dt.i16, dt.bf16: dt.i16}[self.dtype]
        return Tensor(ir.unary(Op.BITCAST, self.node, bits)) < 0

    def matmul(self, other: "Tensor") -> "Tensor":
        a, b = _promote(self, other)
        if a.ndim == 1 and b.ndim == 1:
            if a.shape != b.shape:
                raise ShapeError(f"matmul: {list(a.shape)} @ {list(b.shape)}: the vectors' lengths differ")
            return (a * b).sum()
        if a.ndim == 1:
            return a.unsqueeze(0).matmul(b).squeeze(-2)
        if b.ndim == 1:
            return a.matmul(b.unsqueeze(-1)).squeeze(-1)
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"matmul: {list(a.shape)} @ {list(b.shape)}: "
                             f"inner dims {a.shape[-1]} and {b.shape[-2]} differ")
        low = autocast_dtype(a)
        if low is not None:
            # a transposed operand is cast before its permute, which stays outermost (below)
            bl = Tensor(b.node.srcs[0]).cast(low).permute(b.node.arg) if b.node.op is Op.PERMUTE else b.cast(low)
            return a.cast(low).matmul(bl).cast(a.dtype)
        if a.ndim > 2 and b.ndim == 2:   # x @ W of a linear layer: one matmul of all rows, as PyTorch
            # does (W is not broadcast over the batch, and its gradient is one contraction)
            return a.reshape(-1, a.shape[-1]).matmul(b).reshape(*a.shape[:-1], b.shape[-1])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        if a.ndim == 2 and b.ndim == 2 and b.node.op is Op.PERMUTE and b.node.arg == (1, 0):
            # x @ W.T (nn.Linear): the product laid out [m, n, k] as W [n, k] is, so that W's
            # gradient, a sum over the rows, comes out in W's own layout. As [k, n] the optimizer's
            # kernels read it transposed, at a third of the bandwidth (GPT-2: 2.6 ms a step)
            w = Tensor(b.node.srcs[0])
            return (a.unsqueeze(-2)._broadcast_to((m, n, k)) * w.unsqueeze(0)._broadcast_to((m, n, k))).sum(-1)
        batch = _broadcast_shape(a.shape[:-2], b.shape[:-2], "matmul")
        ae = a._broadcast_to(batch + (m, k)).unsqueeze(-1)._broadcast_to(batch + (m, k, n))
        be = b._broadcast_to(batch + (k, n)).unsqueeze(-3)._broadcast_to(batch + (m, k, n))
        return (ae * be).sum(-2)

    # PyTorch's other names for the methods above
    absolute, arcsin, arccos, arctan, arcsinh, arccosh, arctanh = abs, asin, acos, atan, asinh, acosh, atanh
    sgn, fix, clip, arctan2, ger, reshape_as, nelement, type = sign, trunc, clamp, atan2, outer, view_as, numel, cast
    true_divide, floor_divide = __truediv__, __floordiv__

    # --------------------------------------------------------------------- autodiff
    def backward(self, gradient: "Tensor | None" = None) -> None:
        """Gradients of this tensor's sum for every leaf that requires grad (lazy: they are
        computed with the next realize, an optimizer step for instance, in one program)."""
        if gradient is not None:
            return (self * gradient).sum().backward()
        if self.numel() != 1:
            raise ShapeError(f"backward() needs a scalar (or a gradient argument), got shape {list(self.shape)}")
        if not self.requires_grad:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        leaves = [t for t in _leaves(self) if t.requires_grad]
        for t in leaves:
            g = Tensor(ir.grad(self.node, t.node))
            t.grad = g if t.grad is None else t.grad + g
        context.pending_loss = self
        averaged = [t for t in leaves if t.node in context.averaged]
        if averaged:  # a distributed.DataParallel model's: computed now, and all-reduced as they finish
            grads = [t.grad for t in averaged]
            realize(self, *grads, average=[self, *grads])
            for t in averaged:  # leaves holding the averages: the update reads them (its graph
                t.grad = t.grad.detach()   # would otherwise compute this rank's gradients again)


# +, -, * and the bitwise operators as the IR's binary ops, each with its reflected form (1 - x)
for _name, _op, _form in (("add", Op.ADD, Tensor._binary), ("sub", Op.SUB, Tensor._binary),
                          ("mul", Op.MUL, Tensor._binary), ("and", Op.AND, Tensor._bitwise),
                          ("or", Op.OR, Tensor._bitwise), ("xor", Op.XOR, Tensor._bitwise),
                          ("lshift", Op.SHL, Tensor._bitwise), ("rshift", Op.SHR, Tensor._bitwise)):
    setattr(Tensor, f"__{_name}__", functools.partialmethod(_form, _op))
    setattr(Tensor, f"__r{_name}__", functools.partialmethod(_form, _op, reverse=True))
Tensor.mul, Tensor.bitwise_and, Tensor.bitwise_or, Tensor.bitwise_xor = (  # type: ignore[attr-defined]
    Tensor.__mul__, Tensor.__and__, Tensor.__or__, Tensor.__xor__)  # type: ignore[attr-defined]
Tensor.bitwise_left_shift, Tensor.bitwise_right_shift = Tensor.__lshift__, Tensor.__rshift__  # type: ignore


def _inplace_form(name: str) -> Callable[..., Tensor]:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return self._inplace(getattr(self, name)(*args, **kwargs), name in ("t", "transpose", "unsqueeze", "squeeze"))
    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = f"x.{name}_(...): x becomes x.{name}(...) (Tensor._inplace)."
    return method


for _name in ("add", "sub", "mul", "div", "pow", "clamp", "clip", "clamp_min", "clamp_max", "neg", "abs", "sqrt",
              "exp", "log", "masked_fill", "lerp", "relu", "sigmoid", "tanh", "floor", "ceil", "round", "fmod",
              "remainder", "square", "reciprocal", "t", "transpose", "unsqueeze", "squeeze"):
    setattr(Tensor, _name + "_", _inplace_form(_name))
for _name, _d in (("float", dt.f32), ("double", dt.f64), ("half", dt.f16), ("bfloat16", dt.bf16), ("long", dt.i64),
                 ("int", dt.i32), ("short", dt.i16), ("char", dt.i8), ("byte", dt.u8), ("bool", dt.bool_)):
    setattr(Tensor, _name, functools.partialmethod(Tensor.cast, _d))
Tensor.__iadd__, Tensor.__isub__, Tensor.__imul__, Tensor.__itruediv__ = (  # type: ignore[method-assign]
    Tensor.add_, Tensor.sub_, Tensor.mul_, Tensor.div_)  # type: ignore[attr-defined]


def _needs_grad(node: Node) -> bool:
    """Whether a leaf that requires grad is in node's graph, not behind a stop_gradient."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Op.PARAM:
            leaf = _LEAVES.get(n)
            if leaf is not None and leaf._rg:
                return True
            todo.extend(_EMPTY_SRC.get(n, ()))
        elif ir.stopped(n) is None:
            todo.extend(n.srcs)
    return False


_EMPTY_SRC: "weakref.WeakKeyDictionary[Node, tuple[Node, ...]]" = weakref.WeakKeyDictionary()


def _from_empty(out: Tensor, *empty: Tensor) -> Tensor:
    """out, made without its empty sources (a sum over nothing is a constant): when one of them
    needs a gradient, out becomes a leaf of its own that remembers them, so backward() gives their
    leaves zeros, as PyTorch does, where None would say the loss never read them."""
    srcs = tuple(e.node for e in empty if e.requires_grad)
    if not srcs:
        return out
    realize(out)
    node = ir.param(new_name(), out.dtype, out.shape)
    _DATA[node], _EMPTY_SRC[node] = out.value(), srcs
    return Tensor(node)


def _leaves(t: Tensor) -> list[Tensor]:
    nodes, todo, seen = [], [t.node], set()
    while todo:   # the graph, and the empty graphs its constants came from (_from_empty)
        new = [n for n in ir.toposort(todo) if n not in seen]
        seen.update(new)
        nodes += new
        todo = [s for n in new for s in _EMPTY_SRC.get(n, ())]
    return [leaf for n in nodes if n.op is Op.PARAM and (leaf := _LEAVES.get(n)) is not None]


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
        out.append(y if x == 1 else x)  # a dim of 1 broadcasts to any size, 0 included
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
    d = _promote_dtype(a.dtype, b.dtype)
    return a.cast(d), b.cast(d)


def _promote_dtype(a: DType, b: DType) -> DType:
    """The higher of two dtypes in PyTorch's order (unsigned wider ints rank as their width)."""
    rank = lambda d: _RANK.index(d) if d in _RANK else 4  # noqa: E731
    return a if rank(a) >= rank(b) else b


def _sort(x: Tensor, dim: int, descending: bool) -> tuple[Tensor, Tensor]:
    """A bitonic sorting network along dim over (value, original index) pairs, padded to a power
    of two with entries that always sort last: stable, with NaN ordered as the largest value.
    Each stage is computed before the next is built (all fused, a stage would recompute the
    ones before it for both of its inputs: 2^stages work); the values then come from x through
    the permutation, so they keep their gradient."""
    if x.ndim == 0:
        return x, Tensor(ir.const(0, dt.i64, ()))
    d = _dim(dim, x.ndim)
    src = x.movedim(d, -1)
    if src.numel() == 0:   # nothing to sort
        return x, zeros(x.shape, dtype=dt.i64)
    key = src.cast(dt.u8) if src.dtype is dt.bool_ else src  # compared as numbers
    v = Tensor(key.numpy(), key.dtype)
    n = v.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()
    v = v.pad([0, size - n])
    idx = Tensor(ir.iota(dt.i64, v.shape, v.ndim - 1))

    def before(av: Tensor, ai: Tensor, bv: Tensor, bi: Tensor) -> Tensor:
        """True where a sorts before b."""
        a_pad, b_pad = ai >= n, bi >= n
        if av.dtype.is_float:
            an, bn = av.isnan(), bv.isnan()
            order = (av > bv) if descending else (av < bv)
            first = (an & bn.logical_not()) if descending else (an.logical_not() & bn)
            tie = av.eq(bv) | (an & bn)
            key = first | (order & (an | bn).logical_not()) | (tie & (ai < bi))
        else:
            key = ((av > bv) if descending else (av < bv)) | (av.eq(bv) & (ai < bi))
        return (key & a_pad.logical_not()) | (a_pad.logical_not() & b_pad)

    lead = v.shape[:-1]
    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            shape = lead + (size // (2 * j), 2, j)
            vv, ii = v.reshape(shape), idx.reshape(shape)
            lo_v, hi_v, lo_i, hi_i = vv[..., 0, :], vv[..., 1, :], ii[..., 0, :], ii[..., 1, :]
            group = Tensor(ir.iota(dt.i64, lo_v.shape, len(lead)))
            up = ((group * (2 * j)) // k % 2).eq(0)  # this pair sits in an ascending run of the merge
            swap = where(up, before(hi_v, hi_i, lo_v, lo_i), before(lo_v, lo_i, hi_v, hi_i))
            new_lo_v, new_hi_v = where(swap, hi_v, lo_v), where(swap, lo_v, hi_v)
            new_lo_i, new_hi_i = where(swap, hi_i, lo_i), where(swap, lo_i, hi_i)
            v = stack([new_lo_v, new_hi_v], -2).reshape(lead + (size,))
            idx = stack([new_lo_i, new_hi_i], -2).reshape(lead + (size,))
            realize(v, idx)
            v, idx = Tensor(v.value(), v.dtype), Tensor(idx.value(), dt.i64)
            j //= 2
        k *= 2
    perm = idx[..., :n]
    return _take_along_last(src, perm).movedim(-1, d), perm.movedim(-1, d)


def _true_positions(flat: Tensor) -> Tensor:
    """The positions (int64) of the true elements of a 1-D bool tensor, in order. A compiled
    program computes them (a running count, then for each slot the position that fills it);
    only their number is read first, as it is the result's shape."""
    count = int(flat.cast(dt.i64).sum().item())
    if count == 0:
        return zeros(0, dtype=dt.i64)
    slot = flat.cast(dt.i64).cumsum(0) - 1                                  # [n]
    want = Tensor(ir.iota(dt.i64, (count, 1), 0))                           # [count, 1]
    pos = Tensor(ir.iota(dt.i64, (1, flat.shape[0]), 1))                    # [1, n]
    return where(flat.unsqueeze(0) & slot.unsqueeze(0).eq(want), pos, -1).amax(1)


def _take_along_last(x: Tensor, idx: Tensor) -> Tensor:
    """out[..., j] = x[..., idx[..., j]] (_pick), exact and differentiable in x."""
    if x.dtype is dt.bool_:
        return _take_along_last(x.cast(dt.u8), idx).cast(dt.bool_)
    n = x.shape[-1]
    hit = idx.unsqueeze(-1).eq(Tensor(ir.iota(dt.i64, (n,), 0)))     # [..., j, i]
    return _pick(hit, x.unsqueeze(-2), -1)


def _block_scan(x: Tensor, kind: str, block: int = 128) -> Tensor:
    """Tensor._scan along the last dim."""
    n = x.shape[-1]
    if kind == "sum":
        ident = x._const(-0.0 if x.dtype.is_float else 0)   # -0.0: x + -0.0 is x, -0.0 included
    elif kind == "prod":
        ident = x._const(1)
    else:
        ident = x._const(-math.inf) if x.dtype.is_float else x._const(x.dtype.min)
    if n <= block:   # one block: row i reduces the elements j <= i
        keep = Tensor(ir.iota(dt.i64, (n, n), 1)) <= Tensor(ir.iota(dt.i64, (n, n), 0))
        xs = x.unsqueeze(-2)
        if kind == "lse":   # the row's max subtracted (no gradient through it, as softmax's)
            m = Tensor(ir.stop_gradient(where(keep, xs, ident).amax(-1, keepdim=True).node))
            m = where(m.isfinite(), m, 0.0).cast(x.dtype)
            return where(keep, xs - m, ident).exp().sum(-1).log() + m.squeeze(-1)
        if kind == "prod":
            return _block_cumprod(x, keep)
        masked = where(keep, xs, ident)
        return masked.sum(-1) if kind == "sum" else masked.amax(-1)
    m = -(-n // block)
    blocks = x.pad([0, m * block - n], value=ident.item()).unflatten(-1, (m, block))
    local = _block_scan(blocks, kind, block)                                     # [..., m, B]
    before = _block_scan(local[..., -1], kind, block)                            # the totals' scan
    before = cat([ident._broadcast_to(before.shape[:-1] + (1,)), before[..., :-1]], -1).unsqueeze(-1)
    combined = {"sum": lambda: before + local, "prod": lambda: before * local, "max": lambda: before.maximum(local),
                "lse": lambda: before.logaddexp(local)}[kind]()
    return combined.flatten(-2)[..., :n]


def _block_cumprod(x: Tensor, keep: Tensor) -> Tensor:
    """A block's running product. Integers: log2(n) doubling steps (no gradient to carry). Floats:
    from the running sums of log|x| in f64, the count of zeros and the count of negatives; its
    gradient is given through d y_i / d x_j = prod over k <= i, k != j of x_k (exact at zeros: no
    division), as stop(y) + sum_j w_ij (x_j - stop(x_j)) with w_ij computed the same way."""
    n = x.shape[-1]
    if not x.dtype.is_float:
        step = 1
        while step < n:
            x, step = x * x.pad([step, 0], value=1)[..., :n], step * 2
        return x
    w = Tensor(ir.stop_gradient(x.node)).cast(dt.f64)
    zero, neg = w.eq(0).cast(dt.f64), w.signbit().cast(dt.f64)   # -0.0 and -inf count as negative
    logs = where(w.eq(0), 0.0, w.abs().log()).cast(dt.f64)
    row = lambda v: where(keep, v.unsqueeze(-2), 0.0).cast(dt.f64).sum(-1, keepdim=True)  # noqa: E731  [..., i, 1]
    zs, ns, ls = row(zero), row(neg), row(logs)                                        # running counts and sums

    def product(z: Tensor, n_: Tensor, lg: Tensor) -> Tensor:
        odd = (n_ * 0.5).floor().ne(n_ * 0.5)
        mag = where(z > 0, where(lg.eq(math.inf), math.nan, 0.0), lg.exp()).cast(dt.f64)   # 0 * inf is NaN
        return where(lg.isnan(), math.nan, where(odd, -mag, mag)).cast(dt.f64)
    y = product(zs, ns, ls).squeeze(-1).cast(x.dtype)
    others = product(zs - zero.unsqueeze(-2), ns - neg.unsqueeze(-2), ls - logs.unsqueeze(-2))   # [..., i, j]
    others = where(keep & others.isfinite(), others, 0.0).cast(dt.f64).cast(x.dtype)
    fx = where(x.isfinite(), x, 0.0).cast(x.dtype)   # (inf - inf would make the value NaN)
    delta = fx - Tensor(ir.stop_gradient(fx.node))                                     # 0, with x's gradient
    carry = (Tensor(ir.stop_gradient(others.node)) * delta.unsqueeze(-2)).sum(-1)      # +-0, with the gradient
    return Tensor(ir.stop_gradient(y.node)) - (0.0 - carry)    # y - (+0) is y, -0.0 included


def _check_index(index: Tensor, n: int, name: str) -> None:
    """An index with data (a leaf's) must lie in [0, n), as PyTorch checks; a computed index is
    not computed here to check it (see docs/api.md)."""
    v = index.value() if index.is_leaf else None
    if v is not None and index.numel():
        v = _host(v)
        bad = v[(v < 0) | (v >= n)]
        if bad.size:
            raise IndexError(f"{name}: index {bad.flat[0]} is out of bounds for dimension with size {n}")


def _pick(hit: Tensor, x: Tensor, axis: int) -> Tensor:
    """The element of x where hit is true along axis (at most one is): for floats the sum of
    where(hit, x, -0.0), exact for -0.0, inf and NaN (x + -0.0 is x) and with the gradient on the
    picked element alone (a max split it among ties, -inf ones included); the compiler makes it a
    load (lower.selections_to_loads). Integers: the max over where(hit, x, lowest)."""
    if x.dtype.is_float:
        return where(hit, x, -0.0).sum(axis)
    return where(hit, x, x.dtype.min).amax(axis)


def _pow(x: Tensor, e: Tensor, scalar: float | None = None) -> Tensor:
    """Elementwise x ** e for tensors (PyTorch's promotion and C's pow rules; scalar: e as a
    Python number). Float values come from _pow_value and the gradients are PyTorch's formulas,
    e x^(e-1) for the base (0 where e is 0) and x^e ln x for the exponent (0 where x is 0 and
    e >= 0), attached by _with_gradients: differentiating the value's own formula gave 0 where
    PyTorch gives ln x, infinities or NaN (at e = 0, at a base of 0 or +-inf, at negative bases)."""
    x, e = _broadcast(*_promote(x, e), "pow")
    if not x.dtype.is_float:  # square and multiply over the exponent's bits; negative: 0, 1 or -1
        out, base, bits = x._const(1)._broadcast_to(x.shape), x, e
        for _ in range(x.dtype.bits - 1 if x.dtype.is_signed else x.dtype.bits):
            out = where((bits & 1).eq(1), out * base, out)
            base, bits = base * base, bits >> 1
        if x.dtype.is_signed:
            odd = (e & 1).eq(1)
            neg = where(x.eq(1), 1, where(x.eq(-1), where(odd, -1, 1), 0)).cast(x.dtype)
            out = where(e < 0, neg, out)
        return out
    xs, es = _stopped(x), _stopped(e)
    out = _pow_value(xs, es, scalar)
    pairs = []
    if x.requires_grad:
        gx = es * _pow_value(xs, es - 1, None if scalar is None else scalar - 1)
        pairs.append((x, where(es.eq(0), 0.0, gx).cast(x.dtype)))
    if e.requires_grad:
        pairs.append((e, where(xs.eq(0) & (es >= 0), 0.0, out * xs.log()).cast(x.dtype)))
    return _with_gradients(out, pairs) if pairs else out


def _pow_value(x: Tensor, e: Tensor, scalar: float | None) -> Tensor:
    """x ** e of floats with no gradient path: integer scalars by repeated squaring (negative:
    its reciprocal), 0.5 and -0.5 as sqrt and rsqrt (PyTorch's choice: sqrt(-0.0) is -0.0, where
    C's pow gives +0.0), others through exp2 and log2 of |x| with C's rules for signs, zeros,
    infinities and NaN."""
    if scalar is not None and float(scalar).is_integer() and abs(scalar) < 2 ** 31:
        return x.pow(int(scalar)) if scalar >= 0 else x.pow(-int(scalar)).reciprocal()
    if scalar in (0.5, -0.5):
        return x.sqrt() if scalar > 0 else x.rsqrt()
    ax = x.abs()
    edge = ax.eq(0) | ax.isinf()
    mag = (where(edge, 1.0, ax).cast(x.dtype).log2() * e).exp2()
    big = (ax.eq(0) & (e < 0)) | (ax.isinf() & (e > 0))
    mag = where(edge & e.isnan().logical_not(), where(big, math.inf, 0.0).cast(x.dtype), mag)
    whole = e.trunc().eq(e)
    odd = whole & (e * 0.5).trunc().ne(e * 0.5)
    negative = where(whole, where(odd, -mag, mag), where(ax.isinf(), mag, math.nan).cast(x.dtype))
    out = where(x < 0, negative, where(odd & x.signbit(), -mag, mag))
    # x ** 0 and 1 ** y are 1, NaN included, and so is (-1) ** +-inf (C's pow)
    return where(e.eq(0) | x.eq(1) | (x.eq(-1) & e.isinf()), 1.0, out).cast(x.dtype)


def _stopped(x: Tensor) -> Tensor:
    return Tensor(ir.stop_gradient(x.node)) if x.dtype.is_float else x


def _with_gradients(value: Tensor, pairs: list[tuple[Tensor, Tensor]]) -> Tensor:
    """value (no gradient path), whose elementwise derivative with respect to each x is g (no
    gradient path either; any float, infinities and NaN included), as PyTorch's formulas give
    them. A term of value +0 carries each g: g (x - stop(x)) where g is finite, and where it is
    infinite or NaN the square root of +-(x - stop(x)) or of a difference of those (its derivative
    at 0 is inf, times +-1 or inf - inf), with 1 under the root elsewhere, so that the zero
    gradient reaching the unused branches stays 0. value - (+0) is value bit for bit, -0.0
    included. Where x itself is infinite or NaN, x - stop(x) is not 0: there x * g carries the
    gradient, where it gives the value (x = inf, g = inf, value inf); elsewhere it is 0."""
    zero = value._const(0)
    pairs = [(x, g, _stopped(x).isfinite().logical_not() & g.ne(0)) for x, g in pairs]
    guess = functools.reduce(Tensor.__add__, [where(nat, _stopped(x), zero) * where(nat, g, zero)
                                              for x, g, nat in pairs])
    use = functools.reduce(Tensor.__or__, [nat for _, _, nat in pairs]) & \
        (guess.eq(value) | (guess.isnan() & value.isnan()))
    carried = functools.reduce(Tensor.__add__, [where(use & nat, x, zero) * where(use & nat, g, zero)
                                                for x, g, nat in pairs])
    out = where(use, carried, value)
    for x, g, nat in pairs:
        fx = where(_stopped(x).isfinite(), x, zero)
        d = fx - _stopped(fx)                               # +0, with derivative 1 where x is finite
        finite = g.isfinite()
        r = where(_stopped(x).isinf(), x, value._const(1)).reciprocal()   # 1/x: 0, with derivative -0 at inf
        u = where(g.eq(-math.inf), d, where(g.eq(math.inf), _stopped(fx) - fx,
                                            where(_stopped(x).isinf(), r - _stopped(r), d - d)))
        steep = where(finite, value._const(1), u).sqrt() - where(finite, 1.0, 0.0).cast(value.dtype)
        out = out - (where(finite, -g, zero) * d + steep)
    return out


def _scalar(v: Any) -> Tensor:
    """A Python scalar as a 0-d tensor of PyTorch's dtype for it: bool, int64 or float32."""
    v = v.item() if isinstance(v, np.number) else v
    d = dt.bool_ if isinstance(v, bool) else dt.i64 if isinstance(v, int) else dt.f32
    return Tensor(ir.const(data.literal_value(v, d, truncate=True), d, ()))


def where(cond: Tensor, x: Any = None, y: Any = None) -> Tensor:
    """torch.where: x where cond, else y; with cond alone, cond.nonzero(as_tuple=True)."""
    if x is None and y is None:
        return cond.nonzero(as_tuple=True)
    if isinstance(x, Tensor) or isinstance(y, Tensor):
        xt = x if isinstance(x, Tensor) else y._wrap(x)
        yt = y if isinstance(y, Tensor) else x._wrap(y)
    else:
        xt, yt = _scalar(x), _scalar(y)
        if xt.dtype is not yt.dtype:
            d = dt.f32 if dt.f32 in (xt.dtype, yt.dtype) else dt.i64
            xt, yt = xt.cast(d), yt.cast(d)
    xt, yt = _promote(xt, yt)
    shape = _broadcast_shape(_broadcast_shape(cond.shape, xt.shape, "where"), yt.shape, "where")
    c, a, b = cond._broadcast_to(shape), xt._broadcast_to(shape), yt._broadcast_to(shape)
    if c.dtype is not dt.bool_:
        c = c.cast(dt.bool_)
    return _call("where", lambda: ir.where(c.node, a.node, b.node), c, a, b)


# ------------------------------------------------------------------------------ realize



def _host(v: Any) -> np.ndarray:
    """A value on the host: device values (cuda.DeviceArray) are copied back."""
    return v if isinstance(v, np.ndarray) else v.numpy()


def canonical_program(outputs: list[Node]) -> tuple[list[Node], dict[Node, Node]]:
    """The outputs with their params renamed to slots s0, s1, ... in order of appearance, and
    the renaming: the same structure with new data is the same program, compiled once."""
    from .compiler.rewrite import substitute
    nodes = ir.toposort(outputs)
    empty = next((n for n in nodes if 0 in n.shape), None)
    if empty is not None:  # the ops that make values from empty ones (sum, pad, cat) build constants
        raise ShapeError(f"an empty {empty.op.name.lower()} of shape {list(empty.shape)} feeds a result with "
                         "elements through an op that does not take empty dims")
    params = [n for n in nodes if n.op is Op.PARAM]
    slots = {p: ir.param(f"s{i}", p.dtype, p.shape) for i, p in enumerate(params)}
    return substitute(outputs, slots), slots


def realize(*tensors: Tensor, average: Sequence[Tensor] = ()) -> None:
    """Compute the tensors in one compiled program and attach their values. On "cuda" the
    values stay on the GPU (a step's new weights feed the next step without a copy). average:
    those of the tensors whose values are averaged over the data-parallel ranks as they are
    computed (distributed.py)."""
    assigns, context.pending_assigns = list(context.pending_assigns.values()), {}
    todo = list({id(t): t for t in [t for t in tensors if t.value() is None] +
                 [v for _, v in assigns if v.value() is None]}.values())
    _compute(todo, {id(t) for t in average}, {id(v): leaf.node for leaf, v in assigns})
    for leaf, v in assigns:
        _DATA[leaf.node] = v.value()
        if context.trace is not None:
            context.trace.on_assign(leaf, v)


def host(fn: Callable[[], None]) -> None:
    """Run fn, host-side work of a step (an optimizer's step count and bias corrections), which
    ember.jit repeats when it replays the step."""
    trace, context.trace = context.trace, None
    try:
        fn()
    finally:
        context.trace = trace
    if trace is not None:
        trace.on_host(fn)


def _compute(todo: list[Tensor], average: set[int], replacing: dict[int, Node]) -> None:
    """replacing: id(tensor) -> the leaf that takes its value after this run (pending assigns):
    the leaf's old value is dead then, and its device memory may take the new one."""
    for t in [t for t in todo if t.numel() == 0]:  # empty: nothing to compute
        t._value = np.empty(t.shape, _np_dtype(t.dtype))
    todo = [t for t in todo if t.numel()]
    if not todo:
        return
    t0 = time.perf_counter()
    canonical, slots = canonical_program([t.node for t in todo])
    values = {slot: _DATA[p] for p, slot in slots.items()}
    context.python_s += time.perf_counter() - t0
    averaged = tuple(i for i, t in enumerate(todo) if id(t) in average)
    donate = tuple((i, slots[leaf]) for i, t in enumerate(todo) if (leaf := replacing.get(id(t))) in slots)
    results = execute(canonical, values, averaged, donate)
    for t, v in zip(todo, results):
        t._value = v  # the node stays: gradients can still flow through t
    if context.trace is not None:
        context.trace.on_run(canonical, slots, todo, results, averaged, donate)


def execute(canonical: list[Node], values: dict[Node, Any], average: tuple[int, ...] = (),
            donate: tuple[tuple[int, Node], ...] = ()) -> list:
    """Run a canonical program (its params are slots) on the default device: the results stay
    there (a GPU's in device memory). average: the outputs averaged over the data-parallel
    ranks; donate: (output, slot) pairs whose slot's value is dead after the run (the GPU may
    write the output over it: cuda.CUDAProgram.run_device)."""
    backend = runners.BACKENDS[default_device()]
    if backend.keeps_values:
        try:
            results = backend.compiler.run_device(canonical, values, average, donate)
        except (RuntimeError, NotImplementedError) as e:
            raise runners.BackendError(str(e)) from None
    elif average:
        raise runners.BackendError(f"data-parallel training runs on cuda (the default device is {backend.name})")
    else:
        results = [np.asarray(v) for v in backend.run(canonical, {k: _host(v) for k, v in values.items()})]
    context.runs += 1
    return results


# ----------------------------------------------------------------------------- creation

def manual_seed(seed: int) -> None:
    context.seed, context.draws = seed, 0


def _random_bits(shape: tuple[int, ...]) -> Node:
    """splitmix64 of the element index (spec 7), computed in the graph (runs as compiled code).
    The seed is data, not a constant, so every draw of a shape runs the same compiled program."""
    context.draws += 1
    seed = (context.seed * 0x9E3779B97F4A7C15 + context.draws * 0xD1B54A32D192ED03) & ((1 << 64) - 1)
    n = math.prod(shape)
    u = lambda v: ir.const(v, dt.u64, (n,))  # noqa: E731
    i = ir.binary(Op.ADD, ir.iota(dt.u64, (n,), 0), u(1))
    seeds = ir.expand(Tensor(np.array([seed], np.uint64)).node, (n,))
    z = ir.binary(Op.ADD, seeds, ir.binary(Op.MUL, i, u(0x9E3779B97F4A7C15)))
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ir.binary(Op.MUL, ir.binary(Op.XOR, z, ir.binary(Op.SHR, z, u(shift))), u(mult))
    z = ir.binary(Op.XOR, z, ir.binary(Op.SHR, z, u(31)))
    return ir.reshape(z, shape)


def rand(*shape: Any, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    """Uniform in [0, 1), from the seeded counter-based generator. Computed now, as PyTorch
    does: a random tensor used in every step of a loop is drawn once, not once per step."""
    shape = _shape_arg(shape)
    bits = Tensor(_random_bits(shape))
    top = Tensor(ir.binary(Op.SHR, bits.node, ir.const(40, dt.u64, shape)))  # 24 random bits
    out = (top.cast(dt.f32) * (2.0 ** -24)).cast(as_dtype(dtype))
    return _leaf(Tensor(out.numpy(), out.dtype), requires_grad)


def randint(low: int, high: int | None = None, size: Any = None, dtype: Any = dt.i64) -> Tensor:
    """Integers uniform in [low, high) (randint(high, size) counts from 0), drawn now."""
    low, high, size = (0, low, high) if size is None else (low, high, size)
    if high is None or size is None or high <= low:
        raise ValueError(f"randint: needs low < high and a size, got low={low}, high={high}, size={size}")
    bits = Tensor(_random_bits(tuple(_shape_arg((size,)))))
    out = Tensor(ir.binary(Op.MOD, bits.node, ir.const(high - low, dt.u64, bits.shape))).cast(dt.i64) + low
    return Tensor(out.numpy(), as_dtype(dtype))


def randperm(n: int, dtype: Any = dt.i64) -> Tensor:
    return rand(n).argsort().cast(as_dtype(dtype)) if n else zeros(0, dtype=dtype)


def multinomial(probs: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """One draw (num_samples=1) per row of probs (weights, not necessarily normalized): the first
    class whose running sum passes a uniform draw times the row's sum."""
    if num_samples != 1:
        raise ValueError("multinomial: only num_samples=1 is supported")
    p = probs if probs.ndim == 2 else probs.unsqueeze(0)
    c = p.float().cumsum(-1)
    u = rand(p.shape[0], 1) * c[..., -1:]
    out = (c <= u).cast(dt.i64).sum(-1, keepdim=True).clamp(max=p.shape[-1] - 1)
    return Tensor(out.numpy()) if probs.ndim == 2 else Tensor(out.numpy().reshape(1))


def randn(*shape: Any, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    """Standard normal, Box-Muller on two uniform draws."""
    shape = _shape_arg(shape)
    u1, u2 = rand(shape), rand(shape)
    r = ((1.0 - u1).log() * -2.0).sqrt()
    out = (r * (u2 * (2 * math.pi)).cos()).cast(as_dtype(dtype))
    return _leaf(Tensor(out.numpy(), out.dtype), requires_grad)


def full(shape: Any, value: float, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """PyTorch's full: the dtype of the value (bool, int64 or float32) unless given."""
    d = as_dtype(dtype) if dtype is not None else _scalar(value).dtype
    out = Tensor(ir.const(data.literal_value(value, d, truncate=True), d, tuple(_shape_arg((shape,)))))
    return _leaf(out, requires_grad)


def zeros(*shape: Any, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    return full(_shape_arg(shape), 0, dtype, requires_grad)


def ones(*shape: Any, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    return full(_shape_arg(shape), 1, dtype, requires_grad)


def arange(start: float, end: float | None = None, step: float = 1, dtype: Any = None,
           requires_grad: bool = False) -> Tensor:
    """PyTorch's arange: int64 for integer arguments, float32 when any is a float."""
    start, end, step = (v.item() if isinstance(v, Tensor) else v for v in (start, end, step))
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ShapeError("arange: step must be nonzero")
    floats = any(isinstance(v, float) for v in (start, end, step))
    d = as_dtype(dtype) if dtype is not None else (dt.f32 if floats else dt.i64)
    n = max(0, math.ceil((end - start) / step)) if floats else max(0, -(-(end - start) // step))
    idx = Tensor(ir.iota(dt.f64 if floats or d.is_float else dt.i64, (n,), 0))
    out = (idx * step + start if (step, start) != (1, 0) else idx).cast(d)
    return _leaf(out, requires_grad)


def _leaf(t: Tensor, requires_grad: bool) -> Tensor:
    """t itself, or (requires_grad) its value as a leaf that collects a gradient, as PyTorch's
    factory functions give."""
    if not requires_grad:
        return t
    if not t.dtype.is_float:
        raise ShapeError(f"requires_grad needs a float dtype, got {t.dtype}")
    return Tensor(t.numpy(), t.dtype, requires_grad=True)


def eye(n: int, m: int | None = None, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    shape = (n, m if m is not None else n)
    out = Tensor(ir.iota(dt.i64, shape, 0)).eq(Tensor(ir.iota(dt.i64, shape, 1))).cast(as_dtype(dtype))
    return _leaf(out, requires_grad)


def linspace(start: float, end: float, steps: int, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    """PyTorch's: the first half counted from start, the second back from end (symmetric)."""
    if steps < 0:
        raise ShapeError(f"linspace: number of steps must be non-negative, got {steps}")
    if steps == 0:
        return _leaf(zeros(0, dtype=dtype), requires_grad)
    if steps == 1:
        return _leaf(full((1,), start, dtype), requires_grad)
    step = (end - start) / (steps - 1)
    i = Tensor(ir.iota(dt.f64, (steps,), 0))
    out = where(i < steps // 2, i * step + start, -((steps - 1) - i) * step + end)
    return _leaf(out.cast(as_dtype(dtype)), requires_grad)


def logspace(start: float, end: float, steps: int, base: float = 10.0, dtype: Any = dt.f32) -> Tensor:
    return (base ** linspace(start, end, steps, dt.f64)).cast(as_dtype(dtype))


def empty(*shape: Any, dtype: Any = dt.f32, requires_grad: bool = False) -> Tensor:
    """Zeros: a lazy tensor has no uninitialized memory to show."""
    return zeros(*shape, dtype=dtype, requires_grad=requires_grad)


def zeros_like(t: Tensor, dtype: Any = None) -> Tensor:
    return full(t.shape, 0, dtype or t.dtype)


def ones_like(t: Tensor, dtype: Any = None) -> Tensor:
    return full(t.shape, 1, dtype or t.dtype)


def full_like(t: Tensor, value: float, dtype: Any = None) -> Tensor:
    return full(t.shape, value, dtype or t.dtype)


empty_like = zeros_like


def rand_like(t: Tensor, dtype: Any = None) -> Tensor:
    return rand(t.shape, dtype=dtype or t.dtype)


def randn_like(t: Tensor, dtype: Any = None) -> Tensor:
    return randn(t.shape, dtype=dtype or t.dtype)


def meshgrid(*tensors: Tensor, indexing: str = "ij") -> list[Tensor]:
    ts = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if indexing == "xy" and len(ts) >= 2:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.numel() for t in ts)
    out = []
    for k, t in enumerate(ts):
        view = [1] * len(ts)
        view[k] = t.numel()
        out.append(t.reshape(view)._broadcast_to(shape))
    if indexing == "xy" and len(out) >= 2:  # the first two inputs were swapped; swap their grids back
        out[0], out[1] = out[1], out[0]
    return out


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """Einstein summation as broadcast, multiply and sum (every label is a dim; no '...')."""
    ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops) or eq.replace("...", "").count("."):
        raise ShapeError(f"einsum: {equation!r} with {len(ops)} operands")
    ell = ""   # '...' stands for the same unused labels in every term, aligned from the right
    if "..." in eq:
        most = max((t.ndim - len(term) + 3 for term, t in zip(terms, ops) if "..." in term), default=0)
        ell = "".join([c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq][:most])
        terms = [term.replace("...", ell[most - (t.ndim - len(term) + 3):]) for term, t in zip(terms, ops)]
        rhs = rhs.replace("...", ell)
    if not arrow:   # the labels that appear once, in order, after the '...' ones
        joined = "".join(terms)
        rhs = ell + "".join(sorted(c for c in set(joined) if joined.count(c) == 1 and c not in ell))
    labels = list(dict.fromkeys(rhs + "".join(terms)))
    sizes: dict[str, int] = {}
    out = None
    for term, t in zip(terms, ops):
        if len(term) != t.ndim:
            raise ShapeError(f"einsum: {term!r} has {len(term)} labels for a tensor of {t.ndim} dims")
        for c, n in zip(term, t.shape):
            if sizes.setdefault(c, n) != n and 1 not in (n, sizes[c]):
                raise ShapeError(f"einsum: label {c!r} is {sizes[c]} and {n}")
            sizes[c] = max(sizes[c], n)
        x = t
        for c in dict.fromkeys(term):  # a repeated label within a term: its diagonal
            while term.count(c) > 1:
                a, b = term.index(c), term.index(c, term.index(c) + 1)
                x = x.diagonal(0, a, b)
                term = term[:a] + term[a + 1:b] + term[b + 1:] + c
        order = [term.index(c) for c in labels if c in term]
        x = x.permute(order) if order else x
        present = [c for c in labels if c in term]
        x = x.reshape([x.shape[present.index(c)] if c in present else 1 for c in labels])
        out = x if out is None else out * x
    assert out is not None
    out = out._broadcast_to(tuple(sizes[c] for c in labels))
    summed = [i for i, c in enumerate(labels) if c not in rhs]
    return out.sum(summed) if summed else out


def _function(name: str) -> Any:
    def fn(x: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(x if isinstance(x, Tensor) else tensor(x), name)(*args, **kwargs)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"torch.{name}(x, ...): Tensor.{name} as a function."
    return fn


# torch.<op>(x, ...) for the Tensor methods people call as functions. Names of Python builtins
# (sum, max, min, abs, all, any, pow, round) are left out: this module itself uses the builtins,
# so those stay methods (x.sum()).
for _name in ("abs", "acos", "acosh", "add", "all", "amax", "amin", "aminmax", "any", "argmax", "argmin", "argsort",
              "asin", "asinh", "atan", "atan2", "atanh", "bmm", "ceil", "clamp", "clip", "clone", "copysign", "cos",
              "cosh", "cummax", "cummin", "cumprod", "cumsum", "diag", "diagonal", "div", "dot", "eq", "erf", "erfc",
              "exp", "exp2", "expm1", "flatten", "flip", "floor", "fmod", "frac", "gather", "ge", "gt", "hypot",
              "index_select", "isclose", "allclose", "isfinite", "isinf", "isnan", "kthvalue", "le", "lerp", "log",
              "log10",
              "log1p", "log2", "logaddexp", "logcumsumexp", "logical_and", "logical_not", "logical_or",
              "logical_xor", "logsumexp", "lt", "masked_fill", "masked_select", "matmul", "max", "maximum", "mean",
              "median", "min", "minimum", "mm", "movedim", "mul", "mv", "nan_to_num", "ne", "neg", "nonzero", "norm",
              "outer", "permute", "pow", "prod", "reciprocal", "remainder", "repeat_interleave", "reshape", "roll",
              "round", "rsqrt", "scatter", "scatter_add", "scatter_reduce", "sigmoid", "sign", "signbit", "sin",
              "sinh", "sort", "sqrt", "square", "squeeze", "std", "std_mean", "sub", "sum", "t", "tan", "tanh",
              "tensor_split", "topk", "transpose", "tril", "triu", "trunc", "unflatten", "unsqueeze", "var",
              "var_mean", "xlogy"):
    if _name not in dir(builtins):
        globals()[_name] = _function(_name)


def tensor(value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """torch.tensor: data (numbers, nested lists, arrays, tensors of one element) as a new leaf."""
    out = Tensor(value, dtype, requires_grad)
    return out.to(device) if device is not None else out


def from_numpy(arr: np.ndarray) -> Tensor:
    return Tensor(arr)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along dim: each piece padded to the full length, then selected by position
    (a select keeps -0.0 and NaN's bits, which adding zeros would not)."""
    if not tensors:
        raise ShapeError("cat: expected a non-empty list of tensors")
    dim = _dim(dim, tensors[0].ndim)
    rest = tensors[0].shape[:dim] + tensors[0].shape[dim + 1:]
    for t in tensors:
        if t.ndim != tensors[0].ndim or t.shape[:dim] + t.shape[dim + 1:] != rest:
            raise ShapeError(f"cat: shapes {[list(x.shape) for x in tensors]} differ outside dim {dim}")
    d = tensors[0].dtype
    for t in tensors[1:]:
        d = _promote_dtype(d, t.dtype)
    if _host_data(tensors):
        return Tensor(np.concatenate([t.value() for t in tensors], dim).astype(_np_dtype(d)), d)
    total = sum(t.shape[dim] for t in tensors)
    if any(t.numel() == 0 for t in tensors):  # empty pieces add nothing
        kept = [t for t in tensors if t.numel()]
        if not kept:
            return _from_empty(Tensor(ir.const(0, d, tensors[0].shape[:dim] + (total,) + tensors[0].shape[dim + 1:])),
                               *tensors)
        return _from_empty(cat(kept, dim).cast(d), *[t for t in tensors if not t.numel()])
    out, offset = None, 0
    for t in tensors:
        pads = [0, 0] * (t.ndim - dim - 1) + [offset, total - offset - t.shape[dim]]
        piece = t.cast(d).pad(pads)
        if out is None:
            out = piece
        else:
            pos = Tensor(ir.iota(dt.i64, piece.shape, dim))
            out = where(pos >= offset, piece, out)
        offset += t.shape[dim]
    assert out is not None
    return out


def _host_data(tensors: Sequence[Tensor]) -> bool:
    """Whether all are data on the host that needs no gradient: joined (cat, stack) on the host,
    data stays data (a batch stacked from slices of a dataset, a sequence that generation grows),
    so it does not grow the graph of the program that reads it."""
    return context.trace is None and all(isinstance(t.value(), np.ndarray) and not t.requires_grad for t in tensors)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    if tensors and _host_data(tensors) and len({(t.shape, t.dtype) for t in tensors}) == 1:
        return Tensor(np.stack([t.value() for t in tensors], _dim(dim, tensors[0].ndim + 1)), tensors[0].dtype)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def split(t: Tensor, size: Any, dim: int = 0) -> list[Tensor]:
    """Pieces of size (the last shorter), or of the sizes in a list, which must add up to the dim."""
    dim = _dim(dim, t.ndim)
    if not isinstance(size, int):
        if sum(size) != t.shape[dim]:
            raise ShapeError(f"split: sizes {list(size)} do not add up to dim {dim}'s size {t.shape[dim]}")
        return t.tensor_split(list(itertools.accumulate(size))[:-1], dim)
    return t.tensor_split(list(range(size, t.shape[dim], size)), dim)


def chunk(t: Tensor, chunks: int, dim: int = 0) -> list[Tensor]:
    return split(t, -(-t.shape[_dim(dim, t.ndim)] // chunks), dim)



class _CallableModule(type(builtins)):  # type: ignore[misc]
    """`ember.tensor(data)` is torch.tensor (ember.tensor.tensor), and `import ember.tensor as et`
    still gives the module: an `import ember as torch` script reaches both."""

    def __call__(self, value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        return tensor(value, dtype, device, requires_grad)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule


def _axis_windows(x: Tensor, ax: int, k: int, s: int, d: int, out: int) -> Tensor:
    """Axis ax of length L becomes (out, k) with [q, j] = x[q * s + j * d], by movement alone:
    repeat the axis, flatten the copies, and cut the run into rows of R = L + d (+ a multiple
    of L): row j then starts at j * R = j * d (mod L). The compiler folds the resulting
    (j * R + q * s) mod L back to q * s + j * d, as the bounds of q and j allow."""
    length = x.shape[ax]
    row = length + d
    while row < out * s:
        row += length
    copies = -(-k * row // length)
    lead, rest = x.shape[:ax], x.shape[ax + 1:]
    w = x.unsqueeze(ax).expand(lead + (copies, length) + rest).reshape(lead + (copies * length,) + rest)
    idx = (slice(None),) * ax
    w = w[idx + (slice(0, k * row),)].reshape(lead + (k, row) + rest)
    w = w[idx + (slice(None), slice(0, out * s))].reshape(lead + (k, out, s) + rest)
    w = w[idx + (slice(None), slice(None), slice(0, 1))].reshape(lead + (k, out) + rest)
    return w.transpose(ax, ax + 1)
