"""C rendering of a contraction as packed panels and a register-tile micro-kernel (the CPU's
matmul; see compiler/contraction.py for how one is found).

The output is cut into MC x NC tiles, shared out among OpenMP threads. For each tile a thread
packs the rows of A it needs into micro-panels of MR rows ([K][MR], contiguous) and the columns
of B into micro-panels of NR columns ([K][NR]), converting f16/bf16 to float on the way, with
zeros past the edges. The micro-kernel then keeps an MR x NR block of sums in vector registers
over all of K, reading one MR-vector of A (broadcast) and one NR-vector of B per step; the
epilogue (the kernel's value around the reduction) runs per element on the finished block.

MR and NR follow the vector width the C compiler targets (-march=native): with AVX-512, an 8 x 32
block of floats is 16 of the 32 vector registers (12 x 32 and 14 x 32 were slower, measured);
with AVX2, 6 x 16 is 12 of the 16. docs/performance.md has the measurements.
"""
from __future__ import annotations

from .. import dtype as dt
from ..compiler.contraction import Contraction, PackedPlan
from ..compiler.lower import Kernel
from .render import CLike, ElementWriter, KernelWriter, operand_bases

HELPERS = r"""
#include <stdlib.h>
#if defined(__AVX512F__)
#define EMBER_VBYTES 64
#define EMBER_MR_float 8
#define EMBER_NR_float 32
#define EMBER_MR_double 8
#define EMBER_NR_double 16
#else
#define EMBER_VBYTES 32
#define EMBER_MR_float 6
#define EMBER_NR_float 16
#define EMBER_MR_double 6
#define EMBER_NR_double 8
#endif
/* c[MR][NR] = sum over k of a[k][.] (outer) b[k][.], from packed micro-panels */
#define EMBER_UKERNEL(T)                                                                     \
static void ember_ukernel_##T(int K, const T* restrict a, const T* restrict b, T* restrict c) { \
  typedef T v __attribute__((vector_size(EMBER_VBYTES)));                                     \
  enum { MR = EMBER_MR_##T, NR = EMBER_NR_##T, NV = NR / (EMBER_VBYTES / sizeof(T)) };        \
  v acc[MR][NV];                                                                              \
  for (int i = 0; i < MR; i++) for (int j = 0; j < NV; j++) acc[i][j] = (v){0};              \
  for (int k = 0; k < K; k++) {                                                               \
    v bv[NV];                                                                                 \
    for (int j = 0; j < NV; j++) memcpy(&bv[j], b + k * NR + j * (NR / NV), sizeof(v));       \
    for (int i = 0; i < MR; i++) {                                                            \
      T s = a[k * MR + i];                                                                    \
      for (int j = 0; j < NV; j++) acc[i][j] += s * bv[j];                                    \
    }                                                                                         \
  }                                                                                           \
  for (int i = 0; i < MR; i++) for (int j = 0; j < NV; j++)                                  \
    memcpy(c + i * NR + j * (NR / NV), &acc[i][j], sizeof(v));                                \
}
"""


def compute_type(c: Contraction) -> str:
    return "double" if c.reduce.srcs[0].dtype is dt.f64 else "float"


def helpers(kernels: list[Kernel]) -> str:
    types = sorted({compute_type(k.contraction) for k in kernels if k.contraction is not None})
    if not types:
        return ""
    return HELPERS + "".join(f"EMBER_UKERNEL({t})\n" for t in types)


def _pack(r: CLike, name: str, op, base: str, out_var: str, out_size: int, k_size: int, addr: str,
          tile: str, micro: str, t: str) -> list[str]:
    """Fill `name` with the tile's micro-panels [tile / micro][K][micro], zeros past the edge;
    the loop nest reads the buffer along its contiguous axis. addr: the offset of (o, q)."""
    load = r.load(base, addr, op.load.dtype)
    dst = f"{name}[(o / {micro}) * {k_size} * {micro} + q * {micro} + o % {micro}]"
    inner = f"{dst} = o + {out_var} < {out_size} ? ({t}){load} : ({t})0;"
    if op.k_major:
        return [f"for (int o = 0; o < {tile}; o++)", f"  for (int q = 0; q < {k_size}; q++) {inner}"]
    return [f"for (int q = 0; q < {k_size}; q++)", f"  for (int o = 0; o < {tile}; o++) {inner}"]


def render(r: CLike, k: Kernel, prefix: str = "") -> str:
    """The kernel whole, from its PackedPlan (the contraction family's interface, as mma.render's)."""
    c, p = k.contraction, k.plan
    assert isinstance(c, Contraction) and isinstance(p, PackedPlan)
    m, n, kk = c.mnk
    t = compute_type(c)
    lines, value, index = ElementWriter(r, k, "", c.names("ei", "ej"), c.reduce).element("blk[i * NR + j]")
    store = f"{KernelWriter(r, k).buf(k.store.srcs[0])}[{index}] = {value};"
    body = [f"enum {{ MR = EMBER_MR_{t}, NR = EMBER_NR_{t}, MC = {p.mc_tiles} * MR, NC = {p.nc_tiles} * NR }};",
            f"const int tiles_m = ({m} + MC - 1) / MC, tiles_n = ({n} + NC - 1) / NC;",
            "#pragma omp parallel",
            "{",
            f"  {t}* pa = ({t}*)aligned_alloc(64, (sizeof({t}) * MC * {kk} + 63) / 64 * 64);",
            f"  {t}* pb = ({t}*)aligned_alloc(64, (sizeof({t}) * NC * {kk} + 63) / 64 * 64);",
            "  #pragma omp for schedule(dynamic, 1)",
            f"  for (long long tile = 0; tile < (long long){c.batch_size} * tiles_m * tiles_n; tile++) {{",
            "    const int m0 = (int)((tile / tiles_n) % tiles_m) * MC, n0 = (int)(tile % tiles_n) * NC;"]
    if c.batch:
        body.append("    const long long zf = tile / ((long long)tiles_m * tiles_n);")
    body += ["    " + x for x in operand_bases(c, "zf", r)]
    for name, op, base, o, size, rng, tile, micro in (("pa", c.a, "ga", "m0", m, c.i, "MC", "MR"),
                                                      ("pb", c.b, "gb", "n0", n, c.j, "NC", "NR")):
        addr = f"{c.offset(op, rng, f'o + {o}')} + {c.offset(op, c.k, 'q')}"
        pack = _pack(r, name, op, base, o, size, kk, addr, tile, micro, t)
        body += ["    " + x for x in pack]
    body += [f"    for (int jr = 0; jr < NC && n0 + jr < {n}; jr += NR)",
             f"      for (int ir = 0; ir < MC && m0 + ir < {m}; ir += MR) {{",
             f"        {t} blk[MR * NR];",
             f"        ember_ukernel_{t}({kk}, pa + (ir / MR) * {kk} * MR, pb + (jr / NR) * {kk} * NR, blk);",
             "        for (int i = 0; i < MR; i++)",
             "          for (int j = 0; j < NR; j++) {",
             "            const int ei = m0 + ir + i, ej = n0 + jr + j;",
             f"            if (ei < {m} && ej < {n}) {{",
             *["              " + x for x in lines], "              " + store,
             "            }", "          }", "      }", "  }", "  free(pa);", "  free(pb);", "}"]
    return KernelWriter(r, k, prefix).signature() + " {\n" + "".join("  " + x + "\n" for x in body) + "}\n"
