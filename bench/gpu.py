"""GPU benchmark: Ember's CUDA backend beside PyTorch, same GPU, same run.

    PYTHONPATH=. python3 bench/gpu.py [--quick] [--only NAME] [--torch-compile]

Bandwidth counts the bytes that must move (inputs read once, outputs written once), printed
beside PyTorch's for the same work and beside a device-to-device copy (the practical ceiling;
HBM3e's datasheet figure is 4.8 TB/s). Times are medians of CUDA-event timings after warm-up.
Each Ember result is checked against PyTorch before it is timed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu import chain8, compile_times, layernorm, log_softmax, matmul, reduce_sum, softmax  # noqa: E402

from ember import data, ir  # noqa: E402
from ember import dtype as dt  # noqa: E402
from ember.backend import cuda  # noqa: E402
from ember.ir import Op  # noqa: E402


def transpose(n: int) -> tuple[list, list, Callable]:
    x = ir.param("x", dt.f32, (n, n))
    return [x], [ir.permute(x, (1, 0))], lambda x: x.t().contiguous()


def logsumexp(n: int, m: int) -> tuple[list, list, Callable]:
    """log(sum(exp(x - max))) + max along rows of f32 (issue 30's short-row class)."""
    x = ir.param("x", dt.f32, (n, m))
    mx = ir.reduce(Op.RMAX, x, (1,))
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, ir.binary(Op.SUB, x, ir.expand(mx, (n, m))),
                                    ir.const(1.4426950408889634, dt.f32, (n, m))))
    lse = ir.binary(Op.MUL, ir.unary(Op.LOG2, ir.reduce(Op.SUM, e, (1,))), ir.const(0.6931471805599453, dt.f32, (n, 1)))
    return [x], [ir.binary(Op.ADD, lse, mx)], None


def cross_entropy(n: int, classes: int) -> tuple[list, list, Callable]:
    """Each row's loss and the gradient over bf16 logits, as GPT-2's head computes them in f32:
    logsumexp minus the target's logit, softmax minus its one-hot (issue 30: one pass)."""
    logits, target = ir.param("x", dt.bf16, (n, classes)), ir.param("target", dt.i32, (n, 1))
    x = ir.unary(Op.CAST, logits, dt.f32)
    mx = ir.expand(ir.reduce(Op.RMAX, x, (1,)), x.shape)
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, ir.binary(Op.SUB, x, mx), ir.const(1.4426950408889634, dt.f32, x.shape)))
    s = ir.reduce(Op.SUM, e, (1,))
    hit = ir.binary(Op.CMPEQ, ir.iota(dt.i32, x.shape, 1), ir.expand(target, x.shape))
    zero = ir.const(0.0, dt.f32, x.shape)
    picked = ir.reduce(Op.SUM, ir.where(hit, x, zero), (1,))
    lse = ir.binary(Op.ADD, ir.binary(Op.MUL, ir.unary(Op.LOG2, s), ir.const(0.6931471805599453, dt.f32, (n, 1))),
                    ir.reduce(Op.RMAX, x, (1,)))
    one_hot = ir.where(hit, ir.const(1.0, dt.f32, x.shape), zero)
    grad = ir.binary(Op.SUB, ir.binary(Op.DIV, e, ir.expand(s, x.shape)), one_hot)
    return [logits, target], [ir.binary(Op.SUB, lse, picked), ir.unary(Op.CAST, grad, dt.bf16)], None


def torch_cross_entropy(x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    lse = torch.logsumexp(xf, 1, keepdim=True)
    grad = torch.exp(xf - lse) - torch.nn.functional.one_hot(target[:, 0].long(), x.shape[1]).float()
    return lse - xf.gather(1, target.long()), grad.to(torch.bfloat16)


def cuda_time(fn: Callable[[], object], reps: int = 20) -> float:
    """Median seconds of fn() on the GPU, timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def device_memory_used() -> float:
    """GiB of the GPU in use by anything (cuMemGetInfo); Ember keeps what it allocates in its
    pool, so after its steps this is its peak, plus the CUDA context."""
    from cuda.bindings import driver as cu
    cu.cuInit(0)
    err, free, total = cu.cuMemGetInfo()
    return (total - free) / 2 ** 30 if err == cu.CUresult.CUDA_SUCCESS else float("nan")


TORCH = {
    "chain": lambda x: ((((torch.clamp(x * 1.5 + 0.5, min=0) - 0.25) * x + 1) ** 2) - x),
    "softmax": lambda x: torch.softmax(x, 1),
    "layernorm": lambda x: torch.nn.functional.layer_norm(x, x.shape[1:], eps=1e-5),
    "rowsum": lambda x: x.sum(1, keepdim=True),
    "colsum": lambda x: x.sum(0, keepdim=True),
    "fullsum": lambda x: x.sum().reshape(1, 1),
    "fullsum1d": lambda x: x.sum().reshape(1),
    "logsoftmax": lambda x: torch.log_softmax(x, 1),
    "transpose": lambda x: x.t().contiguous(),
    "matmul": lambda a, b: a @ b,
    "logsumexp": lambda x: torch.logsumexp(x, 1, keepdim=True),
    "crossentropy": torch_cross_entropy,
}


def measure_copy() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting the read and the write."""
    big = torch.empty(1 << 28, device="cuda")
    return 2 * big.numel() * 4 / cuda_time(lambda: big.clone())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also time torch.compile of each op (issue 9's second peer; inductor compiles each)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows, cols, vec, tn, mm = (1024, 4096, 1 << 24, 2048, 1024) if args.quick else (8192, 32768, 1 << 28, 8192, 4096)
    cases = [
        ("chain", f"8-op elementwise chain f32 2^{vec.bit_length() - 1}", chain8(vec)),
        ("rowsum", f"row sum f32 {rows}x{cols}", reduce_sum(rows, cols, (1,))),
        ("colsum", f"column sum f32 {rows}x{cols}", reduce_sum(rows, cols, (0,))),
        ("fullsum", f"full sum f32 {rows}x{cols}", reduce_sum(rows, cols, (0, 1))),
        ("fullsum1d", f"full sum f32 1-D 2^{vec.bit_length() - 1}", reduce_sum(vec, None, (0,))),
        ("rowsum", f"row sum bf16 {rows}x{cols}", reduce_sum(rows, cols, (1,), dt.bf16)),
        ("colsum", f"column sum bf16 {rows}x{cols}", reduce_sum(rows, cols, (0,), dt.bf16)),
        ("fullsum", f"full sum bf16 {rows}x{cols}", reduce_sum(rows, cols, (0, 1), dt.bf16)),
        # few outputs, many rows: a bias gradient's (GPT-2's [16384, 768])
        ("colsum", f"column sum bf16 {2 * rows}x768 (bias gradient)", reduce_sum(2 * rows, 768, (0,), dt.bf16)),
        ("softmax", f"softmax rows f32 {rows}x{cols}", softmax(rows, cols)),
        ("softmax", f"softmax rows bf16 {rows}x{cols}", softmax(rows, cols, dt.bf16)),
        ("logsoftmax", f"log-softmax rows f32 {rows}x{cols}", log_softmax(rows, cols)),
        ("logsoftmax", f"log-softmax rows bf16 {rows}x{cols}", log_softmax(rows, cols, dt.bf16)),
        ("layernorm", f"layernorm rows f32 {rows}x{cols}", layernorm(rows, cols)),
        ("layernorm", f"layernorm rows bf16 {rows}x{cols}", layernorm(rows, cols, dt.bf16)),
        ("rowsum", f"row sum bf16 {rows // 32}x{cols * 32} (long)", reduce_sum(rows // 32, cols * 32, (1,), dt.bf16)),
        ("logsumexp", f"logsumexp f32 {rows * 32}x128 (short)", logsumexp(rows * 32, 128)),
        ("softmax", f"softmax f32 {rows * 32}x64 (short rows)", softmax(rows * 32, 64)),
        ("crossentropy", f"cross-entropy bf16 {rows // 2}x50304", cross_entropy(rows // 2, 50304)),
        ("transpose", f"transpose f32 {tn}x{tn}", transpose(tn)),
        ("matmul", f"matmul f32 {mm} (TF32 off)", matmul(mm)),
    ]
    copy_bw = measure_copy()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)", flush=True)
    compiled_head = f" {'compiled ms':>11s} {'ember/compiled':>14s}" if args.torch_compile else ""
    print(f"{'program':38s} {'kern':>4s} {'ember ms':>9s} {'torch ms':>9s} {'ember/torch':>11s} "
          f"{'ember rate':>14s} {'torch rate':>14s} {'of copy':>7s} {'cold s':>6s} {'cached s':>8s}"
          + compiled_head, flush=True)
    rng = np.random.default_rng(0)
    for key, name, (params, outputs, _ref) in cases:
        if args.only and args.only not in name:
            continue
        width = params[0].shape[-1]   # an integer param (a target) indexes the first's last axis
        inputs = {p: rng.integers(0, width, p.shape).astype(np.int32) if p.dtype is dt.i32 else
                  data.round_float(rng.standard_normal(p.shape, dtype=np.float32), p.dtype) for p in params}
        prog, cold, cached = compile_times(cuda.CUDAProgram, outputs)
        run, fetch = prog.bind({p: data.to_storage(v, p.dtype) for p, v in inputs.items()})
        run()
        low = params[0].dtype is dt.bf16
        tins = [torch.from_numpy(inputs[p]).cuda() if p.dtype is dt.i32 else
                torch.from_numpy(inputs[p]).cuda().to(torch.bfloat16 if low else torch.float32) for p in params]
        wants = TORCH[key](*tins)
        wants = wants if isinstance(wants, tuple) else (wants,)
        errs = []
        for o, got, want in zip(outputs, fetch(), wants):
            got = data.from_storage(got, o.dtype) if o.dtype is dt.bf16 else got
            want = want.float().cpu().numpy().reshape(got.shape)
            scale = max(float(np.linalg.norm(want.astype(np.float64))), 1e-30)
            errs.append(np.inf if np.isnan(got).any() else float(np.linalg.norm(got.astype(np.float64) - want)) / scale)
        err = max(errs)
        if not err < (1e-2 if low else 1e-4 if key != "matmul" else 1e-5):
            print(f"{name}: WRONG RESULT, relative error {err:.2e}", flush=True)
            prog.free()
            continue
        t_e = cuda_time(run)
        t_t = cuda_time(lambda: TORCH[key](*tins))
        compiled = ""
        if args.torch_compile:   # the same function through inductor (its first call compiles)
            fn = torch.compile(TORCH[key])
            t_c = cuda_time(lambda: fn(*tins))
            compiled = f" {t_c * 1e3:11.3f} {t_c / t_e:14.2f}"
        if key == "matmul":
            n = params[0].shape[0]
            rate_e, rate_t, frac = 2 * n**3 / t_e / 1e12, 2 * n**3 / t_t / 1e12, ""
            unit = "TFLOP/s"
        else:
            nbytes = sum(p.numel * p.dtype.itemsize for p in params) + sum(o.numel * o.dtype.itemsize for o in outputs)
            rate_e, rate_t, frac = nbytes / t_e / 1e9, nbytes / t_t / 1e9, f"{nbytes / t_e / copy_bw:6.0%}"
            unit = "GB/s"
        print(f"{name:38s} {len(prog.sched.kernels):4d} {t_e * 1e3:9.3f} {t_t * 1e3:9.3f} {t_t / t_e:11.2f} "
              f"{rate_e:8.1f} {unit:7s}{rate_t:8.1f} {unit:7s}{frac:>7s} {cold:6.2f} {cached:8.3f}{compiled}",
              flush=True)
        prog.free()
        torch.cuda.empty_cache()
    print("ember/torch, ember/compiled > 1: Ember is faster. Limits: copy bandwidth above; f32 FMA peak about "
          "67 TFLOP/s.")


if __name__ == "__main__":
    main()
