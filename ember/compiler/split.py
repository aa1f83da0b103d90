"""The GPU's rewrite of the tensor graph before scheduling: reductions with few outputs over
long axes, which would leave most of the GPU idle, in two stages."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import dtype as dt
from .. import ir
from ..ir import Node, Op, toposort
from ..target import Target
from . import symbolic as sym
from .contraction import find, one_round
from .lower import Buffer
from .rewrite import Pat, RuleSet, rewrite, substitute

if TYPE_CHECKING:
    from .schedule import Schedule


def split_large_reductions(outputs: list[Node], gpu: Target) -> list[Node]:
    """A reduction with few outputs and a long axis would leave most of the GPU idle (a full sum
    on one block, a column sum on one thread per column): reduce in two stages instead, partial
    results over groups of the axis, then the groups. The scheduler keeps them two kernels.
    A rewrite, so that reductions inside a split one's input are split too."""
    def split(n: Node) -> Node | None:
        x = n.srcs[0]
        axes = n.arg
        size = math.prod(x.shape[a] for a in axes)
        if len(axes) > 1 and axes == tuple(range(axes[0], axes[0] + len(axes))) and axes[-1] < len(x.shape) - 1 \
                and 1 < n.numel < 1 << 17 and size >= 1024:
            # neighbouring strided axes (a bias gradient sums [B, T, C] over B and T, 3 blocks for
            # 768 outputs; 3.3 ms for C = 3072 on the H200): one axis, split below
            merged = x.shape[:axes[0]] + (size,) + x.shape[axes[-1] + 1:]
            return ir.reshape(ir.reduce(n.op, ir.reshape(x, merged), (axes[0],)), n.shape)
        if n.numel == 1:  # everything (1-D too): one long axis first
            if x.numel < 1 << 16:
                return None
            x = ir.reshape(x, (x.numel,))
            axis = 0
        elif len(n.arg) > 1 and n.numel < 1 << 16 and x.numel >= n.numel << 15 and x.shape[n.arg[0]] >= 16:
            # few outputs of many axes (batch norm's statistics over N, H and W: 64 blocks of
            # 65536 elements each; a convolution's weight gradient, 9 tiles of K = 65536): first
            # every value of the outermost reduced axis apart (for a contraction: a split K)
            return ir.reshape(_two_stages(n.op, x, n.arg[1:], n.arg[:1]), n.shape)
        elif len(n.arg) == 1 and n.arg[0] < len(x.shape) - 1 and n.numel < 1 << 17 and x.shape[n.arg[0]] >= 1024:
            axis = n.arg[0]  # a strided axis: one thread per output would be too few threads
        else:
            return None
        size = x.shape[axis]
        # groups of at least 64 elements, so the partial results stay small beside the input
        groups = next((g for g in (1 << e for e in range(10, 0, -1)) if size % g == 0 and size // g >= 64), None)
        if groups is None:
            return None
        parts = ir.reshape(x, x.shape[:axis] + (groups, size // groups) + x.shape[axis + 1:])
        return ir.reshape(_two_stages(n.op, parts, (axis + 1,), (axis,)), n.shape)

    rules = [(Pat(Op.SUM, name="n"), pad_operands)] if gpu.mma_sync else []   # before split_k: it keeps the pads
    return rewrite(outputs, RuleSet([*rules, (Pat(Op.SUM, name="n"), lambda n: split_k(n, gpu.sms, gpu.wgmma)),
                                     (Pat(pred=lambda n: n.op in (Op.SUM, Op.RMAX), name="n"), split)]))


def _two_stages(op: Op, x: Node, first: tuple[int, ...], then: tuple[int, ...]) -> Node:
    """op over axes `first` of x, then over `then` of the partial results. A 16-bit sum is summed
    in f32 and rounded once at the end, as the spec says, not rounded in its partial results."""
    if op is Op.SUM and x.dtype in (dt.bf16, dt.f16):
        return ir.unary(Op.CAST, _two_stages(op, ir.unary(Op.CAST, x, dt.f32), first, then), x.dtype)
    return ir.reduce(op, ir.reduce(op, x, first), then)


MIN_SPLIT_K = 1024  # the least K a split part keeps


STREAMED_EPILOGUE = 1024   # a streamed part's atomic epilogue and refill, in K elements of a 128 x 256 tile


def _split_cost(outputs: int, size: int, parts: int, sms: int, streamed: bool = False) -> float:
    """The time of a contraction split in parts, in units of one K element of a 128 x 256 tile:
    its waves of blocks on the SMs, each block's steps plus a pipeline's fill and epilogue (about
    256 steps' worth), with the tile contraction.plan picks (128 x 128, at 0.59 of the time and
    0.85 of the rate, when 128 x 256 tiles are fewer than the SMs). streamed: the atomic parts
    run on persistent blocks that share the last round's tiles out by K-steps (mma._render_hopper's
    stream-K tail), so the steps are balanced and a round costs its atomic epilogue: the fewest
    parts that fill the SMs (GPT-2's fc weight gradient: 2, not 8 parts of 128 KB of atomics a
    tile). Where the tiles do not fill the SMs, every step would be shared out, blocks far apart
    in K: the waves' model holds."""
    blocks, scale = -(-outputs // (128 * 256)) * parts, 1.0
    if streamed and parts > 1 and blocks >= sms:
        return blocks * (size // parts) / sms + -(-blocks // sms) * STREAMED_EPILOGUE
    if blocks < sms:
        blocks, scale = -(-outputs // (128 * 128)) * parts, 0.5 / 0.85
    return -(-blocks // sms) * (size // parts + 256) * scale


def split_k(n: Node, sms: int, streamed: bool = False) -> Node | None:
    """A half-precision contraction with few output tiles and a long K (a weight gradient sums
    over all 16384 tokens of a GPT-2 step into [768, 768]: 36 tiles of 128 x 128 for the H200's 132 SMs)
    as S contractions over parts of K, each with its own output tiles, summed after; S as
    _split_cost estimates best (768 x 3072 over 16384: 8 parts of 72 tiles on sm_86, 2 on sm_90a). The parts are f32
    sums (a tensor-core contraction's accumulator, contraction.find), added up, rounded once."""
    prod = n.srcs[0]
    if n.dtype not in (dt.bf16, dt.f16) or len(n.arg) != 1 or prod.op is not Op.MUL or \
            any(x.op is not Op.EXPAND for x in prod.srcs):
        return None
    (axis,) = n.arg
    size = prod.shape[axis]
    if streamed and one_round(n.numel // n.shape[-1], n.shape[-1], sms):   # the output's last axis is N
        return None
    # each part's K a whole number of 16-byte chunks: else its rows start unaligned, and the
    # operands are staged element by element (bf16 K = 3900 in 2 parts of 1950 on sm_86)
    chunk = 16 // n.dtype.itemsize
    options = [p for p in (1, 2, 4, 8, 16) if size % p == 0 and (p == 1 or size // p >= MIN_SPLIT_K and
                                                                  size // p % chunk == 0)]
    parts = min(options, key=lambda p: _split_cost(n.numel, size, p, sms, streamed))
    if parts == 1:
        return None
    def split(shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:axis] + (parts, shape[axis] // parts) + shape[axis + 1:]
    # each operand split before its broadcast: the product's own index may pass 2^31
    prods = ir.binary(Op.MUL, *(ir.expand(ir.reshape(x.srcs[0], split(x.srcs[0].shape)), split(prod.shape))
                                for x in prod.srcs))
    total = ir.reduce(Op.SUM, ir.reduce(Op.SUM, ir.unary(Op.CAST, prods, dt.f32), (axis + 1,)), (axis,))
    return ir.unary(Op.CAST, ir.reshape(total, n.shape), n.dtype)


PAD_MIN = 1024   # the least output size on the other side that pays for an operand's padded copy


def pad_operands(n: Node) -> Node | None:
    """A contraction whose operand's rows are not 16-byte aligned (bf16 [M, K] with K = 3900: a row
    is 7800 bytes) can use neither TMA nor 16-byte cp.async, and stages element by element. Such
    an operand is read instead from a copy whose last dim is padded to 16 bytes (shrink(pad(x)),
    the pad realized: contraction.gathered_operands), where the tiles come by TMA. The copy is one
    pass over the operand, 2 x 2 bytes an element against 2 N FLOPs an element of the product
    (N the output size the operand lacks): about 470 / N of the product's time on the H200
    (0.8 PFLOP/s against 3.4 TB/s), so only where N >= PAD_MIN. A computed operand costs nothing:
    the kernel that computes it writes the padded buffer."""
    prod = n.srcs[0]
    if len(n.arg) != 1 or prod.op is not Op.MUL or any(x.op is not Op.EXPAND for x in prod.srcs):
        return None
    new = [_padded(x, y, n.arg[0]) for x, y in zip(prod.srcs, reversed(prod.srcs))]
    if all(p is None for p in new):
        return None
    srcs = [x if p is None else ir.expand(p, x.shape) for x, p in zip(prod.srcs, new)]
    return Node(Op.SUM, n.dtype, (Node(Op.MUL, prod.dtype, tuple(srcs), None, prod.shape),), n.arg, n.shape)


def _padded(x: Node, other: Node, axis: int) -> Node | None:
    """x's source (below reshapes and permutes) with its last dim padded to 16 bytes and shrunk
    back, under the same reshapes and permutes; None where it is aligned, padded already, too
    small to pay, or where that dim does not become one axis of the product: the reduced one or
    one the other operand (other, an EXPAND) broadcasts."""
    chain, base = [], x.srcs[0]
    while base.op in (Op.RESHAPE, Op.PERMUTE):
        chain.append(base)
        base = base.srcs[0]
    size, chunk = base.shape[-1], 16 // base.dtype.itemsize
    if base.dtype not in (dt.bf16, dt.f16, dt.f32) or size % chunk == 0 or size == 1 or \
            (base.op is Op.SHRINK and base.srcs[0].op is Op.PAD):
        return None
    pos, below = len(base.shape) - 1, base   # where the last dim is, walking up the chain
    for y in reversed(chain):
        if y.op is Op.PERMUTE:
            pos = y.arg.index(pos)
        else:   # a reshape that only adds or drops dims of size 1 keeps it one dim
            if [d for d in below.shape if d != 1] != [d for d in y.shape if d != 1]:
                return None
            nth = sum(1 for d in below.shape[:pos] if d != 1)
            pos = [i for i, d in enumerate(y.shape) if d != 1][nth]
        below = y
    lacks = [d for q, d in enumerate(x.shape) if q != axis and x.srcs[0].shape[q] == 1 and other.srcs[0].shape[q] != 1]
    if (pos != axis and other.srcs[0].shape[pos] != 1) or math.prod(lacks) < PAD_MIN:
        return None
    zeros = (0,) * len(base.shape)
    y = ir.shrink(ir.pad(base, zeros, zeros[:-1] + (-size % chunk,)), zeros, base.shape)
    for link in reversed(chain):
        y = Node(link.op, link.dtype, (y,), link.arg, link.shape)
    return y


def accumulate_parts(sched: Schedule) -> None:
    """split_k's second half, on the kernels: a contraction whose f32 parts only a sum over the
    parts reads adds its tiles into that sum instead (atomically, onto an output the runtime
    zeroes first), and the sum's kernel keeps only what it did with the sum (the rounding to
    bf16), or goes. The parts were written by the product and read back by the sum: 217 MB a
    layer of GPT-2's step (its four weight gradients), more than L2 holds, twice over memory.
    The order of the sum is unspecified, as the spec allows; f32 atomics flush subnormals (as
    the scatter's)."""
    writer = {k.out.id: k for k in sched.kernels}
    readers: dict[int, int] = {}
    for k in sched.kernels:
        for bid in {b.id for b in k.reads}:
            readers[bid] = readers.get(bid, 0) + 1
    fresh = max((b.id for b in sched.buffers), default=0) + 1
    gone: set[int] = set()
    for r in sched.kernels:
        sums = [n for n in toposort([r.store]) if n.op is Op.REDUCE]
        if len(sums) != 1 or sums[0].arg[0] is not Op.SUM or len(sums[0].arg[1]) != 1 or \
                sums[0].srcs[0].op is not Op.LOAD or len(sums[0].srcs[0].srcs) != 2:
            continue
        (total,), load = sums, sums[0].srcs[0]
        parts = writer.get(load.srcs[0].arg)
        if parts is None or parts.out.kind != "temp" or readers.get(parts.out.id) != 1 or \
                find(parts) is None or parts.out.dtype is not dt.f32:
            continue
        # the sum reads the parts where the product wrote them: each of the sum's ranges (the
        # parts' among them) walks them with the stride of one of the product's, of its size
        (s,) = total.arg[1]
        theirs, const = sym.linear(load.srcs[1])
        mine, base = sym.linear(parts.store.srcs[1])
        twin = {x: next((y for y, cy in mine.items() if cy == cx and y.arg[1] == x.arg[1]), None)
                for x, cx in theirs.items()}
        one_to_one = None not in twin.values() and len(set(twin.values())) == len(twin) == len(mine)
        if s not in twin or not one_to_one or const != base or math.prod(x.arg[1] for x in theirs) != parts.out.size:
            continue
        at = r.store.srcs[1]   # the product adds each value where the sum would have put it
        if total is r.value and r.out.dtype is dt.f32:
            into = r.out
            gone.add(id(r))
        else:   # into an f32 buffer of the sum's, which the rest of the sum's kernel reads
            into = Buffer(fresh, dt.f32, r.out.size, "temp", r.reduces.get(total, parts.out.node))
            fresh += 1
            sched.temps.append(into)
            r.store = substitute([r.store], {total: Node(Op.LOAD, dt.f32, (into.ref(), at))})[0]
            r.reads = [into if b.id == parts.out.id else b for b in r.reads]
            r.reduces = {}
        index = substitute([at], {x: y for x, y in twin.items() if x is not s})[0]
        parts.store = Node(Op.STORE, parts.store.dtype, (into.ref(), index, parts.store.srcs[2]))
        parts.out, parts.atomic = into, True
    sched.kernels = [k for k in sched.kernels if id(k) not in gone]
    used = {b.id for k in sched.kernels for b in [k.out, *k.reads]}
    sched.temps = [b for b in sched.temps if b.id in used]
