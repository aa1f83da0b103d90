"""The loop plans: how optimize.py maps an ordinary kernel's loop nest onto the machine, one
frozen plan type per family (`Kernel.plan`; the contraction and flash families' plans are in
contraction.py and attention.py). The ranges a plan names are the kernel's own (lowering data);
the plan says which family renders the kernel: the CPU's loops (render.KernelWriter), the GPU's
thread per output, block per row and tile (cuda_render.CUDAKernelWriter, launch_config), and
merged launches (merge.py, cuda_render.render_merged).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Node


@dataclass(eq=False)
class Stage:
    """Copy the values of `load` over the ranges `over` into an array at the start of every
    iteration of the loop of range `at`; uses of the load then read the array (a TilePlan's:
    the whole block fills it in shared memory)."""
    load: Node
    at: Node | None               # None: once, at the start of the kernel
    over: tuple[Node, ...]
    pad: int = 0                  # extra elements per step of the first range (against bank conflicts)

    def strides(self) -> list[int]:
        out = [math.prod(r.arg[1] for r in self.over[i + 1:]) for i in range(len(self.over))]
        if out:
            out[0] += self.pad
        return out

    @property
    def size(self) -> int:
        return self.over[0].arg[1] * self.strides()[0] if self.over else 1


@dataclass(frozen=True)
class LoopPlan:
    """CPU: the loop nest as written, the outermost `parallel` loops over OpenMP threads; online:
    the max and exponential sums that run in one loop (online.Online), if any."""
    parallel: int = 0
    online: "object | None" = None

    def __str__(self) -> str:
        return "loops" + (", parallel" if self.parallel else "") + (", online softmax" if self.online else "")


@dataclass(frozen=True)
class ThreadPlan:
    """GPU: a thread per output (times its lanes); reductions run inside the thread."""

    def __str__(self) -> str:
        return "thread per output"


@dataclass(frozen=True)
class RowPlan:
    """GPU: a block per value of the output ranges `block` (a row), whose threads share its
    reductions (ember_block_reduce) and stride over the rest; group: instead `group` threads
    of a warp per row (2 to 32: many short rows, each group's loads of its row coalesced, its
    reductions combined with shuffles, ember_group_reduce)."""
    block: tuple[Node, ...]
    group: int = 0

    def __str__(self) -> str:
        return f"{f'{self.group} threads' if self.group else 'block'} per row {[r.arg[0] for r in self.block]}"


@dataclass(frozen=True)
class TilePlan:
    """GPU: a block per tile (output ranges `block`), a thread per sub-tile (`thread`), register
    lanes inside it; the loads in `stages` copied through shared memory."""
    block: tuple[Node, ...]
    thread: tuple[Node, ...]
    stages: tuple[Stage, ...] = ()

    def __str__(self) -> str:
        return f"block tile {[r.arg[0] for r in self.block]}, thread tile {[r.arg for r in self.thread]}"


@dataclass(frozen=True)
class RowPart:
    """The same elements of each block's row that a row chain's member loads (merge.row_part):
    the address is the row's start, affine in the row ranges, plus a dense run."""
    buffer: int             # its buffer's id
    rows: tuple[int, ...]   # the row ranges' coefficients in the address
    const: int              # the address's constant
    run: int                # the run's length, in elements
    size: int               # an element's bytes
    extents: tuple[int, ...]   # the row ranges' sizes (members that split the rows alike)

    @property
    def nbytes(self) -> int:   # (its room in shared memory: whole 16-byte vectors)
        return -(-self.run * self.size // 16) * 16


@dataclass(frozen=True)
class MergedPlan:
    """GPU: kernels run as one launch (merge.py), each member its own thread-per-output kernel:
    block by block (small kernels), or, `together`, each thread running every member in turn
    on the same elements (a chain of maps over one iteration space: AdamW's update of a tensor);
    or, `rows`, each a block per row (RowPlan) of the same rows, a block running every member
    in turn with a barrier between them (a layernorm's mean, variance and normalized row)."""
    members: tuple   # of lower.Kernel
    together: bool = False
    rows: bool = False
    # rows: the rows that several members read, each kept in shared memory by the first that
    # reads it (merge.row_cache): ((RowPart, its byte offset), ...)
    cache: tuple[tuple[RowPart, int], ...] = ()
    # rows: the rows a member writes that only later members read, kept in shared memory after
    # the cache's and never written to memory (merge.private_rows)
    private: tuple[tuple[RowPart, int], ...] = ()

    @property
    def cache_bytes(self) -> int:   # the block's dynamic shared memory
        return sum(part.nbytes for part, _ in self.cache + self.private)

    def __str__(self) -> str:
        how = "a block per row" if self.rows else "in the same threads" if self.together else "in one launch"
        cached = f"; rows of {', '.join(f'b{part.buffer}' for part, _ in self.cache + self.private)} in shared " \
                 f"memory ({self.cache_bytes / 1024:.1f} KB)" if self.cache or self.private else ""
        return f"{len(self.members)} kernels {how}: {', '.join(m.name for m in self.members)}{cached}"
