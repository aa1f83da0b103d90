"""Compiling generated CUDA without a GPU, for CI: with nvcc where it is installed, else with
NVRTC (the compiler Ember itself uses at run time), which pip installs with the test extras
(cuda-python and nvidia-cuda-nvrtc) and which needs no GPU or driver."""
from __future__ import annotations

import re
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


def _nvcc(src: str, arch: str, folder: Path, stem: str, *flags: str, out: str = ".cubin") \
        -> tuple[subprocess.CompletedProcess, Path]:
    """nvcc on src (written to folder/stem.cu) for arch with flags, output beside it: the
    finished process and the output's path."""
    assert NVCC is not None
    path = folder / f"{stem}_{arch}.cu"
    path.write_text(src)
    proc = subprocess.run([NVCC, f"-arch={arch}", "-std=c++17", "-w", *flags, "-o", str(path.with_suffix(out)),
                           str(path)], capture_output=True, text=True)
    return proc, path.with_suffix(out)


def compile_cuda(src: str, arch: str, folder: Path) -> str | None:
    """None when src compiles to a cubin for arch; else the compiler's messages."""
    if COMPILER == "nvcc":
        proc, _ = _nvcc(src, arch, folder, "unit", "-cubin")
        return None if proc.returncode == 0 else proc.stderr[-3000:]
    from ember.backend import cuda
    try:
        cuda.compile_cubin(src, arch)
    except RuntimeError as e:
        return str(e)[-3000:]
    return None


def _ptxas_report(src: str, arch: str, folder: Path) -> list[str]:
    proc, _ = _nvcc(src, arch, folder, "usage", "-cubin", "-Xptxas", "-v")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr.splitlines()


def resource_usage(src: str, arch: str, folder: Path) -> dict[str, tuple[int, int]]:
    """Each kernel's registers per thread and static shared memory bytes, from ptxas's report
    (nvcc -Xptxas -v): what a launch on arch needs besides its dynamic shared memory."""
    usage, name = {}, None
    for line in _ptxas_report(src, arch, folder):
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            smem = re.search(r"(\d+) bytes smem", line)
            usage[name] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
    return usage


def spills(src: str, arch: str, folder: Path, serialized: set[str] | None = None) -> dict[str, int]:
    """Each kernel's bytes of spill stores (registers that did not fit), from ptxas's report;
    serialized, where given, gets the kernels whose wgmma ptxas serialized (C7514: it could not
    tell that an accumulator read comes after its product was waited for, and waits after each)."""
    out, name = {}, None
    for line in _ptxas_report(src, arch, folder):
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
        elif (m := re.search(r"(\d+) bytes spill stores", line)) and name:
            out[name] = int(m.group(1))
        elif (m := re.search(r"C7514.*serialized.*function '(\w+)'", line)) and serialized is not None:
            serialized.add(m.group(1))
    return out


def ptx_counts(src: str, arch: str, folder: Path, words: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Each kernel's count of PTX instructions beginning with each of words (nvcc -ptx): static
    counts, in the code as written (unrolled loops count each copy)."""
    proc, out = _nvcc(src, arch, folder, "ptx", "-ptx", out=".ptx")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx = out.read_text()
    entries = list(re.finditer(r"\.entry (\w+)\(", ptx)) + [None]
    return {m.group(1): {w: len(re.findall(rf"^\s*{re.escape(w)}", ptx[m.end():nxt.start() if nxt else len(ptx)], re.M))
                         for w in words} for m, nxt in zip(entries, entries[1:])}
