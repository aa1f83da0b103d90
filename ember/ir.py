"""The one node type of Ember, and the tensor-level op set with its type rules (spec section 4).

A Node is immutable and hash-consed: building a node equal to a live one returns that same
object, so common subexpressions merge for free and nodes can be compared with `is` and used
as dict keys. Tensor-level nodes have a shape; kernel-level nodes (ranges, loads, index
arithmetic) are scalars with shape ().
"""
from __future__ import annotations

import math
import struct
import weakref
from enum import Enum, auto
from typing import Any

from . import dtype as dt
from .dtype import DType


class Op(Enum):
    __hash__ = object.__hash__   # members are singletons: hashed by id in C (every Node's key holds one)

    # sources
    PARAM = auto(); CONST = auto(); IOTA = auto()  # noqa: E702
    # unary
    NEG = auto(); RECIP = auto(); SQRT = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto()  # noqa: E702
    TRUNC = auto(); CAST = auto(); BITCAST = auto()  # noqa: E702
    # binary
    ADD = auto(); SUB = auto(); MUL = auto(); DIV = auto(); IDIV = auto(); MOD = auto()  # noqa: E702
    MAX = auto(); CMPLT = auto(); CMPEQ = auto(); CMPNE = auto()  # noqa: E702
    AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()  # noqa: E702
    # ternary
    WHERE = auto()
    # movement
    RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()  # noqa: E702
    # reductions (RMAX is the one-operand `max x axes=[...]`)
    SUM = auto(); RMAX = auto()  # noqa: E702
    # autodiff
    GRAD = auto()
    # made by the compiler, never written: a kernel rendered whole (compiler/attention.py)
    FUSED = auto()
    # kernel level: see ember/compiler/lower.py
    BUFFER = auto(); RANGE = auto(); LOAD = auto(); REDUCE = auto(); STORE = auto()  # noqa: E702


UNARY = {Op.NEG, Op.RECIP, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC, Op.CAST, Op.BITCAST}
BINARY = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.IDIV, Op.MOD, Op.MAX, Op.CMPLT, Op.CMPEQ, Op.CMPNE,
          Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR}
ELEMENTWISE = UNARY | BINARY | {Op.WHERE}
MOVEMENT = {Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.PAD, Op.SHRINK, Op.FLIP}
REDUCTION = {Op.SUM, Op.RMAX}
COMPARE = {Op.CMPLT, Op.CMPEQ, Op.CMPNE}


class IRError(Exception):
    """A program that breaks a rule of the spec. The parser adds the file and line."""


def _key(arg: Any) -> Any:
    # Floats are keyed by their bits: 0.0 == -0.0 and nan != nan must not merge or split nodes.
    if isinstance(arg, float):
        return ("f", struct.pack("<d", arg))
    if isinstance(arg, tuple):
        return tuple(_key(a) for a in arg)
    return arg


class Node:
    __slots__ = ("op", "dtype", "shape", "srcs", "arg", "__weakref__")
    _cache: "weakref.WeakValueDictionary[tuple, Node]" = weakref.WeakValueDictionary()

    op: Op
    dtype: DType
    shape: tuple[int, ...]
    srcs: tuple["Node", ...]
    arg: Any

    def __new__(cls, op: Op, dtype: DType, srcs: tuple["Node", ...] = (), arg: Any = None,
                shape: tuple[int, ...] = ()) -> "Node":
        key = (op, dtype, shape, tuple(id(s) for s in srcs), _key(arg))
        node = cls._cache.get(key)
        if node is None:
            node = object.__new__(cls)
            for name, value in (("op", op), ("dtype", dtype), ("shape", shape), ("srcs", srcs), ("arg", arg)):
                object.__setattr__(node, name, value)
            cls._cache[key] = node
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Node is immutable")

    def __repr__(self) -> str:
        arg = "" if self.arg is None else f" {self.arg!r}"
        shape = f"[{','.join(map(str, self.shape))}]" if self.shape else ""
        return f"<{self.op.name} {self.dtype}{shape}{arg} #{len(self.srcs)}>"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def toposort(roots: list[Node] | tuple[Node, ...]) -> list[Node]:
    """All nodes reachable from roots, sources before users: a depth-first walk, sources left to
    right, each node after its sources. Iterative (deep graphs are fine); a node is marked when
    first reached, so none is pushed twice (twice as fast as marking when popped)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.srcs))]
        while stack:
            node, srcs = stack[-1]
            for s in srcs:
                if id(s) not in seen:
                    seen.add(id(s))
                    stack.append((s, iter(s.srcs)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


# ----------------------------------------------------------------------------------------------
# Tensor-level constructors with the spec's type rules. Each raises IRError with a message that
# says what was expected and what was found.

MAX_NUMEL = 2**31  # params and returned values have fewer elements (spec 2), checked by the parser
MAX_VALUE_NUMEL = 2**62 - 1  # any other value (never stored by a good compiler: a matmul's [M,K,N] product)


def check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dims are integers >= 0. The text format (spec 2) and the compiler take dims >= 1 only:
    the parser rejects a 0 (text.py), and the frontend computes values with an empty dim
    without the compiler (tensor.py, "Empty dims")."""
    shape = tuple(shape)
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise IRError(f"every dim must be an integer >= 1, found {d}")
    return shape


def fmt_type(dtype: DType, shape: tuple[int, ...]) -> str:
    return f"{dtype.name}[{','.join(map(str, shape))}]"


def param(name: str, dtype: DType, shape: tuple[int, ...]) -> Node:
    return Node(Op.PARAM, dtype, (), name, check_shape(shape))


def const(value: int | float | bool, dtype: DType, shape: tuple[int, ...]) -> Node:
    """`value` must already be representable in dtype (see data.literal_value)."""
    return Node(Op.CONST, dtype, (), value, check_shape(shape))


def iota(dtype: DType, shape: tuple[int, ...], axis: int) -> Node:
    shape = check_shape(shape)
    _axis(axis, len(shape), "axis")
    return Node(Op.IOTA, dtype, (), axis, shape)


def _want(x: Node, ok: bool, what: str, opname: str) -> None:
    if not ok:
        raise IRError(f"{opname} expects {what} operands, found {x.dtype}")


def unary(op: Op, x: Node, dtype: DType | None = None) -> Node:
    name = op.name.lower()
    if op is Op.NEG:
        _want(x, x.dtype.is_signed or x.dtype.is_float, "signed int or float", name)
    elif op is Op.CAST:
        assert dtype is not None
        return Node(Op.CAST, dtype, (x,), None, x.shape)
    elif op is Op.BITCAST:
        assert dtype is not None
        if x.dtype is dt.bool_ or dtype is dt.bool_:
            raise IRError(f"bitcast does not take bool, found {x.dtype} to {dtype}")
        if x.dtype.bits != dtype.bits:
            raise IRError(f"bitcast needs the same bit width, found {x.dtype} ({x.dtype.bits} bits) "
                          f"to {dtype} ({dtype.bits} bits)")
        return Node(Op.BITCAST, dtype, (x,), None, x.shape)
    else:
        _want(x, x.dtype.is_float, "float", name)
    return Node(op, x.dtype, (x,), None, x.shape)


def stop_gradient(x: Node) -> Node:
    """x's value with no gradient path through it: a bitcast to the integer of its width and back
    (autodiff passes no gradient through bitcasts; simplify drops the pair once gradients are
    expanded). Softmax's max: the result does not depend on it, but its gradient would cost
    passes over the input (the ties' count, the sum of the gradient) whose total is zero."""
    if not x.dtype.is_float:
        return x
    as_int = {16: dt.i16, 32: dt.i32, 64: dt.i64}[x.dtype.bits]
    return unary(Op.BITCAST, unary(Op.BITCAST, x, as_int), x.dtype)


def widening(n: Node) -> bool:
    """Whether n is an exact widening cast between floats (bf16 to f32: the value unchanged)."""
    return n.op is Op.CAST and n.dtype.is_float and n.srcs[0].dtype.is_float and n.srcs[0].dtype.bits < n.dtype.bits


def stopped(n: Node) -> Node | None:
    """x when n is stop_gradient(x) (a bitcast and its way back), else None."""
    if n.op is Op.BITCAST and n.srcs[0].op is Op.BITCAST and n.dtype is n.srcs[0].srcs[0].dtype:
        return n.srcs[0].srcs[0]
    return None


def binary(op: Op, x: Node, y: Node) -> Node:
    name = op.name.lower()
    if x.shape != y.shape:
        raise IRError(f"{name} needs operands of one shape (no implicit broadcasting), "
                      f"found {fmt_type(x.dtype, x.shape)} and {fmt_type(y.dtype, y.shape)}")
    if x.dtype is not y.dtype:
        raise IRError(f"{name} needs operands of one dtype (no type promotion), found {x.dtype} and {y.dtype}")
    d = x.dtype
    if op in (Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.CMPLT):
        _want(x, d.is_numeric, "numeric", name)
    elif op is Op.DIV:
        _want(x, d.is_float, "float", name)
    elif op in (Op.IDIV, Op.MOD, Op.SHL, Op.SHR):
        _want(x, d.is_int, "int", name)
    elif op in (Op.AND, Op.OR, Op.XOR):
        _want(x, d.is_int or d is dt.bool_, "int or bool", name)
    # CMPEQ / CMPNE take every dtype
    return Node(op, dt.bool_ if op in COMPARE else d, (x, y), None, x.shape)


def where(c: Node, x: Node, y: Node) -> Node:
    if c.dtype is not dt.bool_:
        raise IRError(f"where expects a bool condition, found {c.dtype}")
    if not (c.shape == x.shape == y.shape):
        raise IRError(f"where needs operands of one shape, found {fmt_type(c.dtype, c.shape)}, "
                      f"{fmt_type(x.dtype, x.shape)} and {fmt_type(y.dtype, y.shape)}")
    if x.dtype is not y.dtype:
        raise IRError(f"where needs both branches of one dtype, found {x.dtype} and {y.dtype}")
    return Node(Op.WHERE, x.dtype, (c, x, y), None, x.shape)


def _axis(a: int, rank: int, what: str) -> int:
    if not isinstance(a, int) or not 0 <= a < rank:
        raise IRError(f"{what} must be a dim in [0, {rank}), found {a}")
    return a


def _ints(values: Any, n: int, what: str) -> tuple[int, ...]:
    values = tuple(values)
    if len(values) != n:
        raise IRError(f"{what} needs {n} values (one per dim), found {len(values)}")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise IRError(f"{what} needs integers, found {v}")
    return values


def _distinct_axes(axes: Any, rank: int, what: str) -> tuple[int, ...]:
    axes = tuple(axes)
    for a in axes:
        _axis(a, rank, f"{what} entry")
    if len(set(axes)) != len(axes):
        raise IRError(f"{what} must list distinct dims, found {list(axes)}")
    return tuple(sorted(axes))


def reshape(x: Node, shape: tuple[int, ...]) -> Node:
    shape = check_shape(shape)
    if math.prod(shape) != x.numel:
        raise IRError(f"reshape must keep the element count: {fmt_type(x.dtype, x.shape)} has {x.numel}, "
                      f"shape={list(shape)} has {math.prod(shape)}")
    return Node(Op.RESHAPE, x.dtype, (x,), None, shape)


def permute(x: Node, order: tuple[int, ...]) -> Node:
    order = _ints(order, len(x.shape), "permute order")
    if sorted(order) != list(range(len(x.shape))):
        raise IRError(f"permute order must be a permutation of 0..{len(x.shape) - 1}, found {list(order)}")
    return Node(Op.PERMUTE, x.dtype, (x,), order, tuple(x.shape[o] for o in order))


def expand(x: Node, shape: tuple[int, ...]) -> Node:
    shape = _ints(shape, len(x.shape), "expand shape")
    check_shape(shape)
    for d, (a, b) in enumerate(zip(x.shape, shape)):
        if a != b and a != 1:
            raise IRError(f"expand can only grow dims of size 1: dim {d} is {a}, asked {b}")
    return Node(Op.EXPAND, x.dtype, (x,), None, shape)


def pad(x: Node, before: tuple[int, ...], after: tuple[int, ...], value: int | float | bool = 0) -> Node:
    before = _ints(before, len(x.shape), "pad before")
    after = _ints(after, len(x.shape), "pad after")
    if any(v < 0 for v in before + after):
        raise IRError(f"pad amounts must be >= 0, found before={list(before)} after={list(after)}")
    shape = check_shape(tuple(s + b + a for s, b, a in zip(x.shape, before, after)))
    return Node(Op.PAD, x.dtype, (x,), (before, after, value), shape)


def shrink(x: Node, start: tuple[int, ...], end: tuple[int, ...]) -> Node:
    start = _ints(start, len(x.shape), "shrink start")
    end = _ints(end, len(x.shape), "shrink end")
    for d, (s, e, n) in enumerate(zip(start, end, x.shape)):
        if not 0 <= s <= e <= n:  # start == end: an empty dim (the frontend's; the parser rejects it)
            raise IRError(f"shrink needs 0 <= start < end <= size in dim {d}, found start={s} end={e} size={n}")
    return Node(Op.SHRINK, x.dtype, (x,), (start, end), tuple(e - s for s, e in zip(start, end)))


def flip(x: Node, axes: tuple[int, ...]) -> Node:
    return Node(Op.FLIP, x.dtype, (x,), _distinct_axes(axes, len(x.shape), "flip axes"), x.shape)


def reduce(op: Op, x: Node, axes: tuple[int, ...]) -> Node:
    name = "sum" if op is Op.SUM else "max"
    _want(x, x.dtype.is_numeric, "numeric", name)
    axes = _distinct_axes(axes, len(x.shape), f"{name} axes")
    if not axes:
        return x  # the spec: an empty list is the identity
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    return Node(op, x.dtype, (x,), axes, shape)


def grad(y: Node, x: Node) -> Node:
    if not x.dtype.is_float:
        raise IRError(f"grad is taken with respect to a float node, found {x.dtype}")
    return Node(Op.GRAD, x.dtype, (y, x), None, x.shape)
