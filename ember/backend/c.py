"""The C backend: one translation unit per program, built once with the system C compiler,
cached on disk by the hash of its source, loaded with ctypes.

Flags: -O3 -march=native for speed; -fno-math-errno (sqrt may inline); -fno-trapping-math (no
one reads floating-point traps, so selects such as NaN-propagating max can be if-converted and
vectorized; values are unchanged). Never -ffast-math, which breaks NaN, inf and -0. Not
-fwrapv: it stops gcc from treating index arithmetic as affine (5x slower matmul, see
docs/performance.md); the renderer makes the spec's wrapping signed arithmetic explicit
instead, computing it in the unsigned type. OpenMP runs the outer loop of large kernels in
parallel when the compiler supports it, with as many threads as this process has free cores
and a passive wait policy (threads()).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import debug, target
from ..cache import cache_dir, cache_read, cache_write
from ..compiler import pipeline, schedule
from ..compiler.contraction import PackedPlan
from ..compiler.lower import Kernel
from ..compiler.schedule import Schedule
from ..dtype import DType
from ..ir import Node, Op, toposort
from . import cached, packed
from . import run_values as shared_run_values
from .render import HALF_HELPERS, CLike, kinds

PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <stdint.h>

#define EMBER_D static inline
static inline float ember_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int ember_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline unsigned short ember_f32_to_f16_bits(float f) {  /* round to nearest, ties to even */
  unsigned int x = ember_as_uint(f);
  unsigned int sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);    /* >= 65520: inf */
  if (ax < 0x38800000u)                                                /* subnormal or zero */
    return (unsigned short)(sign | (unsigned int)nearbyintf(ember_as_float(ax) * 16777216.0f));
  unsigned int h = ((((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13)), rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (unsigned short)(sign | h);
}
""" + HALF_HELPERS + r"""
/* 2^x for float, branch-free so loops that use it vectorize (libm's exp2f is a call).
   x = n + f with |f| <= 1/2; 2^f by its Taylor series to degree 7 (relative error < 1e-8, below
   half an ulp of float); 2^n applied in two halves so that results down to subnormals and up to
   overflow round correctly. NaN, +-inf and out-of-range x fall out of the clamps and selects. */
static inline float ember_exp2f(float x) {
  float xc = x < -160.0f ? -160.0f : (x > 160.0f ? 160.0f : x);
  float n = floorf(xc + 0.5f), f = xc - n;
  float p = 1.5252733804059841e-05f;
  p = p * f + 1.5403530393381608e-04f; p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.6181291076284772e-03f; p = p * f + 5.5504108664821580e-02f;
  p = p * f + 2.4022650695910071e-01f; p = p * f + 6.9314718055994531e-01f; p = p * f + 1.0f;
  int ni = (int)n, n1 = ni / 2, n2 = ni - n1;
  unsigned int e1 = (unsigned int)(n1 + 127) << 23, e2 = (unsigned int)(n2 + 127) << 23;
  float s1, s2; memcpy(&s1, &e1, 4); memcpy(&s2, &e2, 4);
  float r = p * s1 * s2;
  return x != x ? x : r;
}
"""


FAMILIES = {PackedPlan: packed}   # the plan families rendered whole (render, helpers), by plan type
NEST = 128  # reductions of up to 128 elements may run inside others (attention's scores, unstored)


def _short_loops(k: Kernel) -> bool:
    """Whether a loop that is not a lane runs at most 16 times (GCC peels those completely)."""
    reduced = [r for n in toposort([k.store]) if n.op is Op.REDUCE for r in n.arg[1]]
    return any(r.arg[1] <= 16 for r in [*k.ranges, *reduced] if r not in k.lanes)


class CRenderer(CLike):
    # GCC 12.2 -O3 (x86, AVX2 or AVX-512) vectorizes a sum whose steps convert int -> unsigned
    # -> int wrongly once its vectors are wider than the sum's lanes: the epilogue keeps one
    # quarter of the vector (an i32 sum of 4096 values in 8 lanes, AVX-512:
    # tests/compiler/toolchain/gcc12_int_sum_lanes.eir). Accumulated in the unsigned type, with
    # one conversion at the end, it is right, and wraps as the spec's sum does.
    unsigned_sums = True

    def render_kernel(self, k: Kernel, prefix: str = "") -> str:
        if type(k.plan) in FAMILIES:
            return FAMILIES[type(k.plan)].render(self, k, prefix)
        text = super().render_kernel(k, prefix)
        if k.lanes and _short_loops(k):
            # GCC 12.2's loop vectorizer (-O2 and -O3) miscompiles lane loops (unrolled register
            # tiles) inside short loops: a 2-row integer column sum over 16 columns in 8 lanes
            # came out wrong (tests/compiler/toolchain/gcc12_lanes_in_short_loop.eir). The lanes
            # are the vector dimension already (SLP vectorizes them), so the loop vectorizer goes
            # there. Elsewhere it stays: without it softmax rows ran 2x slower and column sums
            # 1.4x (row and full sums ran 2.2x faster: a lead for later, bench/cpu.py).
            text = '__attribute__((optimize("no-tree-loop-vectorize"))) ' + text
        return text


def _bitcast_helpers(pairs: set[tuple[DType, DType]]) -> str:
    out = []
    for src, dst in sorted(pairs, key=lambda p: (p[0].name, p[1].name)):
        out.append(f"static inline {dst.c_name} ember_bitcast_{src.name}_{dst.name}({src.c_name} x) "
                   f"{{ {dst.c_name} y; memcpy(&y, &x, sizeof y); return y; }}")
    return "\n".join(out) + "\n" if out else ""


@dataclass
class CSource:
    """A program's C source in parts, so big programs compile as several units in parallel."""
    header: str                  # prelude and helpers, in every unit
    kernels: list[str]
    entry: str                   # ember_run, calling the kernels in order
    calls: dict[str, str] = field(default_factory=dict)   # kernel name -> the function it calls (its kind's)

    @property
    def text(self) -> str:
        return self.header + "\n" + "\n".join(self.kernels) + "\n" + self.entry

    def units(self, parts: int) -> list[str]:
        if parts <= 1 or len(self.kernels) < 16:
            return [self.text]
        size = -(-len(self.kernels) // parts)
        groups = [self.kernels[i:i + size] for i in range(0, len(self.kernels), size)]
        prototypes = "".join(k[:k.index(" {")] + ";\n" for k in self.kernels)
        return [self.header + "\n" + "\n".join(g) for g in groups] + [self.header + prototypes + self.entry]


def render(sched: Schedule) -> CSource:
    """The whole program: prelude, one function per kernel, and `ember_run(void** buffers)`."""
    r = CRenderer()
    texts = [r.render_kernel(k) for k in sched.kernels]
    calls = kinds(sched.kernels, texts)   # a model's layers share their kinds' functions
    entry = ["void ember_run(void** b) {"]
    entry += [f"  {calls[k.name]}({', '.join(f'b[{b.id}]' for b in k.args)});" for k in sched.kernels]
    entry.append("}")
    return CSource(PRELUDE + packed.helpers(sched.kernels) + _bitcast_helpers(r.bitcasts),
                   [t for k, t in zip(sched.kernels, texts) if calls[k.name] == k.name], "\n".join(entry) + "\n", calls)


# ------------------------------------------------------------------------------- compiling

def _cc() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def available() -> bool:
    return _cc() is not None


def why_unavailable() -> str:
    return "no C compiler was found (install gcc or clang, or set CC)"


@functools.lru_cache(maxsize=None)
def _flags(opt: str = "-O3") -> tuple[str, ...]:
    """opt: -O3 always, except when the fuzzer asks whether a wrong answer is the C compiler's."""
    base = (opt, "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")
    return base + (("-fopenmp",) if _supports("-fopenmp") else ("-fopenmp-simd",) if _supports("-fopenmp-simd") else ())


def _supports(flag: str) -> bool:
    cc = _cc()
    if cc is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "t.c"
        src.write_text("int f(int x) { return x + 1; }\n")
        proc = subprocess.run([cc, flag, "-shared", "-fPIC", str(src), "-o", str(Path(d) / "t.so")],
                              capture_output=True)
        return proc.returncode == 0


def threads() -> int:
    """The cores this process may run on (its affinity) less the machine's load, at least 1.
    More threads than free cores only makes each parallel loop wait for its preempted thread."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    busy = os.getloadavg()[0]
    try:  # the 1-minute average lags behind a process that just started: the runnable tasks now, less this one
        busy = max(busy, int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        pass
    return max(1, min(cores, cores - int(busy + 0.5)))


@functools.lru_cache(maxsize=None)
def _openmp_settings() -> None:
    """Set before the first program loads libgomp, which reads them once, at load. Passive: a
    thread that waits sleeps; spinning (libgomp's default, for a while) takes the cores that
    the other threads, or other processes, need. A user's own OMP_* settings win."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads()))
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")


class CompileError(RuntimeError):
    pass


def build(source: "CSource | str", opt: str = "-O3") -> Path:
    """The shared library for source, from the cache or compiled now (atomically published).
    A large program is compiled as several units at once, one per core, then linked."""
    cc = _cc()
    if cc is None:
        raise CompileError("no C compiler found (set CC, or install gcc or clang)")
    src = source if isinstance(source, CSource) else CSource(source, [], "")
    key = hashlib.sha256("\0".join([cc, *_flags(opt), src.text]).encode()).hexdigest()[:32]
    lib = cache_dir("c") / f"{key}.so"
    if cache_read(lib) is not None:
        return lib
    with tempfile.TemporaryDirectory(dir=lib.parent) as work:
        units = src.units(threads())
        paths = [Path(work) / f"u{i}.c" for i in range(len(units))]
        for path, text in zip(paths, units):
            path.write_text(text)
        compile_flags = [f for f in _flags(opt) if f != "-shared"]
        def compile_unit(p: Path) -> subprocess.CompletedProcess:
            return subprocess.run([cc, *compile_flags, "-c", str(p), "-o", str(p.with_suffix(".o"))],
                                  capture_output=True, text=True)
        with ThreadPoolExecutor(max_workers=len(units)) as pool:
            procs = list(pool.map(compile_unit, paths))
        failed = next((p for p in procs if p.returncode != 0), None)
        if failed is None:
            objects = [str(p.with_suffix(".o")) for p in paths]
            failed = subprocess.run([cc, *_flags(opt), *objects, "-o", f"{work}/lib.so", "-lm"],
                                    capture_output=True, text=True)
            failed = failed if failed.returncode != 0 else None
        if failed is not None:
            raise CompileError(f"the C compiler failed on generated code:\n{failed.stderr[:4000]}")
        cache_write(lib, Path(f"{work}/lib.so").read_bytes())
    return lib


# --------------------------------------------------------------------------------- running

class CProgram:
    """A compiled program: call it with the params' storage arrays, get the outputs' arrays."""

    def __init__(self, outputs: list[Node], opt: str = "-O3"):
        t0 = time.perf_counter()
        self.sched = prepare(outputs)
        self.csource = render(self.sched)
        self.source = self.csource.text
        t1 = time.perf_counter()
        _openmp_settings()
        self.lib = ctypes.CDLL(str(build(self.csource, opt)))
        self.compile_seconds = (t1 - t0, time.perf_counter() - t1)
        debug.log(1, f"ember: {len(self.sched.kernels)} kernels, codegen {self.compile_seconds[0] * 1e3:.1f} ms, "
                     f"cc {self.compile_seconds[1] * 1e3:.1f} ms")
        debug.log(2, self.source)
        self.arena_bytes = schedule.arena_bytes(self.sched)
        self.nbuf = max((b.id for b in self.sched.buffers), default=-1) + 1

    def __call__(self, inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
        return self.bind(inputs)()

    def bind(self, inputs: dict[Node, np.ndarray]) -> Callable[[], list[np.ndarray]]:
        """Allocate the buffers once; the returned function runs the program on them."""
        arrays: dict[int, np.ndarray] = {}
        for node, buf in self.sched.inputs.items():
            arr = np.ascontiguousarray(inputs[node], dtype=np.dtype(buf.dtype.np_name))
            arrays[buf.id] = arr
        for buf in self.sched.outputs:
            arrays.setdefault(buf.id, np.empty(buf.size, dtype=np.dtype(buf.dtype.np_name)))
        arena = np.empty(max(self.arena_bytes, 1), dtype=np.uint8)   # the temporaries, at their offsets
        ptrs = (ctypes.c_void_p * max(self.nbuf, 1))()
        for bid, arr in arrays.items():
            ptrs[bid] = arr.ctypes.data
        for b in self.sched.temps:
            ptrs[b.id] = arena.ctypes.data + self.sched.slots[b.id]
        results = [arrays[b.id].reshape(b.node.shape) for b in self.sched.outputs]

        def run() -> list[np.ndarray]:
            if debug.level() >= 1:
                self._run_timed(ptrs)
            else:
                self.lib.ember_run(ptrs)
            return results
        run.keep_alive = (arrays, arena)  # type: ignore[attr-defined]
        run.ptrs = ptrs  # type: ignore[attr-defined]
        return run

    def timed(self, inputs: dict[Node, np.ndarray], runs: int) -> tuple[list[np.ndarray], list[float]]:
        """The outputs of one run, then the milliseconds of each of `runs` more (host clock)."""
        run = self.bind(inputs)
        outputs = [a.copy() for a in run()]
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            self.lib.ember_run(run.ptrs)  # type: ignore[attr-defined]
            times.append((time.perf_counter() - t) * 1e3)
        return outputs, times

    def _run_timed(self, ptrs: ctypes.Array) -> None:
        for k in self.sched.kernels:
            fn = getattr(self.lib, self.csource.calls[k.name])
            t = time.perf_counter()
            fn(*[ctypes.c_void_p(ptrs[b.id]) for b in k.args])
            debug.log(1, f"  {k.name:6s} {(time.perf_counter() - t) * 1e6:10.1f} us  -> {k.out.node.dtype}"
                         f"{list(k.out.node.shape)}  reads {len(k.reads)}")


program = cached(CProgram)


def prepare(outputs: list[Node]) -> Schedule:
    """The program's kernels, scheduled (short reductions may nest) and optimized for the CPU."""
    return pipeline.compile_schedule(outputs, target.cpu(), nest=NEST)


def source(outputs: list[Node]) -> str:
    return render(prepare(outputs)).text


def run_values(outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    return shared_run_values(program(outputs), inputs)
