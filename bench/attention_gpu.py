"""Attention on the GPU: Ember's flash kernels, derived from the primitive graph (expand-mul-sum,
iota mask, max, exp2, sum, div, expand-mul-sum), beside PyTorch's SDPA flash in the same run.

    PYTHONPATH=. python3 bench/attention_gpu.py [--quick | --f32-memory | --variants | --kernels] [--dims 32,80,96,256]

bf16, 16k tokens a batch (batch = 16384 / S) and a model width of 2048 (heads = 2048 / D, rounded
down), as FlashAttention's own benchmarks; --dims picks the head sizes (64 and 128 unless given).
FLOPs: 4 B H S^2 D for the forward (two matmuls), 2.5 times
that for the backward; causal counts half. "program" times Ember's whole compiled program (its
layout copies and casts included), "kernel" the flash kernels alone. Every result is checked
against PyTorch before it is timed. Peak: 989 TFLOP/s (H200, dense bf16).

--variants: the score forms of issue 30 at B4 H16 S2048 D64 bf16 (key-padding mask from a bool
param, causal ALiBi, soft-capping, a sliding window of 1024, a scale written (s + s) * 0.5, q scaled
before the product, causal, causal grouped-query attention of 4 q heads a k/v head), written
with F.scaled_dot_product_attention, F.flex_attention or
plain Tensor ops, beside SDPA with the equivalent attn_mask and FlexAttention compiled (where
torch has it); the ratio is to the faster of the two. FLOPs count the scores kept.
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
    ap.add_argument("--variants", action="store_true", help="the score forms of issue 30 (masks, biases, softcap)")
    ap.add_argument("--flex", default=".", help="--variants: those this regular expression finds get FlexAttention")
    ap.add_argument("--kernels", action="store_true",
                    help="each flash kernel of GPT-2's attention (B16 H12 T1024 D64 causal) alone, as the forward "
                         "without and with a gradient, q, k, v as params or as views of one qkv")
    ap.add_argument("--dims", default="64,128", help="the head sizes of the main table, e.g. 32,80,96,256")
    args = ap.parse_args()
    if args.f32_memory:
        f32_memory()
        return
    if args.variants:
        variants(args.only, args.flex)
        return
    if args.kernels:
        kernels()
        return
    print(f"{'case':28} {'pass':8} {'Ember TFLOP/s':>13} {'(kernel)':>9} {'SDPA':>7} {'ratio':>6} {'% peak':>7} "
          f"{'ms':>7} {'compile':>8}")
    for d in (int(x) for x in args.dims.split(",")):
        for s in (1024, 4096, 16384):
            if args.quick and (d != 64 or s > 4096):
                continue
            for causal in (False, True):
                run_case(d, s, causal, args.only)


def kernels() -> None:
    """The flash kernels of GPT-2's attention one at a time (cuda.time_kernel: one launch on zeroed
    buffers), as the forward alone (o in bf16) and inside a training step's graph (the forward
    writes o and the logsumexp in f32 for the backward), with q, k and v as [B, H, T, D] params
    or as views of one qkv [B, T, 3 C] (GPT-2's layout: rows 3 C apart)."""
    b, h, t, d = 16, 12, 1024, 64
    flops = {"attention": 2.0, "attention_dq": 3.0, "attention_dkdv": 4.0}   # products a kernel does, x 2 B H T^2 D / 2
    gpu = cuda.device_target()
    print(f"{'layout':8} {'graph':9} {'kernel':16} {'out':22} {'us':>8} {'TFLOP/s':>8} {'GB/s out':>9}")
    for layout in ("params", "qkv"):
        if layout == "params":
            q, k, v = (ir.param(n, dt.bf16, (b, h, t, d)) for n in "qkv")
            wrt = [q, k, v]
        else:
            qkv = ir.param("qkv", dt.bf16, (b, t, 3 * h * d))
            heads = ir.permute(ir.reshape(qkv, (b, t, 3, h, d)), (2, 0, 3, 1, 4))
            q, k, v = (ir.reshape(ir.shrink(heads, (i, 0, 0, 0, 0), (i + 1, b, h, t, d)), (b, h, t, d))
                       for i in range(3))
            wrt = [qkv]
        o = attention(q, k, v, True)
        w = ir.param("w", dt.bf16, (b, h, t, d))
        loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, o, dt.f32), ir.unary(Op.CAST, w, dt.f32)),
                         (0, 1, 2, 3))
        for graph, outputs in (("forward", [o]), ("training", [o] + [ir.grad(loss, x) for x in wrt])):
            prog = cuda.CUDAProgram(outputs)
            for kern in prog.sched.kernels:
                if kern.fused is None:
                    continue
                secs = cuda.time_kernel(kern, gpu)
                kind = kern.fused[0].arg[0]
                work = flops[kind] * b * h * t * t * d   # causal: half of 2 B H T^2 D a product
                out = f"{kern.out.node.dtype}{list(kern.out.node.shape)}"
                print(f"{layout:8} {graph:9} {kind:16} {out:22} {secs * 1e6:8.1f} {work / secs / 1e12:8.1f} "
                      f"{kern.out.nbytes / secs / 1e9:9.1f}", flush=True)
            prog.free()


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


VB, VH, VS, VD, WINDOW, CAP = 4, 16, 2048, 64, 1024, 30.0
GROUP = 4   # "gqa": q heads a k/v head
VARIANTS = ["key_padding", "window", "alibi", "doubled", "q_prescaled", "causal", "softcap", "gqa"]


def _variant_inputs() -> dict[str, np.ndarray]:
    """The masks' and biases' data: keys kept per batch (key padding), ALiBi's slopes per head."""
    kept = np.array([VS, VS - 300, VS // 2, VS - 1000])
    return {"pad": np.arange(VS)[None, :] < kept[:, None], "slopes": 2.0 ** (-8.0 * np.arange(1, VH + 1) / VH)}


def _ember_variant(name: str, q, k, v, pad, slopes):  # type: ignore[no-untyped-def]
    """The variant as a program writes it with Ember's frontend (q, k, v: Tensors, [B, H, S, D])."""
    from ember import functional as F
    scale = 1 / math.sqrt(VD)
    if name == "key_padding":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=pad.reshape(VB, 1, 1, VS))
    if name == "alibi":   # causal, as ALiBi's models use it
        return F.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + slopes.reshape(1, VH, 1, 1) * (j - i),
                                mask_mod=lambda b, h, i, j: j <= i)
    if name == "softcap":
        return F.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: (s / CAP).tanh() * CAP)
    if name == "window":
        return F.flex_attention(q, k, v, mask_mod=lambda b, h, i, j: (j <= i) & (i - j < WINDOW))
    if name == "doubled":   # the program: the scale written (s + s) * 0.5
        sc = q @ k.transpose(-2, -1)
        return ((sc + sc) * (0.5 * scale)).softmax(-1) @ v
    if name == "q_prescaled":
        return F.scaled_dot_product_attention(q * scale, k, v, is_causal=True, scale=1.0)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=name == "gqa")


def _torch_variant(name: str, tq, tk, tv, tpad, tslopes, with_flex: bool):  # type: ignore[no-untyped-def]
    """(SDPA with the equivalent attn_mask or None, FlexAttention compiled or None, the kept
    fraction of the scores): PyTorch's ways to the same result."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    i = torch.arange(VS, device="cuda")[:, None]
    j = torch.arange(VS, device="cuda")[None, :]
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention) if with_flex else None
    except ImportError:
        flex = create_block_mask = None
    scale = 1 / math.sqrt(VD)
    causal = float(((j <= i).float().mean()))
    if name == "key_padding":
        keep = tpad[:, None, None, :]
        mask = create_block_mask(lambda b, h, qi, kv: tpad[b, kv], VB, None, VS, VS) if flex else None
        return (lambda: sdpa(tq, tk, tv, attn_mask=keep), flex and (lambda: flex(tq, tk, tv, block_mask=mask)),
                float(tpad.float().mean()))
    if name == "alibi":
        bias = (tslopes[:, None, None] * (j - i)[None]).masked_fill(j > i, -math.inf).to(torch.bfloat16)[None]
        mask = create_block_mask(lambda b, h, qi, kv: kv <= qi, None, None, VS, VS) if flex else None
        return (lambda: sdpa(tq, tk, tv, attn_mask=bias),
                flex and (lambda: flex(tq, tk, tv, score_mod=lambda s, b, h, qi, kv: s + tslopes[h] * (kv - qi),
                                       block_mask=mask)), causal)
    if name == "softcap":
        return None, flex and (lambda: flex(tq, tk, tv, score_mod=lambda s, b, h, qi, kv: torch.tanh(s / CAP) * CAP)), \
            1.0
    if name == "window":
        keep = (j <= i) & (i - j < WINDOW)
        mask = create_block_mask(lambda b, h, qi, kv: (kv <= qi) & (qi - kv < WINDOW), None, None, VS, VS) \
            if flex else None
        return (lambda: sdpa(tq, tk, tv, attn_mask=keep), flex and (lambda: flex(tq, tk, tv, block_mask=mask)),
                float(keep.float().mean()))
    if name == "doubled":
        return lambda: sdpa(tq, tk, tv), None, 1.0
    if name == "q_prescaled":
        return lambda: sdpa(tq * scale, tk, tv, is_causal=True, scale=1.0), None, causal
    if name == "gqa":
        return lambda: sdpa(tq, tk, tv, is_causal=True, enable_gqa=True), None, causal
    return lambda: sdpa(tq, tk, tv, is_causal=True), None, causal


def variants(only: str | None = None, flex: str = "") -> None:
    """flex: a regular expression of the variants that get a FlexAttention peer (compiling it
    takes tens of seconds a variant)."""
    from ember import tensor as T
    print(f"B={VB} H={VH} S={VS} D={VD} bf16; TFLOP/s of the scores kept, % of the {PEAK / 1e12:.0f} TFLOP/s peak")
    print(f"{'variant':12} {'pass':8} {'Ember':>7} {'%peak':>6} {'SDPA':>7} {'Flex':>7} {'ratio':>6} {'ms':>7} "
          f"{'compile':>8} {'error':>8}")
    extra = _variant_inputs()
    g = torch.Generator(device="cuda").manual_seed(0)
    tq, tk_all, tv_all, tw = (torch.randn((VB, VH, VS, VD), device="cuda", generator=g).to(torch.bfloat16)
                              for _ in range(4))
    tpad = torch.tensor(extra["pad"], device="cuda")
    tslopes = torch.tensor(extra["slopes"], device="cuda", dtype=torch.float32)
    for name in VARIANTS:
        if only and not re.search(only, name):
            continue
        kv = VH // GROUP if name == "gqa" else VH   # k's and v's heads
        params = [ir.param(n, dt.bf16, (VB, kv if n in "kv" else VH, VS, VD)) for n in "qkvw"]
        pad, slopes = ir.param("pad", dt.bool_, (VB, VS)), ir.param("slopes", dt.f32, (VH,))
        q, k, v, w = (T.Tensor(p) for p in params)
        o = _ember_variant(name, q, k, v, T.Tensor(pad), T.Tensor(slopes))
        loss = (o.float() * w.float()).sum()
        tk, tv = (x[:, :kv].contiguous() for x in (tk_all, tv_all))
        inputs = {p: data.to_storage(x.float().cpu().numpy(), dt.bf16) for p, x in zip(params, (tq, tk, tv, tw))}
        inputs.update({pad: extra["pad"], slopes: extra["slopes"].astype(np.float32)})
        sdpa, flexed, kept = _torch_variant(name, tq, tk, tv, tpad, tslopes, bool(re.search(flex, name)))
        flops = 4.0 * VB * VH * VS * VS * VD * kept
        both = [o.node] + [ir.grad(loss.node, p) for p in params[:3]]
        for label, outputs, work in (("fwd", [o.node], flops), ("fwd+bwd", both, 3.5 * flops)):
            t0 = time.perf_counter()
            prog = cuda.CUDAProgram(outputs)
            compile_s = time.perf_counter() - t0
            flash = sum(kk.fused is not None for kk in prog.sched.kernels)
            got, times = prog.timed(inputs, 10)
            peers, want = [], None
            for fn in (sdpa, flexed):
                if fn is None:
                    peers.append(None)
                    continue
                tq.requires_grad_(label != "fwd"), tk.requires_grad_(label != "fwd"), tv.requires_grad_(label != "fwd")

                def step(fn=fn) -> torch.Tensor:  # type: ignore[no-untyped-def]
                    out = fn()
                    if label != "fwd":
                        tq.grad = tk.grad = tv.grad = None
                        (out.float() * tw.float()).sum().backward()
                    return out
                out = step()
                if want is None:
                    want = [out] + ([tq.grad, tk.grad, tv.grad] if label != "fwd" else [])
                    want = [x.detach().float().cpu().numpy() for x in want]
                peers.append(cuda_time(step))
            tq.requires_grad_(False), tk.requires_grad_(False), tv.requires_grad_(False)
            err = max(float(np.abs(np.asarray(data.from_storage(a, dt.bf16) if a.dtype == np.uint16 else a, np.float64)
                                   - b).max() / np.abs(b).max()) for a, b in zip(got, want))
            ember_s = statistics.median(times) / 1e3
            best = min(t for t in peers if t is not None)
            cells = [f"{work / t / 1e12:7.1f}" if t else f"{'-':>7}" for t in peers]
            bad = "" if err < 3e-2 else "  WRONG"
            print(f"{name:12} {label:8} {work / ember_s / 1e12:7.1f} {100 * work / ember_s / PEAK:5.1f}% {cells[0]} "
                  f"{cells[1]} {best / ember_s:6.2f} {ember_s * 1e3:7.2f} {compile_s:7.1f}s {err:8.1e}"
                  f"{'' if flash else '  (no flash kernel)'}{bad}", flush=True)
            prog.free()
            del prog
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
