"""Compiling generated CUDA without a GPU, for CI: with nvcc where it is installed, else with
NVRTC (the compiler Ember itself uses at run time), which pip installs with the test extras
(cuda-python and nvidia-cuda-nvrtc) and which needs no GPU or driver."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NVCC = shutil.which("nvcc")


def _nvrtc() -> bool:
    try:
        from cuda.bindings import nvrtc
        return int(nvrtc.nvrtcVersion()[0]) == 0
    except Exception:  # not installed, or the library is missing
        return False


COMPILER = "nvcc" if NVCC else "nvrtc" if _nvrtc() else None


def compile_cuda(src: str, arch: str, folder: Path) -> str | None:
    """None when src compiles to a cubin for arch; else the compiler's messages."""
    if COMPILER == "nvcc":
        path = folder / f"unit_{arch}.cu"
        path.write_text(src)
        proc = subprocess.run([NVCC, f"-arch={arch}", "-std=c++17", "-w", "-cubin", "-o", str(path.with_suffix(".cubin")),
                               str(path)], capture_output=True, text=True)
        return None if proc.returncode == 0 else proc.stderr[-3000:]
    from ember.backend import cuda
    try:
        cuda.compile_cubin(src, arch)
    except RuntimeError as e:
        return str(e)[-3000:]
    return None
