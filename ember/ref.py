"""The reference evaluator (`--backend ref`): the spec made executable, one op at a time.

This is the oracle every compiled backend is tested against, so it favours plain, exact
semantics over speed. Values are numpy arrays: ints and bool in their own type, f32 and f64 in
theirs, f16 and bf16 as f32 arrays holding values representable in the dtype. Float math is
done in f64 and rounded once to the result dtype. numpy computing is allowed here and only here.

With wide=True (`--backend ref-wide`) it computes what a compiler that keeps every intermediate in
the highest precision (spec 4) would: float results stay in f64, unrounded, except a float `cast`
(its rounding is what it asks for), the source of a `bitcast` (its bits) and the returned values.
With reverse=True (`--backend ref-reversed`) every float sum is added one by one from its last
element, in f32 (f64 for f64): spec 4 leaves a sum's order free. A test is valid only if it holds
in every mode (spec 8; docs/ir.md's appendix says why this reading).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import data
from . import dtype as dt
from .dtype import DType
from .ir import Node, Op, toposort


class Unsupported(Exception):
    """An op this evaluator cannot run (exit status 3, not a malformed program)."""


def _float(result: np.ndarray, dtype: DType) -> np.ndarray:
    return data.round_float(result, dtype).astype(data.value_dtype(dtype))


def _wide(result: np.ndarray, dtype: DType) -> np.ndarray:
    return np.asarray(result, np.float64)  # kept unrounded: the widest a fused kernel may hold


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
        q = a // safe   # numpy's floors: a signed quotient is moved toward zero
        if d.is_signed:
            q = q + ((a - q * safe != 0) & ((a < 0) != (safe < 0))).astype(d.np_name)
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


def eval_node(node: Node, srcs: list[np.ndarray], wide: bool = False, reverse: bool = False) -> np.ndarray:
    """The value of one node from the values of its sources (wide: float results left unrounded;
    reverse: float sums added one by one from the last element, in the narrowest accumulator
    spec 4 allows: another order a correct compiler may take)."""
    op, d, rnd = node.op, node.dtype, _wide if wide else _float
    x = srcs[0] if srcs else None
    with np.errstate(all="ignore"):
        if op is Op.CONST:
            return np.full(node.shape, node.arg, dtype=data.value_dtype(d))
        if op is Op.IOTA:
            return _iota(node)
        if op is Op.NEG:
            return rnd(-x.astype(np.float64), d) if d.is_float else np.negative(x)
        if op in FLOAT_UNARY:
            return rnd(FLOAT_UNARY[op](x.astype(np.float64)), d)
        if op is Op.CAST:
            return cast(x, node.srcs[0].dtype, d)
        if op is Op.BITCAST:
            return _bitcast(x, node.srcs[0].dtype, d)  # of the rounded source: to_storage rounds
        if op in COMPARE:
            return COMPARE[op](x, srcs[1])
        if op in (Op.IDIV, Op.MOD):
            q, r = _idiv_mod(x, srcs[1], d)
            return q if op is Op.IDIV else r
        if op in (Op.SHL, Op.SHR):
            return _shift(x, srcs[1], d, op is Op.SHL)
        if op in FLOAT_BINARY and d.is_float:
            return rnd(FLOAT_BINARY[op](x.astype(np.float64), srcs[1].astype(np.float64)), d)
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
            if d.is_float and reverse:
                acc = np.float64 if d is dt.f64 else np.float32   # f16 and bf16 accumulate in f32 at least
                rows = np.moveaxis(x, node.arg, range(x.ndim - len(node.arg), x.ndim))
                rows = rows.reshape(rows.shape[:x.ndim - len(node.arg)] + (-1,))[..., ::-1]
                total = np.cumsum(rows.astype(acc), axis=-1, dtype=acc)[..., -1] if rows.shape[-1] else 0.0
                return rnd(np.asarray(total, np.float64).reshape(node.shape), d)   # cumsum: one by one
            if d.is_float:
                # from -0.0, the identity of IEEE addition: a sum of -0.0s is -0.0 (numpy starts at +0.0)
                return rnd(np.sum(x.astype(np.float64), axis=node.arg, keepdims=True, initial=-0.0), d)
            return np.sum(x, axis=node.arg, keepdims=True, dtype=x.dtype)  # wraps, as the spec asks
        if op is Op.RMAX:
            return np.max(x, axis=node.arg, keepdims=True)
        if op is Op.FUSED:
            return _attention(node, srcs, rnd)
    raise Unsupported(f"the reference evaluator cannot run '{op.name.lower()}' here")


def _attention(node: Node, srcs: list[np.ndarray], rnd: Callable = _float) -> np.ndarray:
    """The flash-attention kernels the CUDA pipeline puts in a graph (compiler/attention.py), in
    f64: tests evaluate a rewritten graph here against the graph it came from. The score graph
    (node.arg[1]) maps q k^T to base-2 scores; "attention" returns o beside the logsumexp of each
    row, [N, T, D + 2] with its f32 bits in two 16-bit columns ([N, T, D + 1] in f32; or o alone,
    [N, T, D]); "attention_dq" dq; "attention_dkdv" dk beside dv, [N, S, 2 D], with dS = dP's
    part times the score graph's derivative."""
    from .compiler.attention import FIXED, placeholders, score_derivative
    kind, score = node.arg
    q, k, v = (a.astype(np.float64) for a in srcs[:3])
    k, v = (np.repeat(x, q.shape[0] // k.shape[0], 0) for x in (k, v))   # heads shared by groups of q heads
    raw, extra = placeholders(score)
    inputs = {raw: q @ k.transpose(0, 2, 1), **{p: srcs[FIXED[kind] + i] for i, p in enumerate(extra)}}
    values: dict[Node, np.ndarray] = {}
    _fill([score], inputs, values, True)
    s = np.broadcast_to(values[score], score.shape)
    m = s.max(-1, keepdims=True)
    lse = m + np.log2(np.exp2(s - m).sum(-1, keepdims=True))
    p = np.exp2(s - lse)
    if kind == "attention":   # o beside the logsumexp, or o alone (a forward with no gradient)
        o = p @ v
        if node.shape[-1] == q.shape[-1]:
            return rnd(o.reshape(node.shape), node.dtype)
        if node.dtype is dt.f32:
            return rnd(np.concatenate([o, lse], -1).reshape(node.shape), node.dtype)
        # 16-bit: the logsumexp's f32 bits in the last two columns, low half first, as the kernel stores it
        halves = data.from_storage(lse.astype(np.float32).view(np.uint16), node.dtype)
        return np.concatenate([rnd(o, node.dtype), halves], -1).reshape(node.shape)
    dg = score_derivative(score)
    _fill([dg], inputs, values, True)
    do, di = srcs[4].astype(np.float64), srcs[5].astype(np.float64)[..., None]
    ds = p * (do @ v.transpose(0, 2, 1) - di) * np.broadcast_to(values[dg], score.shape)
    if kind == "attention_dq":
        return rnd(ds @ k, node.dtype)
    return rnd(np.concatenate([ds.transpose(0, 2, 1) @ q, p.transpose(0, 2, 1) @ do], -1), node.dtype)


def evaluate(outputs: list[Node], inputs: dict[Node, np.ndarray], wide: bool = False,
             reverse: bool = False) -> list[np.ndarray]:
    """Values of outputs, given the values of the params they depend on (wide, reverse: see the
    module's note)."""
    big = next((n for n in toposort(outputs) if n.numel >= 1 << 31 and n.op is not Op.EXPAND), None)
    if big is not None:  # spec 2 allows it; an evaluator that stores every value cannot
        raise Unsupported(f"the reference evaluator stores every value, and one has {big.numel} elements "
                          "(conformance tests keep values under 2^31; use a compiled backend)")
    values: dict[Node, np.ndarray] = {}
    _fill(outputs, inputs, values, wide, reverse)
    out = [_float(values[o], o.dtype) if wide and o.dtype.is_float else values[o] for o in outputs]  # returned: rounded
    return [np.ascontiguousarray(v).reshape(o.shape) for v, o in zip(out, outputs)]


def _fill(roots: list[Node], inputs: dict[Node, np.ndarray], values: dict[Node, np.ndarray], wide: bool,
          reverse: bool = False) -> None:
    for node in toposort(roots):
        if node in values:
            continue
        if node.op is Op.PARAM:
            values[node] = inputs[node]
        elif node.op is Op.GRAD:
            values[node] = _grad(node.srcs[0], node.srcs[1], inputs, values, wide)
        else:
            values[node] = eval_node(node, [values[s] for s in node.srcs], wide, reverse)


# ------------------------------------------------------------------------------------ grad
# The reference's own reverse pass: numeric, in f64, over the forward values; independent of
# the compiler's symbolic rules (compiler/autodiff.py), so each checks the other.

def _grad(y: Node, x: Node, inputs: dict[Node, np.ndarray], values: dict[Node, np.ndarray],
          wide: bool) -> np.ndarray:
    rnd = _wide if wide else _float
    if any(n.op is Op.GRAD for n in toposort([y])):
        # a grad inside y's graph must itself be differentiated: only the symbolic form can be
        from .compiler.autodiff import expand_grads
        (y,) = expand_grads([y])
        _fill([y], inputs, values, wide)
    order = toposort([y])
    depends: set[Node] = set()
    for n in order:
        if n is x or any(s in depends for s in n.srcs):
            depends.add(n)
    out = np.zeros(x.shape)
    if y in depends and y.dtype.is_float:
        f64 = {n: values[n].astype(np.float64) if n.dtype.is_float else values[n] for n in order}
        grads: dict[Node, np.ndarray] = {y: np.ones(y.shape)}
        for n in reversed(order):
            if n not in grads or n is x:
                continue
            g = grads.pop(n)
            for src, gs in _vjp(n, g, f64):
                if src in depends and src.dtype.is_float:
                    gs = rnd(gs, src.dtype).astype(np.float64)  # a gradient is rounded to its node's dtype
                    grads[src] = grads[src] + gs if src in grads else gs
        out = grads.get(x, out)
    return rnd(np.broadcast_to(out, x.shape), x.dtype)


def _vjp(n: Node, g: np.ndarray, v: dict[Node, np.ndarray]) -> list[tuple[Node, np.ndarray]]:
    op, s = n.op, n.srcs
    with np.errstate(all="ignore"):
        x = v[s[0]] if s else None
        if op is Op.NEG:
            return [(s[0], -g)]
        if op is Op.RECIP:
            return [(s[0], -g / (x * x))]
        if op is Op.SQRT:
            return [(s[0], g / (2 * np.sqrt(x)))]
        if op is Op.EXP2:
            return [(s[0], g * np.exp2(x) * np.log(2.0))]
        if op is Op.LOG2:
            return [(s[0], g / (x * np.log(2.0)))]
        if op is Op.SIN:
            return [(s[0], g * np.cos(x))]
        if op is Op.CAST:
            return [(s[0], g)] if s[0].dtype.is_float else []
        if op is Op.ADD:
            return [(s[0], g), (s[1], g)]
        if op is Op.SUB:
            return [(s[0], g), (s[1], -g)]
        if op is Op.MUL:
            return [(s[0], g * v[s[1]]), (s[1], g * x)]
        if op is Op.DIV:
            y = v[s[1]]
            return [(s[0], g / y), (s[1], -g * x / (y * y))]
        if op is Op.MAX and n.dtype.is_float:
            y = v[s[1]]
            share = np.where(x > y, 1.0, np.where(x == y, 0.5, 0.0))
            return [(s[0], g * share), (s[1], g * (1.0 - share))]
        if op is Op.WHERE:
            c = v[s[0]]
            return [(s[1], np.where(c, g, 0.0)), (s[2], np.where(c, 0.0, g))]
        if op is Op.RESHAPE:
            return [(s[0], g.reshape(s[0].shape))]
        if op is Op.PERMUTE:
            return [(s[0], np.transpose(g, np.argsort(n.arg)))]
        if op is Op.EXPAND:
            axes = tuple(d for d, (a, b) in enumerate(zip(s[0].shape, n.shape)) if a != b)
            return [(s[0], g.sum(axis=axes, keepdims=True))]
        if op is Op.PAD:
            before = n.arg[0]
            return [(s[0], g[tuple(slice(b, b + d) for b, d in zip(before, s[0].shape))])]
        if op is Op.SHRINK:
            full = np.zeros(s[0].shape)
            full[tuple(slice(a, b) for a, b in zip(*n.arg))] = g
            return [(s[0], full)]
        if op is Op.FLIP:
            return [(s[0], np.flip(g, n.arg))]
        if op is Op.SUM:
            return [(s[0], np.broadcast_to(g, s[0].shape))]
        if op is Op.RMAX and n.dtype.is_float:
            hit = x == np.max(x, axis=n.arg, keepdims=True)
            return [(s[0], np.where(hit, g / hit.sum(axis=n.arg, keepdims=True), 0.0))]
    return []  # keeps rank 0
