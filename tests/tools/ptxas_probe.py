"""Probe of a ptxas miscompile (issue 14, case 2): on sm_90, ptxas of CUDA 13.0 merges integer
max chains into the 3-input VIMNMX3 and drops the negation of an operand (`max(a, -b, c)` is
computed as `max(a, b, c)`). Each kernel below computes one form of it on random ints; the
script prints how many of 4096 results are wrong, with NVRTC at full optimization.

    python tests/tools/ptxas_probe.py      (needs a GPU and cuda-python)
"""
from __future__ import annotations

import numpy as np

from ember.backend import cuda

BODY = {
    "max(a, -b, c)": "int y = -b[i]; int m = a[i] > y ? a[i] : y; m = m > c[i] ? m : c[i];",
    "max(-a, -b, -c)": "int x = -a[i], y = -b[i], z = -c[i]; int m = x > y ? x : y; m = m > z ? m : z;",
    "max(a, -b)": "int y = -b[i]; int m = a[i] > y ? a[i] : y;",
    "max(a, b, c)": "int m = a[i] > b[i] ? a[i] : b[i]; m = m > c[i] ? m : c[i];",
    "workaround ember_imax": "int y = -b[i]; int m = ember_imax(ember_imax(a[i], y), c[i]);",
}
HELPER = """
/* int max without a compare-select, so ptxas forms no VIMNMX3 from it */
__device__ static inline int ember_imax(int a, int b) { return a ^ ((a ^ b) & -(int)(a < b)); }
"""


def main() -> None:
    from cuda.bindings import driver as cu
    ctx, arch = cuda._device()  # type: ignore[misc]
    rng = np.random.default_rng(0)
    n = 4096
    host = [rng.integers(-1000, 1000, n, dtype=np.int32) for _ in range(3)]
    a, b, c = host
    want = {"max(a, -b, c)": np.maximum(np.maximum(a, -b), c), "max(-a, -b, -c)": np.maximum(np.maximum(-a, -b), -c),
            "max(a, -b)": np.maximum(a, -b), "max(a, b, c)": np.maximum(np.maximum(a, b), c),
            "workaround ember_imax": np.maximum(np.maximum(a, -b), c)}
    bufs = []
    for arr in host + [np.zeros(n, np.int32)]:
        p = cuda._check(cu.cuMemAlloc(arr.nbytes))
        cuda._check((cu.cuMemcpyHtoD(p, arr.ctypes.data, arr.nbytes)[0], None))
        bufs.append(p)
    for name, body in BODY.items():
        src = HELPER + ('extern "C" __global__ void k(int* __restrict__ o, const int* __restrict__ a, const int* '
                        '__restrict__ b, const int* __restrict__ c) { int i = blockIdx.x * blockDim.x + threadIdx.x; '
                        + body + " o[i] = m; }")
        mod = cuda._check(cu.cuModuleLoadData(cuda.compile_cubin(src, arch)))
        fn = cuda._check(cu.cuModuleGetFunction(mod, b"k"))
        args = [np.array([int(p)], dtype=np.uint64) for p in [bufs[3], *bufs[:3]]]
        addrs = np.array([x.ctypes.data for x in args], dtype=np.uint64)
        cuda._check((cu.cuLaunchKernel(fn, n // 256, 1, 1, 256, 1, 1, 0, 0, addrs.ctypes.data, 0)[0], None))
        out = np.empty(n, np.int32)
        cuda._check((cu.cuMemcpyDtoH(out.ctypes.data, bufs[3], out.nbytes)[0], None))
        print(f"{name:24s} {int((out != want[name]).sum()):5d} of {n} wrong  ({arch})")


if __name__ == "__main__":
    main()
