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


def transpose(n: int) -> tuple[list, list, Callable]:
    x = ir.param("x", dt.f32, (n, n))
    return [x], [ir.permute(x, (1, 0))], lambda x: x.t().contiguous()


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
        ("softmax", f"softmax rows f32 {rows}x{cols}", softmax(rows, cols)),
        ("softmax", f"softmax rows bf16 {rows}x{cols}", softmax(rows, cols, dt.bf16)),
        ("logsoftmax", f"log-softmax rows f32 {rows}x{cols}", log_softmax(rows, cols)),
        ("logsoftmax", f"log-softmax rows bf16 {rows}x{cols}", log_softmax(rows, cols, dt.bf16)),
        ("layernorm", f"layernorm rows f32 {rows}x{cols}", layernorm(rows, cols)),
        ("layernorm", f"layernorm rows bf16 {rows}x{cols}", layernorm(rows, cols, dt.bf16)),
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
        inputs = {p: data.round_float(rng.standard_normal(p.shape, dtype=np.float32), p.dtype) for p in params}
        prog, cold, cached = compile_times(cuda.CUDAProgram, outputs)
        run, fetch = prog.bind({p: data.to_storage(v, p.dtype) for p, v in inputs.items()})
        run()
        got = fetch()[0]
        low = params[0].dtype is dt.bf16
        tins = [torch.from_numpy(inputs[p]).cuda().to(torch.bfloat16 if low else torch.float32) for p in params]
        if low:
            got = data.from_storage(got, dt.bf16)
        want = TORCH[key](*tins).float().cpu().numpy().reshape(got.shape)
        err = float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want.astype(np.float64)), 1e-30))
        if not err < (1e-2 if low else 1e-4 if key != "matmul" else 1e-5) or np.isnan(got).any():
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
