"""Attention on the GPU: Ember's flash kernels, derived from the primitive graph (expand-mul-sum,
iota mask, max, exp2, sum, div, expand-mul-sum), beside PyTorch's SDPA flash in the same run.

    PYTHONPATH=. python3 bench/attention_gpu.py [--quick | --f32-memory]

bf16, 16k tokens a batch (batch = 16384 / S) and a model width of 2048 (heads = 2048 / D), as
FlashAttention's own benchmarks. FLOPs: 4 B H S^2 D for the forward (two matmuls), 2.5 times
that for the backward; causal counts half. "program" times Ember's whole compiled program (its
layout copies and casts included), "kernel" the flash kernels alone. Every result is checked
against PyTorch before it is timed. Peak: 989 TFLOP/s (H200, dense bf16).
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import cuda_time, device_memory_used  # noqa: E402

from ember import data, ir  # noqa: E402
from ember import dtype as dt  # noqa: E402
from ember.backend import cuda  # noqa: E402
from ember.compiler import schedule  # noqa: E402
from ember.ir import Op  # noqa: E402

PEAK = 989e12


def matmul(a: ir.Node, b: ir.Node) -> ir.Node:
    *lead, m, k = a.shape
    n = b.shape[-1]
    lead = tuple(lead)
    ae = ir.expand(ir.reshape(a, lead + (m, k, 1)), lead + (m, k, n))
    be = ir.expand(ir.reshape(b, lead + (1, k, n)), lead + (m, k, n))
    return ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, ae, be), (len(lead) + 1,)), lead + (m, n))


def attention(q: ir.Node, k: ir.Node, v: ir.Node, causal: bool) -> ir.Node:
    """softmax(q k^T / sqrt(d), causal mask from iotas) v, all bf16, as a program would write it."""
    *lead, s, d = q.shape
    shape = tuple(lead) + (s, s)
    kt = ir.permute(k, tuple(range(len(lead))) + (len(lead) + 1, len(lead)))
    sc = ir.binary(Op.MUL, matmul(q, kt), ir.const(1 / math.sqrt(d), q.dtype, shape))
    if causal:
        future = ir.binary(Op.CMPLT, ir.iota(dt.i32, shape, len(lead)), ir.iota(dt.i32, shape, len(lead) + 1))
        sc = ir.where(future, ir.const(-math.inf, q.dtype, shape), sc)
    m = ir.expand(ir.reduce(Op.RMAX, sc, (len(shape) - 1,)), shape)
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, ir.binary(Op.SUB, sc, m), ir.const(1 / math.log(2), q.dtype, shape)))
    p = ir.binary(Op.DIV, e, ir.expand(ir.reduce(Op.SUM, e, (len(shape) - 1,)), shape))
    return matmul(p, v)


def fused_ms(prog: cuda.CUDAProgram) -> float:
    """Milliseconds of the program's flash kernels alone."""
    return sum(cuda.time_kernel(k, cuda.device_target()) for k in prog.sched.kernels if k.fused is not None) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="S = 1024 and 4096, D = 64")
    ap.add_argument("--only", default=None, help="the rows whose \"case pass\" this regular expression finds")
    ap.add_argument("--f32-memory", action="store_true",
                    help="only f32 attention's device memory and time at S = 1024, 2048, 4096 (issue 9: not S^2)")
    args = ap.parse_args()
    if args.f32_memory:
        f32_memory()
        return
    print(f"{'case':28} {'pass':8} {'Ember TFLOP/s':>13} {'(kernel)':>9} {'SDPA':>7} {'ratio':>6} {'% peak':>7} "
          f"{'ms':>7} {'compile':>8}")
    for d in (64, 128):
        for s in (1024, 4096, 16384):
            if args.quick and (d != 64 or s > 4096):
                continue
            for causal in (False, True):
                run_case(d, s, causal, args.only)


def f32_memory() -> None:
    """f32 attention (no autocast), causal, D = 64, 8 heads, forward: the device memory Ember's
    program holds, as planned (its buffers, temporaries sharing an arena) and as measured (the GPU's
    memory in use after its runs less before it was built: Ember frees nothing in between),
    beside PyTorch's peak for SDPA on f32 and both times; then whether Ember's memory grows as
    S^2 (16x from S = 1024 to 4096) or as S (4x)."""
    print(f"{'f32 attention, causal, D=64, 8 heads':38} {'planned MiB':>11} {'measured MiB':>12} "
          f"{'SDPA peak MiB':>14} {'Ember ms':>9} {'SDPA ms':>8} {'ratio':>6} {'error':>8}")
    held = {}
    for s in (1024, 2048, 4096):
        g = torch.Generator(device="cuda").manual_seed(0)
        tq, tk, tv = (torch.randn((1, 8, s, 64), device="cuda", generator=g) for _ in range(3))
        torch.cuda.synchronize()
        before = device_memory_used()
        q, k, v = (ir.param(n, dt.f32, (1, 8, s, 64)) for n in "qkv")
        prog = cuda.CUDAProgram([attention(q, k, v, True)])
        sched = prog.sched
        planned = sum(schedule.footprint(sched).values())
        inputs = {p: x.cpu().numpy() for p, x in zip((q, k, v), (tq, tk, tv))}
        got, times = prog.timed(inputs, 5)
        measured = (device_memory_used() - before) * 2**30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        peak = torch.cuda.max_memory_allocated() - base
        torch_ms = cuda_time(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)) * 1e3
        err = float(np.abs(got[0] - want.cpu().numpy()).max() / np.abs(want.cpu().numpy()).max())
        held[s] = planned
        ember_ms = statistics.median(times)
        print(f"S={s:<36} {planned / 2**20:11.1f} {measured / 2**20:12.1f} {peak / 2**20:14.1f} "
              f"{ember_ms:9.2f} {torch_ms:8.2f} {torch_ms / ember_ms:6.2f} {err:8.1e}", flush=True)
        prog.free()
    growth = held[4096] / held[1024]
    kind = "S^2: the scores are in memory" if growth > 8 else "linear in S"
    print(f"S 1024 -> 4096: Ember's memory x{growth:.1f} ({kind})")


def run_case(d: int, s: int, causal: bool, only: str | None = None) -> None:
    b, h = max(1, 16384 // s), 2048 // d
    name = f"D={d} S={s} B={b} H={h}{' causal' if causal else ''}"
    if only and not any(re.search(only, f"{name} {label}") for label in ("fwd", "fwd+bwd")):
        return
    q, k, v, w = (ir.param(n, dt.bf16, (b, h, s, d)) for n in "qkvw")
    o = attention(q, k, v, causal)
    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, o, dt.f32), ir.unary(Op.CAST, w, dt.f32)),
                     (0, 1, 2, 3))
    g = torch.Generator(device="cuda").manual_seed(0)
    tq, tk, tv, tw = (torch.randn((b, h, s, d), device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    inputs = {p: data.to_storage(x.float().cpu().numpy(), dt.bf16) for p, x in zip((q, k, v, w), (tq, tk, tv, tw))}
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    tq.requires_grad_(True), tk.requires_grad_(True), tv.requires_grad_(True)

    def torch_fwd() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def torch_both() -> None:
        (torch_fwd().float() * tw.float()).sum().backward()

    both = [o] + [ir.grad(loss, x) for x in (q, k, v)]
    for label, outputs, work, peer in (("fwd", [o], flops, torch_fwd), ("fwd+bwd", both, 3.5 * flops, torch_both)):
        if only and not re.search(only, f"{name} {label}"):
            continue
        t0 = time.perf_counter()
        prog = cuda.CUDAProgram(outputs)
        compile_s = time.perf_counter() - t0
        got, times = prog.timed(inputs, 10)
        torch_fwd_out = torch_fwd()
        want = [torch_fwd_out]
        if label == "fwd+bwd":
            tq.grad = tk.grad = tv.grad = None
            torch_both()
            want += [tq.grad, tk.grad, tv.grad]
        err = 0.0
        for a, wt in zip(got, want):
            theirs = wt.detach().float().cpu().numpy()
            mine = np.asarray(data.from_storage(a, dt.bf16), np.float64)
            err = max(err, float(np.abs(mine - theirs).max() / np.abs(theirs).max()))
        ember_s = statistics.median(times) / 1e3
        kernel_s = fused_ms(prog) / 1e3
        torch_s = cuda_time(peer)
        bad = "" if err < 3e-2 else f"  WRONG (max error {err:.2e} of the largest value)"
        print(f"{name:28} {label:8} {work / ember_s / 1e12:13.1f} {work / kernel_s / 1e12:9.1f} "
              f"{work / torch_s / 1e12:7.1f} {torch_s / ember_s:6.2f} {100 * work / ember_s / PEAK:6.1f}% "
              f"{ember_s * 1e3:7.2f} {compile_s:7.1f}s{bad}", flush=True)
        prog.free()
        del prog
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
