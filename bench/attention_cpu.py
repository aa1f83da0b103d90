"""Attention on the CPU in O(S*D) memory: Ember's C backend beside numpy materializing the
S x S scores, each in a fresh process so that its peak resident memory is its own.

    python bench/attention_cpu.py [--seq 8192] [--dim 64] [--causal]

The program is the primitive graph (expand-mul-sum for q.k, max, exp2, sum, div, expand-mul-sum
with v); nothing names attention. Ember fuses it into one kernel that recomputes each row's
scores on every pass over the row instead of storing them.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def program(s: int, d: int, causal: bool, batch: int = 1) -> tuple:
    """(params q, k, v, [the output]) of softmax(q k^T / sqrt(d) [causal]) v, [batch, s, d] f32."""
    from ember import dtype as dt
    from ember import ir
    from ember.ir import Op
    b = batch
    q, k, v = (ir.param(n, dt.f32, (b, s, d)) for n in "qkv")
    dot = ir.binary(Op.MUL, ir.expand(ir.reshape(q, (b, s, 1, d)), (b, s, s, d)),
                    ir.expand(ir.reshape(k, (b, 1, s, d)), (b, s, s, d)))
    sc = ir.binary(Op.MUL, ir.reshape(ir.reduce(Op.SUM, dot, (3,)), (b, s, s)), ir.const(d ** -0.5, dt.f32, (b, s, s)))
    if causal:
        future = ir.binary(Op.CMPLT, ir.iota(dt.i32, (b, s, s), 1), ir.iota(dt.i32, (b, s, s), 2))
        sc = ir.where(future, ir.const(-float("inf"), dt.f32, (b, s, s)), sc)
    m = ir.expand(ir.reduce(Op.RMAX, sc, (2,)), (b, s, s))
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, ir.binary(Op.SUB, sc, m), ir.const(1.4426950408889634, dt.f32, (b, s, s))))
    p = ir.binary(Op.DIV, e, ir.expand(ir.reduce(Op.SUM, e, (2,)), (b, s, s)))
    o = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.expand(ir.reshape(p, (b, s, s, 1)), (b, s, s, d)),
                                    ir.expand(ir.reshape(v, (b, 1, s, d)), (b, s, s, d))), (2,))
    return [q, k, v], [ir.reshape(o, (b, s, d))]


def inputs(s: int, d: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, s, d)).astype(np.float32) for _ in range(3)]


def run_ember(s: int, d: int, causal: bool, out: mp.Queue) -> None:
    from ember.backend import c
    params, outputs = program(s, d, causal)
    prog = c.CProgram(outputs)
    run = prog.bind(dict(zip(params, inputs(s, d))))
    t = time.perf_counter()
    result = run()[0]
    seconds = time.perf_counter() - t
    temps = sum(b.nbytes for b in prog.sched.temps)
    out.put(("ember", seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, len(prog.sched.kernels), temps,
             result[0, :4, :4].copy()))


def run_numpy(s: int, d: int, causal: bool, out: mp.Queue) -> None:
    q, k, v = (x[0] for x in inputs(s, d))
    t = time.perf_counter()
    scores = (q @ k.T) * d ** -0.5
    if causal:
        scores[np.triu_indices(s, 1)] = -np.inf
    scores = np.exp(scores - scores.max(1, keepdims=True))
    result = (scores / scores.sum(1, keepdims=True)) @ v
    seconds = time.perf_counter() - t
    out.put(("numpy", seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 0, s * s * 4, result[:4, :4]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    rows = {}
    for fn in (run_ember, run_numpy):
        q: mp.Queue = ctx.Queue()
        p = ctx.Process(target=fn, args=(args.seq, args.dim, args.causal, q))
        p.start()
        name, seconds, rss_kb, kernels, stored, corner = q.get()
        p.join()
        rows[name] = corner
        print(f"{name:6s} S={args.seq} D={args.dim}{' causal' if args.causal else ''}: {seconds:7.2f} s, "
              f"peak RSS {rss_kb / 1024:8.1f} MB, {kernels} kernels, stored beside inputs and output "
              f"{stored / 2**20:8.1f} MB", flush=True)
    print(f"results agree: max |difference| {np.abs(rows['ember'] - rows['numpy']).max():.2e} (a 4x4 corner)")


if __name__ == "__main__":
    main()
