"""Matmul benchmark: Ember's contractions (written as expand-mul-sum) beside cuBLAS through
PyTorch, same GPU, same run.

    PYTHONPATH=. python3 bench/matmul.py [--quick | --odd] [--only NAME]

FLOPs are 2*M*N*K per matmul; the peak is the H200's dense tensor-core rate (989 TFLOP/s for
bf16/f16, 67 TFLOP/s of f32 FMA). Times are medians of CUDA-event timings after a warm-up;
each Ember result is checked against PyTorch's before it is timed. Compile time is printed
cold (code generation plus NVRTC, empty cache) and cached (a second build of the same program).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import cuda_time  # noqa: E402

from ember import data, ir  # noqa: E402
from ember import dtype as dt  # noqa: E402
from ember.backend import cuda  # noqa: E402
from ember.ir import Op  # noqa: E402

PEAK = {"bf16": 989e12, "f16": 989e12, "f32": 67e12}
TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def contraction(batch: int, m: int, n: int, k: int, dtype: dt.DType, b_transposed: bool | None = False) -> tuple:
    """[batch,] m x k @ k x n as expand-mul-sum; B given as n x k when b_transposed (x @ W.T), A given
    as k x m when b_transposed is None (x.T @ dy: a weight gradient, whose long K is split)."""
    lead = (batch,) if batch > 1 else ()
    pa = ir.param("a", dtype, lead + ((k, m) if b_transposed is None else (m, k)))
    a = pa if b_transposed is not None else ir.permute(pa, tuple(range(len(lead))) + (len(lead) + 1, len(lead)))
    b = ir.param("b", dtype, lead + ((n, k) if b_transposed else (k, n)))
    bk = ir.permute(b, tuple(range(len(lead))) + (len(lead) + 1, len(lead))) if b_transposed else b
    ae = ir.expand(ir.reshape(a, lead + (m, k, 1)), lead + (m, k, n))
    be = ir.expand(ir.reshape(bk, lead + (1, k, n)), lead + (m, k, n))
    out = ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, ae, be), (len(lead) + 1,)), lead + (m, n))
    return [pa, b], [out]


CASES = [  # name, batch, m, n, k, dtype, B transposed
    ("bf16 4096", 1, 4096, 4096, 4096, "bf16", False),
    ("bf16 8192", 1, 8192, 8192, 8192, "bf16", False),
    ("f16 4096", 1, 4096, 4096, 4096, "f16", False),
    ("f16 8192", 1, 8192, 8192, 8192, "f16", False),
    ("gpt2 qkv 16384x2304x768", 1, 16384, 2304, 768, "bf16", False),
    ("gpt2 fc 16384x3072x768", 1, 16384, 3072, 768, "bf16", False),
    ("gpt2 proj 16384x768x3072", 1, 16384, 768, 3072, "bf16", False),
    ("gpt2 lm head 16384x50304x768", 1, 16384, 50304, 768, "bf16", False),
    ("x @ W.T bf16 16384x3072x768", 1, 16384, 3072, 768, "bf16", True),
    # weight gradients x.T @ dy (A given as k x m): K = B*T is split into parts added atomically
    ("gpt2 fc dW 768x3072 K=16384", 1, 768, 3072, 16384, "bf16", None),
    ("gpt2 proj dW 3072x768 K=16384", 1, 3072, 768, 16384, "bf16", None),
    ("gpt2 qkv dW 768x2304 K=16384", 1, 768, 2304, 16384, "bf16", None),
    ("gpt2 lm head dW 50304x768 K=16384", 1, 50304, 768, 16384, "bf16", None),
    ("gpt2 lm head dX 4096x768 K=50304", 1, 4096, 768, 50304, "bf16", False),   # a chunk's dlogits @ W
    ("bmm bf16 64x(1024x64 @ 64x1024)", 64, 1024, 1024, 64, "bf16", False),
    ("f32 4096 (no TF32)", 1, 4096, 4096, 4096, "f32", False),
    # odd shapes (issue 30): rows not 16-byte aligned (padded copies, timed with the product), tiles
    # that leave a last round of blocks nearly empty
    ("bf16 4000x4100x3900", 1, 4000, 4100, 3900, "bf16", False),
    ("bf16 3001x2047x1999", 1, 3001, 2047, 1999, "bf16", False),
    ("f16 3001x2047x1999", 1, 3001, 2047, 1999, "f16", False),
    ("x @ W.T f16 3001x2047x1999", 1, 3001, 2047, 1999, "f16", True),
    ("f32 2000x3000x1000 (no TF32)", 1, 2000, 3000, 1000, "f32", False),
    ("f32 3001x2047x1999 (no TF32)", 1, 3001, 2047, 1999, "f32", False),
]
QUICK = {"bf16 4096", "gpt2 qkv 16384x2304x768", "bmm bf16 64x(1024x64 @ 64x1024)", "gpt2 fc dW 768x3072 K=16384"}
ODD = {"bf16 4096", "f16 4096", *(c[0] for c in CASES[-6:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="three shapes")
    ap.add_argument("--odd", action="store_true", help="the odd shapes and f16 4096")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--plan", default=None, help="force a tensor-core plan, as EMBER_TC_PLAN (docs/debugging.md)")
    ap.add_argument("--search", action="store_true", help="search plans (EMBER_SEARCH=1); cold compile includes it")
    ap.add_argument("--split-parts", type=int, default=None,
                    help="split a long K in this many parts where it splits (split._split_cost's choice otherwise)")
    args = ap.parse_args()
    if args.split_parts:
        from ember.compiler import split
        cost = split._split_cost
        split._split_cost = lambda outputs, size, parts, *rest: -1.0 if parts == args.split_parts else \
            cost(outputs, size, parts, *rest)
    if args.plan:
        os.environ["EMBER_TC_PLAN"] = args.plan
    if args.search:
        os.environ["EMBER_SEARCH"] = "1"
    torch.backends.cuda.matmul.allow_tf32 = False
    cache = Path(tempfile.mkdtemp(prefix="ember-mm-"))
    os.environ["EMBER_CACHE"] = str(cache)  # cold compiles are cold
    print(f"{'case':34} {'Ember TFLOP/s':>13} {'cuBLAS':>8} {'ratio':>6} {'% peak':>7} "
          f"{'compile cold/cached':>20}  plan")
    for name, batch, m, n, k, dname, bt in CASES:
        chosen = QUICK if args.quick else ODD if args.odd else None
        if (chosen is not None and name not in chosen) or (args.only and args.only not in name):
            continue
        dtype = getattr(dt, dname)
        params, outputs = contraction(batch, m, n, k, dtype, bt)
        t0 = time.perf_counter()
        prog = cuda.CUDAProgram(outputs)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        cuda.CUDAProgram(outputs)
        cached = time.perf_counter() - t0
        tc = next((k.plan for k in prog.sched.kernels if k.contraction), None)
        copies = len(prog.sched.kernels) - 1   # the padded copies of unaligned operands
        plan = (str(tc) if tc else "no tensor cores") + (f" + {copies} copies" if copies else "")
        g = torch.Generator(device="cuda").manual_seed(0)
        ta = torch.randn(params[0].shape, device="cuda", generator=g).to(TORCH_DT[dname])
        tb = torch.randn(params[1].shape, device="cuda", generator=g).to(TORCH_DT[dname])
        inputs = {p: data.to_storage(x.float().cpu().numpy(), p.dtype) for p, x in zip(params, (ta, tb))}
        runs = 10
        (out,), times = prog.timed(inputs, runs)
        got = torch.from_numpy(np.asarray(data.from_storage(out, outputs[0].dtype), np.float32)).cuda()
        bmat = tb.transpose(-1, -2) if bt else tb
        amat = ta.transpose(-1, -2) if bt is None else ta
        want = (amat @ bmat).float()
        err = ((got - want).norm() / want.norm()).item()
        ember_s = statistics.median(times) / 1e3
        torch_s = cuda_time(lambda: amat @ bmat)
        flops = 2.0 * batch * m * n * k
        ok = "" if err < 2e-2 else f"  WRONG (relative error {err:.2e})"
        print(f"{name:34} {flops / ember_s / 1e12:13.1f} {flops / torch_s / 1e12:8.1f} {torch_s / ember_s:6.2f} "
              f"{100 * flops / ember_s / PEAK[dname]:6.1f}% {cold:9.2f}s/{cached:6.2f}s  {plan}{ok}", flush=True)


    if args.search:
        print(f"searched plans: {cache / 'plans' / 'plans.json'}")
        if os.environ.get("OUT"):
            shutil.copy(cache / "plans" / "plans.json", Path(os.environ["OUT"]) / "plans.json")


if __name__ == "__main__":
    main()
