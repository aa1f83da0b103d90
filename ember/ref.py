"""The reference evaluator (`--backend ref`): the spec made executable, one op at a time.

This is the oracle every compiled backend is tested against, so it favours plain, exact
semantics over speed. Values are numpy arrays: ints and bool in their own type, f32 and f64 in
theirs, f16 and bf16 as f32 arrays holding values representable in the dtype. Float math is
done in f64 and rounded once to the result dtype. numpy computing is allowed here and only here.
"""
from __future__ import annotations

import numpy as np

from . import data
from . import dtype as dt
from .dtype import DType
from .ir import Node, Op, toposort


class Unsupported(Exception):
    """An op this evaluator cannot run (exit status 3, not a malformed program)."""


def _float(result: np.ndarray, dtype: DType) -> np.ndarray:
    return data.round_float(result, dtype).astype(data.value_dtype(dtype))


def cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """Spec section 5."""
    with np.errstate(invalid="ignore", over="ignore"):
        if dst is dt.bool_:
            return x != 0
        if dst.is_float:
            return _float(x.astype(np.float64), dst)
        if src.is_float:  # truncate toward zero; out-of-range is undefined behaviour
            return np.trunc(x.astype(np.float64)).astype(dst.np_name)
        return x.astype(dst.np_name)  # int to int keeps the low bits; bool gives 0/1


def _unsigned(d: DType) -> str:
    return f"uint{d.bits}"


def _idiv_mod(a: np.ndarray, b: np.ndarray, d: DType) -> tuple[np.ndarray, np.ndarray]:
    """C division: quotient truncated toward zero, remainder with the sign of a."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        safe = np.where(b == 0, np.ones_like(b), b)
        if not d.is_signed:
            q = a // safe
        else:
            q = a // safe
            r = a - q * safe
            q = q + ((r != 0) & ((a < 0) != (safe < 0))).astype(d.np_name)
        return q, a - q * safe


def _shift(a: np.ndarray, b: np.ndarray, d: DType, left: bool) -> np.ndarray:
    amount = b.astype(_unsigned(d)) & (d.bits - 1)
    if left:  # shift the unsigned bits so the result wraps instead of overflowing
        return np.left_shift(a.view(_unsigned(d)), amount).view(d.np_name)
    return np.right_shift(a, amount.astype(d.np_name))  # arithmetic for signed, logical for unsigned


def _bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    stored = data.to_storage(x, src)
    return data.from_storage(stored.view(np.dtype(dst.np_name)), dst)


def _iota(node: Node) -> np.ndarray:
    axis = node.arg
    shape = [1] * len(node.shape)
    shape[axis] = node.shape[axis]
    idx = np.arange(node.shape[axis], dtype=np.int64).reshape(shape)
    return cast(np.broadcast_to(idx, node.shape), dt.i64, node.dtype)


FLOAT_UNARY = {Op.RECIP: lambda x: 1.0 / x, Op.SQRT: np.sqrt, Op.EXP2: np.exp2, Op.LOG2: np.log2,
               Op.SIN: np.sin, Op.TRUNC: np.trunc}
FLOAT_BINARY = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide,
                Op.MAX: np.maximum}
INT_BINARY = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.MAX: np.maximum,
              Op.AND: np.bitwise_and, Op.OR: np.bitwise_or, Op.XOR: np.bitwise_xor}
COMPARE = {Op.CMPLT: np.less, Op.CMPEQ: np.equal, Op.CMPNE: np.not_equal}


def eval_node(node: Node, srcs: list[np.ndarray]) -> np.ndarray:
    """The value of one node from the values of its sources."""
    op, d = node.op, node.dtype
    x = srcs[0] if srcs else None
    with np.errstate(all="ignore"):
        if op is Op.CONST:
            return np.full(node.shape, node.arg, dtype=data.value_dtype(d))
        if op is Op.IOTA:
            return _iota(node)
        if op is Op.NEG:
            return _float(-x.astype(np.float64), d) if d.is_float else np.negative(x)
        if op in FLOAT_UNARY:
            return _float(FLOAT_UNARY[op](x.astype(np.float64)), d)
        if op is Op.CAST:
            return cast(x, node.srcs[0].dtype, d)
        if op is Op.BITCAST:
            return _bitcast(x, node.srcs[0].dtype, d)
        if op in COMPARE:
            return COMPARE[op](x, srcs[1])
        if op in (Op.IDIV, Op.MOD):
            q, r = _idiv_mod(x, srcs[1], d)
            return q if op is Op.IDIV else r
        if op in (Op.SHL, Op.SHR):
            return _shift(x, srcs[1], d, op is Op.SHL)
        if op in FLOAT_BINARY and d.is_float:
            return _float(FLOAT_BINARY[op](x.astype(np.float64), srcs[1].astype(np.float64)), d)
        if op in INT_BINARY:
            return INT_BINARY[op](x, srcs[1]).astype(data.value_dtype(d))
        if op is Op.WHERE:
            return np.where(x, srcs[1], srcs[2])
        if op is Op.RESHAPE:
            return x.reshape(node.shape)
        if op is Op.PERMUTE:
            return np.transpose(x, node.arg)
        if op is Op.EXPAND:
            return np.broadcast_to(x, node.shape)
        if op is Op.PAD:
            before, after, value = node.arg
            return np.pad(x, list(zip(before, after)), constant_values=np.array(value, dtype=x.dtype))
        if op is Op.SHRINK:
            return x[tuple(slice(s, e) for s, e in zip(*node.arg))]
        if op is Op.FLIP:
            return np.flip(x, node.arg)
        if op is Op.SUM:
            if d.is_float:
                return _float(np.sum(x.astype(np.float64), axis=node.arg, keepdims=True), d)
            return np.sum(x, axis=node.arg, keepdims=True, dtype=x.dtype)  # wraps, as the spec asks
        if op is Op.RMAX:
            return np.max(x, axis=node.arg, keepdims=True)
    raise Unsupported(f"the reference evaluator does not run '{op.name.lower()}' yet")


def evaluate(outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    """Values of outputs, given the values of the params they depend on."""
    values: dict[Node, np.ndarray] = {}
    for node in toposort(outputs):
        if node.op is Op.PARAM:
            values[node] = inputs[node]
        else:
            values[node] = eval_node(node, [values[s] for s in node.srcs])
    return [np.ascontiguousarray(values[o]).reshape(o.shape) for o in outputs]  # keeps rank 0
