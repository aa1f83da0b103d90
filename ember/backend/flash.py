"""CUDA rendering of the flash-attention kernels that compiler/attention.py puts in the graph.

Three kernels on `mma.sync.m16n8k16` (sm_80 and later; f16 or bf16 operands, f32 accumulators),
4 warps per block; block and tile sizes per head size are in compiler/attention.py's TILES:
- forward: a block per 128 query rows (two 16-row tiles per warp); tiles of 64 keys and values
  (32 for D = 128) arrive by `cp.async` into a double buffer while the warps compute s = q k^T,
  update the running max and sum per row (the 4 threads of a row combine with shuffles),
  rescale o and add p v, with p converted to the operand dtype in registers (the accumulator
  layout of s is the A layout of p). The score graph's functor (`score_struct`) makes the raw
  scores the program's; a block reads only the key tiles between its first and last that its
  iota masks keep a score of (`ember_flash_span`: past a causal diagonal or outside a window,
  none is loaded), and only edge tiles (masks not full, the bounds) apply the masks per
  element. It writes o / l and the base-2 logsumexp m + log2(l) of every
  row: [N, T, D + 2] in the operand dtype, the logsumexp's f32 in the last two columns (f32
  operands: [N, T, D + 1]), or (no gradient in the graph) o / l alone, [N, T, D].
- dq: a block per 64 query rows; per key tile it recomputes p = exp2(score - lse), dp = do v^T
  and ds = p (dp - rowsum(do o)) (times the score's derivative where it is no constant), and
  adds ds k. Both backward kernels write their gradients in
  the operand dtype.
- dk, dv: a block per 64 keys; per query tile (64 rows, 32 for D = 128 so the accumulators fit
  in registers) it computes s^T = k q^T directly (keys as rows, so p^T and ds^T are A operands
  with no transpose), then adds p^T do to dv and ds^T q to dk.
Shared-memory tiles are rows of D 16-bit values in 16-byte chunks, the chunk index XORed with
the row (eight rows one `ldmatrix` reads fall in eight bank groups); D = 32, 80 and 96 pad rows
to an odd count of chunks instead, and sm_90a pads them to panels of 64 columns (`pitch`).
Grouped-query attention: k and v have N / group batches, read at n // group; D = 256's dk|dv
splits its columns over blockIdx.z (FlashPlan.split).
On sm_90a (`FlashPlan.wgmma`) every product is wgmma (`EmberWg<true>`): scores from tiles in the
128-byte-swizzled layout (`ember_hswz`), and p (or ds) kept in registers as the A operand of
the product that follows, the other operand read transposed. The three kernels are the ones
above with HOPPER set: the forward with two warpgroups of 64 rows (128 a block; tiles of 128
keys at D = 64, HOPPER_TILE), dq and dk|dv with one. SASS: HGMMA only, 8, 12 and 16 a tile for
the forward (tiles of 64 keys), dq and dk|dv; 90-126 (forward, 128-key tiles), 126 and 174
registers at D = 64; no local memory. Measured on the H200 (docs/performance.md).

On sm_90a the three kernels are warp-specialized (`ember_flash_*_ws`, FlashAttention-3's plan;
`EMBER_FLASH_WS=0` renders the ones above instead, as does a q, k or v that does not split by
one head count): a producer warpgroup (24 registers) copies the block's own rows once and
streams the other side's tiles by TMA (tensor maps of q, k, v and do as [N / H, H, rows, D],
`tma_layouts`) through mbarrier-guarded slots, and two consumer warpgroups of 64 rows (240
registers) take turns at issuing their products (named barriers), so one's softmax overlaps
the other's products. The forward is persistent (a block an SM, items from a counter).

f32 operands (tensor cores would round them) take three kernels of their own on CUDA cores
(`ember_flash32_*`, sizes in TILES32): G neighbouring threads hold a row, D / G of its values
each in registers (ember_g32); every thread of a block reads the same key (or query) row of a
shared-memory tile at once, a broadcast, and a row's dot products are summed over its G threads
with shuffles. The forward holds two query rows a thread (each key loaded serves both) and
updates the running max every 16 keys; dq and dk|dv hold one row. 96-134 registers, no local
memory. A block skips the tiles its iota masks cover whole but computes its edge tiles whole,
masked: skipping per warp inside a tile made ptxas keep a divergent copy of the shuffles
(BRA.DIV) and spill.
"""
from __future__ import annotations

import math

from .. import dtype as dt
from ..compiler.attention import FIXED, FlashPlan, Scores, group, placeholders, score_parts
from ..compiler.lower import Buffer, Kernel
from ..compiler.rewrite import substitute
from ..ir import Node, Op, toposort
from .mma import wgmma_helper  # mma.helpers brings the descriptors and fences
from .render import CLike, KernelWriter, Scope, include

# the device code (backend/include/): the tile loads, online softmax and the three mma.sync
# kernels; their f32 variants on CUDA cores; the sm_90a kernels on wgmma and TMA, after the
# declarations of the products they call (specialized per tile by _hopper_helpers)
HELPERS, F32, HOPPER = include("flash.cuh"), include("flash_f32.cuh"), include("flash_hopper.cuh")
WGMMA = include("flash_wgmma.cuh")


def tma_ranks(kernels: list[Kernel]) -> set[int]:
    """The warp-specialized forward copies q, k and v as 4-d tensors (mma.helpers writes the copy)."""
    return {4 for k in kernels if k.fused is not None and ws_heads(k) is not None}


def _hopper_helpers(kernels: list[Kernel]) -> str:
    """The wgmma instructions sm_90a's flash kernels use, as the templates ember_wgmma_s<N, BF16>
    (scores: N columns, both operands from shared memory) and ember_wgmma_pv<D, BF16> (A in
    registers, B transposed), and the EmberWg<true> that does the kernels' products with them."""
    hopper = [k for k in kernels if _wgmma(k)]
    if not hopper:
        return ""
    scores, products = set(), set()
    for k in hopper:
        dtype = k.fused[0].srcs[0].dtype.name
        scores.add((dtype, _plan(k)[1]))
        products.add((dtype, pitch(_columns(k), True)))
    out = WGMMA
    for dtype, n in sorted(scores):
        out += wgmma_helper(dtype, n, 0, 0, f"ember_wgmma_s_{dtype}_n{n}")
        out += (f"template <> __device__ inline void ember_wgmma_s<{n}, {str(dtype == 'bf16').lower()}>(float* d, "
                f"unsigned long long da, unsigned long long db, int acc) {{\n"
                f"  ember_wgmma_s_{dtype}_n{n}(d, da, db, acc);\n}}\n")
    for dtype, d in sorted(products):
        # p (registers) times v (shared memory, contiguous along d: read transposed)
        out += wgmma_helper(dtype, d, 0, 1, f"ember_wgmma_rs_{dtype}_n{d}", a_in_registers=True)
        out += (f"template <> __device__ inline void ember_wgmma_pv<{d}, {str(dtype == 'bf16').lower()}>(float* d, "
                f"const unsigned* a, unsigned long long db) {{ ember_wgmma_rs_{dtype}_n{d}(d, a, db); }}\n")
    return out + HOPPER


def helpers(kernels: list[Kernel]) -> str:
    fused = [k for k in kernels if k.fused is not None]
    if not fused:
        return ""
    return HELPERS + (F32 if any(_f32(k) for k in fused) else "") + _hopper_helpers(kernels)


def _f32(k: Kernel) -> bool:
    """Whether a flash kernel takes f32 operands (CUDA cores: tensor cores would round them)."""
    assert k.fused is not None
    return k.fused[0].srcs[0].dtype.name == "f32"


def _sizes(k: Kernel) -> tuple[str, int, int, int, int]:
    """(kind, N, T, S, D)."""
    assert k.fused is not None
    node = k.fused[0]
    n, t_len, d = node.srcs[0].shape
    return node.arg[0], n, t_len, node.srcs[1].shape[1], d


# the warp-specialized kernels' slots, and which of a kernel's sources each copies once (its
# block's rows; the others it streams by tiles: compiler/attention.py's flash_plan sizes them)
WS_STAGES = 2
WS_OWN = {"attention": (0,), "attention_dq": (0, 4), "attention_dkdv": (1, 2)}


def ws_stages(kind: str, d: int) -> int:
    """The pipelined kernels free a tile's slot only once the next tile's first products are
    computed (its last ones run beside them: ember_flash_fwd_ws, ember_flash_dq_ws), so they keep
    a third slot to load ahead into where three fit (D <= 128: 225 KB at most)."""
    return 3 if d <= 128 else WS_STAGES


def pitch(d: int, hopper: bool) -> int:
    """flash.cuh's ember_pitch: the elements a shared-memory row of d 16-bit values takes (sm_90a:
    panels of 64 columns; mma.sync: an odd count of 16-byte chunks where d is no multiple of 64)."""
    return -(-d // 64) * 64 if hopper else d if d % 64 == 0 or (d // 8) % 2 else d + 8


def _columns(k: Kernel) -> int:
    """The columns of the kernel's accumulators before sm_90a's padding: D, or dk|dv's share (split)."""
    assert isinstance(k.plan, FlashPlan)
    return _sizes(k)[4] // k.plan.split


def _plan(k: Kernel) -> tuple[int, int, int]:
    """(rows a block owns, rows a tile streams, threads a block): the plan optimize chose."""
    assert isinstance(k.plan, FlashPlan)
    return k.plan.rows, k.plan.tile, k.plan.threads


def ws_heads(k: Kernel) -> int | None:
    """The heads the warp-specialized kernels see q, k, v in, or None for the cp.async kernels."""
    return k.plan.heads or None if isinstance(k.plan, FlashPlan) else None


def kv_heads(k: Kernel) -> int:
    """The heads the warp-specialized kernels see k and v in: q's over the group sharing each
    (grouped-query attention; compiler/attention.py's flash_plan makes them divide, or q has one)."""
    assert k.fused is not None and (heads := ws_heads(k)) is not None
    return max(1, heads // group(k.fused[0]))


def _wgmma(k: Kernel) -> bool:
    return isinstance(k.plan, FlashPlan) and k.plan.wgmma


def _ws_sources(k: Kernel) -> list[int]:
    """The sources the warp-specialized kernel reads by TMA, in its tensor maps' order: q, k, v,
    and do for the backward."""
    return [0, 1, 2] if _sizes(k)[0] == "attention" else [0, 1, 2, 4]


def tma_layouts(k: Kernel) -> list[tuple[int, int, list[int], list[int]]]:
    """How the warp-specialized kernels' TMA sees q, k, v (and do): for each, (its buffer's id,
    the element offset of its first element, dims [D, rows, H, N / H] innermost first, and the
    element strides of the last three). Element (n, r, d) sits at offset + (n // H) * strides[2]
    + (n % H) * strides[1] + r * strides[0] + d."""
    assert k.fused is not None
    node, bufs, views = k.fused
    heads = ws_heads(k)
    assert heads is not None
    out = []
    for i in _ws_sources(k):
        heads = kv_heads(k) if i in (1, 2) else ws_heads(k)
        assert heads is not None
        (n, rows, d), b, view = node.srcs[i].shape, bufs[i], views[i]
        if view is None:
            offset, strides = 0, [d, rows * d, heads * rows * d]
        elif view.heads > 1:
            offset, strides = view.offset, [view.ld, view.sh, view.sb]
        else:   # batch n at n * sb: head n % H, batch n // H
            offset, strides = view.offset, [view.ld, view.sb, heads * view.sb]
        out.append((b.id, offset, [d, rows, heads, n // heads], strides))
    return out


def tensor_maps(k: Kernel, ptr: dict[int, int]) -> list:
    """The warp-specialized kernels' CUtensorMaps for buffers at ptr (tma_layouts): boxes of 64
    columns x the rows a block owns or a tile streams, in the 128-byte swizzle ember_hswz lays
    tiles out in; zeros past the edges."""
    from cuda.bindings import driver as cu
    assert k.fused is not None
    kinds = {"bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             "f16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    kind = _sizes(k)[0]
    rows, tile, _ = _plan(k)
    maps = []
    for i, (buf, offset, dims, strides) in zip(_ws_sources(k), tma_layouts(k)):
        box = [64, rows if i in WS_OWN[kind] else tile, 1, 1]
        err, tmap = cu.cuTensorMapEncodeTiled(
            kinds[k.fused[0].srcs[i].dtype.name], 4, ptr[buf] + 2 * offset, [cu.cuuint64_t(x) for x in dims],
            [cu.cuuint64_t(x * 2) for x in strides], [cu.cuuint32_t(x) for x in box], [cu.cuuint32_t(1)] * 4,
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if int(err) != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled for {k.name}: {err} (dims {dims}, strides {strides})")
        maps.append(tmap)
    return maps


def smem_bytes(k: Kernel) -> int:
    """f16/bf16: the forward keeps its block's q, the backward kernels two matrices (q and do; k
    and v); each streams two matrices through double buffers (the warp-specialized kernels
    through WS_STAGES slots). The sm_90a tiles start on 1024 bytes (the swizzle's period). f32:
    only the two streamed matrices (a thread's own rows are in its registers)."""
    kind, _, _, _, d = _sizes(k)
    rows, tile, _ = _plan(k)
    if _f32(k):
        return 4 * tile * d * 4
    own, p = (1 if kind == "attention" else 2) * rows, pitch(d, _wgmma(k))
    if ws_heads(k) is not None:
        return (own + 2 * ws_stages(kind, d) * tile) * p * 2 + 1024
    return (own + 4 * tile) * p * 2 + 1024 * _wgmma(k)


def launch(k: Kernel, sms: int) -> tuple[tuple[int, int, int], int, int]:
    kind, n, t_len, s_len, d = _sizes(k)
    rows, _, threads = _plan(k)
    blocks = -(-(s_len if kind == "attention_dkdv" else t_len) // rows)
    if kind == "attention" and ws_heads(k) is not None:   # persistent: a block per SM at most
        return (min(blocks * n, sms), 1, 1), threads, smem_bytes(k)
    assert isinstance(k.plan, FlashPlan)
    return (blocks, n, k.plan.split), threads, smem_bytes(k)


def scores(k: Kernel) -> Scores:
    """The kernel's score graph taken apart (compiler/attention.py's score_parts), reading its
    sources from the kernel's buffers."""
    assert k.fused is not None
    node, bufs, _ = k.fused
    raw, extra = placeholders(node.arg[1])
    at = {raw: Buffer(-1, dt.f32, raw.numel, "temp", raw)}
    at.update((p, bufs[FIXED[node.arg[0]] + i]) for i, p in enumerate(extra))
    return score_parts(node, at, node.arg[0] != "attention")


class _ScoreWriter(KernelWriter):
    """The elementwise renderer with the raw score (buffer -1) as the variable s, and f32
    divisions and exponentials on the hardware's approximations (MUFU.RCP and MUFU.EX2, 2 ulp:
    spec 4 leaves a fused kernel's precision free; a soft-cap's tanh divided in IEEE f32, three
    times an element in its derivative, was most of the backward's time)."""

    FAST = {Op.DIV: "__fdividef({0}, {1})", Op.EXP2: "ember_ex2({0})"}

    def buf(self, b: Node) -> str:
        return "s" if b.arg == -1 else super().buf(b)

    def emit(self, n: Node, scope: Scope) -> str:   # type: ignore[override]
        if n.dtype is not dt.f32 or n.op not in self.FAST:
            return super().emit(n, scope)   # type: ignore[return-value]
        name = self.var()
        scope.put(f"float {name} = {self.FAST[n.op].format(*(self.operand(x, scope) for x in n.srcs))};")
        return name


def _function(r: CLike, value: Node, ranges: tuple[Node, ...], head: str) -> str:
    """A device function computing value at (n, i, j) from the raw score s, by the elementwise
    renderer (render.KernelWriter): its loads of the score graph's sources are the kernel's."""
    names = {x: v for x, v in zip(ranges, "nij") if x.op is Op.RANGE}
    raw = {ld: ld.srcs[0] for ld in toposort([value]) if ld.op is Op.LOAD and ld.srcs[0].arg == -1}
    (value,) = substitute([value], raw) if raw else (value,)
    out = Buffer(-2, dt.f32, 1, "temp", value)
    store = Node(Op.STORE, dt.f32, (out.ref(), Node(Op.CONST, dt.i32, (), 0), value))
    w = _ScoreWriter(r, Kernel("score", out, list(names), store), "")
    w.names.update(names)
    root = Scope(None, frozenset(names), [])
    v = w.ref(w.value(value, root), value)
    body = "".join(f"    {line}\n" for line in root.lines if isinstance(line, str))
    return f"  {head} {{\n{body}    return {v};\n  }}\n"


def _bound(atom: tuple, box: dict[Node, tuple[str, str]], high: bool) -> str:
    """The largest (high) or smallest value over the box of an atom's linear form."""
    _, terms, k = atom
    parts = [str(k)] + [f"{c} * {box[x][int((c > 0) == high)]}" for x, c in terms.items()]
    return "(" + " + ".join(parts) + ")"


def _never(f: tuple, box: dict[Node, tuple[str, str]]) -> str:
    """C for: formula f is false everywhere in the box."""
    if f[0] == "lt":
        return f"{_bound(f, box, False)} >= 0"
    if f[0] == "not":
        return _always(f[1], box)
    parts = [_never(x, box) for x in f[1:]]
    return "(" + (" || " if f[0] == "and" else " && ").join(parts) + ")"


def _always(f: tuple, box: dict[Node, tuple[str, str]]) -> str:
    """C for: formula f is true everywhere in the box."""
    if f[0] == "lt":
        return f"{_bound(f, box, True)} < 0"
    if f[0] == "not":
        return _never(f[1], box)
    parts = [_always(x, box) for x in f[1:]]
    return "(" + (" && " if f[0] == "and" else " || ").join(parts) + ")"


METHOD = "__device__ __forceinline__"   # the functor's methods (EMBER_D is static)


def _factor(x: Node, c: float | None = None) -> tuple[float, Node] | None:
    """x as c * g (c a positive constant: a scale, log2 e), with g, so that the kernels fuse
    the product with what follows (exp2(fma(g, c, -max)), as the templates did before the score
    graph); masks of -inf or 0 pass through (their value over c is theirs). c: the one to find."""
    if x.op is Op.MUL:
        for a, b in (x.srcs, x.srcs[::-1]):
            if b.op is Op.CONST and math.isfinite(float(b.arg)) and float(b.arg) > 0 and c in (None, float(b.arg)):
                return float(b.arg), a
    if x.op is Op.WHERE:
        sides: list = []
        for side in x.srcs[1:]:
            if side.op is Op.CONST and float(side.arg) in (0.0, -math.inf, math.inf):
                sides.append(side)
                continue
            if (f := _factor(side, c)) is None:
                return None
            c, g = f
            sides.append(g)
        if c is not None:
            return c, Node(Op.WHERE, x.dtype, (x.srcs[0], *sides), x.arg, x.shape)
    return None


def score_struct(r: CLike, k: Kernel, name: str) -> str:
    """The score graph as the functor the kernel templates take: `score<EDGE>(s, n, i, j)`, the
    base-2 score of raw score s at batch n, query i, key j (EDGE false: inside every iota mask,
    which is then left out), as `scale * part<EDGE>` (_factor), `grad<EDGE>` its derivative,
    and over a box of rows and columns `live` (some score may be kept by the iota masks: the tile
    is not skipped) and `full` (every score is: the masks are left out)."""
    assert k.fused is not None
    node, bufs, _ = k.fused
    sc = scores(k)
    members = [b for b in dict.fromkeys(bufs[FIXED[node.arg[0]]:])]
    out = f"struct {name} {{\n" + "".join(f"  const {r.stype(b.dtype)}* __restrict__ b{b.id};\n" for b in members)
    out += f"  static constexpr bool loads = {str(bool(members)).lower()};\n"   # indices must stay in bounds
    args = "float s, int n, int i, int j"
    # a graph that reads sources keeps its product: ALiBi's dq spilled 8 bytes on sm_86 factored
    edge, inner = (None, None) if members else (_factor(sc.value), _factor(sc.inner))
    scale = 1.0
    if edge is not None and inner is not None and edge[0] == inner[0]:
        scale, parts = edge[0], (edge[1], inner[1])
    else:
        parts = (sc.value, sc.inner)
    out += f"  static constexpr float scale = {r.literal(scale, dt.f32)};   /* score = scale * part */\n"
    out += (f"  template <bool EDGE> {METHOD} float score({args}) const {{ return scale * part<EDGE>(s, n, i, j); }}\n")
    for fn, full, inner in (("part", *parts), ("grad", sc.grad, sc.grad_inner)):
        if full is None:
            continue
        out += (f"  template <bool EDGE> {METHOD} float {fn}({args}) const {{\n"
                f"    if constexpr (EDGE) return {fn}_edge(s, n, i, j); else return {fn}_inner(s, n, i, j);\n  }}\n")
        out += _function(r, full, sc.ranges, f"{METHOD} float {fn}_edge({args}) const")
        out += _function(r, inner, sc.ranges, f"{METHOD} float {fn}_inner({args}) const")
    box = {x: b for x, b in zip(sc.ranges, (("n", "n"), ("i0", "i1"), ("j0", "j1")))}
    live = " && ".join(f"!({_never(m, box)})" for m in sc.masks) or "true"
    full = " && ".join(f"({_always(m, box)})" for m in sc.masks) or "true"
    box_args = "int n, int i0, int i1, int j0, int j1"
    out += f"  {METHOD} bool live({box_args}) const {{ return {live}; }}\n"
    out += f"  {METHOD} bool full({box_args}) const {{ return {full}; }}\n"
    return out + "};\n"


def render(r: CLike, k: Kernel, prefix: str = "") -> str:
    """The kernel's entry point: its buffers in `Kernel.args` order, each source placed at the
    block's batch (q, k and v where their View says, the others in order) and handed to the
    template with the row strides of q, k and v, and the score graph's functor (score_struct)
    holding the buffers it reads."""
    assert k.fused is not None
    node, bufs, views = k.fused
    kind, n, t_len, s_len, d = _sizes(k)
    fixed = FIXED[kind]
    bf16 = node.srcs[0].dtype.name == "bf16"
    signature = KernelWriter(r, k, prefix).signature()[len("void "):]
    name = signature.split("(")[0].strip()
    functor = f"EmberScore_{name}"
    members = list(dict.fromkeys(bufs[fixed:]))
    struct = score_struct(r, k, functor)
    sm = f"{functor}{{{', '.join(f'b{b.id}' for b in members)}}}"
    args, grp = [], group(node)
    for i, (src, b, view) in enumerate(zip(node.srcs[:fixed], bufs, views)):
        at = f"(nb / {grp})" if i in (1, 2) and grp > 1 else "nb"   # k and v: a head shared by grp of q's
        if view is None:
            args.append(f"b{b.id} + (size_t){at} * {math.prod(src.shape[1:])}")
        else:
            args.append(f"b{b.id} + {view.offset} + (size_t)({at} / {view.heads}) * {view.sb} + "
                        f"(size_t)({at} % {view.heads}) * {view.sh}")
    lds = [str(v.ld if v else d) for v in views[:3]]
    call = ", ".join(args + lds)
    dgrad, extra = False, ""
    if kind != "attention":   # the backward's factor of ds: the score's derivative, or 1 and it per element
        dconst = scores(k).dconst
        dgrad = dconst is None
        extra = f", {1.0 if dgrad else dconst!r}f"
    fn = {"attention": "fwd", "attention_dq": "dq", "attention_dkdv": "dkdv"}[kind]
    fn = f"ember_flash32_{fn}" if _f32(k) else f"ember_flash_{fn}"
    if kind == "attention":   # 16-bit: whether the logsumexp follows o (a gradient is taken)
        flag = "" if _f32(k) else f", {str(node.shape[-1] != d).lower()}"
    else:
        flag = f", {str(dgrad).lower()}"
    if kind == "attention_dkdv" and not _f32(k) and _columns(k) != d:   # the columns a block adds up
        flag += f", {_columns(k)}"
    rows, tile, threads = _plan(k)
    heads = ws_heads(k)
    if heads is not None:   # q, k, v (and do) by TMA: the tensor maps follow the buffers, by value
        maps = ["tq", "tk", "tv", "tdo"][:len(_ws_sources(k))]
        # the forward's items (row blocks x heads) count n; the backward's: the packed output, rowsum(do o)
        rest = f"{n}, " if kind == "attention" else f"{args[3]}, {args[5]}, "
        # the forward's item counter, zero when the module loads and put back by each launch
        counter = f"__device__ unsigned {name}_next[2];\n" if kind == "attention" else ""
        extra += f", {name}_next" if kind == "attention" else ""
        return (struct + counter + f"extern \"C\" __global__ void __launch_bounds__({threads}, 1) {signature[:-1]}, "
                + ", ".join(f"const __grid_constant__ EmberTmap {m}" for m in maps) + ") {\n"
                "  const int nb = blockIdx.y;\n"
                f"  {fn}_ws<{d}, {tile}, {ws_stages(kind, d)}, {str(bf16).lower()}{flag}>(b{k.out.id}, "
                f"{', '.join('&' + m for m in maps)}, {rest}{heads}, {grp}, {kv_heads(k)}, {t_len}, {s_len}{extra}, "
                f"{sm});\n}}\n")
    flags = flag[2:] if _f32(k) else f"{str(bf16).lower()}, {str(_wgmma(k)).lower()}{flag}"
    return (struct + f"extern \"C\" __global__ void __launch_bounds__({threads}) {signature} {{\n"
            "  const int nb = blockIdx.y;\n"
            f"  {fn}<{d}, {rows}, {tile}{', ' + flags if flags else ''}>(b{k.out.id}, {call}, {t_len}, "
            f"{s_len}{extra}, {sm});\n}}\n")
