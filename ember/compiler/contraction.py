"""Contractions found on the kernel graph, and the tensor-core plan for them.

A contraction is a kernel whose value holds one REDUCE(add) over one range k of
MUL(load A, load B), where A's address is affine in k and in an output range i that B ignores,
and B's is affine in k and in an output range j that A ignores. The other output ranges are
batch ranges (either load may use them). Around the reduction, the rest of the kernel's value
is an epilogue evaluated per output element (a bias, an activation, a cast); nothing in the IR
names a matmul.

The plan (`GpuPlan`) is a record the CUDA backend renders as one kernel: block tiles of
the output on the grid, warp tiles of `mma.sync.m16n8k16` fragments read with `ldmatrix` from
shared memory, a `cp.async` pipeline of `stages` K-steps, masked edge tiles. Each operand is
staged with its contiguous axis innermost: "k-major" when its k stride is 1 (A row-major, B
transposed as in x @ W.T), else "mn-major" when its i (or j) stride is 1.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from .. import dtype as dt
from ..ir import MOVEMENT, Node, Op, toposort, widening
from ..target import Target
from . import symbolic as sym
from .lower import Kernel, free_ranges

TENSOR_CORE_DTYPES = (dt.f16, dt.bf16)


@dataclass(frozen=True)
class Operand:
    load: Node
    strides: dict            # range -> element stride in the buffer (the load's affine address)
    offset: int              # the constant part of the address
    k_major: bool            # contiguous along k (else along its output range)
    aligned: bool            # every 16-byte chunk along the contiguous axis one load (the last may pass its end)


@dataclass(frozen=True)
class Contraction:
    reduce: Node
    i: Node                  # the output range of A (rows of the tile), size M
    j: Node                  # the output range of B (columns), size N
    k: Node                  # the reduced range, size K
    batch: tuple[Node, ...]  # the other output ranges, outermost first (the grid's z)
    a: Operand
    b: Operand
    dtype: dt.DType          # the operands' dtype (f16 or bf16)
    pair_store: bool = False  # outputs (i, j) and (i, j + 1) are adjacent and their pair aligned (j even)
    # i, j and k made of several ranges, outermost first, each with its own strides in the
    # operands (a convolution's rows n, h, w; a weight gradient's K over n and h*w), decoded
    # where the operands are read and the output stored; empty: the range itself
    i_parts: tuple[Node, ...] = ()
    j_parts: tuple[Node, ...] = ()
    k_parts: tuple[Node, ...] = ()
    # i's and j's parts chain in the operands and the output (each outer part's stride is the
    # next one's times its size: a [B, T, C] activation's B and T): memory sees one range, so
    # TMA may read and write the tiles; the parts are decoded for the epilogue only
    chained: bool = False
    # the output's element strides over i and the batch ranges, where TMA can write its tiles:
    # bf16 or f16, j contiguous and even, the other strides multiples of 16 bytes, offset 0
    out_strides: "dict[Node, int] | None" = None

    @property
    def batch_size(self) -> int:
        return math.prod(r.arg[1] for r in self.batch)

    def tiles(self, rows: int, cols: int) -> int:
        """Output tiles of rows x cols, over every batch."""
        m, n, _ = self.mnk
        return -(-m // rows) * -(-n // cols) * self.batch_size

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.i.arg[1], self.j.arg[1], self.k.arg[1]

    def offset(self, op: Operand, axis: Node, var: str) -> str:
        """C expression: the element offset in op's buffer of index `var` along axis (i, j or
        k), decoded into the axis's parts."""
        parts = {self.i: self.i_parts, self.j: self.j_parts, self.k: self.k_parts}[axis]
        if not parts:
            return f"(long long)({var}) * {op.strides.get(axis, 0)}"
        terms, inner = [], 1
        for r in reversed(parts):
            idx = var if inner == 1 else f"({var}) / {inner}"
            idx = idx if r is parts[0] else f"(({idx}) % {r.arg[1]})"
            if op.strides.get(r, 0):
                terms.append(f"(long long)({idx}) * {op.strides[r]}")
            inner *= r.arg[1]
        return "(" + " + ".join(terms or ["0"]) + ")"

    def names(self, i: str, j: str) -> dict[Node, str]:
        """C expressions of the output ranges, given the variables holding i, j and the batch
        ranges (z0, z1, ...): a merged range is decoded into its parts."""
        out = {b: f"z{n}" for n, b in enumerate(self.batch)}
        for merged, parts, var in ((self.i, self.i_parts, i), (self.j, self.j_parts, j)):
            out[merged] = var
            inner = 1
            for r in reversed(parts):
                out[r] = f"(({var} / {inner}) % {r.arg[1]})" if inner > 1 else f"({var} % {r.arg[1]})"
                inner *= r.arg[1]
        return out



@dataclass(frozen=True)
class GpuPlan:
    """One kernel's tensor-core tiling: printed by EMBER_DEBUG=2. With wgmma (sm_90a), a block
    is warps_m warpgroups of 64 rows each, and warps_n is 1."""
    instruction: str = "mma.sync"  # "mma.sync" (m16n8k16, sm_80+), "wgmma" (m64nNk16, sm_90a), "fma" (f32)
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 4
    tma: bool = False   # wgmma: the operands arrive by TMA, issued by a producer warpgroup of its own
    tma_store: bool = False   # and the tile leaves through shared memory by TMA (Contraction.out_strides)

    @property
    def threads(self) -> int:
        if self.instruction == "fma":  # a thread per 8 x 8 outputs
            return self.block_m * self.block_n // 64
        if self.instruction == "wgmma":   # one warpgroup per 64 rows (and the TMA producer's)
            return 128 * (self.warps_m + self.tma)
        return 32 * self.warps_m * self.warps_n

    def __str__(self) -> str:
        who = {"wgmma": f"{self.warps_m} warpgroups", "fma": "8x8 per thread"}.get(
            self.instruction, f"warps {self.warps_m}x{self.warps_n}")
        kind = "FMA register tiles" if self.instruction == "fma" else f"tensor core {self.instruction}"
        return (f"{kind}: block {self.block_m}x{self.block_n}x{self.block_k}, "
                f"{who}, {'TMA' if self.tma else 'cp.async'} {self.stages}-stage"
                + (", TMA store" if self.tma_store else ""))


@dataclass(frozen=True)
class PackedPlan:
    """A contraction on the CPU (backend/packed.py): output tiles of mc_tiles x nc_tiles register
    blocks of MR x NR, whose sizes the C compiler's vector width sets."""
    mc_tiles: int = 16
    nc_tiles: int = 4

    def __str__(self) -> str:
        return f"packed panels: tiles of {self.mc_tiles} x {self.nc_tiles} register blocks"


def _operand_load(x: Node, dtypes: tuple[dt.DType, ...]) -> Node | None:
    """The load under a multiplicand: the load itself, or an exact widening cast of it."""
    if widening(x):
        x = x.srcs[0]
    if x.op is Op.LOAD and len(x.srcs) == 2 and x.dtype in dtypes:
        return x
    return None


def _affine(load: Node, allowed: set[Node]) -> tuple[dict, int] | None:
    terms, const = sym.linear(load.srcs[1])
    if not all(t.op is Op.RANGE and t in allowed for t in terms):
        return None
    return terms, const


def find(k: Kernel, dtypes: tuple[dt.DType, ...] = TENSOR_CORE_DTYPES) -> Contraction | None:
    """The kernel's contraction with operands of these dtypes, or None."""
    nodes = toposort([k.store])
    reduces = [n for n in nodes if n.op is Op.REDUCE]
    if len(reduces) != 1:
        return None
    (red,) = reduces
    op, own = red.arg
    if op is not Op.SUM or not red.dtype.is_float:
        return None
    body = red.srcs[0]
    if body.op is Op.CAST and body.dtype.bits > 16 and body.srcs[0].op is Op.MUL and body.srcs[0].dtype in dtypes:
        body = body.srcs[0]   # half products summed in f32 (split.split_k): the accumulator already is
    if body.op is not Op.MUL:
        return None
    x, y = (_operand_load(s, dtypes) for s in body.srcs)
    if x is None or y is None or x.dtype is not y.dtype:
        return None
    deps = free_ranges(k.store)
    if deps[red] != frozenset(k.ranges):  # the epilogue may not loop over the reduction
        return None
    allowed = set(k.ranges) | set(own)
    fx, fy = _affine(x, allowed), _affine(y, allowed)
    if fx is None or fy is None:
        return None
    kr, fx, fy, k_parts = _merge_reduced(own, fx, fy)
    if kr not in fx[0] or kr not in fy[0]:
        return None
    only_x = [r for r in k.ranges if r in fx[0] and r not in fy[0]]
    only_y = [r for r in k.ranges if r in fy[0] and r not in fx[0]]
    if not only_x or not only_y:
        return None
    # A's output range: the innermost range only A uses; likewise B's; the rest go on the grid
    ia, jb = only_x[-1], only_y[-1]
    if k.ranges.index(ia) > k.ranges.index(jb):  # the output's last range belongs to B
        x, y, fx, fy, ia, jb, only_x, only_y = y, x, fy, fx, jb, ia, only_y, only_x
    ia, i_parts, fx = _merge_output(ia, only_x, fx)
    jb, j_parts, fy = _merge_output(jb, only_y, fy)
    batch = tuple(r for r in k.ranges if r is not ia and r is not jb and r not in i_parts and r not in j_parts)
    a = _operand(x, *fx, ia, kr, k_parts, i_parts)
    b = _operand(y, *fy, jb, kr, k_parts, j_parts)
    if a is None or b is None:
        return None
    pairs = _pairs(k, j_parts[-1] if j_parts else jb)  # even sizes: a pair never straddles parts
    store = sym.linear(k.store.srcs[1])[0]
    chained = bool(i_parts or j_parts) and _chain(i_parts, fx[0]) and _chain(j_parts, fy[0]) and \
        _chain(i_parts, store) and _chain(j_parts, store)
    out = None if (i_parts or j_parts) and not chained or k.atomic else \
        _out_strides(k, ia, jb, batch, i_parts if chained else (), j_parts if chained else ())
    return Contraction(red, ia, jb, kr, batch, a, b, x.dtype, pairs, i_parts, j_parts, k_parts, chained, out)


def _chain(parts: tuple[Node, ...], terms: dict[Node, int]) -> bool:
    """Whether each part's stride in terms is the next inner one's times that one's size."""
    return all(terms.get(outer, 0) == terms.get(inner, 0) * inner.arg[1] for outer, inner in zip(parts, parts[1:]))


def _out_strides(k: Kernel, i: Node, j: Node, batch: tuple[Node, ...], i_parts: tuple[Node, ...] = (),
                 j_parts: tuple[Node, ...] = ()) -> dict[Node, int] | None:
    """The store's strides over i and the batch ranges if TMA can write the output tile by tile
    (Contraction.out_strides), else None; i_parts, j_parts: parts that chain, one range to TMA."""
    terms, const = sym.linear(k.store.srcs[1])
    for merged, parts in ((i, i_parts), (j, j_parts)):
        if parts:
            terms = {r: c for r, c in terms.items() if r not in parts} | {merged: terms.get(parts[-1], 0)}
    chunk = 8   # 2-byte elements in 16 bytes
    if k.out.dtype not in (dt.bf16, dt.f16) or terms.get(j) != 1 or j.arg[1] % 2 or const or \
            set(terms) - {i, j, *batch}:
        return None
    strides = {r: terms.get(r, 0) for r in (i, *batch)}
    return strides if strides[i] and all(st % chunk == 0 for st in strides.values()) else None


def _merge_output(r: Node, only: list[Node], f: tuple[dict, int]) -> tuple[Node, tuple[Node, ...], tuple]:
    """All output ranges only this operand uses as one range (M or N): their product, each a
    part with its own stride, innermost the smallest (an implicit-GEMM convolution's rows n, h,
    w of the padded input; an im2col buffer's). One range: r itself, with no parts."""
    terms, const = f
    if len(only) == 1:
        return r, (), f
    parts = tuple(sorted(only, key=lambda o: -terms[o]))
    merged = sym.rng("_".join(p.arg[0] for p in parts), math.prod(p.arg[1] for p in parts))
    return merged, parts, ({**terms, merged: terms[parts[-1]]}, const)


def _merge_reduced(own: tuple[Node, ...], fx: tuple[dict, int], fy: tuple[dict, int]) -> tuple:
    """The reduced ranges as one k: neighbours merge where both operands walk them as one axis
    (a weight gradient sums x[b, t, i] dy[b, t, j] over b and t: each range's stride is the next
    one's times its size). Groups that do not chain stay K's parts (k_parts), decoded from k
    where the operands are read. Returns (k, A's and B's (strides, offset), k_parts)."""
    groups = [[own[-1]]]
    for r in reversed(own[:-1]):  # outwards
        outer = groups[-1][0]
        if all(terms.get(r, 0) == terms.get(outer, 0) * outer.arg[1] for terms, _ in (fx, fy)):
            groups[-1].insert(0, r)
        else:
            groups.append([r])
    groups.reverse()
    parts = [g[0] if len(g) == 1 else sym.rng("_".join(r.arg[0] for r in g), math.prod(r.arg[1] for r in g))
             for g in groups]
    kr = parts[0] if len(parts) == 1 else sym.rng("_".join(p.arg[0] for p in parts), math.prod(p.arg[1] for p in parts))
    merged = []
    for terms, const in (fx, fy):
        t = {r: c for r, c in terms.items() if r not in own}
        for g, part in zip(groups, parts):
            if g[-1] in terms:
                t[part] = terms[g[-1]]
        if parts[-1] in t:  # k's own stride: its innermost part's (k-major when that is 1)
            t[kr] = t[parts[-1]]
        merged.append((t, const))
    return kr, merged[0], merged[1], tuple(parts) if len(parts) > 1 else ()


def _pairs(k: Kernel, j: Node) -> bool:
    """Whether the epilogue may store outputs two at a time along j (one 4- or 8-byte store)."""
    terms, const = sym.linear(k.store.srcs[1])
    return (k.out.dtype.itemsize in (2, 4) and terms.get(j) == 1 and j.arg[1] % 2 == 0 and const % 2 == 0
            and all(c % 2 == 0 for r, c in terms.items() if r is not j))


def _operand(load: Node, strides: dict, offset: int, out: Node, kr: Node,
             k_parts: tuple[Node, ...] = (), out_parts: tuple[Node, ...] = ()) -> Operand | None:
    if strides.get(kr) == 1:
        k_major, other, contiguous, parts = True, strides.get(out), k_parts[-1] if k_parts else kr, k_parts
    elif strides.get(out) == 1:
        k_major, other, contiguous, parts = False, strides.get(kr), out_parts[-1] if out_parts else out, out_parts
    else:
        return None  # neither axis contiguous: the generic path
    merged = {kr} if k_parts else set()
    merged |= {out} if out_parts else set()   # their strides are their parts'
    rest = [c for r, c in strides.items() if r is not contiguous and r not in merged]
    chunk = 16 // load.dtype.itemsize   # elements per 16-byte load
    # a row's last chunk may pass the contiguous extent (split.pad_operands' copies, K = 3900 in
    # rows of 3904): TMA's box and cp.async's byte count stop at it; not within a merged range
    aligned = offset % chunk == 0 and all(c % chunk == 0 for c in rest) and \
        (contiguous.arg[1] % chunk == 0 or not parts)
    if parts and not aligned:  # element-wise staging reads runs along the contiguous axis: one part only
        return None
    return Operand(load, dict(strides), offset, k_major, aligned) if other else None


def tma_ready(c: Contraction) -> bool:
    """Whether TMA can read both operands: a box per tile of a tensor of at most 5 dimensions
    (its contiguous axis, the other, the batch ranges it moves along) at 16-byte aligned strides;
    not the decoded parts of merged ranges (a convolution's windows)."""
    return not (c.k_parts or (c.i_parts or c.j_parts) and not c.chained) and all(
        op.aligned and 2 + sum(1 for b in c.batch if op.strides.get(b)) <= 5 for op in (c.a, c.b))


def fed(p: GpuPlan, c: Contraction, gpu: Target) -> GpuPlan:
    """A wgmma tiling with TMA where c's operands allow it (stored plans record only tilings),
    and the TMA store where the output allows it: its tile takes block_m x block_n x 2 bytes of
    shared memory, so slots are given up (not below 3) to make room."""
    if p.instruction != "wgmma" or not tma_ready(c):
        return p
    fed = dataclasses.replace(p, tma=True)
    if c.out_strides is None or p.block_n % 64:
        return fed
    # the most slots that fit, given up down to 3 (a plan of fewer keeps its own)
    stored = [dataclasses.replace(fed, stages=s, tma_store=True) for s in range(p.stages, min(p.stages, 3) - 1, -1)]
    room = gpu.smem_block
    return next((q for q in stored if smem_bytes(q) <= room), fed)


def smem_bytes(p: GpuPlan) -> int:
    """A plan's shared memory: its slots, and for wgmma room to align the tiles to 1024 bytes
    (the swizzle atom), the mbarriers (TMA) and the TMA store's output tile."""
    if p.instruction == "fma":  # f32 tiles [block_k][block + 4]
        return p.stages * (p.block_m + p.block_n + 8) * p.block_k * 4
    slots = p.stages * (p.block_m + p.block_n) * p.block_k * 2
    if p.instruction != "wgmma":
        return slots
    return slots + 1024 + 16 * p.stages * p.tma + p.block_m * p.block_n * 2 * p.tma_store


def _waves(c: Contraction, tile: tuple[int, int], sms: int) -> float:
    """The time of c's tiles on the SMs, one block each at a time (the persistent TMA kernel),
    in units of 128 x 256 FLOPs at that tile's rate: its rounds times a tile's time, 128 columns
    at 0.85 of the rate of 256 (split._split_cost's figures). 4000 x 4100 has 544 tiles of
    128 x 256, 4.12 rounds of 132 taking 5 (5.0), and 1056 of 128 x 128, 8.0 rounds (4.7)."""
    rows, cols = tile
    return -(-c.tiles(rows, cols) // sms) * rows * cols / (128 * 256) / (1.0 if cols == 256 else 0.85)


def one_round(m: int, n: int, sms: int) -> bool:
    """Whether tiles of 128 x 192 fill the SMs in one round (90% of them at least) where those of
    128 x 256 leave some idle: wgmma then takes 192 columns and K is not split (split_k). GPT-2's
    lm head dX, 4096 x 768 over K = 50304: 96 tiles of 128 x 256, K split in 2 and streamed, ran at
    0.77 of cuBLAS; 128 tiles of 128 x 192 in one round at 1.08 (an H100, bench/matmul.py)."""
    rows = -(-m // 128)
    return rows * -(-n // 256) < sms and rows * -(-n // 192) <= sms and m * n >= 0.9 * sms * 128 * 192


def plan(c: Contraction, gpu: Target, atomic: bool = False) -> GpuPlan | None:
    """Heuristic tiling, or None where tiles do not pay (a matrix-vector product). atomic: the
    kernel adds its tiles into their sum (split_k's parts), which wgmma's persistent blocks share
    out by K-steps in the last round: the rounds' waves do not quantize its time (split._split_cost)."""
    m, n, kk = c.mnk
    if m < 16 or n < 16 or kk < 16:
        return None
    # 4 stages where two blocks of 128 x 128 tiles in 4 (64 KB each) fit an SM (not sm_86's 100 KB)
    stages = 4 if gpu.smem_sm >= 128 * 1024 else 3
    if c.dtype is dt.f32:  # FMA: 8x8 outputs per thread (TF32 tensor cores would round the operands);
        # 128 x 128 in 4 stages, 16 deep where two blocks of them fit an SM (68 KB each): on an H100
        # 3001x2047x1999 ran at 38.5 TFLOP/s against 8 deep's 28.8, 4096 and 2000x3000x1000 alike
        deep = 16 if gpu.smem_sm >= 160 * 1024 else 8
        if m <= 64 or n <= 64:
            return GpuPlan("fma", 64, 64, 8, 1, 1, 3)
        return GpuPlan("fma", 128, 128, deep, 1, 1, stages)
    if gpu.wgmma and m > 64 and not atomic and one_round(m, n, gpu.sms):
        return fed(GpuPlan("wgmma", 128, 192, 64, 2, 1, 4), c, gpu)
    if gpu.wgmma and (m > 64 or n > 128):  # Hopper: warpgroups of 64 rows reading shared memory
        rows = 128 if m > 64 else 64   # one warpgroup for 64 rows (a convolution's 64 output channels)
        tiles = [(r, cols) for r, cols in ((rows, 256), (rows, 128), (64, 256), (64, 128))
                 if r <= rows and (cols == 128 or n > 128)]
        # the largest tile that still gives the SMs a block each (a 7 x 7 convolution with 512
        # channels had 28 tiles of 128 x 256: 0.42-0.57 of cuDNN), or half as wide where its
        # rounds of blocks on the SMs take less time (waves)
        rows, cols = next((t for t in tiles if c.tiles(*t) >= gpu.sms), tiles[-1])
        if cols == 256 and not atomic and _waves(c, (rows, 128), gpu.sms) < _waves(c, (rows, 256), gpu.sms):
            cols = 128
        return fed(GpuPlan("wgmma", rows, cols, 64, rows // 64, 1, 4), c, gpu)
    if m <= 64 or n <= 64:
        return GpuPlan("mma.sync", 64, 64, 32, 2, 2, stages)
    return GpuPlan("mma.sync", 128, 128, 32, 2, 2, stages)


def gathered_operands(k: Kernel) -> set[Node]:
    """Operands of a sum of products that reach their buffer through index arithmetic no
    stride describes (a permute and reshape that merge axes: attention's heads put back side by
    side, read as (c // 64, c % 64)), or through overlapping windows (a convolution's input at
    h + kh: two ranges with one stride) or a permute (its weight, wanted with the channels
    innermost) that the contraction paths cannot read in place. A contiguous copy (for a
    convolution, the im2col buffer) costs one pass over memory and lets the tensor-core and
    packed paths take the product."""
    @functools.cache
    def direct() -> bool:  # the tensor-core and packed paths read the windows in place (asked once)
        return find(k, (dt.f16, dt.bf16, dt.f32, dt.f64)) is not None

    found: set[Node] = set()
    for t in k.reduces.values():   # split.pad_operands' aligned copies (of split_k's parts too)
        prod = t.srcs[0].srcs[0] if t.srcs[0].op is Op.CAST else t.srcs[0]
        if t.op is Op.SUM and prod.op is Op.MUL:
            found |= {pad for x in prod.srcs if (pad := _padded_copy(x)) is not None}
    for red, t in k.reduces.items():
        body = red.srcs[0]
        if t.op is not Op.SUM or t.srcs[0].op is not Op.MUL or body.op is not Op.MUL:
            continue
        for x, ld in zip(t.srcs[0].srcs, body.srcs):
            while x.op is Op.EXPAND or x.op is Op.CAST:
                x = x.srcs[0]
            if ld.op is Op.CAST:
                ld = ld.srcs[0]
            if ld.op is not Op.LOAD or x.op not in MOVEMENT:
                continue
            terms, _ = sym.linear(ld.srcs[1])
            if any(term.op is not Op.RANGE for term in terms):
                found.add(_below_widening(_under_reshapes(x)))
            elif (len(set(terms.values())) < len(terms) or _permuted(x)) and not direct():
                found.add(_below_widening(x))
    return found


def _under_reshapes(x: Node) -> Node:
    """The value that reshapes alone lead x to, when it is computed (not moved): its buffer is then
    read through the reshapes in place. A copy of the reshape itself, made while the value was
    still fused (its index through the reshape is a division), stayed once the value had a buffer
    of its own: GPT-2's residual gradient in bf16 was copied again for the projection's dx."""
    y = x
    while y.op is Op.RESHAPE:
        y = y.srcs[0]
    return y if y.op not in MOVEMENT and y.op is not Op.PARAM else x


def _below_widening(x: Node) -> Node:
    """x, or the value under an exact widening cast among the movements below it: the copy then
    holds the 16-bit value (f32 scores of bf16 q and k, functional.attention_scores), half the
    bytes, and stays a tensor-core operand."""
    y = x
    while y.op in MOVEMENT or y.op is Op.CAST:
        if widening(y):
            return y.srcs[0]
        y = y.srcs[0]
    return x


def _padded_copy(x: Node) -> Node | None:
    """The zero pad below x's movements that a shrink takes off again, as split.pad_operands
    writes it (the last dim only, to a multiple of 16 bytes), or None. (Other pads stay fused:
    the flash kernels' output packs o with the logsumexp, [.., 64] -> [.., 65].)"""
    while x.op in (Op.EXPAND, Op.RESHAPE, Op.PERMUTE):
        x = x.srcs[0]
    pad = x.srcs[0] if x.op is Op.SHRINK else x
    if pad is x or pad.op is not Op.PAD or pad.arg[2] != 0:
        return None
    before, after = pad.arg[0], pad.arg[1]
    chunk = 16 // pad.dtype.itemsize
    aligned = pad.shape[-1] % chunk == 0 and 0 < after[-1] < chunk
    return pad if aligned and not any(before) and not any(after[:-1]) else None


def _permuted(x: Node) -> bool:
    while x.op is Op.RESHAPE:
        x = x.srcs[0]
    return x.op is Op.PERMUTE
