"""The course's GPU (RTX 3080, sm_86) measured as a proxy on the H200: Ember's sm_86 plans
(mma.sync and cp.async only, at most 99 KB of shared memory a block, tiles for 68 SMs) compiled
for and run on this GPU, beside the limits of that path here.

    PYTHONPATH=. python3 bench/course_gpu.py [--quick] [--plans default mma.sync,128,256,32,2,4,3 ...]

The limits printed beside each figure:
- the H200's own mma.sync peak, from the microbenchmark below (every warp of 4 blocks an SM
  issuing independent m16n8k16 bf16 products): what any mma.sync kernel can reach here, well
  under the 989 TFLOP/s of wgmma;
- matmuls: cuBLAS (which uses wgmma here, so the ratio understates the plan), and the L2 read
  rate the plan's tiles ask for at its speed (each block tile reads K (block_m + block_n)
  2-byte elements: 1/block_m + 1/block_n bytes a FLOP) beside the L2 bandwidth this GPU gives
  (its microbenchmark below): where they meet, the tile size bounds the plan, not its loop;
- attention: SDPA forced to its FlashAttention-2 backend
  (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`), which is mma.sync code as well.
Every result is checked against PyTorch before it is timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_gpu import attention  # noqa: E402
from gpu import cuda_time  # noqa: E402
from matmul import TORCH_DT, contraction  # noqa: E402

from ember import data, ir  # noqa: E402
from ember import dtype as dt  # noqa: E402
from ember.backend import cuda  # noqa: E402
from ember.ir import Op  # noqa: E402

PLAN_ARCH = "sm_86"
CHAINS, WARPS, BLOCKS_PER_SM, ITERS = 8, 8, 4, 8192
MMA_PEAK_SRC = r"""
extern "C" __global__ void mma_peak(float* out, int iters) {
  unsigned a0 = 0x3f803f80u, a1 = 0x3f003f00u, a2 = 0x3e803e80u, a3 = 0x3f403f40u;
  unsigned b0 = 0x3c003c00u ^ threadIdx.x, b1 = 0x3c803c80u;
  float acc[CHAINS][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < CHAINS; ++j)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                   "{%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < CHAINS; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;   // keeps every product live
}
"""


L2_BYTES, L2_REPS = 16 << 20, 64   # a buffer L2 holds (50 MB on an H100 or H200), read this many times
L2_READ_SRC = r"""
extern "C" __global__ void l2_read(const uint4* __restrict__ src, unsigned n, int reps, unsigned* out) {
  unsigned acc = 0;
  for (int r = 0; r < reps; r++)
#pragma unroll 4
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
      const uint4 v = __ldcg(src + i);   /* cached in L2 only: L1 would serve the later reps */
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;   // keeps every load live
}
"""


def _kernel(src: str, name: str):  # noqa: ANN202 (a driver handle)
    from cuda.bindings import driver as cu
    module = cuda._check(cu.cuModuleLoadData(cuda.compile_cubin(src, cuda.device_target().arch)))
    return cuda._check(cu.cuModuleGetFunction(module, name.encode()))


def _timed_launch(fn, grid: int, threads: int, *args: np.ndarray) -> float:  # noqa: ANN001
    """Seconds of one launch (the median of cuda_time's), args each a one-element array."""
    from cuda.bindings import driver as cu
    pointers = np.array([a.ctypes.data for a in args], np.uint64)

    def launch() -> None:
        cuda._check((cu.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, 0, pointers.ctypes.data, 0)[0], None))
    return cuda_time(launch, reps=10)


def l2_read_bandwidth() -> float:
    """Bytes a second that every SM together reads from L2 (16-byte loads of a buffer L2 holds):
    the rate a matmul's tile loads may not exceed (`L2 TB/s` beside each matmul)."""
    gpu = cuda.device_target()
    blocks, threads = gpu.sms * 4, 256
    buf, out = torch.ones(L2_BYTES // 4, device="cuda", dtype=torch.int32), torch.empty(blocks * threads, device="cuda")
    seconds = _timed_launch(_kernel(L2_READ_SRC, "l2_read"), blocks, threads, np.array([buf.data_ptr()], np.uint64),
                            np.array([L2_BYTES // 16], np.uint32), np.array([L2_REPS], np.int32),
                            np.array([out.data_ptr()], np.uint64))
    return L2_BYTES * L2_REPS / seconds


def mma_sync_peak() -> float:
    """FLOP/s of mma.sync.m16n8k16 (bf16 in, f32 accumulators) on this GPU."""
    gpu = cuda.device_target()
    blocks, threads = gpu.sms * BLOCKS_PER_SM, WARPS * 32
    out = torch.empty(blocks * threads, device="cuda")
    seconds = _timed_launch(_kernel(f"#define CHAINS {CHAINS}\n" + MMA_PEAK_SRC, "mma_peak"), blocks, threads,
                            np.array([out.data_ptr()], np.uint64), np.array([ITERS], np.int32))
    return blocks * WARPS * ITERS * CHAINS * 2 * 16 * 8 * 16 / seconds


def matmuls(peak: float, quick: bool) -> None:
    cases = [("bf16 4096", 4096, 4096, 4096, "bf16"), ("f16 4096", 4096, 4096, 4096, "f16"),
             ("bf16 4000x4100x3900", 4000, 4100, 3900, "bf16"), ("gpt2 fc 16384x3072x768", 16384, 3072, 768, "bf16")]
    print(f"{'matmul, sm_86 plan':28} {'Ember TFLOP/s':>13} {'cuBLAS':>7} {'ratio':>6} {'% mma.sync':>10} "
          f"{'L2 TB/s':>8}  plan")
    for name, m, n, k, dname in cases[:2] if quick else cases:
        params, outputs = contraction(1, m, n, k, getattr(dt, dname))
        prog = cuda.CUDAProgram(outputs, plan_arch=PLAN_ARCH)
        g = torch.Generator(device="cuda").manual_seed(0)
        ta, tb = (torch.randn(p.shape, device="cuda", generator=g).to(TORCH_DT[dname]) for p in params)
        inputs = {p: data.to_storage(x.float().cpu().numpy(), p.dtype) for p, x in zip(params, (ta, tb))}
        (out,), times = prog.timed(inputs, 10)
        got = torch.from_numpy(np.asarray(data.from_storage(out, outputs[0].dtype), np.float32)).cuda()
        want = (ta @ tb).float()
        err = ((got - want).norm() / want.norm()).item()
        ember_s, torch_s = statistics.median(times) / 1e3, cuda_time(lambda: ta @ tb)
        flops = 2.0 * m * n * k
        ok = "" if err < 2e-2 else f"  WRONG (relative error {err:.2e})"
        # the product's kernel (an odd shape's padded copies come first), and the tile reads it
        # asks of L2: each block tile reads K (block_m + block_n) 2-byte elements, 1/bm + 1/bn bytes a FLOP
        plan = next(kern.plan for kern in prog.sched.kernels if kern.contraction is not None)
        l2 = flops / ember_s * (1 / plan.block_m + 1 / plan.block_n) / 1e12
        print(f"{name:28} {flops / ember_s / 1e12:13.1f} {flops / torch_s / 1e12:7.1f} {torch_s / ember_s:6.2f} "
              f"{100 * flops / ember_s / peak:9.1f}% {l2:8.2f}  {plan}{ok}", flush=True)
        prog.free()


def attentions(peak: float, quick: bool) -> None:
    print(f"{'attention bf16, sm_86 plan':30} {'pass':8} {'Ember TFLOP/s':>13} {'FA2':>7} {'ratio':>6} "
          f"{'% mma.sync':>10} {'compile':>8}")
    for d in (64, 128):
        for s in (1024, 4096):
            for causal in (False, True):
                if quick and (d != 64 or s != 4096):
                    continue
                attention_case(d, s, causal, peak)


def attention_case(d: int, s: int, causal: bool, peak: float) -> None:
    b, h = max(1, 16384 // s), 2048 // d
    name = f"D={d} S={s} B={b} H={h}{' causal' if causal else ''}"
    q, k, v, w = (ir.param(n, dt.bf16, (b, h, s, d)) for n in "qkvw")
    o = attention(q, k, v, causal)
    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, o, dt.f32), ir.unary(Op.CAST, w, dt.f32)),
                     (0, 1, 2, 3))
    g = torch.Generator(device="cuda").manual_seed(0)
    tq, tk, tv, tw = (torch.randn((b, h, s, d), device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    inputs = {p: data.to_storage(x.float().cpu().numpy(), dt.bf16) for p, x in zip((q, k, v, w), (tq, tk, tv, tw))}
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    tq.requires_grad_(True), tk.requires_grad_(True), tv.requires_grad_(True)

    def fa2_fwd() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def fa2_both() -> None:
        (fa2_fwd().float() * tw.float()).sum().backward()

    both = [o] + [ir.grad(loss, x) for x in (q, k, v)]
    for label, outputs, work, peer in (("fwd", [o], flops, fa2_fwd), ("fwd+bwd", both, 3.5 * flops, fa2_both)):
        t0 = time.perf_counter()
        prog = cuda.CUDAProgram(outputs, plan_arch=PLAN_ARCH)
        compile_s = time.perf_counter() - t0
        got, times = prog.timed(inputs, 10)
        want = [fa2_fwd()]
        if label == "fwd+bwd":
            tq.grad = tk.grad = tv.grad = None
            fa2_both()
            want += [tq.grad, tk.grad, tv.grad]
        err = 0.0
        for a, wt in zip(got, want):
            theirs = wt.detach().float().cpu().numpy()
            mine = np.asarray(data.from_storage(a, dt.bf16), np.float64)
            err = max(err, float(np.abs(mine - theirs).max() / np.abs(theirs).max()))
        ember_s, torch_s = statistics.median(times) / 1e3, cuda_time(peer)
        bad = "" if err < 3e-2 else f"  WRONG (max error {err:.2e} of the largest value)"
        print(f"{name:30} {label:8} {work / ember_s / 1e12:13.1f} {work / torch_s / 1e12:7.1f} "
              f"{torch_s / ember_s:6.2f} {100 * work / ember_s / peak:9.1f}% {compile_s:7.1f}s{bad}", flush=True)
        prog.free()
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two matmuls and D = 64, S = 4096")
    ap.add_argument("--plans", nargs="+", metavar="PLAN",
                    help="the matmuls alone, once for each of these EMBER_TC_PLAN tilings (mma.sync,128,256,32,2,4,3; "
                         "'default' for the heuristic's)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    peak = mma_sync_peak()
    gpu = cuda.device_target()
    print(f"{gpu.name}: mma.sync m16n8k16 bf16 peak {peak / 1e12:.0f} TFLOP/s "
          f"({CHAINS} chains x {WARPS} warps x {BLOCKS_PER_SM} blocks an SM; wgmma's dense peak: 989); "
          f"L2 reads {l2_read_bandwidth() / 1e12:.2f} TB/s")
    for plan in args.plans or []:
        os.environ["EMBER_TC_PLAN"] = "" if plan == "default" else plan
        matmuls(peak, args.quick)
    if not args.plans:
        matmuls(peak, args.quick)
        attentions(peak, args.quick)


if __name__ == "__main__":
    main()
