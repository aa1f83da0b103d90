"""The machine a program is compiled for: what the compiler's passes may read about the hardware.

A GPU target comes from a table by architecture (`ember source --arch sm_86`, no GPU needed), or
from the device itself (backend/cuda_runtime.py reads its attributes when one is present, over
the table's entry for its architecture: the rates, which no attribute gives, stay the table's).
A CPU target describes this process's host. Every hardware fact a pass uses is a field here, so
that a new GPU is a new row of GPUS and not a hunt for constants.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

KB = 1024


@dataclass(frozen=True)
class Target:
    kind: str                     # "cuda" or "cpu"
    arch: str                     # "sm_86", "sm_90a"...; the machine's name for a CPU ("x86_64")
    name: str = ""                # the device's name (stored plans are per device: backend/search.py)
    sms: int = 0                  # streaming multiprocessors
    smem_block: int = 0           # bytes of shared memory one block may have (the opt-in maximum)
    smem_sm: int = 0              # bytes of shared memory per SM (what resident blocks share)
    regs_sm: int = 0              # 32-bit registers per SM (and per block)
    threads_sm: int = 0           # resident threads per SM
    l2: int = 0                   # bytes of L2 (the last level for a CPU)
    tensor_cores: tuple[str, ...] = ()   # the matrix instructions: "mma.sync" (sm_80+), "wgmma" (sm_90a)
    tma: bool = False             # the Tensor Memory Accelerator's bulk copies (sm_90a)
    vector_atomics: bool = False  # atomicAdd of a float2 to global memory, one 8-byte red (sm_90+)
    bandwidth: float = 0.0        # bytes/s the memory moves (GPUs: a device-to-device copy's practical rate)
    flops_f32: float = 0.0        # FLOP/s: f32 FMA, and dense bf16/f16 products on the tensor cores
    flops_bf16: float = 0.0
    # the host's, read by no pass yet: outside the schedule cache's key (repr), which they would split per process
    cores: int = dataclasses.field(default=0, repr=False)   # the cores this process may run on
    simd: int = dataclasses.field(default=0, repr=False)    # bytes of a vector register
    caches: tuple[int, ...] = dataclasses.field(default=(), repr=False)   # bytes of L1d, L2, L3

    @property
    def mma_sync(self) -> bool:
        return "mma.sync" in self.tensor_cores

    @property
    def wgmma(self) -> bool:
        return "wgmma" in self.tensor_cores

    @property
    def min_threads(self) -> int:
        """The fewest threads that fill the GPU (a power of two, at most 1024 a SM): a kernel with
        fewer leaves SMs partly idle unless its threads share work (compiler/optimize.py)."""
        return 1 << (self.sms * 1024).bit_length() - 1


_AMPERE = dict(kind="cuda", regs_sm=64 * KB, tensor_cores=("mma.sync",))
GPUS: dict[str, Target] = {t.arch: t for t in (
    # A100 (SXM4, 40 GB)
    Target(arch="sm_80", name="NVIDIA A100-SXM4-40GB", sms=108, smem_block=163 * KB, smem_sm=164 * KB,
           threads_sm=2048, l2=40 * KB * KB, bandwidth=1.555e12, flops_f32=19.5e12, flops_bf16=312e12, **_AMPERE),
    # RTX 3080 (10 GB): the course's grading GPU, and the default without a GPU
    Target(arch="sm_86", name="NVIDIA GeForce RTX 3080", sms=68, smem_block=99 * KB, smem_sm=100 * KB,
           threads_sm=1536, l2=5 * KB * KB, bandwidth=760e9, flops_f32=29.8e12, flops_bf16=59.5e12, **_AMPERE),
    # RTX 4090 (the L4 has the same limits per SM, 58 SMs and 300 GB/s)
    Target(arch="sm_89", name="NVIDIA GeForce RTX 4090", sms=128, smem_block=99 * KB, smem_sm=100 * KB,
           threads_sm=1536, l2=72 * KB * KB, bandwidth=1.008e12, flops_f32=82.6e12, flops_bf16=165e12, **_AMPERE),
    # H200 (SXM, 141 GB): 4.0 TB/s is a copy's rate (the datasheet's 4.8); without the a, no wgmma
    Target(kind="cuda", arch="sm_90", name="NVIDIA H200", sms=132, smem_block=227 * KB, smem_sm=228 * KB,
           regs_sm=64 * KB, threads_sm=2048, l2=50 * KB * KB, tensor_cores=("mma.sync",), tma=True,
           vector_atomics=True, bandwidth=4.0e12, flops_f32=67e12, flops_bf16=989e12),
    Target(kind="cuda", arch="sm_90a", name="NVIDIA H200", sms=132, smem_block=227 * KB, smem_sm=228 * KB,
           regs_sm=64 * KB, threads_sm=2048, l2=50 * KB * KB, tensor_cores=("mma.sync", "wgmma"), tma=True,
           vector_atomics=True, bandwidth=4.0e12, flops_f32=67e12, flops_bf16=989e12),
)}
ARCHS = tuple(GPUS)
DEFAULT_ARCH = "sm_86"   # what source printed without a GPU is for


def gpu(arch: str) -> Target:
    """The table's target for a GPU architecture."""
    if arch not in GPUS:
        raise ValueError(f"unknown GPU architecture '{arch}' (known: {', '.join(ARCHS)})")
    return GPUS[arch]


def _cache_sizes() -> tuple[int, ...]:
    """This host's data caches, innermost first (Linux's sysfs; empty elsewhere)."""
    sizes = []
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (d / "type").read_text().strip() in ("Data", "Unified"):
                text = (d / "size").read_text().strip()
                sizes.append(int(text[:-1]) * KB if text.endswith("K") else int(text))
        except (OSError, ValueError):
            continue
    return tuple(sizes)


def _simd_bytes() -> int:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        flags = []
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16


@functools.lru_cache(maxsize=None)
def cpu() -> Target:
    """This host: the cores this process may use (its affinity), its vector width and caches."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    caches = _cache_sizes()
    return Target(kind="cpu", arch=platform.machine(), name=platform.processor() or platform.machine(),
                  cores=cores, simd=_simd_bytes(), caches=caches)
