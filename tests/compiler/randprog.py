"""Random valid programs for differential testing: every op, every dtype, movement chains,
reductions, odd shapes, several outputs, and the patterns that toolchains have miscompiled
(nested `where` on one condition, reductions of negated and masked integers). Undefined behaviour (spec 6) is avoided by construction: divisors are made nonzero,
shift amounts masked, floats clamped before casts to ints. Used by test_differential.py and by
tests/tools/fuzz_backends.py for large batches."""
from __future__ import annotations

import random

import numpy as np

from ember import data, ir
from ember import dtype as dt
from ember.ir import Node, Op

FLOATS = [dt.f32, dt.f64, dt.f16, dt.bf16]
INTS = [dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64]


class Gen:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.nodes: list[Node] = []
        self.params: list[Node] = []

    # ------------------------------------------------------------------------- helpers
    def const(self, v: float, d: dt.DType, shape: tuple[int, ...]) -> Node:
        return ir.const(data.literal_value(v, d, truncate=True), d, shape)

    def param(self, d: dt.DType, shape: tuple[int, ...]) -> Node:
        p = ir.param(f"p{len(self.params)}", d, shape)
        self.params.append(p)
        return p

    def like(self, x: Node) -> Node:
        """Another node of x's type: an existing one, a new param or a constant."""
        same = [n for n in self.nodes if n.dtype is x.dtype and n.shape == x.shape and n is not x]
        roll = self.rng.random()
        if same and roll < 0.6:
            return self.rng.choice(same)
        if roll < 0.85:
            return self.param(x.dtype, x.shape)
        values: list[float] = [0, 1] if x.dtype is dt.bool_ else [0, 1, 2, 3]
        if x.dtype.is_signed or x.dtype.is_float:
            values.append(-1)
        if x.dtype.is_float:
            values.append(self.rng.uniform(-2, 2))
        return self.const(self.rng.choice(values), x.dtype, x.shape)

    def nonzero(self, y: Node) -> Node:
        zero, minus1, three = (self.const(v, y.dtype, y.shape) for v in (0, -1 if y.dtype.is_signed else 0, 3))
        bad = ir.binary(Op.OR, ir.binary(Op.CMPEQ, y, zero), ir.binary(Op.CMPEQ, y, minus1))
        return ir.where(bad, three, y)

    def clamp_for_int(self, x: Node, target: dt.DType) -> Node:
        lo, hi = (max(target.min, -100), min(target.max, 100))
        lo_c, hi_c, zero = self.const(lo, x.dtype, x.shape), self.const(hi, x.dtype, x.shape), self.const(0, x.dtype, x.shape)
        x = ir.where(ir.binary(Op.CMPNE, x, x), zero, x)
        x = ir.where(ir.binary(Op.CMPLT, x, lo_c), lo_c, x)
        return ir.where(ir.binary(Op.CMPLT, hi_c, x), hi_c, x)

    # ----------------------------------------------------------------------------- ops
    def step(self) -> Node | None:
        x = self.rng.choice(self.nodes[-6:] if self.rng.random() < 0.7 else self.nodes)
        d, r = x.dtype, self.rng.random
        kind = self.rng.randrange(7)
        if kind == 6:
            return self.pattern(x)
        if kind == 0:  # movement
            return self.movement(x)
        if kind == 1 and d.is_numeric:  # reduction
            axes = [a for a in range(len(x.shape)) if r() < 0.5]
            return ir.reduce(Op.SUM if r() < 0.5 else Op.RMAX, x, tuple(axes))
        if kind == 2:  # cast or bitcast
            return self.convert(x)
        if d.is_float:
            if r() < 0.4:
                op = self.rng.choice([Op.NEG, Op.RECIP, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC])
                if op in (Op.SQRT, Op.LOG2):
                    x = ir.binary(Op.MUL, x, x)  # no negative operands (spec 6)
                return ir.unary(op, x)
            op = self.rng.choice([Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.CMPLT, Op.CMPEQ, Op.CMPNE])
            return ir.binary(op, x, self.like(x))
        if d.is_int:
            op = self.rng.choice([Op.ADD, Op.SUB, Op.MUL, Op.IDIV, Op.MOD, Op.MAX, Op.CMPLT, Op.CMPEQ, Op.AND,
                                  Op.OR, Op.XOR, Op.SHL, Op.SHR, Op.NEG])
            if op is Op.NEG:
                return ir.unary(Op.NEG, x) if d.is_signed else ir.unary(Op.NEG, ir.unary(Op.CAST, x, dt.i64))
            y = self.like(x)
            if op in (Op.IDIV, Op.MOD):
                y = self.nonzero(y)
            if op in (Op.SHL, Op.SHR):
                y = ir.binary(Op.AND, y, self.const(d.bits - 1, d, y.shape))
            return ir.binary(op, x, y)
        # bool
        if r() < 0.5:
            return ir.binary(self.rng.choice([Op.AND, Op.OR, Op.XOR, Op.CMPEQ, Op.CMPNE]), x, self.like(x))
        num = [n for n in self.nodes if n.shape == x.shape and n.dtype is not dt.bool_]
        if not num:
            return None
        a = self.rng.choice(num)
        return ir.where(x, a, self.like(a))

    def pattern(self, x: Node) -> Node:
        """Shapes of code that toolchains got wrong (issue 14), and the sources no other step makes."""
        rng, shape = self.rng, x.shape
        kind = rng.randrange(3)
        if kind == 0:  # where(c, where(c, a, b), d) and where(c, a, where(c, b, d)): GCC 12 at -O3 -mavx2
            conds = [n for n in self.nodes if n.dtype is dt.bool_ and n.shape == shape]
            c = rng.choice(conds) if conds and rng.random() < 0.7 else self.param(dt.bool_, shape)
            inner = ir.where(c, x, self.like(x))
            return ir.where(c, inner, self.like(x)) if rng.random() < 0.5 else ir.where(c, self.like(x), inner)
        if kind == 1 and x.dtype.is_int:  # max or sum of negated, masked ints: ptxas 13.0 on sm_90
            y = x if x.dtype.is_signed else ir.unary(Op.CAST, x, rng.choice([dt.i8, dt.i16, dt.i32, dt.i64]))
            y = ir.binary(Op.AND, y, self.const(rng.choice([1, 7, 31, 127]), y.dtype, shape))
            y = ir.binary(Op.MAX, y, self.const(0, y.dtype, shape))
            y = ir.unary(Op.NEG, y)
            axes = tuple(a for a in range(len(shape)) if rng.random() < 0.6)
            return ir.reduce(Op.RMAX if rng.random() < 0.7 else Op.SUM, y, axes)
        if shape and rng.random() < 0.7:
            return ir.iota(rng.choice(FLOATS + INTS), shape, rng.randrange(len(shape)))
        return self.const(rng.choice([0, 1, 2, -1]) if x.dtype.is_signed or x.dtype.is_float else 1, x.dtype, shape)

    def convert(self, x: Node) -> Node:
        target = self.rng.choice(FLOATS + INTS + [dt.bool_])
        if self.rng.random() < 0.2 and x.dtype is not dt.bool_ and not x.dtype.is_float:
            same = [d for d in FLOATS + INTS if d.bits == x.dtype.bits and d is not x.dtype]
            if same:
                return ir.unary(Op.BITCAST, x, self.rng.choice(same))  # ints to anything: exact bits
        if x.dtype.is_float and target.is_int:
            x = self.clamp_for_int(x, target)
        return ir.unary(Op.CAST, x, target)

    def movement(self, x: Node) -> Node:
        shape, rng = x.shape, self.rng
        kind = rng.randrange(6)
        if kind == 0:
            n = x.numel
            dims = []
            while n > 1 and len(dims) < 3:
                f = rng.choice([f for f in range(1, n + 1) if n % f == 0])
                dims.append(f)
                n //= f
            dims.append(n)
            rng.shuffle(dims)
            return ir.reshape(x, tuple(dims))
        if kind == 1 and shape:
            order = list(range(len(shape)))
            rng.shuffle(order)
            return ir.permute(x, tuple(order))
        if kind == 2 and 1 in shape:
            return ir.expand(x, tuple(rng.randint(2, 4) if s == 1 else s for s in shape))
        if kind == 3 and shape:
            before = tuple(rng.randint(0, 2) for _ in shape)
            after = tuple(rng.randint(0, 2) for _ in shape)
            value = rng.choice([0, 1, -1]) if x.dtype is not dt.bool_ else rng.choice([0, 1])
            if not x.dtype.is_signed and not x.dtype.is_float:
                value = abs(value)
            return ir.pad(x, before, after, data.literal_value(value, x.dtype, truncate=True))
        if kind == 4 and shape:
            start = tuple(rng.randint(0, s - 1) for s in shape)
            end = tuple(rng.randint(a + 1, s) for a, s in zip(start, shape))
            return ir.shrink(x, start, end)
        if shape:
            return ir.flip(x, tuple(a for a in range(len(shape)) if rng.random() < 0.5))
        return ir.reshape(x, (1,))


def random_program(seed: int, steps: int = 8) -> tuple[list[Node], dict[Node, np.ndarray]]:
    rng = random.Random(seed)
    g = Gen(rng)
    rank = rng.randint(0, 3)
    shape = tuple(rng.choice([1, 2, 3, 4, 5, 7, 33]) for _ in range(rank))  # odd sizes: masked edges, remainders
    if int(np.prod(shape)) > 4096:
        shape = tuple(min(d, 5) for d in shape)
    g.nodes.append(g.param(rng.choice(FLOATS + INTS + [dt.bool_]), shape))
    for _ in range(steps):
        node = g.step()
        if node is not None and node.numel <= 4096:
            g.nodes.append(node)
    outputs = [g.nodes[-1]] + [rng.choice(g.nodes) for _ in range(rng.choice([0, 0, 0, 1, 2]))]
    inputs = {}
    for i, p in enumerate(g.params):
        d = p.dtype
        if d.is_float:
            r = data.Rand(seed * 31 + i, scale=2.0)
        elif d.is_int:
            lo = -20 if d.is_signed else 0
            r = data.Rand(seed * 31 + i, lo=lo, hi=lo + 40)
        else:
            r = data.Rand(seed * 31 + i)
        inputs[p] = data.generate(r, d, p.numel).reshape(p.shape)
    return outputs, inputs


def program_text(seed: int, steps: int = 8) -> str:
    """random_program(seed, steps) as a test file, inputs as the rand lines that made them."""
    from ember.text import print_graph
    outputs, inputs = random_program(seed, steps)
    used = set(ir.toposort(outputs))
    params = list(inputs)
    lines = print_graph(outputs, {p: p.arg for p in params})
    for i, p in enumerate(params):
        if p not in used:
            continue
        d, s = p.dtype, seed * 31 + i
        spec = f"seed={s} scale=2" if d.is_float else f"seed={s} lo={-20 if d.is_signed else 0} hi={20 if d.is_signed else 40}" \
            if d.is_int else f"seed={s}"
        lines.append(f"input {p.arg} = rand {spec}")
    return "\n".join(lines) + "\n"


def layers_text(layers: int, rows: int, width: int) -> str:
    """A program of `layers` layers of one shape, h = relu(h @ w), as text: the kernels of its
    layers are equal up to their buffers (test_c_backend, test_cuda_source)."""
    lines = ["ember 1", f"h0 = param f32[{rows},{width}]"]
    for i in range(layers):
        lines += [f"w{i} = param f32[{width},{width}]", f"xr{i} = reshape h{i} shape=[{rows},{width},1]",
                  f"xe{i} = expand xr{i} shape=[{rows},{width},{width}]",
                  f"wr{i} = reshape w{i} shape=[1,{width},{width}]",
                  f"we{i} = expand wr{i} shape=[{rows},{width},{width}]", f"p{i} = mul xe{i} we{i}",
                  f"s{i} = sum p{i} axes=[1]", f"r{i} = reshape s{i} shape=[{rows},{width}]",
                  f"z{i} = const 0 f32[{rows},{width}]", f"h{i + 1} = max r{i} z{i}"]
    return "\n".join(lines + [f"return h{layers}"]) + "\n"


def tolerance(node: Node) -> tuple[float, float]:
    """Floats: sums run in any order, and libm's transcendental functions are not the reference's."""
    if node.dtype in (dt.f16, dt.bf16):
        return (2e-3, 2e-2) if node.dtype is dt.f16 else (2e-2, 4e-2)
    return (1e-4, 1e-3) if node.dtype is dt.f32 else (1e-9, 1e-7)


def compare(outputs: list[Node], got: list[np.ndarray], want: list[np.ndarray],
            precision: dt.DType | None = None) -> str | None:
    """None if got matches want; precision: the dtype whose tolerance applies, when values went
    through a less precise dtype than the outputs' (a gradient through a cast)."""
    for o, a, e in zip(outputs, got, want):
        if a.shape != e.shape:
            return f"shape {a.shape} != {e.shape}"
        atol, rtol = tolerance(ir.const(0, precision or _least_precise(o), ()))
        if o.dtype.is_float:
            a = _relax_huge(a, e)
        bad = data.first_mismatch(a, e, o.dtype, atol if o.dtype.is_float else None, rtol if o.dtype.is_float else None)
        if bad is not None:
            return f"{o.dtype}{list(o.shape)} element {bad}: got {a.reshape(-1)[bad]!r}, expected {e.reshape(-1)[bad]!r}"
    return None


def _least_precise(o: Node) -> dt.DType:
    """The least precise float dtype a value went through: an f32 exp2 cast to f64 is as exact as
    f32 (the GPU's exp2f is within 2 ulp, not correctly rounded), whatever the output's dtype."""
    order = [dt.bf16, dt.f16, dt.f32, dt.f64]
    floats = [n.dtype for n in ir.toposort([o]) if n.dtype in order and n.op not in (Op.PARAM, Op.CONST)]
    return min(floats, key=order.index) if o.dtype.is_float and floats else o.dtype


def _relax_huge(a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Elements beyond 1e6 (products of exp2s, recips of tiny values) amplify last-bit differences
    of the operations before them: there, 1% relative agreement counts as agreement."""
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(all="ignore"):
        close = np.isfinite(e64) & (np.abs(e64) > 1e6) & (np.abs(a64 - e64) <= 1e-2 * np.abs(e64))
    return np.where(close, e, a)
