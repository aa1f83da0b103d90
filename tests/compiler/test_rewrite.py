"""The rewrite engine and the algebraic simplification rules."""
from __future__ import annotations

from ember import dtype as dt
from ember import ir
from ember.compiler.rewrite import P, RuleSet, rewrite
from ember.compiler.simplify import simplify
from ember.ir import Node, Op


def x32(name: str = "x", shape: tuple[int, ...] = (4,)) -> Node:
    return ir.param(name, dt.f32, shape)


def test_pattern_binds_and_commutes() -> None:
    x = x32()
    one = ir.const(1.0, dt.f32, (4,))
    rules = RuleSet([(P(Op.MUL, P(name="a"), P(Op.CONST, arg=1.0)), lambda a: a)])
    assert rewrite([ir.binary(Op.MUL, one, x)], rules) == [x]  # matched with the operands swapped


def test_rewrite_reaches_fixed_point_through_new_nodes() -> None:
    x = x32()
    y = ir.unary(Op.NEG, ir.unary(Op.NEG, ir.unary(Op.NEG, ir.unary(Op.NEG, x))))
    assert simplify([y]) == [x]


def test_rewrite_is_iterative_on_deep_graphs() -> None:
    x = x32()
    y = x
    for _ in range(100_000):
        y = ir.unary(Op.NEG, y)
    assert simplify([y]) == [x]


def test_identities_respect_float_semantics() -> None:
    x = x32()
    zero, negzero = ir.const(0.0, dt.f32, (4,)), ir.const(-0.0, dt.f32, (4,))
    assert simplify([ir.binary(Op.ADD, x, negzero)]) == [x]
    kept = ir.binary(Op.ADD, x, zero)  # -0 + 0 is +0: not an identity
    assert simplify([kept]) == [kept]
    i = ir.param("i", dt.i32, (4,))
    assert simplify([ir.binary(Op.ADD, i, ir.const(0, dt.i32, (4,)))]) == [i]


def test_integer_constants_fold_with_wrapping() -> None:
    a, b = ir.const(100, dt.i8, (2,)), ir.const(100, dt.i8, (2,))
    (s,) = simplify([ir.binary(Op.ADD, a, b)])
    assert s.op is Op.CONST and s.arg == -56


def test_cast_of_cast_only_when_exact() -> None:
    h = ir.param("h", dt.f16, (3,))
    wide = ir.unary(Op.CAST, ir.unary(Op.CAST, h, dt.f32), dt.f64)
    assert simplify([wide])[0].srcs == (h,)
    i = ir.param("i", dt.i32, (3,))
    lossy = ir.unary(Op.CAST, ir.unary(Op.CAST, i, dt.i8), dt.i32)
    assert simplify([lossy]) == [lossy]


def test_movement_chains_collapse() -> None:
    x = x32("x", (2, 3, 4))
    y = ir.permute(ir.permute(x, (2, 0, 1)), (1, 2, 0))
    assert simplify([y]) == [x]
    r = ir.reshape(ir.reshape(x, (6, 4)), (24,))
    assert simplify([r]) == [ir.reshape(x, (24,))]
    s = ir.shrink(ir.shrink(x, (1, 0, 0), (2, 3, 4)), (0, 1, 1), (1, 3, 3))
    assert simplify([s]) == [ir.shrink(x, (1, 1, 1), (2, 3, 3))]
    f = ir.flip(ir.flip(x, (0, 2)), (2,))
    assert simplify([f]) == [ir.flip(x, (0,))]


def test_concatenation_of_narrow_pieces_stays_narrow_and_exact() -> None:
    """pad(f32(a)) + pad(f32(b)) + pad(f32(c)), bf16 pieces side by side (q, k and v's gradients
    into their projection's): rewritten as f32 of the bf16 concatenation, the same value for
    every input, -0.0, infinities and NaN included; overlapping pieces are left alone."""
    import numpy as np

    from ember import ref
    pieces = [ir.param(n, dt.bf16, (3, 4)) for n in "abc"]
    pads = [ir.pad(ir.unary(Op.CAST, p, dt.f32), (0, 4 * i), (0, 8 - 4 * i), 0.0) for i, p in enumerate(pieces)]
    cat = ir.binary(Op.ADD, ir.binary(Op.ADD, pads[0], pads[1]), pads[2])
    (out,) = simplify([cat])
    assert out.op is Op.CAST and out.srcs[0].dtype is dt.bf16
    rng = np.random.default_rng(0)
    special = np.array([-0.0, np.inf, -np.inf, np.nan], np.float32)
    values = [rng.permutation(np.concatenate([rng.standard_normal(8).astype(np.float32), special])) for _ in pieces]
    inputs = {p: (v.view(np.uint32) & 0xFFFF0000).view(np.float32).reshape(3, 4)   # bf16 values
              for p, v in zip(pieces, values)}
    want, got = ref.evaluate([cat], inputs)[0], ref.evaluate([out], inputs)[0]
    assert np.array_equal(np.signbit(want), np.signbit(got)) and np.array_equal(want, got, equal_nan=True)
    overlap = ir.binary(Op.ADD, pads[0], ir.pad(ir.unary(Op.CAST, pieces[1], dt.f32), (0, 2), (0, 6), 0.0))
    assert simplify([overlap])[0].op is Op.ADD
