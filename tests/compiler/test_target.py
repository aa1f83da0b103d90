"""The described target (ember/target.py): its table, the facts the compiler reads from it, and
every kernel built for the course's RTX 3080 (sm_86) within that GPU's limits by nvcc's own
resource report (no GPU needed)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ember import dtype as dt
from ember import ir, text
from ember.backend import cuda
from ember.compiler import contraction
from ember.ir import Op
from ember.target import ARCHS, Target, cpu, gpu

from .cuda_compile import NVCC, resource_usage

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_describes_the_course_gpu_and_the_h200() -> None:
    rtx, h200 = gpu("sm_86"), gpu("sm_90a")
    assert (rtx.sms, rtx.smem_block, rtx.smem_sm, rtx.regs_sm, rtx.bandwidth) == (68, 101376, 102400, 65536, 760e9)
    assert rtx.mma_sync and not rtx.wgmma and not rtx.tma
    assert (h200.sms, h200.smem_block, h200.bandwidth, h200.flops_bf16) == (132, 227 * 1024, 4.0e12, 989e12)
    assert h200.wgmma and h200.tma and h200.min_threads == 1 << 17 and rtx.min_threads == 1 << 16
    assert set(ARCHS) >= {"sm_80", "sm_86", "sm_89", "sm_90a"} and gpu("sm_80").sms == 108
    with pytest.raises(ValueError, match="unknown GPU architecture 'sm_42'"):
        gpu("sm_42")
    host = cpu()
    assert host.kind == "cpu" and host.cores == len(os.sched_getaffinity(0)) and host.simd in (16, 32, 64)


def test_the_plans_read_the_target() -> None:
    """The heuristic's tiles come from the target: the SM count a wgmma tile is sized for, and
    the stages a block's shared memory allows (a GPU of the H200's kind with fewer SMs and less
    shared memory gets smaller tiles and 3 stages)."""
    a, b = ir.param("a", dt.bf16, (1024, 1024, 1)), ir.param("b", dt.bf16, (1, 1024, 1024))
    out = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.expand(a, (1024, 1024, 1024)), ir.expand(b, (1024, 1024, 1024))), (1,))
    (c,) = [k.contraction for k in cuda.prepare([out], "sm_90a").kernels if k.contraction]
    h200 = gpu("sm_90a")
    assert (contraction.plan(c, h200).block_m, contraction.plan(c, h200).block_n) == (64, 128)   # none of 128 x 256 .. 64 x 128 fills 132
    few = dataclasses.replace(h200, sms=16)
    assert (contraction.plan(c, few).block_m, contraction.plan(c, few).block_n) == (128, 256)
    small = dataclasses.replace(gpu("sm_90"), smem_sm=100 * 1024)
    assert contraction.plan(c, gpu("sm_90")).stages == 4 and contraction.plan(c, small).stages == 3


def _programs() -> list[tuple[str, list[ir.Node]]]:
    """The corpus (one schedule), benchmark shapes (bf16 and f32 matmuls, a bf16 softmax) and a
    small GPT-2 training step (its flash attention and gradients, bf16 contractions, AdamW)."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    import source_snapshot as snap
    corpus = [o for p in sorted((ROOT / "tests" / "eir").rglob("*.eir")) for o in text.parse_file(str(p)).output_nodes]
    bench = dict(snap.bench_programs())
    chosen = ["bench__matmul_bf16_4096", "bench__matmul_f32_4096_no_TF32", "bench__gpu_softmax_bf16"]
    return [("corpus", corpus)] + [(n, bench[n]()) for n in chosen] + [
        ("gpt2", snap.gpt_step(vocab=256, block=128, dim=128, layers=2, batch=4))]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_kernel_fits_the_rtx_3080(tmp_path: Path) -> None:
    """Built for sm_86, each kernel's threads, registers (ptxas's count x threads) and shared
    memory (static, from ptxas, plus the dynamic of its launch) fit one of the 3080's SMs."""
    rtx = gpu("sm_86")
    for name, outputs in _programs():
        sched = cuda.prepare(outputs, "sm_86")
        usage = resource_usage(cuda.render(sched), "sm_86", tmp_path)
        assert _over(sched, usage, rtx) == [], name
        if name == "bench__matmul_bf16_4096":   # the check can fail: a GPU of 32 KB per block
            assert _over(sched, usage, dataclasses.replace(rtx, smem_block=32 * 1024))


def _over(sched: object, usage: dict[str, tuple[int, int]], limits: Target) -> list[str]:
    """The kernels whose threads, registers or shared memory pass the limits."""
    over = []
    for k in sched.kernels:   # type: ignore[attr-defined]
        _, threads, dynamic = cuda.launch_config(k, limits)
        regs, static = usage[k.name]
        if threads > 1024 or regs * threads > limits.regs_sm or static + dynamic > limits.smem_block:
            over.append(f"{k.name}: {threads} threads x {regs} registers, {static} + {dynamic} bytes of shared memory")
    return over



def test_the_device_describes_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a GPU, the target is the device's attributes over its architecture's table entry (the
    driver faked here: an H100 PCIe-like sm_90a with 114 SMs); without one, the table's sm_86."""
    pytest.importorskip("cuda.bindings")
    from cuda.bindings import driver as cu
    attr = cu.CUdevice_attribute
    values = {attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 114, attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 50 << 20,
              attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
              attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 233472,
              attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: 65536,
              attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: 2048}
    monkeypatch.setattr(cu, "cuDeviceGet", lambda i: (cu.CUresult.CUDA_SUCCESS, 0))
    monkeypatch.setattr(cu, "cuDeviceGetName", lambda n, d: (cu.CUresult.CUDA_SUCCESS, b"NVIDIA H100 PCIe\0"))
    monkeypatch.setattr(cu, "cuDeviceGetAttribute", lambda a, d: (cu.CUresult.CUDA_SUCCESS, values[a]))
    monkeypatch.delenv("EMBER_NO_CUDA", raising=False)
    monkeypatch.setattr(cuda, "_device", lambda: (None, "sm_90a"))
    cuda.device_target.cache_clear()
    try:
        h100 = cuda.device_target()
        assert (h100.name, h100.arch, h100.sms, h100.smem_block) == ("NVIDIA H100 PCIe", "sm_90a", 114, 232448)
        assert h100.wgmma and h100.flops_bf16 == gpu("sm_90a").flops_bf16   # the rates stay the table's
        monkeypatch.setattr(cuda, "_device", lambda: None)
        cuda.device_target.cache_clear()
        assert cuda.device_target() == gpu("sm_86")
    finally:
        cuda.device_target.cache_clear()
