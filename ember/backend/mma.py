"""CUDA rendering of a contraction on tensor cores (`mma.sync.m16n8k16`, sm_80 and later).

The kernel a GpuPlan describes (see compiler/contraction.py):
- the grid: x over column tiles (j), y over row tiles (i), z over the batch ranges;
- shared memory: `stages` slots of one A tile and one B tile, each stored with its contiguous
  axis innermost, in rows of 16-byte chunks whose chunk index is XOR-swizzled by the row, so
  that the eight rows one `ldmatrix` reads fall in eight different bank groups;
- the K loop: `cp.async` fills the slot `stages - 1` steps ahead while the warps run `ldmatrix`
  and `mma` on the current one (zero-filled past the edges: masked edge tiles; a bound the
  tiles divide is not tested); mma.sync's fragments are double-buffered, the next slot waited
  for before the step's last products;
- the epilogue: the kernel's own expression around the reduction (bias, activation, cast),
  rendered by the generic writer per accumulator element, guarded at the edges.
"""
from __future__ import annotations

from ..compiler.attention import FlashPlan
from ..compiler.contraction import Contraction, GpuPlan, Operand, smem_bytes
from ..compiler.lower import Kernel
from .render import CLike, ElementWriter, KernelWriter, include, operand_bases

CHUNK = 8  # f16/bf16 elements per 16-byte chunk

# cp.async, ldmatrix and mma.sync (sm_80+); wgmma descriptors, mbarriers and TMA (sm_90a)
HELPERS, HOPPER_HELPERS = include("mma.cuh"), include("mma_hopper.cuh")


# cp.async of a chunk's first `bytes` (0 to 16), the rest of its 16 bytes zero-filled
CP_ASYNC_N = """EMBER_D void ember_cp_async_n(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(ember_smem_addr(dst)), "l"(src), "r"(bytes));
}
"""


def _straddles(c: Contraction, op: Operand) -> bool:
    """Whether an aligned operand's rows end inside a 16-byte chunk (its contiguous extent)."""
    along = c.k if op.k_major else c.i if op is c.a else c.j
    return op.aligned and along.arg[1] % (16 // c.dtype.itemsize) != 0


def _tma_coordinates(rank: int) -> tuple[str, str, str]:
    """A TMA helper's coordinate parameters, their asm operands (%2 on) and inputs."""
    return (", ".join(f"int c{i}" for i in range(rank)), ", ".join(f"%{i + 2}" for i in range(rank)),
            ", ".join(f'"r"(c{i})' for i in range(rank)))


def _tma_helper(rank: int) -> str:
    """ember_tma<rank>(dst, map, c0, c1, ..., bar): one box of the tensor at those coordinates
    (innermost first) into shared memory, zeros where it passes the tensor's edge."""
    coords, regs, ins = _tma_coordinates(rank)
    return (f"EMBER_D void ember_tma{rank}(void* dst, const EmberTmap* map, {coords}, unsigned long long* bar) {{\n"
            f'  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "\n'
            f'               "[%0], [%1, {{{regs}}}], [%{rank + 2}];\\n"\n'
            f'               :: "r"(ember_smem_addr(dst)), "l"(map), {ins}, "r"(ember_smem_addr(bar))\n'
            f'               : "memory");\n}}\n')


def _tma_store_helper(rank: int) -> str:
    """ember_tma_store<rank>(src, map, c0, c1, ...): one box from shared memory into the tensor at
    those coordinates (innermost first); what passes the tensor's edge is not written."""
    coords, regs, ins = _tma_coordinates(rank)
    return (f"EMBER_D void ember_tma_store{rank}(const void* src, const EmberTmap* map, {coords}) {{\n"
            f'  asm volatile("cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group "\n'
            f'               "[%0, {{{regs}}}], [%1];\\n"\n'
            f'               :: "l"(map), "r"(ember_smem_addr(src)), {ins} : "memory");\n}}\n')


def wgmma_helper(kind: str, n: int, trans_a: int, trans_b: int, name: str = "", a_in_registers: bool = False) -> str:
    """name(d, a, descB), by default ember_wgmma_<kind>_n<n>_<ta><tb>: d[n/2] += A (64x16) * B
    (16xn). A comes from shared memory by its descriptor, or (a_in_registers, flash.py) from four
    registers in mma.sync's A fragment layout, which wgmma cannot transpose."""
    regs = n // 2
    outs = ",".join(f"%{i}" for i in range(regs))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    name = name or f"ember_wgmma_{kind}_n{n}_{trans_a}{trans_b}"
    if a_in_registers:
        a, operand, reads, flags = ("const unsigned* a", "{" + ",".join(f"%{regs + i}" for i in range(4)) + "}",
                                    '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])', f"1, 1, {trans_b}")
    else:
        a, operand, reads, flags = "unsigned long long da", f"%{regs}", '"l"(da)', f"1, 1, {trans_a}, {trans_b}"
    b = regs + (4 if a_in_registers else 1)   # the operand number of B's descriptor; the predicate's is next
    # acc = 0: d = A B, the accumulators not read (no zeroing instructions between wgmma)
    return (f"EMBER_D void {name}(float* d, {a}, unsigned long long db, int acc = 1) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{b + 1}, 0;\\n"\n'
            f'    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} {{{outs}}}, {operand}, %{b}, p, '
            f'{flags};\\n}}\\n"\n'
            f'    : {cons}\n    : {reads}, "l"(db), "r"(acc));\n}}\n')


def helpers(kernels: list[Kernel], tma_ranks: set[int]) -> str:
    """The device functions the tensor-core kernels among these use; tma_ranks: the ranks of the
    tensor maps other kernels copy with (flash.tma_ranks)."""
    plans = [(k.contraction, k.plan) for k in kernels if k.contraction is not None]
    if not plans and not any(k.fused is not None for k in kernels):   # flash.py uses them too
        return ""
    out = HELPERS
    if any(_straddles(c, op) for c, p in plans if not p.tma for op in (c.a, c.b)):
        out += CP_ASYNC_N
    hopper = sorted({(c.dtype.name, p.block_n, int(not c.a.k_major), int(not c.b.k_major))
                     for c, p in plans if p.instruction == "wgmma"})
    # flash.py's sm_90a kernels need the descriptors too
    if hopper or any(isinstance(k.plan, FlashPlan) and k.plan.wgmma for k in kernels):
        out += HOPPER_HELPERS + "".join(wgmma_helper(*h) for h in hopper)
        ranks = {len(_tma_box(c, op, p)[0]) for c, p in plans if p.tma for op in (c.a, c.b)} | tma_ranks
        out += "".join(_tma_helper(rank) for rank in sorted(ranks))
        out += "".join(_tma_store_helper(rank) for rank in sorted({len(_tma_out_box(c)[0]) for c, p in plans
                                                                   if p.tma_store}))
    return out


def grid(c: Contraction, p: GpuPlan, sms: int, atomic: bool = False) -> tuple[int, int, int]:
    if p.tma:   # persistent blocks, one per SM at most (atomic: the K-steps shared out, every SM)
        work = c.tiles(p.block_m, p.block_n) * (-(-c.mnk[2] // p.block_k) if atomic else 1)
        return min(work, sms), 1, 1
    m, n, _ = c.mnk
    return -(-n // p.block_n), -(-m // p.block_m), c.batch_size


def _tile_shape(op: Operand, out_tile: int, p: GpuPlan) -> tuple[int, int]:
    """(rows, width) of an operand's tile in shared memory: the contiguous axis is the width.
    FMA tiles are always [k][i or j], 4 elements of padding per row (see _fill_transposed)."""
    if p.instruction == "fma":
        return p.block_k, out_tile + 4
    return (out_tile, p.block_k) if op.k_major else (p.block_k, out_tile)


def _swizzle(row: str, chunk: str, width: int) -> str:
    """mma.sync tiles: the physical chunk of (row, chunk), so that eight consecutive rows land in
    eight bank groups. Rows of 4 chunks (64 bytes) pair up in a 128-byte line, so the pair index
    is XORed in."""
    chunks = width // CHUNK
    if chunks >= 8:
        return f"({chunk} ^ ({row} & 7))"
    return f"({chunk} ^ (({row} >> 1) & 3))"


def _place(hopper: bool, rows: int, width: int) -> str:
    """Where chunk c of row r of a tile goes (in elements from the tile's start). wgmma's 128-byte
    swizzle: the tile is cut into panels 64 elements wide, each rows x 128 bytes, and chunk c of
    row r of a panel sits at chunk c ^ (r % 8) of its 128-byte row."""
    if hopper:
        return f"((c >> 3) * {rows} + r) * 64 + ((c & 7) ^ (r & 7)) * {CHUNK}"
    return f"r * {width} + {_swizzle('r', 'c', width)} * {CHUNK}"


def _element(r: CLike, k: Kernel, c: Contraction, prefix: str, tag: str, col: str) -> ElementWriter:
    return ElementWriter(r, k, prefix, c.names("ei", col), c.reduce, tag)


def _epilogue(r: CLike, k: Kernel, c: Contraction, p: GpuPlan, prefix: str, acc: str) -> list[str]:
    """Statements storing the accumulator elements h and h + 1 (columns ej and ej + 1), inside
    the guard ei < M && ej < N where tiles can pass the edges; one 4- or 8-byte store for the
    pair where the layout allows."""
    m, n, _ = c.mnk
    out = k.out.dtype
    first = _element(r, k, c, prefix, "a", "ej")
    lines0, v0, i0 = first.element(acc)
    buf = first.buf(k.store.srcs[0])
    edges = bool(m % p.block_m or n % p.block_n)   # else every tile is whole: no guards to test
    if k.atomic:   # parts of a split K added into their sum (split.accumulate_parts; f32)
        lines1, v1, i1 = _element(r, k, c, prefix, "b", "ej1").element(acc.replace("[h]", "[h + 1]"))
        pair = c.pair_store and r.gpu.vector_atomics   # one 8-byte red
        adds = [f"  atomicAdd((float2*)&{buf}[{i0}], make_float2({v0}, {v1}));"] if pair else \
            [f"  atomicAdd(&{buf}[{i0}], {v0});", f"  if (ej + 1 < {n}) atomicAdd(&{buf}[{i1}], {v1});"]
        return [f"if (ei < {m} && ej < {n}) {{" if edges else "{", "  const int ej1 = ej + 1;",
                *["  " + x for x in lines0 + lines1], *adds, "}"]
    if c.pair_store:
        lines1, v1, _ = _element(r, k, c, prefix, "b", "ej1").element(acc.replace("[h]", "[h + 1]"))
        if out.itemsize == 2:
            store = f"*(unsigned*)&{buf}[{i0}] = (unsigned){v0} | ((unsigned){v1} << 16);"
        else:
            pair = {"float": "float2", "int": "int2", "unsigned": "uint2"}[out.c_name]
            store = f"*({pair}*)&{buf}[{i0}] = make_{pair}({v0}, {v1});"
        return [f"if (ei < {m} && ej < {n}) {{" if edges else "{", "  const int ej1 = ej + 1;",
                *["  " + x for x in lines0 + lines1], "  " + store, "}"]
    lines1, v1, i1 = _element(r, k, c, prefix, "b", "ej1").element(acc.replace("[h]", "[h + 1]"))
    return [f"if (ei < {m} && ej < {n}) {{" if edges else "{", *["  " + x for x in lines0], f"  {buf}[{i0}] = {v0};",
            "}", f"if (ei < {m} && ej + 1 < {n}) {{" if edges else "{", "  const int ej1 = ej + 1;",
            *["  " + x for x in lines1], f"  {buf}[{i1}] = {v1};", "}"]


def _fill(name: str, op: Operand, base: str, out_var: str, out_size: int, kr_size: int, rows: int, width: int,
          nthreads: int, addr: str, hopper: bool, chunk: int = CHUNK, logical: int = 0) -> list[str]:
    """Statements that copy one operand tile into shared-memory slot `slot` (k0: its first k).
    addr: the offset of element (go, gk) in the buffer, from c.offset;
    chunk: elements per 16 bytes; logical: the row's width without padding (default width)."""
    CHUNK = chunk  # noqa: N806
    per_row = (logical or width) // CHUNK
    count = rows * per_row // nthreads
    lines = ["#pragma unroll", f"for (int q = 0; q < {count}; q++) {{",
             f"  int ch = threadIdx.x + q * {nthreads}, r = ch / {per_row}, c = ch % {per_row};"]
    if op.k_major:
        lines.append(f"  int go = {out_var} + r, gk = k0 + c * {CHUNK};")
        along, along_size, other, other_size = "gk", kr_size, "go", out_size
    else:
        lines.append(f"  int gk = k0 + r, go = {out_var} + c * {CHUNK};")
        along, along_size, other, other_size = "go", out_size, "gk", kr_size
    place = f"r * {width} + c * {CHUNK}" if chunk != 8 else _place(hopper, rows, width)
    et = "float" if chunk == 4 else "unsigned short"
    lines.append(f"  {et}* dst = {name} + slot * {rows * width} + {place};")
    src = f"{base} + {addr}"
    if op.aligned and along_size % CHUNK:   # a row's last chunk passes its end: its elements, zeros after
        lines.append(f"  const int n = {other} < {other_size} ? min({along_size} - {along}, {CHUNK}) : 0;")
        lines.append(f"  ember_cp_async_n(dst, n > 0 ? (const void*)({src}) : (const void*){base}, "
                     f"max(n, 0) * {16 // CHUNK});")
    elif op.aligned:   # a bound the tiles divide holds for every chunk: no test for it
        tests = [f"{v} < {size}" for v, size, tile in ((other, other_size, rows), (along, along_size, logical or width))
                 if size % tile]
        if tests:
            lines.append(f"  bool ok = {' && '.join(tests)};")
            lines.append(f"  ember_cp_async16(dst, ok ? (const void*)({src}) : (const void*){base}, ok);")
        else:
            lines.append(f"  ember_cp_async16(dst, (const void*)({src}), true);")
    else:  # element by element, each masked (an odd contiguous extent or an unaligned base)
        lines.append("  #pragma unroll")
        lines.append(f"  for (int e = 0; e < {CHUNK}; e++) dst[e] = ({other} < {other_size} && {along} + e < "
                     f"{along_size}) ? ({src})[e] : ({et})0;")
    lines.append("}")
    return lines


# the shared-memory row and column each lane gives ldmatrix.x4, by operand and by whether the
# tile is K-major (read as is) or not (read transposed); see the fragment layouts of m16n8k16
LANE_ADDRESS = {
    ("a", True): "row = base + (lane & 15), col = kk + (lane >> 4) * 8",
    ("a", False): "row = kk + ((lane >> 4) & 1) * 8 + (lane & 7), col = base + ((lane >> 3) & 1) * 8",
    ("b", True): "row = base + ((lane >> 4) & 1) * 8 + (lane & 7), col = kk + ((lane >> 3) & 1) * 8",
    ("b", False): "row = kk + ((lane >> 3) & 1) * 8 + (lane & 7), col = base + ((lane >> 4) & 1) * 8",
}


def _fragments(frag: str, var: str, count: int, base: str, operand: str, k_major: bool, tile: str,
               width: int) -> list[str]:
    """The loop loading one operand's fragments for a 16-deep K-step with ldmatrix.x4."""
    load = "ember_ldmatrix4" if k_major else "ember_ldmatrix4_trans"
    return [f"  #pragma unroll\n  for (int {var} = 0; {var} < {count}; {var}++) {{",
            f"    int base = {base};",
            f"    int {LANE_ADDRESS[operand, k_major]};",
            f"    {load}({frag}[{var}], {tile} + row * {width} + {_swizzle('row', 'col / 8', width)} * 8);",
            "  }"]


def _mma_sync_step(c: Contraction, p: GpuPlan, aw: int, bw: int, wait: list[str],
                   slots: tuple[int, int]) -> tuple[list[str], list[str]]:
    """(declarations, the compute on tile slot (ta, tb)) for mma.sync, given the loop's wait for
    a slot and the slots' sizes (sa's, sb's): each warp owns a
    (block_m / warps_m) x (block_n / warps_n) tile of m16n8 fragments. The fragments are double
    buffered: a 16-deep step's products run while the next step's ldmatrix land, and the last
    one's while the next K-step's first fragments load, past the barrier that lets them (with
    all of a step's loads before its products, each barrier left the first products waiting on
    ldmatrix's latency, twice a K-step)."""
    assert p.block_k % 32 == 0, f"{p}: the next K-step starts on the first fragment buffer"
    et = "unsigned short"
    wtm, wtn = p.block_m // p.warps_m, p.block_n // p.warps_n
    mi, ni = wtm // 16, wtn // 8
    decl = ["const int wm = warp / %d, wn = warp %% %d;" % (p.warps_n, p.warps_n),
            f"float acc[{mi}][{ni}][4];",
            f"#pragma unroll\nfor (int x = 0; x < {mi}; x++)",
            f"  #pragma unroll\n  for (int y = 0; y < {ni}; y++) acc[x][y][0] = acc[x][y][1] = acc[x][y][2] = "
            "acc[x][y][3] = 0.0f;",
            f"unsigned fa[2][{mi}][4], fb[2][{ni // 2}][4];",
            # A fragments: rows of 16 (i) by 16 (k); K-major tiles are [i][k], else [k][i] read transposed.
            # B fragments, two n8 tiles per ldmatrix.x4: K-major tiles are [j][k], else [k][j] read transposed.
            f"auto frags = [&](int buf, const {et}* ta, const {et}* tb, int kk) {{",
            *_fragments("fa[buf]", "x", mi, f"wm * {wtm} + x * 16", "a", c.a.k_major, "ta", aw),
            *_fragments("fb[buf]", "y", ni // 2, f"wn * {wtn} + y * 16", "b", c.b.k_major, "tb", bw), "};"]
    last = p.block_k // 16 - 1
    step = [f"#pragma unroll\nfor (int kk = 0; kk < {last + 1}; kk++) {{",
            f"  if (kk == {last}) {{  /* the next slot is in; every warp is done with this one */",
            *["    " + x for x in wait],
            f"    frags((kk + 1) & 1, sa + ((t + 1) % {p.stages}) * {slots[0]}, "
            f"sb + ((t + 1) % {p.stages}) * {slots[1]}, 0);",
            "  } else {", "    frags((kk + 1) & 1, ta, tb, (kk + 1) * 16);", "  }",
            f"  #pragma unroll\n  for (int x = 0; x < {mi}; x++)",
            f"    #pragma unroll\n    for (int y = 0; y < {ni}; y++) "
            f"ember_mma_{c.dtype.name}(acc[x][y], fa[kk & 1][x], &fb[kk & 1][y >> 1][(y & 1) * 2]);", "}"]
    return decl, step


def _wgmma_step(c: Contraction, p: GpuPlan) -> tuple[list[str], list[str]]:
    """For wgmma: warpgroup g owns rows 64g..64g+63 of the block tile and all its columns; the
    descriptors walk the K-step 16 at a time (32 bytes along a K-major row, or 16 rows of an
    MN-major panel)."""
    bk, bn = p.block_k, p.block_n
    decl = ["const int wg = warp >> 2;", f"float acc[{bn // 8}][4];",
            f"#pragma unroll\nfor (int y = 0; y < {bn // 8}; y++) acc[y][0] = acc[y][1] = acc[y][2] = acc[y][3] = 0;"]
    if c.a.k_major:  # [block_m rows][64]: 8-row groups 1024 bytes apart
        da = "ember_desc(ta + wg * 64 * 64 + kk * 16, 16, 1024)"
    else:            # panels [block_m / 64][bk rows][64]: the warpgroup's is panel wg
        da = f"ember_desc(ta + wg * {bk * 64} + kk * 16 * 64, {bk * 128}, 1024)"
    if c.b.k_major:
        db = "ember_desc(tb + kk * 16, 16, 1024)"
    else:            # panels of 64 columns, bk rows each: LBO steps from panel to panel
        db = f"ember_desc(tb + kk * 16 * 64, {bk * 128}, 1024)"
    fn = f"ember_wgmma_{c.dtype.name}_n{bn}_{int(not c.a.k_major)}{int(not c.b.k_major)}"
    step = ["ember_wgmma_fence();",
            f"#pragma unroll\nfor (int kk = 0; kk < {bk // 16}; kk++) {fn}(&acc[0][0], {da}, {db});",
            "ember_wgmma_commit();", "ember_wgmma_wait<1>();  /* the previous step's are done */"]
    return decl, step


def _fill_transposed(name: str, op: Operand, base: str, out_var: str, out_size: int, kr_size: int, p: GpuPlan,
                     out_tile: int, addr: str) -> tuple[list[str], list[str]]:
    """FMA tiles of a K-major f32 operand: [out][k] in memory, wanted as [k][out] (each thread
    then reads four neighbouring rows or columns at once). Issued as 16-byte register loads before
    the step's compute and stored transposed after it, so their latency hides behind it. The
    rows are padded by 4 floats: the four scalar stores of a warp then hit different banks."""
    pitch, per_row = out_tile + 4, p.block_k // 4
    count = out_tile * per_row // p.threads
    reg = f"r{name}"
    issue = [f"#pragma unroll\nfor (int q = 0; q < {count}; q++) {{",
             f"  int ch = threadIdx.x + q * {p.threads}, o = ch / {per_row}, c = ch % {per_row};",
             f"  int go = {out_var} + o, gk = k0 + c * 4;",
             f"  const float* src = {base} + {addr};"]
    if op.aligned and kr_size % 4:   # a row's last chunk passes its end
        issue += [f"  const int n = go < {out_size} ? {kr_size} - gk : 0;",
                  f"  {reg}[q] = n >= 4 ? *(const float4*)src : "
                  "make_float4(n > 0 ? src[0] : 0.f, n > 1 ? src[1] : 0.f, n > 2 ? src[2] : 0.f, 0.f);"]
    elif op.aligned:
        issue.append(f"  {reg}[q] = go < {out_size} && gk < {kr_size} ? *(const float4*)src : make_float4(0, 0, 0, 0);")
    else:
        issue += [f"  {reg}[q].{f} = go < {out_size} && gk + {e} < {kr_size} ? src[{e}] : 0.0f;"
                  for e, f in enumerate("xyzw")]
    issue.append("}")
    store = [f"#pragma unroll\nfor (int q = 0; q < {count}; q++) {{",
             f"  int ch = threadIdx.x + q * {p.threads}, o = ch / {per_row}, c = ch % {per_row};",
             f"  float* dst = {name} + slot * {p.block_k * pitch} + c * 4 * {pitch} + o;",
             f"  dst[0] = {reg}[q].x; dst[{pitch}] = {reg}[q].y; dst[{2 * pitch}] = {reg}[q].z; "
             f"dst[{3 * pitch}] = {reg}[q].w;", "}"]
    return [f"float4 {reg}[{count}];"] + issue, store


def _fma_step(p: GpuPlan) -> tuple[list[str], list[str]]:
    """FMA: thread (tx, ty) of a 16 x 16 grid owns rows {4ty..4ty+3, half + 4ty..} and the same
    columns of tx, read as float4 from the [k][i] and [k][j] tiles (a warp's two ty values
    broadcast, its 16 tx read 256 contiguous bytes)."""
    pa, pb = p.block_m + 4, p.block_n + 4
    hm, hn = p.block_m // 2, p.block_n // 2
    tdim = p.block_n // 8
    decl = [f"const int tx = threadIdx.x % {tdim}, ty = threadIdx.x / {tdim};", "float acc[8][8];",
            "#pragma unroll\nfor (int x = 0; x < 8; x++)",
            "  #pragma unroll\n  for (int y = 0; y < 8; y++) acc[x][y] = 0.0f;"]
    step = [f"#pragma unroll\nfor (int kk = 0; kk < {p.block_k}; kk++) {{",
            f"  const float* ra = ta + kk * {pa} + ty * 4;",
            f"  const float* rb = tb + kk * {pb} + tx * 4;",
            f"  float4 a0 = *(const float4*)ra, a1 = *(const float4*)(ra + {hm});",
            f"  float4 b0 = *(const float4*)rb, b1 = *(const float4*)(rb + {hn});",
            "  float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};",
            "  float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};",
            "  #pragma unroll\n  for (int x = 0; x < 8; x++)",
            "    #pragma unroll\n    for (int y = 0; y < 8; y++) acc[x][y] = fmaf(a[x], b[y], acc[x][y]);", "}"]
    return decl, step


PRODUCER_REGS, CONSUMER_REGS = 40, 232   # setmaxnreg: 128 * 40 + 256 * 232 <= 64K registers


TILE_GROUP = 8   # row tiles a wave of blocks walks together (tile_order)


def tile_order(tm: int, tn: int, p: GpuPlan) -> list[str]:
    """C statements giving (m0, n0) of tile number `tile` (of tm x tn, per batch): groups of
    TILE_GROUP row tiles, column tile by column tile, the group's row tiles next to each other.
    A wave of 132 blocks then reads a few row tiles of A and a few column tiles of B, which stay
    in L2; row by row, a B larger than L2 (the lm head's 77 MB) came from DRAM once per row tile."""
    g = TILE_GROUP
    return [f"const int t = tile % {tm * tn};", f"const int first = t / {g * tn} * {g};",
            f"const int rows = min({tm} - first, {g});", f"const int at = t % {g * tn};",
            f"m0 = (first + at % rows) * {p.block_m};", f"n0 = at / rows * {p.block_n};"]


def _tma_box(c: Contraction, op: Operand, p: GpuPlan) -> tuple[list[int], list[int], list[int]]:
    """An operand as TMA sees it: (its dims, their element strides, the box one copy brings),
    innermost first: the contiguous axis, the other, then the batch ranges it moves along. A
    K-major tile is one box of block_k x its rows; an MN-major one, a box of 64 columns x
    block_k rows per 64-column panel (the layout the wgmma descriptors read, _place)."""
    out = c.i if op is c.a else c.j
    rows = p.block_m if op is c.a else p.block_n
    batch = [b for b in c.batch if op.strides.get(b)]
    inner, other = (c.k, out) if op.k_major else (out, c.k)
    dims = [inner.arg[1], other.arg[1]] + [b.arg[1] for b in batch]
    strides = [1, op.strides[other]] + [op.strides[b] for b in batch]
    box = [p.block_k, rows] if op.k_major else [64, p.block_k]
    return dims, strides, box + [1] * len(batch)


def _tma_out_box(c: Contraction) -> tuple[list[int], list[int], list[int]]:
    """The output as the TMA store sees it (as _tma_box): j, i, then the batch ranges it moves
    along; a box is one 64-column panel of a warpgroup's 64 rows."""
    assert c.out_strides is not None
    batch = [b for b in c.batch if c.out_strides.get(b)]
    return ([c.j.arg[1], c.i.arg[1]] + [b.arg[1] for b in batch], [1, c.out_strides[c.i]] +
            [c.out_strides[b] for b in batch], [64, 64] + [1] * len(batch))


def tensor_maps(k: Kernel, ptr: dict[int, int]) -> list:
    """The CUtensorMaps of a TMA kernel's operands for buffers at ptr (kernel parameters after
    the buffers: encoded again for every new set of buffers, as a captured graph keeps them)."""
    from cuda.bindings import driver as cu
    c, p = k.contraction, k.plan
    assert c is not None and isinstance(p, GpuPlan)
    kinds = {"bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             "f16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    maps = []
    boxes = [(_tma_box(c, op, p), ptr[op.load.srcs[0].arg] + op.offset * 2, c.dtype) for op in (c.a, c.b)]
    if p.tma_store:   # the output (2-byte floats: Contraction.out_strides)
        boxes.append((_tma_out_box(c), ptr[k.out.id], k.out.dtype))
    for (dims, strides, box), address, dtype in boxes:
        size = dtype.itemsize
        err, tmap = cu.cuTensorMapEncodeTiled(
            kinds[dtype.name], len(dims), address, [cu.cuuint64_t(d) for d in dims],
            [cu.cuuint64_t(st * size) for st in strides[1:]], [cu.cuuint32_t(b) for b in box],
            [cu.cuuint32_t(1)] * len(dims), cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)   # zeros past the edges
        if int(err) != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled for {k.name}: {err} "
                               f"(dims {dims}, strides {strides}, box {box})")
        maps.append(tmap)
    return maps


def _aligned_tiles() -> list[str]:
    """The tiles' start: the swizzle pattern repeats every 1024 bytes of absolute address."""
    return ["extern __shared__ __align__(128) unsigned char ember_smem[];",
            "unsigned short* sa = (unsigned short*)(ember_smem + "
            "((1024 - (ember_smem_addr(ember_smem) & 1023)) & 1023));"]


def _render_hopper(r: CLike, k: Kernel, c: Contraction, p: GpuPlan, prefix: str) -> str:
    """wgmma fed by TMA, warp-specialized and persistent. One thread of warpgroup 0 copies the
    K-steps' tiles into the slots with TMA; the other warpgroups (64 rows of the tile each) run
    wgmma on them. mbarriers say when a slot is full (its bytes arrived) and when it is free
    again, so neither side waits for the other at every step (no __syncthreads in the loop),
    and the copies of a block's next tile start during this tile's epilogue. A warpgroup of
    cp.async copies instead kept up with half the tensor cores' rate (4096^2: 271 TFLOP/s, the
    all-warps pipeline 560).

    A kernel whose tiles add into their sum (k.atomic: split_k's parts) shares its last round's
    tiles out by K-steps (stream-K's tail): block b takes steps [b U / G, (b + 1) U / G) of
    their U, each run of a tile's steps ending in its atomic adds. A weight gradient's 576
    tiles on 132 SMs took 5 rounds for 4.36 rounds of work. The whole rounds keep the tile
    order, so that a round's operands stay in L2 (a stream-K over every tile would have had
    each block on tiles far apart in the order, and all of K's parts in flight at once)."""
    m, n, kk = c.mnk
    (ar, aw), (br, bw) = _tile_shape(c.a, p.block_m, p), _tile_shape(c.b, p.block_n, p)
    stages, steps = p.stages, -(-kk // p.block_k)
    tn, tm = -(-n // p.block_n), -(-m // p.block_m)
    out_tile = p.block_m * p.block_n if p.tma_store else 0   # the TMA store's tile, after the slots
    lines = [*_aligned_tiles(), f"unsigned short* sb = sa + {stages * ar * aw};",
             f"unsigned short* so = sb + {stages * br * bw};",
             f"unsigned long long* full = (unsigned long long*)(so + {out_tile});",
             f"unsigned long long* empty = full + {stages};",
             "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
             "if (threadIdx.x == 0) {",
             f"  for (int s = 0; s < {stages}; s++) {{ ember_mbar_init(&full[s], 1); "
             f"ember_mbar_init(&empty[s], {4 * p.warps_m}); }}",
             "}",
             "__syncthreads();",
             "int s = 0, ph = 0;   /* the slot, and the parity of its round */",
             "auto tile_at = [&](int tile, int& m0, int& n0) {",
             *["  " + x for x in tile_order(tm, tn, p)],
             f"  return tile / {tn * tm};",
             "};"]
    batch_vars = [x for x in operand_bases(c, "zt", r) if x.startswith("const int z")]
    tiles = c.tiles(p.block_m, p.block_n)
    if k.atomic:   # whole tiles round by round, then the last round's tiles shared out by K-steps
        tile_loop = [f"const int rounds = {tiles} / gridDim.x;",
                     f"const long long rest = (long long)({tiles} - rounds * gridDim.x) * {steps};",
                     "long long u = rest * blockIdx.x / gridDim.x;",
                     "const long long end = rest * (blockIdx.x + 1) / gridDim.x;",
                     "for (int round = 0; round < rounds || u < end; round++) {",
                     f"  int tile = round * gridDim.x + blockIdx.x, t0 = 0, t1 = {steps};",
                     "  if (round >= rounds) {   /* steps t0..t1 of a tile of the last round */",
                     f"    tile = rounds * gridDim.x + (int)(u / {steps}), t0 = (int)(u % {steps});",
                     f"    t1 = (int)min((long long){steps}, t0 + (end - u));",
                     "    u += t1 - t0;",
                     "  }"]
        t0, t1 = "t0", "t1"
    else:
        tile_loop = [f"for (int tile = blockIdx.x; tile < {tiles}; tile += gridDim.x) {{"]
        t0, t1 = "0", f"{steps}"
    copies = []
    for op, tile, base, var, mn0 in ((c.a, "sa", ar * aw, "tma_a", "m0"), (c.b, "sb", br * bw, "tma_b", "n0")):
        zs = [f"z{i}" for i, b in enumerate(c.batch) if op.strides.get(b)]
        rank = 2 + len(zs)
        if op.k_major:
            copies.append(f"ember_tma{rank}({tile} + s * {base}, &{var}, {', '.join(['k0', mn0, *zs])}, &full[s]);")
        else:
            panels = (p.block_m if op is c.a else p.block_n) // 64
            copies += [f"ember_tma{rank}({tile} + s * {base} + {q * p.block_k * 64}, &{var}, "
                       f"{', '.join([f'{mn0} + {64 * q}', 'k0', *zs])}, &full[s]);" for q in range(panels)]
    lines += ["if (warp < 4) {   /* the producer */",
              f"  ember_setmaxnreg_dec<{PRODUCER_REGS}>();",
              "  if (threadIdx.x != 0) return;",
              *["  " + x for x in tile_loop],
              "    int m0, n0;",
              "    const int zt = tile_at(tile, m0, n0);",
              *["    " + x for x in batch_vars],
              f"    for (int t = {t0}; t < {t1}; t++) {{",
              f"      const int k0 = t * {p.block_k};",
              "      ember_mbar_wait(&empty[s], ph ^ 1);",
              f"      ember_mbar_expect(&full[s], {(p.block_m + p.block_n) * p.block_k * 2});",
              *["      " + x for x in copies],
              f"      if (++s == {stages}) {{ s = 0; ph ^= 1; }}",
              "    }", "  }", "  return;", "}"]
    decl, step = _wgmma_step(c, p)
    decl[0] = "const int wg = (warp >> 2) - 1;   /* the consumer warpgroup: rows 64 wg.. of the tile */"
    row, col = "m0 + wg * 64 + (warp & 3) * 16", "n0 + y * 8"
    lines += [f"ember_setmaxnreg_inc<{CONSUMER_REGS}>();", *decl[:2],
              *tile_loop,
              "  int m0, n0;",
              "  const int zt = tile_at(tile, m0, n0);",
              *["  " + x for x in batch_vars],
              *["  " + x for x in decl[2:]],
              "  int prev = 0;",
              f"  for (int t = {t0}; t < {t1}; t++) {{",
              "    ember_mbar_wait(&full[s], ph);",
              f"    const unsigned short* ta = sa + s * {ar * aw};",
              f"    const unsigned short* tb = sb + s * {br * bw};",
              *["    " + x for x in step],
              f"    if (t > {t0} && lane == 0) ember_mbar_arrive(&empty[prev]);"
              "   /* the previous step's are done */",
              f"    prev = s; if (++s == {stages}) {{ s = 0; ph ^= 1; }}",
              "  }",
              "  ember_wgmma_wait<0>();",
              "  if (lane == 0) ember_mbar_arrive(&empty[prev]);"]
    if p.tma_store:
        lines += ["  " + x for x in _tma_store_epilogue(r, k, c, p, prefix)] + [
                  "}", "if ((threadIdx.x & 127) == 0) ember_bulk_wait();   /* the stores read shared memory */"]
    else:
        lines += [*["  " + x for line in _fragment_stores(r, k, c, p, prefix,
                                                          [f"for (int y = 0; y < {p.block_n // 8}; y++)"],
                                                          "acc[y][h]", row, col)
                    for x in line.split("\n")], "}"]
    body = "".join("  " + x + "\n" for line in lines for x in line.split("\n"))
    signature = KernelWriter(r, k, prefix).signature()[len("void "):-1]   # and the tensor maps, by value
    maps = ["tma_a", "tma_b"] + ["tma_c"] * p.tma_store
    return (f"extern \"C\" __global__ void __launch_bounds__({p.threads}, 1) {signature}, "
            + ", ".join(f"const __grid_constant__ EmberTmap {m}" for m in maps) + ") {\n" + body + "}\n")


def _tma_store_epilogue(r: CLike, k: Kernel, c: Contraction, p: GpuPlan, prefix: str) -> list[str]:
    """A consumer warpgroup's tile out through shared memory: its 64 rows written there as 64-column
    panels in the 128-byte swizzle (a warp's eight rows then fall in eight different banks), and
    one thread's TMA stores, which run while the warpgroup goes on to its next tile. Before
    writing, the warpgroup waits until TMA has read its previous tile."""
    m, n, _ = c.mnk
    first = _element(r, k, c, prefix, "a", "ej")
    lines0, v0, _ = first.element("acc[y][h]")
    lines1, v1, _ = _element(r, k, c, prefix, "b", "ej1").element("acc[y][h + 1]")
    zs = [f"z{i}" for i, b in enumerate(c.batch) if c.out_strides.get(b)]
    rank = 2 + len(zs)
    stores = [f"  ember_tma_store{rank}(ep + {q * 4096}, &tma_c, {', '.join([f'n0 + {64 * q}', 'm0 + wg * 64', *zs])});"
              for q in range(p.block_n // 64)]
    return ["if ((threadIdx.x & 127) == 0) ember_bulk_wait_read();",
            "ember_bar_sync(1 + wg, 128);",
            f"unsigned short* ep = so + wg * {64 * p.block_n};",
            f"#pragma unroll\nfor (int y = 0; y < {p.block_n // 8}; y++)",
            "#pragma unroll\nfor (int h = 0; h < 4; h += 2) {",
            "  const int er = (warp & 3) * 16 + (lane >> 2) + (h >> 1) * 8;   /* the row among the 64 */",
            "  const int ei = m0 + wg * 64 + er, ej = n0 + y * 8 + (lane & 3) * 2, ej1 = ej + 1;",
            "  unsigned pair = 0;   /* past the edges: TMA does not write it */",
            f"  if (ei < {m} && ej < {n}) {{" if m % p.block_m or n % p.block_n else "  {",
            *["    " + x for x in lines0 + lines1],
            f"    pair = (unsigned){v0} | ((unsigned){v1} << 16);",
            "  }",
            "  *(unsigned*)&ep[(y >> 3) * 4096 + er * 64 + (((y & 7) ^ (er & 7)) << 3) + (lane & 3) * 2] = pair;",
            "}",
            "ember_fence_async_smem();   /* the writes, seen by the async proxy */",
            "ember_bar_sync(1 + wg, 128);",
            "if ((threadIdx.x & 127) == 0) {", *stores, "  ember_bulk_commit();", "}"]


def launch(k: Kernel, sms: int) -> tuple[tuple[int, int, int], int, int]:
    c, p = k.contraction, k.plan
    assert c is not None and isinstance(p, GpuPlan)
    return grid(c, p, sms, k.atomic), p.threads, smem_bytes(p)


def render(r: CLike, k: Kernel, prefix: str = "") -> str:
    c, p = k.contraction, k.plan
    assert c is not None and isinstance(p, GpuPlan)
    if p.tma:
        return _render_hopper(r, k, c, p, prefix)
    m, n, kk = c.mnk
    nt = p.threads
    hopper, fma = p.instruction == "wgmma", p.instruction == "fma"
    et = "float" if fma else "unsigned short"   # the operands' storage type
    (ar, aw), (br, bw) = _tile_shape(c.a, p.block_m, p), _tile_shape(c.b, p.block_n, p)
    if hopper:
        lines = _aligned_tiles()
    else:
        lines = ["extern __shared__ __align__(128) unsigned char ember_smem[];", f"{et}* sa = ({et}*)ember_smem;"]
    lines += [f"{et}* sb = sa + {p.stages * ar * aw};",
              "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
              f"const int m0 = blockIdx.y * {p.block_m}, n0 = blockIdx.x * {p.block_n};"]
    lines += operand_bases(c, "blockIdx.z", r)
    # ahead: K-steps in flight while one is computed. wgmma keeps one step of its own in flight
    # too (wait_group 1), so the slot refilled is the one read two steps back, and one fewer is ahead.
    ahead = p.stages - 2 if hopper else p.stages - 1
    # the wait for a slot (mma.sync's at the end of the step before: its first fragments load there)
    wait = [f"ember_cp_async_wait<{ahead - 1}>();", "__syncthreads();"]
    decl, step = _fma_step(p) if fma else _wgmma_step(c, p) if hopper else \
        _mma_sync_step(c, p, aw, bw, wait, (ar * aw, br * bw))
    lines += decl
    steps = -(-kk // p.block_k)
    # issue: start copying a K-step into a slot (cp.async, or register loads); finish: the
    # register-staged part's stores, after the current step's compute
    issue: list[str] = []
    finish: list[str] = []
    for name, op, base, o, size, rng, tile, (rows, width) in (("sa", c.a, "ga", "m0", m, c.i, p.block_m, (ar, aw)),
                                                              ("sb", c.b, "gb", "n0", n, c.j, p.block_n, (br, bw))):
        addr = f"{c.offset(op, rng, 'go')} + {c.offset(op, c.k, 'gk')}"  # of element (go, gk)
        if fma and op.k_major:
            first, store = _fill_transposed(name, op, base, o, size, kk, p, tile, addr)
            lines.append(first[0])
            issue += first[1:]
            finish += store
        elif fma:
            issue += _fill(name, op, base, o, size, kk, rows, width, nt, addr, False, chunk=4, logical=tile)
        else:
            issue += _fill(name, op, base, o, size, kk, rows, width, nt, addr, hopper)
    lines += ["auto issue = [&](int slot, int k0) {", *["  " + x for x in issue], "};",
              "auto finish = [&](int slot) {", *["  " + x for x in finish], "};"]
    lines += [f"#pragma unroll\nfor (int s = 0; s < {ahead}; s++) {{",
              f"  if (s < {steps}) {{ issue(s, s * {p.block_k}); finish(s); }}", "  ember_cp_async_commit();", "}"]
    if p.instruction == "mma.sync":
        lines += [*wait, "frags(0, sa, sb, 0);", f"for (int t = 0; t < {steps}; t++) {{"]
    else:
        lines += [f"for (int t = 0; t < {steps}; t++) {{", "  " + wait[0]]
        if hopper:  # cp.async wrote through the generic proxy; wgmma reads through the async proxy
            lines.append("  ember_fence_async_smem();")
        lines.append("  __syncthreads();  /* slot t is in; every warp is done with the slot refilled next */")
    lines += [f"  const bool more = t + {ahead} < {steps};",
              f"  if (more) issue((t + {ahead}) % {p.stages}, (t + {ahead}) * {p.block_k});",
              "  ember_cp_async_commit();",
              f"  const {et}* ta = sa + (t % {p.stages}) * {ar * aw};",
              f"  const {et}* tb = sb + (t % {p.stages}) * {br * bw};",
              *["  " + x for x in step],
              f"  if (more) finish((t + {ahead}) % {p.stages});", "}"]
    if hopper:
        lines.append("ember_wgmma_wait<0>();")
    # the epilogue, two neighbouring columns at a time
    if fma:
        lines += ["#pragma unroll\nfor (int x = 0; x < 8; x++)", "#pragma unroll\nfor (int h = 0; h < 8; h += 2) {",
                  f"  const int ei = m0 + (x >> 2) * {p.block_m // 2} + ty * 4 + (x & 3);",
                  f"  const int ej = n0 + (h >> 2) * {p.block_n // 2} + tx * 4 + (h & 3);",
                  *["  " + x for x in _epilogue(r, k, c, p, prefix, "acc[x][h]")], "}"]
        return _kernel(r, k, prefix, lines, f"{nt}")
    # mma fragments: rows (g, g + 8) and columns (2 tig, 2 tig + 1) of every m16n8 tile
    if hopper:
        loops, acc = [f"for (int y = 0; y < {p.block_n // 8}; y++)"], "acc[y][h]"
        row, col = "m0 + wg * 64 + (warp & 3) * 16", "n0 + y * 8"
    else:
        wtm, wtn = p.block_m // p.warps_m, p.block_n // p.warps_n
        loops = [f"for (int x = 0; x < {wtm // 16}; x++)", f"for (int y = 0; y < {wtn // 8}; y++)"]
        acc, row, col = "acc[x][y][h]", f"m0 + wm * {wtm} + x * 16", f"n0 + wn * {wtn} + y * 8"
    lines += _fragment_stores(r, k, c, p, prefix, loops, acc, row, col)
    return _kernel(r, k, prefix, lines, f"{nt}, 1" if hopper else f"{nt}")


def _fragment_stores(r: CLike, k: Kernel, c: Contraction, p: GpuPlan, prefix: str, loops: list[str], acc: str,
                     row: str, col: str) -> list[str]:
    """The epilogue of mma.sync and wgmma accumulators: under the loops over a thread's
    fragments, rows (g, g + 8) and columns (2 tig, 2 tig + 1) of each m16n8 piece, from the
    piece's first row and column."""
    return [*("#pragma unroll\n" + x for x in loops), "#pragma unroll\nfor (int h = 0; h < 4; h += 2) {",
            f"  const int ei = {row} + (lane >> 2) + (h >> 1) * 8;",
            f"  const int ej = {col} + (lane & 3) * 2;",
            *["  " + x for x in _epilogue(r, k, c, p, prefix, acc)], "}"]


def _kernel(r: CLike, k: Kernel, prefix: str, lines: list[str], bounds: str) -> str:
    body = "".join("  " + x + "\n" for line in lines for x in line.split("\n"))
    signature = KernelWriter(r, k, prefix).signature()[len("void "):]
    return f"extern \"C\" __global__ void __launch_bounds__({bounds}) " + signature + " {\n" + body + "}\n"
