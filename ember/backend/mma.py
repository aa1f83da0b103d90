"""CUDA rendering of a contraction on tensor cores (`mma.sync.m16n8k16`, sm_80 and later).

The kernel a TensorCorePlan describes (see compiler/contraction.py):
- the grid: x over column tiles (j), y over row tiles (i), z over the batch ranges;
- shared memory: `stages` slots of one A tile and one B tile, each stored with its contiguous
  axis innermost, in rows of 16-byte chunks whose chunk index is XOR-swizzled by the row, so
  that the eight rows one `ldmatrix` reads fall in eight different bank groups;
- the K loop: `cp.async` fills the slot `stages - 1` steps ahead while the warps run `ldmatrix`
  and `mma` on the current one (zero-filled past the edges: masked edge tiles);
- the epilogue: the kernel's own expression around the reduction (bias, activation, cast),
  rendered by the generic writer per accumulator element, guarded at the edges.
"""
from __future__ import annotations

from ..compiler.contraction import Contraction, Operand, TensorCorePlan
from ..compiler.lower import Kernel
from .render import CLike, KernelWriter, Scope

CHUNK = 8  # f16/bf16 elements per 16-byte chunk

HELPERS = r"""
EMBER_D unsigned ember_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
EMBER_D void ember_cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(ember_smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
EMBER_D void ember_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> EMBER_D void ember_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
EMBER_D void ember_ldmatrix4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ember_smem_addr(p)));
}
EMBER_D void ember_ldmatrix4_trans(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ember_smem_addr(p)));
}
#define EMBER_MMA(TYPE) \
EMBER_D void ember_mma_##TYPE(float* c, const unsigned* a, const unsigned* b) { \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #TYPE "." #TYPE ".f32 " \
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])); \
}
EMBER_MMA(bf16)
EMBER_MMA(f16)
"""


def threads(p: TensorCorePlan) -> int:
    return 32 * p.warps_m * p.warps_n


def smem_bytes(p: TensorCorePlan) -> int:
    return p.stages * (p.block_m + p.block_n) * p.block_k * 2


def grid(c: Contraction, p: TensorCorePlan) -> tuple[int, int, int]:
    m, n, _ = c.mnk
    batch = 1
    for r in c.batch:
        batch *= r.arg[1]
    return -(-n // p.block_n), -(-m // p.block_m), batch


def _tile_shape(op: Operand, out_tile: int, p: TensorCorePlan) -> tuple[int, int]:
    """(rows, width) of an operand's tile in shared memory: the contiguous axis is the width."""
    return (out_tile, p.block_k) if op.k_major else (p.block_k, out_tile)


def _swizzle(row: str, chunk: str, width: int) -> str:
    """The physical chunk of (row, chunk): eight consecutive rows land in eight bank groups.
    Rows of 4 chunks (64 bytes) pair up in a 128-byte line, so the pair index is XORed in."""
    chunks = width // CHUNK
    if chunks >= 8:
        return f"({chunk} ^ ({row} & 7))"
    return f"({chunk} ^ (({row} >> 1) & 3))"


class _Epilogue(KernelWriter):
    """The kernel's value around the reduction, for one output element (names set by render)."""

    def __init__(self, r: CLike, k: Kernel, c: Contraction, prefix: str):
        super().__init__(r, k, prefix)
        self.names.update({c.i: "ei", c.j: "ej"})
        self.names.update({b: f"z{n}" for n, b in enumerate(c.batch)})

    def body(self, c: Contraction, acc: str) -> list[str]:
        root = Scope(None, frozenset(self.k.ranges), [])
        d = c.reduce.dtype
        self.memo[(c.reduce, id(root))] = self.r.round_to(d, acc)  # f16/bf16 sums round once at the end
        buf, idx, value = self.k.store.srcs
        v = self.value(value, root)
        i = self.value(idx, root)
        root.put(f"{self.buf(buf)}[{i}] = {self.r.store_value(self.ref(v, value), value.dtype)};")
        return [line for line in root.lines if isinstance(line, str)]


def _fill(name: str, op: Operand, base: str, out_var: str, out_size: int, kr_size: int, rows: int, width: int,
          nthreads: int, other_stride: int) -> list[str]:
    """Statements that copy one operand tile into shared-memory slot `slot` (k0: its first k).
    other_stride: the buffer stride of the tile's rows (the axis that is not contiguous)."""
    per_row = width // CHUNK
    count = rows * per_row // nthreads
    lines = ["#pragma unroll", f"for (int q = 0; q < {count}; q++) {{",
             f"  int ch = threadIdx.x + q * {nthreads}, r = ch / {per_row}, c = ch % {per_row};"]
    if op.k_major:
        lines.append(f"  int go = {out_var} + r, gk = k0 + c * {CHUNK};")
        along, along_size, other, other_size = "gk", kr_size, "go", out_size
    else:
        lines.append(f"  int gk = k0 + r, go = {out_var} + c * {CHUNK};")
        along, along_size, other, other_size = "go", out_size, "gk", kr_size
    lines.append(f"  unsigned short* dst = {name} + slot * {rows * width} + r * {width} + "
                 f"{_swizzle('r', 'c', width)} * {CHUNK};")
    src = f"{base} + (long long){other} * {other_stride} + {along}"
    if op.aligned:
        lines.append(f"  bool ok = {other} < {other_size} && {along} < {along_size};")
        lines.append(f"  ember_cp_async16(dst, ok ? (const void*)({src}) : (const void*){base}, ok);")
    else:  # element by element, each masked (an odd contiguous extent or an unaligned base)
        lines.append("  #pragma unroll")
        lines.append(f"  for (int e = 0; e < {CHUNK}; e++) dst[e] = ({other} < {other_size} && {along} + e < "
                     f"{along_size}) ? ({src})[e] : (unsigned short)0;")
    lines.append("}")
    return lines


def render(r: CLike, k: Kernel, c: Contraction, p: TensorCorePlan, prefix: str) -> str:
    m, n, kk = c.mnk
    nt = threads(p)
    wtm, wtn = p.block_m // p.warps_m, p.block_n // p.warps_n   # a warp's tile
    mi, ni = wtm // 16, wtn // 8
    (ar, aw), (br, bw) = _tile_shape(c.a, p.block_m, p), _tile_shape(c.b, p.block_n, p)
    ep = _Epilogue(r, k, c, prefix)
    kind = c.dtype.name
    lines = ["extern __shared__ __align__(128) unsigned char ember_smem[];",
             "unsigned short* sa = (unsigned short*)ember_smem;",
             f"unsigned short* sb = sa + {p.stages * ar * aw};",
             "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
             f"const int wm = warp / {p.warps_n}, wn = warp % {p.warps_n};",
             f"const int m0 = blockIdx.y * {p.block_m}, n0 = blockIdx.x * {p.block_n};"]
    stride = 1
    for i, b in reversed(list(enumerate(c.batch))):
        lines.append(f"const int z{i} = (blockIdx.z / {stride}) % {b.arg[1]};")
        stride *= b.arg[1]
    for op, var in ((c.a, "ga"), (c.b, "gb")):
        off = " + ".join([str(op.offset)] + [f"(long long)z{i} * {op.strides[b]}"
                                             for i, b in enumerate(c.batch) if b in op.strides])
        lines.append(f"const unsigned short* {var} = b{op.load.srcs[0].arg} + {off};")
    lines += [f"float acc[{mi}][{ni}][4];",
              f"#pragma unroll\nfor (int x = 0; x < {mi}; x++)",
              f"  #pragma unroll\n  for (int y = 0; y < {ni}; y++) acc[x][y][0] = acc[x][y][1] = acc[x][y][2] = "
              "acc[x][y][3] = 0.0f;"]
    steps = -(-kk // p.block_k)
    fill_a = _fill("sa", c.a, "ga", "m0", m, kk, ar, aw, nt, c.a.strides[c.i if c.a.k_major else c.k])
    fill_b = _fill("sb", c.b, "gb", "n0", n, kk, br, bw, nt, c.b.strides[c.j if c.b.k_major else c.k])
    lines += ["auto fill = [&](int slot, int k0) {", *["  " + x for x in fill_a + fill_b], "};"]
    lines += [f"#pragma unroll\nfor (int s = 0; s < {p.stages - 1}; s++) {{",
              f"  if (s < {steps}) fill(s, s * {p.block_k});", "  ember_cp_async_commit();", "}",
              f"for (int t = 0; t < {steps}; t++) {{",
              f"  ember_cp_async_wait<{p.stages - 2}>();",
              "  __syncthreads();  /* slot t is in; everyone is done with slot t - 1 */",
              f"  if (t + {p.stages - 1} < {steps}) fill((t + {p.stages - 1}) % {p.stages}, "
              f"(t + {p.stages - 1}) * {p.block_k});",
              "  ember_cp_async_commit();",
              f"  const unsigned short* ta = sa + (t % {p.stages}) * {ar * aw};",
              f"  const unsigned short* tb = sb + (t % {p.stages}) * {br * bw};",
              f"  #pragma unroll\n  for (int kk = 0; kk < {p.block_k}; kk += 16) {{",
              f"    unsigned fa[{mi}][4], fb[{ni // 2}][4];"]
    # A fragments: rows of 16 (i) by 16 (k); K-major tiles are [i][k], else [k][i] read transposed
    lines.append(f"    #pragma unroll\n    for (int x = 0; x < {mi}; x++) {{")
    lines.append(f"      int base = wm * {wtm} + x * 16;")
    if c.a.k_major:
        lines.append("      int row = base + (lane & 15), col = kk + (lane >> 4) * 8;")
        lines.append(f"      ember_ldmatrix4(fa[x], ta + row * {aw} + {_swizzle('row', 'col / 8', aw)} * 8);")
    else:
        lines.append("      int row = kk + ((lane >> 4) & 1) * 8 + (lane & 7), col = base + ((lane >> 3) & 1) * 8;")
        lines.append(f"      ember_ldmatrix4_trans(fa[x], ta + row * {aw} + {_swizzle('row', 'col / 8', aw)} * 8);")
    lines.append("    }")
    # B fragments, two n8 tiles per ldmatrix.x4: K-major tiles are [j][k], else [k][j] read transposed
    lines.append(f"    #pragma unroll\n    for (int y = 0; y < {ni // 2}; y++) {{")
    lines.append(f"      int base = wn * {wtn} + y * 16;")
    if c.b.k_major:
        lines.append("      int row = base + ((lane >> 4) & 1) * 8 + (lane & 7), col = kk + ((lane >> 3) & 1) * 8;")
        lines.append(f"      ember_ldmatrix4(fb[y], tb + row * {bw} + {_swizzle('row', 'col / 8', bw)} * 8);")
    else:
        lines.append("      int row = kk + ((lane >> 3) & 1) * 8 + (lane & 7), col = base + ((lane >> 4) & 1) * 8;")
        lines.append(f"      ember_ldmatrix4_trans(fb[y], tb + row * {bw} + {_swizzle('row', 'col / 8', bw)} * 8);")
    lines.append("    }")
    lines += [f"    #pragma unroll\n    for (int x = 0; x < {mi}; x++)",
              f"      #pragma unroll\n      for (int y = 0; y < {ni}; y++) "
              f"ember_mma_{kind}(acc[x][y], fa[x], &fb[y >> 1][(y & 1) * 2]);",
              "  }", "}"]
    # the epilogue: (g, g + 8) rows and (2 tig, 2 tig + 1) columns of every fragment
    lines += [f"#pragma unroll\nfor (int x = 0; x < {mi}; x++)",
              f"#pragma unroll\nfor (int y = 0; y < {ni}; y++)",
              "#pragma unroll\nfor (int h = 0; h < 4; h++) {",
              f"  int ei = m0 + wm * {wtm} + x * 16 + (lane >> 2) + (h >> 1) * 8;",
              f"  int ej = n0 + wn * {wtn} + y * 8 + (lane & 3) * 2 + (h & 1);",
              f"  if (ei < {m} && ej < {n}) {{",
              *["    " + x for x in ep.body(c, "acc[x][y][h]")], "  }", "}"]
    body = "".join("  " + x + "\n" for line in lines for x in line.split("\n"))
    return f"extern \"C\" __global__ void __launch_bounds__({nt}) " + ep.signature()[len("void "):] + \
        " {\n" + body + "}\n"
