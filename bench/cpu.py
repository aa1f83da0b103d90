"""CPU benchmark: Ember's C backend beside numpy, same machine, same run.

    python bench/cpu.py [--quick] [--only NAME]

For each program: kernels Ember runs, median time of Ember and of numpy doing the same work,
the speed ratio (numpy time / Ember time: above 1 Ember is faster), the rate (GB/s counted as
bytes that must move: inputs read once, outputs written once; GFLOP/s for matmul), and the
compile time cold (empty cache: codegen + cc) and cached (codegen + load from the disk cache).
Each result is checked against numpy before it is timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember import (
    data,  # noqa: E402
    ir,  # noqa: E402
)
from ember import dtype as dt  # noqa: E402
from ember.backend import c  # noqa: E402
from ember.ir import Node, Op  # noqa: E402

F32 = dt.f32


def const(v: float, shape: tuple[int, ...]) -> Node:
    return ir.const(literal(v, F32), F32, shape)


def literal(v: float, dtype: dt.DType) -> float:
    """v as a const of dtype holds it: rounded to the dtype (ir.const's precondition)."""
    return float(data.literal_value(v, dtype, True))


def bcast(x: Node, shape: tuple[int, ...]) -> Node:
    return ir.expand(x, shape)


def chain8(n: int) -> tuple[list[Node], list[Node], Callable]:
    x = ir.param("x", F32, (n,))
    s = (n,)
    y = ir.binary(Op.MUL, x, const(1.5, s))
    y = ir.binary(Op.ADD, y, const(0.5, s))
    y = ir.binary(Op.MAX, y, const(0.0, s))
    y = ir.binary(Op.SUB, y, const(0.25, s))
    y = ir.binary(Op.MUL, y, x)
    y = ir.binary(Op.ADD, y, const(1.0, s))
    y = ir.binary(Op.MUL, y, y)
    y = ir.binary(Op.SUB, y, x)

    def ref(x: np.ndarray) -> np.ndarray:
        y = x * np.float32(1.5)
        y = y + np.float32(0.5)
        y = np.maximum(y, np.float32(0))
        y = y - np.float32(0.25)
        y = y * x
        y = y + np.float32(1)
        y = y * y
        return y - x
    return [x], [y], ref


def softmax(n: int, m: int, dtype: dt.DType = F32) -> tuple[list[Node], list[Node], Callable]:
    x = ir.param("x", dtype, (n, m))
    mx = bcast(ir.reduce(Op.RMAX, x, (1,)), (n, m))
    log2e = ir.const(literal(1.4426950408889634, dtype), dtype, (n, m))
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, ir.binary(Op.SUB, x, mx), log2e))
    p = ir.binary(Op.DIV, e, bcast(ir.reduce(Op.SUM, e, (1,)), (n, m)))

    def ref(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    return [x], [p], ref


def log_softmax(n: int, m: int, dtype: dt.DType = F32) -> tuple[list[Node], list[Node], Callable]:
    """x - max - log(sum(exp(x - max))) along rows, with exp2 and log2 as the IR has them."""
    x = ir.param("x", dtype, (n, m))
    d = ir.binary(Op.SUB, x, bcast(ir.reduce(Op.RMAX, x, (1,)), (n, m)))
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, d, ir.const(literal(1.4426950408889634, dtype), dtype, (n, m))))
    lse = ir.binary(Op.MUL, ir.unary(Op.LOG2, ir.reduce(Op.SUM, e, (1,))),
                    ir.const(literal(0.6931471805599453, dtype), dtype, (n, 1)))
    y = ir.binary(Op.SUB, d, bcast(lse, (n, m)))

    def ref(x: np.ndarray) -> np.ndarray:
        d = x - x.max(1, keepdims=True)
        return d - np.log(np.exp(d).sum(1, keepdims=True))
    return [x], [y], ref


def layernorm(n: int, m: int, dtype: dt.DType = F32) -> tuple[list[Node], list[Node], Callable]:
    x = ir.param("x", dtype, (n, m))
    c = lambda v, shape: ir.const(literal(v, dtype), dtype, shape)  # noqa: E731
    inv = c(1.0 / m, (n, 1))
    mu = ir.binary(Op.MUL, ir.reduce(Op.SUM, x, (1,)), inv)
    d = ir.binary(Op.SUB, x, bcast(mu, (n, m)))
    var = ir.binary(Op.MUL, ir.reduce(Op.SUM, ir.binary(Op.MUL, d, d), (1,)), inv)
    r = ir.unary(Op.RECIP, ir.unary(Op.SQRT, ir.binary(Op.ADD, var, c(1e-5, (n, 1)))))
    y = ir.binary(Op.MUL, d, bcast(r, (n, m)))

    def ref(x: np.ndarray) -> np.ndarray:
        mu = x.mean(1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + np.float32(1e-5))
    return [x], [y], ref


def reduce_sum(n: int, m: int | None, axes: tuple[int, ...],
               dtype: dt.DType = F32) -> tuple[list[Node], list[Node], Callable]:
    """The sum of an n x m array over axes, or of a vector of n (m None, axes (0,))."""
    x = ir.param("x", dtype, (n,) if m is None else (n, m))
    return [x], [ir.reduce(Op.SUM, x, axes)], lambda x: x.sum(axis=axes, keepdims=True)


def matmul(n: int) -> tuple[list[Node], list[Node], Callable]:
    a, b = ir.param("a", F32, (n, n)), ir.param("b", F32, (n, n))
    ae = ir.expand(ir.reshape(a, (n, n, 1)), (n, n, n))
    be = ir.expand(ir.reshape(b, (1, n, n)), (n, n, n))
    c_ = ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, ae, be), (1,)), (n, n))
    return [a, b], [c_], lambda a, b: a @ b


def median_time(fn: Callable[[], object], min_reps: int = 3, budget: float = 1.5) -> float:
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget and len(times) < 50):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compile_times(program: Callable[[list[Node]], Any], outputs: list[Node]) -> tuple[Any, float, float]:
    """Build the program with an empty disk cache (cold), then again from the cache (cached)."""
    with tempfile.TemporaryDirectory() as d:
        old = os.environ.get("EMBER_CACHE")
        os.environ["EMBER_CACHE"] = d
        try:
            t = time.perf_counter()
            program(outputs)
            cold = time.perf_counter() - t
            t = time.perf_counter()
            prog = program(outputs)
            cached = time.perf_counter() - t
        finally:
            if old is None:
                del os.environ["EMBER_CACHE"]
            else:
                os.environ["EMBER_CACHE"] = old
    return prog, cold, cached


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke test")
    ap.add_argument("--only", help="run the cases whose name contains this")
    args = ap.parse_args()
    big, vec = (1024, 1 << 20) if args.quick else (4096, 1 << 24)
    cases = [
        (f"chain of 8 elementwise ops, f32 {vec}", chain8(vec), "bw"),
        (f"softmax rows f32 {big}x{big}", softmax(big, big), "bw"),
        (f"layernorm rows f32 {big}x{big}", layernorm(big, big), "bw"),
        (f"sum axis 1 (rows) f32 {big}x{big}", reduce_sum(big, big, (1,)), "bw"),
        (f"sum axis 0 (columns) f32 {big}x{big}", reduce_sum(big, big, (0,)), "bw"),
        (f"sum all f32 {big}x{big}", reduce_sum(big, big, (0, 1)), "bw"),
    ] + [(f"matmul f32 {n}", matmul(n), "flops") for n in ((256, 512) if args.quick else (256, 1024, 2048))]
    rng = np.random.default_rng(0)
    print(f"{'program':40s} {'kernels':>7s} {'ember ms':>9s} {'numpy ms':>9s} {'ratio':>6s} {'rate':>14s} "
          f"{'cold s':>7s} {'cached s':>8s}")
    for name, (params, outputs, ref), unit in cases:
        if args.only and args.only not in name:
            continue
        inputs = {p: rng.standard_normal(p.shape, dtype=np.float32) for p in params}
        prog, cold, cached = compile_times(c.CProgram, outputs)
        run = prog.bind(inputs)
        got = run()[0]
        want = ref(*[inputs[p] for p in params])
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max())):
            print(f"{name}: WRONG RESULT (max error {np.abs(got - want).max()})")
            continue
        t_ember = median_time(run)
        t_numpy = median_time(lambda: ref(*[inputs[p] for p in params]))
        if unit == "flops":
            n = params[0].shape[0]
            rate = f"{2 * n ** 3 / t_ember / 1e9:7.1f} GFLOP/s"
        else:
            nbytes = sum(p.numel * 4 for p in params) + sum(o.numel * 4 for o in outputs)
            rate = f"{nbytes / t_ember / 1e9:8.2f} GB/s"
        print(f"{name:40s} {len(prog.sched.kernels):7d} {t_ember * 1e3:9.2f} {t_numpy * 1e3:9.2f} "
              f"{t_numpy / t_ember:6.2f} {rate:>14s} {cold:7.2f} {cached:8.3f}", flush=True)


if __name__ == "__main__":
    main()
