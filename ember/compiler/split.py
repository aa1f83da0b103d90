"""The GPU's rewrite of the tensor graph before scheduling: reductions with few outputs over
long axes, which would leave most of the GPU idle, in two stages."""
from __future__ import annotations

import math

from .. import ir
from ..ir import Node, Op
from .rewrite import Pat, RuleSet, rewrite


def split_large_reductions(outputs: list[Node]) -> list[Node]:
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

    return rewrite(outputs, RuleSet([(Pat(pred=lambda n: n.op in (Op.SUM, Op.RMAX), name="n"), split)]))
