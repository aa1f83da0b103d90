"""The GPU's rewrite of the tensor graph before scheduling: reductions with few outputs over
long axes, which would leave most of the GPU idle, in two stages."""
from __future__ import annotations

import math

from .. import dtype as dt
from .. import ir
from ..ir import Node, Op
from ..target import Target
from .rewrite import Pat, RuleSet, rewrite


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
            return ir.reshape(ir.reduce(n.op, ir.reduce(n.op, x, n.arg[1:]), n.arg[:1]), n.shape)
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
        return ir.reshape(ir.reduce(n.op, ir.reduce(n.op, parts, (axis + 1,)), (axis,)), n.shape)

    return rewrite(outputs, RuleSet([(Pat(Op.SUM, name="n"), lambda n: split_k(n, gpu.sms)),
                                     (Pat(pred=lambda n: n.op in (Op.SUM, Op.RMAX), name="n"), split)]))


MIN_SPLIT_K = 1024  # the least K a split part keeps


def _split_cost(outputs: int, size: int, parts: int, sms: int) -> float:
    """The time of a contraction split in parts, in units of one K step of a 128 x 256 tile: its
    waves of blocks on the SMs, each block's steps plus a pipeline's fill and epilogue (about 256
    steps' worth), with the tile contraction.plan picks (128 x 128, at 0.59 of the time and 0.85
    of the rate, when 128 x 256 tiles are fewer than the SMs)."""
    blocks, scale = -(-outputs // (128 * 256)) * parts, 1.0
    if blocks < sms:
        blocks, scale = -(-outputs // (128 * 128)) * parts, 0.5 / 0.85
    return -(-blocks // sms) * (size // parts + 256) * scale


def split_k(n: Node, sms: int) -> Node | None:
    """A half-precision contraction with few output tiles and a long K (a weight gradient sums
    over all 16384 tokens of a GPT-2 step into [768, 768]: 36 tiles of 128 x 128 for the H200's 132 SMs)
    as S contractions over parts of K, each with its own output tiles, summed after; S as
    _split_cost estimates best (768 x 3072 over 16384: 8 parts, 576 blocks). The parts are f32
    sums (a tensor-core contraction's accumulator, contraction.find), added up, rounded once."""
    prod = n.srcs[0]
    if n.dtype not in (dt.bf16, dt.f16) or len(n.arg) != 1 or prod.op is not Op.MUL or \
            any(x.op is not Op.EXPAND for x in prod.srcs):
        return None
    (axis,) = n.arg
    size = prod.shape[axis]
    options = [p for p in (1, 2, 4, 8, 16) if size % p == 0 and (p == 1 or size // p >= MIN_SPLIT_K)]
    parts = min(options, key=lambda p: _split_cost(n.numel, size, p, sms))
    if parts == 1:
        return None
    def split(shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:axis] + (parts, shape[axis] // parts) + shape[axis + 1:]
    # each operand split before its broadcast: the product's own index may pass 2^31
    prods = ir.binary(Op.MUL, *(ir.expand(ir.reshape(x.srcs[0], split(x.srcs[0].shape)), split(prod.shape))
                                for x in prod.srcs))
    total = ir.reduce(Op.SUM, ir.reduce(Op.SUM, ir.unary(Op.CAST, prods, dt.f32), (axis + 1,)), (axis,))
    return ir.unary(Op.CAST, ir.reshape(total, n.shape), n.dtype)
