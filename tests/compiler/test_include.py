"""The hand-written device code (ember/backend/include/): each file compiles with nvcc for sm_86
and sm_90a on its own, after only the files the renderer puts before it, and all of them with
the instantiations real kernels make (attention with its gradients in bf16 and f32, a bf16
matmul: every file appears in one of the two sources)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ember import dtype as dt
from ember import ir
from ember.backend import cuda, mma
from ember.backend.render import INCLUDE, include
from ember.ir import Op

from .cuda_compile import NVCC, compile_cuda
from .test_attention import attention_graph

BASE = ["prelude.cuh", "half.h", "prelude_ops.cuh"]
BEFORE = {   # what the renderer puts before each file (cuda_render._source, mma.helpers, flash.helpers)
    "prelude.cuh": [], "half.h": ["prelude.cuh"], "prelude_ops.cuh": ["prelude.cuh", "half.h"],
    "mma.cuh": BASE, "mma_hopper.cuh": BASE + ["mma.cuh"], "flash.cuh": BASE + ["mma.cuh"],
    "flash_f32.cuh": BASE + ["mma.cuh", "flash.cuh"], "flash_wgmma.cuh": BASE,
    "flash_hopper.cuh": BASE + ["mma.cuh", "mma_hopper.cuh", "flash.cuh", "flash_wgmma.cuh"],
}


# generated text a file needs before it too (the warp-specialized forward's 4-d TMA copy)
GENERATED = {"flash_hopper.cuh": lambda: mma._tma_helper(4)}


def test_every_file_is_listed() -> None:
    assert sorted(p.name for p in INCLUDE.iterdir()) == sorted(BEFORE)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
@pytest.mark.parametrize("name", sorted(BEFORE))
def test_each_file_compiles_on_its_own(name: str, arch: str, tmp_path: Path) -> None:
    driver = tmp_path / "driver.cu"
    generated = GENERATED.get(name, lambda: "")()
    driver.write_text("".join(f'#include "{INCLUDE / f}"\n' for f in BEFORE[name]) + generated + f'#include "{INCLUDE / name}"\n')
    proc = subprocess.run([NVCC, f"-arch={arch}", "-std=c++17", "-x", "cu", "-c", "-o", str(tmp_path / "d.o"),
                           str(driver)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_files_compile_with_the_kernels_instantiations(tmp_path: Path) -> None:
    q, k, v, w = (ir.param(n, dt.bf16, (2, 2, 128, 64)) for n in "qkvw")
    o = attention_graph(q, k, v, True, dt.bf16)
    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, o, dt.f32), ir.unary(Op.CAST, w, dt.f32)),
                     (0, 1, 2, 3))
    f32 = attention_graph(*(ir.param(n, dt.f32, (2, 2, 64, 64)) for n in "abc"), False, dt.f32)
    a, b = ir.param("x", dt.bf16, (256, 256, 1)), ir.param("y", dt.bf16, (1, 256, 256))
    mm = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.expand(a, (256, 256, 256)), ir.expand(b, (256, 256, 256))), (1,))
    outputs = [o, f32, mm] + [ir.grad(loss, x) for x in (q, k, v)]
    sources = {arch: cuda.source(outputs, arch) for arch in ("sm_86", "sm_90a")}
    assert all(any(include(name) in src for src in sources.values()) for name in BEFORE)
    for arch, src in sources.items():
        assert compile_cuda(src, arch, tmp_path) is None, arch
