"""Symbolic index simplification, fuzzed: thousands of random expressions over small ranges,
simplified and unsimplified, evaluated by brute force with C semantics; zero mismatches."""
from __future__ import annotations

import itertools
import random

from ember import dtype as dt
from ember.compiler import symbolic as sym
from ember.ir import Node, Op, toposort


def c_eval(root: Node, env: dict[Node, int]) -> int:
    vals: dict[Node, int] = {}
    for n in toposort([root]):
        a = [vals[s] for s in n.srcs]
        op = n.op
        if op is Op.RANGE:
            v = env[n]
        elif op is Op.CONST:
            v = int(n.arg)
        elif op is Op.ADD:
            v = a[0] + a[1]
        elif op is Op.SUB:
            v = a[0] - a[1]
        elif op is Op.MUL:
            v = a[0] * a[1]
        elif op in (Op.IDIV, Op.MOD):
            q = abs(a[0]) // abs(a[1])
            q = q if (a[0] < 0) == (a[1] < 0) else -q
            v = q if op is Op.IDIV else a[0] - q * a[1]
        elif op is Op.CMPLT:
            v = int(a[0] < a[1])
        elif op is Op.AND:
            v = a[0] & a[1]
        elif op is Op.WHERE:
            v = a[1] if a[0] else a[2]
        else:
            raise AssertionError(op)
        vals[n] = v
    return vals[root]


def random_expr(rng: random.Random, ranges: list[Node], depth: int) -> Node:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(ranges) if rng.random() < 0.75 else sym.const(rng.randint(-6, 12))
    kind = rng.randrange(8)
    a = random_expr(rng, ranges, depth - 1)
    if kind <= 1:
        return sym.add(a, random_expr(rng, ranges, depth - 1))
    if kind == 2:
        return sym.mul(a, sym.const(rng.randint(-3, 8)))
    if kind == 3:
        return Node(Op.SUB, dt.i32, (a, random_expr(rng, ranges, depth - 1)))
    if kind == 4:
        return sym.idiv(a, rng.randint(1, 9))
    if kind == 5:
        return sym.mod(a, rng.randint(1, 9))
    if kind == 6:
        return sym.mul(a, random_expr(rng, ranges, depth - 1))
    cond = sym.lt(a, sym.const(rng.randint(-2, 10)))
    return Node(Op.WHERE, dt.i32, (cond, random_expr(rng, ranges, depth - 1), a))


def test_fuzz_simplify_matches_brute_force() -> None:
    rng = random.Random(7)
    changed = 0
    for trial in range(3000):
        ranges = [sym.rng(f"r{i}", rng.randint(1, 6)) for i in range(rng.randint(1, 3))]
        expr = random_expr(rng, ranges, rng.randint(1, 5))
        (simple,) = sym.simplify([expr])
        changed += simple is not expr
        for values in itertools.product(*(range(r.arg[1]) for r in ranges)):
            env = dict(zip(ranges, values))
            assert c_eval(simple, env) == c_eval(expr, env), (trial, expr, simple, env)
    assert changed > 1000


def test_reshape_round_trip_folds_to_the_ranges() -> None:
    i, j = sym.rng("i", 3), sym.rng("j", 4)
    flat = sym.add(sym.mul(i, sym.const(4)), j)
    assert sym.simplify([sym.idiv(flat, 4), sym.mod(flat, 4)]) == [i, j]


def test_rows_read_through_a_reshape_fold() -> None:
    """[16384, V] read as [16, 1024, V] and back (a matmul's flattened rows): r*V + v again,
    with no division (it once cost the GPT head a copy of its logits' gradient)."""
    r, v = sym.rng("r", 16384), sym.rng("v", 50304)
    flat = sym.add(sym.mul(r, sym.const(50304)), v)
    b, t, c = sym.idiv(flat, 1024 * 50304), sym.mod(sym.idiv(flat, 50304), 1024), sym.mod(flat, 50304)
    back = sym.add(sym.add(sym.mul(b, sym.const(1024 * 50304)), sym.mul(t, sym.const(50304))), c)
    (simple,) = sym.simplify([back])
    assert sym.linear(simple) == ({r: 50304, v: 1}, 0)
    (row,) = sym.simplify([sym.mod(sym.add(sym.mul(r, sym.const(8)), sym.mod(v, 8)), 64)])
    assert c_eval(row, {r: 9, v: 13}) == (9 * 8 + 5) % 64 and not any(n.op is Op.IDIV for n in toposort([row]))


def test_bounds_decide_comparisons() -> None:
    i = sym.rng("i", 8)
    assert sym.simplify([sym.lt(i, sym.const(8))])[0].arg == 1
    assert sym.simplify([sym.lt(sym.add(i, sym.const(1)), sym.const(1))])[0].arg == 0
    assert sym.simplify([sym.lt(i, sym.const(3))])[0].op is Op.CMPLT


def test_deep_graph_does_not_recurse() -> None:
    x = sym.rng("i", 5)
    for k in range(20000):
        x = sym.add(x, sym.const(1))
    (s,) = sym.simplify([x])
    assert s.op is Op.ADD and s.srcs[1].arg == 20000


def test_and_with_constant_folds_only_for_bool() -> None:
    """Regression: `x & 3` on int data once became `x` (the bool rule `true & x -> x` matched)."""
    x = Node(Op.LOAD, dt.i32, (Node(Op.BUFFER, dt.i32, (), 0), sym.rng("i", 4)))
    masked = Node(Op.AND, dt.i32, (x, sym.const(3)))
    assert sym.simplify([masked]) == [masked]
    cond = sym.lt(sym.rng("i", 4), sym.const(2))
    assert sym.simplify([sym.and_(sym.true(), cond)]) == [cond]


def test_bounds_of_int_and() -> None:
    """Regression: bounds once took every AND as bool ([0, 1]), so (x & 2) // 2 folded to 0."""
    x = Node(Op.LOAD, dt.u16, (Node(Op.BUFFER, dt.u16, (), 0), sym.rng("i", 4)))
    masked = Node(Op.AND, dt.u16, (x, Node(Op.CONST, dt.u16, (), 2)))
    assert sym.bounds(masked) == (0, 2)
    q = Node(Op.IDIV, dt.u16, (masked, Node(Op.CONST, dt.u16, (), 2)))
    assert sym.simplify([q]) == [q]


def test_coarsened_comparisons_match_brute_force() -> None:
    """K < g*i + l (l below g, a lane) is decided by i alone; fuzzed over both directions,
    constants on either side and a second term, against brute force (symbolic._coarsen_lt)."""
    rng = random.Random(11)
    coarsened = 0
    for trial in range(2000):
        g = rng.choice([2, 4, 8])
        i, lane, j = sym.rng("i", rng.randint(1, 12)), sym.rng("l", g), sym.rng("j", rng.randint(1, 4))
        form = sym.add(sym.add(sym.mul(i, sym.const(g)), lane), sym.mul(j, sym.const(g * rng.randint(-2, 2))))
        k = sym.const(rng.randint(-10, 40))
        cond = sym.lt(k, form) if rng.random() < 0.5 else sym.lt(form, k)
        (simple,) = sym.simplify([cond])
        coarsened += lane not in toposort([simple])
        for env in itertools.product(range(i.arg[1]), range(g), range(j.arg[1])):
            values = dict(zip((i, lane, j), env))
            assert c_eval(simple, values) == c_eval(cond, values), (trial, cond, simple, values)
    assert coarsened > 1000


def test_given_keeps_the_address_wherever_the_guard_holds() -> None:
    """A concatenation's piece [b, b + n) of a column range c, its rows r of n values read back
    as [rows, n / d, d] (heads): symbolic.given rewrites the address for where the guard holds.
    It must agree there, and the row's division by n folds (c - b is in [0, n) there)."""
    rng = random.Random(5)
    fewer = 0
    for trial in range(300):
        d = rng.choice([2, 4, 8])
        n = d * rng.randint(2, 4)
        b = rng.randint(0, 3) * d + rng.choice([0, 0, 1])
        c = sym.rng("c", b + n + rng.randint(0, 6))
        r = sym.rng("r", rng.randint(1, 3))
        flat = sym.add(sym.mul(r, sym.const(n)), Node(Op.SUB, dt.i32, (c, sym.const(b))))
        row, head, e = sym.idiv(flat, n), sym.mod(sym.idiv(flat, d), n // d), sym.mod(flat, d)
        index = sym.add(sym.add(sym.mul(row, sym.const(1000)), sym.mul(head, sym.const(30))), e)
        valid = sym.and_(sym.lt(sym.const(b - 1), c), sym.lt(c, sym.const(b + n)))
        (plain,) = sym.simplify([index])
        got = sym.given(plain, valid)
        for cv, rv in itertools.product(range(c.arg[1]), range(r.arg[1])):
            env = {c: cv, r: rv}
            if c_eval(valid, env):
                assert c_eval(got, env) == c_eval(index, env), (trial, index, got, env)
        divisions = [sum(x.op in (Op.IDIV, Op.MOD) for x in toposort([y])) for y in (plain, got)]
        assert divisions[1] <= divisions[0]
        fewer += divisions[1] < divisions[0]
    assert fewer > 100, fewer


def test_remembered_normal_forms_are_the_same_and_reused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Within one compilation (sym.remembered) simplify keeps the normal forms it found: the same
    results as without, a repeated expression costs no rule application, and none is kept after."""
    rng = random.Random(11)
    ranges = [sym.rng(f"m{i}", 5) for i in range(3)]
    exprs = [random_expr(rng, ranges, 4) for _ in range(200)]
    plain = [sym.simplify([e])[0] for e in exprs]
    applied: list[Node] = []
    real = sym.RULES.apply
    monkeypatch.setattr(sym.RULES, "apply", lambda n: applied.append(n) or real(n))
    with sym.remembered():
        assert [sym.simplify([e])[0] for e in exprs] == plain
        first = len(applied)
        assert [sym.simplify([e])[0] for e in exprs] == plain and len(applied) == first
    sym.simplify(exprs[:1])
    assert len(applied) > first
