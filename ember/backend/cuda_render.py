"""The CUDA renderer: the lowered kernels as CUDA C++ source, and each one's launch
configuration (the runtime, backend/cuda.py, compiles and launches them).

Each kernel is rendered by its plan's type (compiler/loops.py; FAMILIES for the families
rendered whole: contractions, mma.py, and flash attention, flash.py):
- ThreadPlan, a thread per output: the output ranges are decoded from the global thread index;
  reductions run as loops inside the thread (elementwise kernels; reductions over a strided
  axis, such as column sums, which stay coalesced because neighbouring threads read
  neighbouring columns);
- RowPlan, a block per row: the ranges every reduction depends on (a prefix of the output
  ranges, the row) come from the block index; each reduction is strided over the block's
  threads and combined with warp shuffles and shared memory; the remaining output ranges are
  strided over the threads (softmax, layernorm, row sums);
- TilePlan: a block per output tile, its operands staged in shared memory (transposes, the
  matmuls the contraction path does not take);
- MergedPlan: thread-per-output kernels as one launch, block by block (small ones) or
  thread by thread (a chain).
Source generation needs no GPU (CI compiles every kernel with nvcc); running needs cuda-python.
"""
from __future__ import annotations

import collections
import math
import os
from typing import Any

from .. import dtype as dt
from ..compiler import merge
from ..compiler import symbolic as sym
from ..compiler.attention import FlashPlan
from ..compiler.contraction import GpuPlan
from ..compiler.loops import MergedPlan, RowPart, RowPlan, ThreadPlan, TilePlan
from ..compiler.lower import Kernel, enclosing_reduces
from ..compiler.optimize import stride
from ..compiler.rewrite import substitute
from ..compiler.schedule import Schedule
from ..dtype import DType
from ..ir import Node, Op, toposort
from ..target import Target
from . import flash, mma
from .render import HALF_HELPERS, CLike, KernelWriter, Scope, include, kinds

BLOCK = 256
# the plan families rendered whole, by their plan's type: the module of each (render, launch,
# helpers); the loop plans' (compiler/loops.py) are CUDAKernelWriter's, looked up below too
FAMILIES = {FlashPlan: flash, GpuPlan: mma}
ROW_CACHE_REGS = 32   # registers a thread may keep of its row (finish): 1024-thread blocks have 64

PRELUDE = include("prelude.cuh") + HALF_HELPERS + include("prelude_ops.cuh")


class CUDARenderer(CLike):
    restrict = "__restrict__"
    store_rounded = True
    math32 = {Op.SQRT: "sqrtf", Op.EXP2: "exp2f", Op.LOG2: "log2f", Op.SIN: "sinf", Op.TRUNC: "truncf"}

    def __init__(self, gpu: Target) -> None:
        super().__init__()
        self.gpu = gpu

    def alu(self, n: Node, a: list[str], no_overflow: bool = False) -> str:
        if n.op is Op.MAX and n.dtype.is_int:  # see ember_imax in the prelude: a ptxas miscompile
            return f"ember_imax<{n.dtype.c_name}>({a[0]}, {a[1]})"
        if n.dtype is dt.bf16 and n.op in BF16_FMA:   # rounded by the instruction itself
            return BF16_FMA[n.op].format(*a)
        if n.dtype in (dt.bf16, dt.f16) and n.op in (Op.EXP2, Op.DIV):   # 16-bit results: see the prelude
            return f"ember_ex2({a[0]})" if n.op is Op.EXP2 else f"ember_div16({a[0]}, {a[1]})"
        if n.op is Op.CAST and n.dtype is dt.bf16 and n.srcs[0].dtype is dt.f32 and _canonical_nan(n.srcs[0]):
            # an f32 result of the GPU's arithmetic: its NaN is the canonical one, which the
            # conversion keeps, so the cast's NaN test (three instructions an element) is not needed
            return f"ember_round_bf16_op({a[0]})"
        return super().alu(n, a, no_overflow)

    def round_result(self, d: DType, expr: str) -> str:
        if d is dt.bf16 and _call_of(expr, "ember_bf16_fma"):
            return expr
        return f"ember_round_bf16_op({expr})" if d is dt.bf16 else self.round_to(d, expr)

    def store_value(self, v: str, d: DType) -> str:
        # a value rounded where it is stored (an op's result in a contraction's epilogue, an f32
        # cast to bf16 or f16) is converted once, not rounded, widened and converted again: the
        # same bits (an op's NaN is the canonical one); for f16 the widening is in software, about
        # 25 instructions an element of an f16 matmul's epilogue
        for dtype, rounding, bits in STORED_BITS:
            if d is dtype and _call_of(v, rounding):
                return bits + v[len(rounding):]
        if d is dt.bf16 and _call_of(v, "ember_bf16_fma"):   # a bf16 value already: its upper half
            return f"((unsigned short)(__float_as_uint({v}) >> 16))"
        return super().store_value(v, d)

    def cast(self, x: str, src: DType, d: DType) -> str:
        if d.is_float and src.is_int and src.bits < 32:
            # through int: NVVM of CUDA 13.0 dropped the 8-bit sign extension of some lanes of a
            # 16-byte i8 load before `cvt.rn.f32.s16` (i8 sums cast to f32 came out wrong; the
            # PTX already was). From int it emits cvt.s32.s8, right in every lane (issue 14).
            x = f"((int)({x}))"
        return super().cast(x, src, d)

    def acc_ctype(self, op: Op, d: DType) -> str:
        # 8- and 16-bit integer maxima accumulate in int: NVVM of CUDA 13.0 dropped the sign
        # extension of an i8 sum before the 16-bit compare it made of an i8 max (a max over
        # iota + x came out wrong: tests/compiler/toolchain/nvvm13_i8_max.eir). In int it keeps it.
        return "int" if op is Op.RMAX and d.is_int and d.bits < 32 else self.ctype(d)

    def combine(self, op: Op, d: DType, acc: str, v: str) -> str:
        if op is Op.RMAX and d.is_int:
            t = self.acc_ctype(op, d)
            return f"ember_imax<{t}>({acc}, ({t})({v}))"
        return super().combine(op, d, acc, v)

    def loop_header(self, r: Node, var: str, lane: bool, parallel: bool, uneven: bool = False) -> list[str]:
        return (["#pragma unroll"] if lane else []) + [f"for ({r.dtype.c_name} {var} = 0; {var} < {r.arg[1]}; {var}++)"]

    def stage_open(self, name: str, ctype: str, size: int, count: int, var: str) -> tuple[list[str], list[str]]:
        # the block fills shared memory together; the barrier first: others may still read the last tile
        return ([f"__shared__ {ctype} {name}[{size}];", "__syncthreads();"],
                [f"for (int {var} = threadIdx.x; {var} < {count}; {var} += blockDim.x)"])

    def stage_close(self) -> list[str]:
        return ["__syncthreads();"]

    def render_kernel(self, k: Kernel, prefix: str = "") -> str:
        if type(k.plan) in FAMILIES:
            return FAMILIES[type(k.plan)].render(self, k, prefix)
        if isinstance(k.plan, MergedPlan):
            return self.render_merged(k, k.plan, prefix)
        return CUDAKernelWriter(self, k, prefix).write()

    def render_merged(self, k: Kernel, plan: MergedPlan, prefix: str) -> str:
        """The members as device functions, and the kernel that gives each its blocks."""
        written = {m.out.id for m in plan.members}
        threads = max(block_size(m) for m in plan.members) if plan.rows else 0
        # a row chain's members read what earlier members wrote: those reads not through the
        # read-only cache (its lines are not kept coherent with the kernel's own stores)
        shared = frozenset(written) if plan.rows else frozenset()
        # members equal up to their names and buffers (a bias gradient's last stage, one a layer)
        # are one function, called with each member's buffers; not inlined, or NVRTC still
        # compiles every copy (GPT-2's 98 in one launch: 3.2 s, and 0.16 s as 3 functions)
        offsets = dict(plan.cache)   # the rows kept in shared memory, and where
        private = {part.buffer: (part, at) for part, at in plan.private}
        stored: set[RowPart] = set()   # those an earlier member has put there
        bodies = []
        for m in plan.members:
            writer = CUDAKernelWriter(self, m, prefix, member=True, threads=threads, shared=shared,
                                      cache=offsets, stored=frozenset(stored), private=private)
            bodies.append(writer.write())
            stored |= writer.storing
        called = kinds(plan.members, bodies)
        shared_by = collections.Counter(called.values())
        members = "".join(body if shared_by[m.name] == 1 else body.replace("__forceinline__", "__noinline__", 1)
                          for m, body in zip(plan.members, bodies) if called[m.name] == m.name)
        params = ", ".join(f"{'' if b.id in written else 'const '}{self.stype(b.dtype)}* {self.restrict} b{b.id}"
                           for b in k.args)
        if plan.together:   # every member in every thread (or block), one after another
            calls = ("  __syncthreads();\n" if plan.rows else "").join(
                f"  {prefix}{called[m.name]}({', '.join(f'b{b.id}' for b in m.args)}, blockIdx.x);\n"
                for m in plan.members)
            return (members + f"extern \"C\" __global__ void __launch_bounds__({threads or BLOCK}) "
                    f"{prefix}{k.name}({params}) {{\n{calls}}}\n")
        body = ["  int ember_block = blockIdx.x;"]
        for m in plan.members:
            blocks = launch_config(m, self.gpu)[0][0]
            args = ", ".join(f"b{b.id}" for b in m.args)
            body += [f"  if (ember_block < {blocks}) {{ {prefix}{called[m.name]}({args}, ember_block); return; }}",
                     f"  ember_block -= {blocks};"]
        return (members + f"extern \"C\" __global__ void __launch_bounds__({BLOCK}) {prefix}{k.name}({params}) {{\n"
                + "\n".join(body[:-1]) + "\n}\n")


# f32 ops whose NaN results are the canonical NaN on the GPU (its FADD, FMUL, FFMA and the
# library's division, exp2f, log2f and sqrtf, built of them), the bits the C backend's rounding
# writes for that NaN too
CANONICAL_NAN = frozenset([Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.EXP2, Op.LOG2, Op.SQRT])


def _canonical_nan(n: Node) -> bool:
    """Whether n is an op of CANONICAL_NAN that nvcc keeps: not one with a constant operand, which
    it may fold away with a loaded NaN's bits passing through (x * 1, x + -0)."""
    def constant(x: Node) -> bool:
        while x.op is Op.CAST:
            x = x.srcs[0]
        return x.op is Op.CONST
    return n.op in CANONICAL_NAN and not any(constant(s) for s in n.srcs)


BF16_FMA = {Op.ADD: "ember_bf16_fma({0}, 1.0f, {1})", Op.SUB: "ember_bf16_fma({1}, -1.0f, {0})",
            Op.MUL: "ember_bf16_fma({0}, {1}, -0.0f)"}


# a rounding call whose value a store converts again -> the call that gives its bits at once
STORED_BITS = ((dt.bf16, "ember_round_bf16_op", "ember_bf16_bits_op"),
               (dt.bf16, "ember_round_bf16f", "ember_f32_to_bf16_bits"),
               (dt.f16, "ember_round_f16f", "ember_f32_to_f16_bits"))


def _call_of(expr: str, fn: str) -> bool:
    """Whether expr is one call of fn."""
    return expr.startswith(fn + "(") and _one_call(expr[len(fn):])


def _one_call(args: str) -> bool:
    """Whether args, "(...)", is one parenthesized group (its first "(" closes at the end)."""
    depth = 0
    for i, ch in enumerate(args):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i == len(args) - 1
    return False


def block_size(k: Kernel) -> int:
    """Threads per block. Blocks that share long row reductions get 1024 threads: fewer rows in
    flight, so a row read again by a later pass of the kernel is still in L2."""
    if isinstance(k.plan, TilePlan):
        return math.prod(r.arg[1] for r in k.plan.thread)
    if isinstance(k.plan, RowPlan) and not k.plan.group:
        reduces = [n for n in toposort([k.store]) if n.op is Op.REDUCE]
        longest = max((math.prod(r.arg[1] for r in n.arg[1]) for n in reduces), default=0)
        if longest >= 8192:
            return 1024
        # a short row (layernorm's 768, in 192 vectors): threads with two steps or more each,
        # and more rows in flight (256 threads left a quarter idle, at 2.5 TB/s)
        steps = max((math.prod(r.arg[1] for r in n.arg[1] if r not in k.lanes) for n in reduces), default=0)
        return min(BLOCK, max(64, 1 << max(0, (steps // 2).bit_length() - 1)))
    return BLOCK


def scattered_loads(k: Kernel) -> list[Node]:
    """The loads of a thread-per-output or block-per-row kernel (a merged one's members') whose
    neighbouring threads of a warp read more than 16 bytes apart beyond the run each reads
    itself (its lanes): each thread's element then takes a 32-byte sector of its own (a block
    per output summing a column: 64 threads, 64 rows). Addresses not affine along the threads
    (a head's rows gathered by i / 8 and i % 8) are not judged. For `bench/step_kernels.py` and
    the test that no GPT-2 step reads a large buffer so."""
    if isinstance(k.plan, MergedPlan):
        return [ld for m in k.plan.members for ld in scattered_loads(m)]
    out = []
    for ld, apart in warp_strides(k):
        run = math.prod(r.arg[1] for r in k.lanes if stride(ld, r) == 1)
        if apart is not None and abs(apart) > run and abs(apart) * ld.dtype.itemsize > 16:
            out.append(ld)
    return out


def warp_strides(k: Kernel) -> list[tuple[Node, int | None]]:
    """Each load of a thread-per-output or block-per-row kernel, and how many elements apart
    neighbouring threads of a warp read it: 0 the same element, None not affine."""
    if not isinstance(k.plan, (ThreadPlan, RowPlan)):
        return []
    rows = k.plan.block if isinstance(k.plan, RowPlan) else ()
    outer = [r for r in k.ranges if r not in rows and r not in k.lanes]
    fast = {}   # load -> the range neighbouring threads take in turn
    if isinstance(k.plan, RowPlan):   # a reduction's loads: its last range, strided over the threads
        nested = enclosing_reduces(k.store)
        for n in toposort([k.store]):
            if n.op is Op.REDUCE and n not in nested and (own := [r for r in n.arg[1] if r not in k.lanes]):
                fast.update((ld, own[-1]) for ld in toposort([n.srcs[0]]) if ld.op is Op.LOAD)
    loads = [n for n in toposort([k.store]) if n.op is Op.LOAD]
    return [(ld, stride(ld, r) if (r := fast.get(ld, outer[-1] if outer else None)) is not None else 0)
            for ld in loads]


GRID_YZ = 65535   # the most blocks a grid has along y and along z (x: 2^31 - 1)


def check_grids(kernels: list[Kernel], configs: list[tuple[tuple[int, int, int], int, int]]) -> None:
    """One clear error, before any launch, where a kernel's grid passes the GPU's limits (a batch
    of over 65535 products or attention heads), not the driver's CUDA_ERROR_INVALID_VALUE later."""
    for k, ((gx, gy, gz), _, _) in zip(kernels, configs):
        if gy > GRID_YZ or gz > GRID_YZ or gx >= 2 ** 31:
            what = "attention heads x batch" if k.fused is not None else "blocks"
            raise RuntimeError(f"kernel {k.name} ({k.kind}) needs a grid of {gx} x {gy} x {gz} blocks; the GPU "
                               f"allows {GRID_YZ} along y and z ({what} too many: split the batch)")


def launch_config(k: Kernel, gpu: Target) -> tuple[tuple[int, int, int], int, int]:
    """(grid, threads per block, dynamic shared memory bytes), from the plan optimize made for gpu."""
    if type(p := k.plan) in FAMILIES:
        return FAMILIES[type(p)].launch(k, gpu.sms)
    if isinstance(p, MergedPlan):   # the members' blocks (together: each block every member's)
        blocks = [launch_config(m, gpu)[0][0] for m in p.members]
        threads = max(block_size(m) for m in p.members) if p.rows else BLOCK
        return (blocks[0] if p.together else sum(blocks), 1, 1), threads, p.cache_bytes
    if isinstance(p, RowPlan) and p.group:   # groups of a block's threads, a row each
        return (-(-math.prod(r.arg[1] for r in p.block) // (BLOCK // p.group)), 1, 1), BLOCK, 0
    if isinstance(p, (RowPlan, TilePlan)):   # a block per row or tile
        return (max(1, math.prod(r.arg[1] for r in p.block)), 1, 1), block_size(k), 0
    return (max(1, -(-merge.threads(k) // BLOCK)), 1, 1), BLOCK, 0


class CUDAKernelWriter(KernelWriter):
    vector_bytes = 16

    def __init__(self, r: CLike, k: Kernel, prefix: str = "", member: bool = False, threads: int = 0,
                 shared: frozenset[int] = frozenset(), cache: dict[RowPart, int] | None = None,
                 stored: frozenset[RowPart] = frozenset(), private: dict[int, tuple[RowPart, int]] | None = None):
        """member: a merged kernel's member (merge.py), a device function given its block index;
        threads: a row chain member's block size (the chain's); shared: the buffers the chain's
        members write (read as ordinary memory); cache: the chain's rows kept in shared memory
        and their byte offsets (MergedPlan.cache); stored: those an earlier member stored there;
        private: the chain's rows that live in shared memory alone, by buffer (MergedPlan.private)."""
        super().__init__(r, k, prefix)
        self.cache, self.stored, self.private = cache or {}, stored, private or {}
        self.storing: set[RowPart] = set()   # the cached rows this member stores
        self.rows_declared = False   # the dynamic shared memory's declaration, put once
        self.block_scope: Scope | None = None
        self.member, self.threads, self.shared = member, threads or block_size(k), shared
        self.known_threads = not member or bool(threads)
        # a row's threads: the block's, or a group of `group` of a warp's (RowPlan.group)
        self.group = k.plan.group if isinstance(k.plan, RowPlan) else 0
        self.sub = f"(int)(threadIdx.x & {self.group - 1})" if self.group else "(int)threadIdx.x"
        self.unrolled: dict[Node, tuple[int, int]] = {}   # row range -> (steps, threads): cooperative_loop
        self.row_reads: dict[tuple, list] = {}   # a row's part read by unrolled loops -> the reads (finish)

    def signature(self) -> str:
        if self.member:
            k, r = self.k, self.r
            params = [f"{'' if b is k.out or b.id in self.shared else 'const '}{r.stype(b.dtype)}* "
                      f"{'' if b.id in self.shared and b is not k.out else r.restrict + ' '}b{b.id}" for b in k.args]
            return f"__device__ static __forceinline__ void {self.name}({', '.join(params)}, int ember_block)"
        bounds = block_size(self.k)
        return f"extern \"C\" __global__ void __launch_bounds__({bounds}) " + super().signature()[len("void "):]

    def open_outputs(self, root: Scope) -> Scope:
        k = self.k
        # every buffer starts a cuMemAlloc allocation (256-byte aligned): with that known, nvcc
        # merges a thread's consecutive loads into 16-byte ones
        for b in [k.out, *k.reads]:
            typ = ("" if b is k.out or b.id in self.shared else "const ") + self.r.stype(b.dtype)
            root.put(f"b{b.id} = ({typ}*)__builtin_assume_aligned(b{b.id}, 16);")
        scope = {TilePlan: self.open_tile, RowPlan: self.open_row}.get(type(k.plan), self.open_threads)(root)
        for r in [r for r in k.ranges if r in k.lanes]:   # then the register lanes
            scope = scope.open(frozenset([r]), self.r.loop_header(r, self.range_var(r), True, False))
        return scope

    def open_tile(self, root: Scope) -> Scope:
        """A tile: block and thread indices, the stages filled."""
        block, thread = self.k.plan.block, self.k.plan.thread
        self.decode(root, "blockIdx.x", list(block))
        self.decode(root, "threadIdx.x", list(thread))
        root.avail = frozenset([*block, *thread])
        self.fill_stages(None, root)
        return root

    def open_threads(self, root: Scope) -> Scope:
        """A thread per output (times its lanes)."""
        outer = [r for r in self.k.ranges if r not in self.k.lanes]
        total = math.prod(r.arg[1] for r in outer)
        block = "ember_block" if self.member else "blockIdx.x"
        if total >= 1 << 31:  # 64-bit indexing (symbolic.index_type)
            root.put(f"long long gid = (long long){block} * blockDim.x + threadIdx.x;")
        else:
            root.put(f"int gid = {block} * blockDim.x + threadIdx.x;")
        root.put(f"if (gid >= {total}) return;")
        self.decode(root, "gid", outer)
        root.avail = frozenset(outer)
        return root

    def open_row(self, root: Scope) -> Scope:
        """A block per row: the root scope is the block's; the rest of the outputs strided over
        its threads (a thread's consecutive outputs of the row: its lanes)."""
        rows = self.k.plan.block
        if self.group:
            per, count = BLOCK // self.group, math.prod(r.arg[1] for r in rows)
            root.put(f"int ember_row = blockIdx.x * {per} + (int)(threadIdx.x / {self.group});")
            if count % per:
                root.put(f"if (ember_row >= {count}) return;")   # (no barrier follows: shuffles only)
        self.decode(root, "ember_row" if self.group else "ember_block" if self.member else "blockIdx.x", list(rows))
        root.avail = frozenset(rows)
        scope = self.block_scope = root
        for b in [self.k.out, *self.k.reads]:
            if b.id in self.private:   # the pointer moved so that this block's row lands in shared memory
                part, at = self.private[b.id]
                start = " + ".join([*(f"(long long){self.range_var(r)} * {c}" for r, c in zip(rows, part.rows) if c),
                                    str(part.const)])
                self.declare_rows(root)
                root.put(f"b{b.id} = ({self.r.stype(b.dtype)}*)(ember_rows + {at}) - ({start});")
        inner = [r for r in self.k.ranges if r not in rows and r not in self.k.lanes]
        for i, r in enumerate(inner):
            v = self.range_var(r)
            t = r.dtype.c_name
            head = self.cooperative_loop(r) if i == len(inner) - 1 else [f"for ({t} {v} = 0; {v} < {r.arg[1]}; {v}++)"]
            scope = scope.open(frozenset([r]), head)
        return scope

    def cooperative_loop(self, r: Node) -> list[str]:
        """A block's threads striding over the row range r. In at most 16 steps, the trip count
        is a constant and the loop unrolls, the steps past the row's end skipped by a guard: a
        thread's loads of the row are in flight together (bf16 softmax had one 16-byte load per
        thread in flight; a cross-entropy's rows of 6288 vectors, which 1024 threads do not
        divide, waited for each of a thread's seven in turn)."""
        v, t, n = self.range_var(r), r.dtype.c_name, r.arg[1]
        threads = self.group or self.threads
        sub, first = (self.sub, self.sub) if self.group else ("threadIdx.x", f"({t})threadIdx.x")
        steps = -(-n // threads)
        if self.known_threads and steps <= 16:
            self.unrolled[r] = (steps, threads)
            if n % threads == 0:
                return ["#pragma unroll", f"for ({t} {v} = {sub}; {v} < {first} + {n}; {v} += {threads})"]
            # the guard folds away in the steps every thread takes
            return ["#pragma unroll", f"for ({t} {v}s = 0, {v} = {sub}; {v}s < {steps}; {v}s++, {v} += {threads})",
                    f"if ({v}s < {n // threads} || {v} < {n})"]
        return [f"for ({t} {v} = {sub}; {v} < {n}; {v} += {self.group or 'blockDim.x'})"]

    def stage_open(self, name: str, ctype: str, size: int, count: int, var: str) -> tuple[list[str], list[str]]:
        """The block fills a stage with a constant trip count where its threads divide it, so
        that the loop unrolls and a thread's loads are in flight together (a transpose's 32 x 32
        tile took its four loads one after another)."""
        before, header = super().stage_open(name, ctype, size, count, var)
        threads = self.threads
        if self.known_threads and count % threads == 0 and count // threads <= 16:
            header = ["#pragma unroll", f"for (int {var} = threadIdx.x; {var} < (int)threadIdx.x + {count}; "
                                        f"{var} += {threads})"]
        return before, header

    def vector_read(self, n: Node, scope: Scope, vec: Any) -> tuple[Scope, str]:
        """Reads of a row by a block's unrolled loops are noted for finish (below)."""
        part = merge.row_part(n, self.k) if self.cache else None
        if part in self.cache:
            return self.cached_row_read(n, scope, vec, part)
        outer, arr = super().vector_read(n, scope, vec)
        loop = next(iter(outer.avail - outer.parent.avail), None) if outer.parent is not None else None
        if loop in self.unrolled and len(n.srcs) == 2 and n.srcs[0].arg != self.k.out.id and n.dtype.itemsize >= 4:
            trips, threads = self.unrolled[loop]
            row = Node(Op.RANGE, loop.dtype, (), ("row", loop.arg[1]))
            key = (n.srcs[0], trips, threads, vec.count, substitute([vec.base], {loop: row})[0])
            j = f"(({self.range_var(loop)} - {self.sub}) / {threads}) * {vec.count}"
            # (the declaration line, to be replaced by a read from registers, and its vectors)
            self.row_reads.setdefault(key, []).append((outer, outer.lines[outer.cursor - 2], f"{arr}v", j, vec.type))
        return outer, arr

    def cached_row_read(self, n: Node, scope: Scope, vec: Any, part: RowPart) -> tuple[Scope, str]:
        """The vectors of a row that the chain keeps in shared memory (MergedPlan.cache): the
        first member to read them reads memory and stores them there, at the same place in the
        row; later members, after the barrier between members, read them there (the first reads
        memory again, if again at all: its threads may split the row differently, unsynchronized)."""
        outer = self.target(vec.base, scope)
        first, st, arr = part not in self.stored, self.r.stype(n.dtype), self.var("v")
        terms, _ = sym.linear(vec.base)
        within = sym.build({r: c for r, c in terms.items() if r not in self.k.plan.block}, 0, vec.base.dtype)
        row = f"(({'' if first else 'const '}{st}*)(ember_rows + {self.cache[part]}))"
        self.declare_rows(scope.chain()[0])
        if first:
            base = self.ref(self.value(vec.base, outer), vec.base)
            parts = [f"*(const {vec.type}*)({a})" for a in vec.addresses(self.operand(n.srcs[0], scope), base)]
            outer.put(f"const {vec.type} {arr}v[{vec.count}] = {{{', '.join(parts)}}};")
            if part not in self.storing:
                self.storing.add(part)
                at = self.ref(self.value(within, outer), within)
                for c, a in enumerate(vec.addresses(row, at)):
                    outer.put(f"*({vec.type}*)({a}) = {arr}v[{c}];")
        else:
            at = self.ref(self.value(within, outer), within)
            parts = [f"*(const {vec.type}*)({a})" for a in vec.addresses(row, at)]
            outer.put(f"const {vec.type} {arr}v[{vec.count}] = {{{', '.join(parts)}}};")
        outer.put(f"const {st}* {arr} = (const {st}*){arr}v;")
        return outer, arr

    def declare_rows(self, root: Scope) -> None:
        """The block's dynamic shared memory (the chain's rows: MergedPlan.cache and .private), once."""
        if not self.rows_declared:
            self.rows_declared = True
            root.lines.insert(0, "extern __shared__ __align__(16) unsigned char ember_rows[];")
            root.cursor += 1

    def finish(self, root: Scope) -> None:
        """A thread's share of a row that several of a block's unrolled loops read (softmax: the
        max, the sum of exponentials, the output) is read once, by the first, into registers,
        and the others take it from there: with the reads the same, nvcc also computes each
        exponential once. At most ROW_CACHE_REGS registers a thread, and rows of 4-byte elements
        only: a bf16 softmax's row cached took its kernel to 64 registers and one block an SM
        (26% of copy on the H200, against 31% reading the row three times from L2)."""
        regs = 0
        for (_, trips, _, count, _), reads in self.row_reads.items():
            parent = reads[0][0].parent
            if len(reads) < 2 or regs + trips * count * 4 > ROW_CACHE_REGS or \
                    any(loop.parent is not parent for loop, *_ in reads):
                continue
            regs += trips * count * 4
            reads.sort(key=lambda read: parent.lines.index(read[0]))
            cache = self.var("row")
            (first, line, arr, j, vtype), rest = reads[0], reads[1:]
            parent.lines.insert(parent.lines.index(first), f"{vtype} {cache}[{trips * count}];")
            first.lines.insert(first.lines.index(line) + 1,
                               f"for (int c = 0; c < {count}; c++) {cache}[{j} + c] = {arr}[c];")
            for loop, line, arr, j, vtype in rest:
                taken = ", ".join(f"{cache}[{j} + {c}]" for c in range(count))
                loop.lines[loop.lines.index(line)] = f"const {vtype} {arr}[{count}] = {{{taken}}};"

    def store_guard(self, scope: Scope) -> str:
        if scope is not self.block_scope:
            return ""
        return f"if ((threadIdx.x & {self.group - 1}) == 0) " if self.group else "if (threadIdx.x == 0) "

    def cooperative(self, scope: Scope) -> bool:
        return self.block_scope is not None and scope is self.block_scope

    def reduce_header(self, n: Node, r: Node, last: bool, scope: Scope) -> list[str]:
        if last and self.cooperative(scope):
            return self.cooperative_loop(r)
        return super().reduce_header(n, r, last, scope)

    def reduce_finish(self, n: Node, acc: str, scope: Scope) -> list[str]:
        if not self.cooperative(scope):
            return []
        t, mx = self.r.acc_ctype(n.arg[0], n.dtype), int(n.arg[0] is Op.RMAX)
        if self.group:
            return [f"{acc} = ember_group_reduce<{t}, {mx}, {self.group}>({acc});"]
        return [f"{acc} = ember_block_reduce<{t}, {mx}>({acc});"]


def _bitcast_helpers(pairs: set[tuple[DType, DType]]) -> str:
    return "".join(f"EMBER_D {d.c_name} ember_bitcast_{s.name}_{d.name}({s.c_name} x) "
                   f"{{ union {{ {s.c_name} a; {d.c_name} b; }} u; u.a = x; return u.b; }}\n"
                   for s, d in sorted(pairs, key=lambda p: (p[0].name, p[1].name)))


def _source(kernels: list[Kernel], gpu: Target, prefix: str = "") -> str:
    """One CUDA source for these kernels: the prelude, the helpers they use, the kernels."""
    r = CUDARenderer(gpu)
    return _assemble(kernels, [r.render_kernel(k, prefix) for k in kernels], r)


def _assemble(kernels: list[Kernel], bodies: list[str], r: CUDARenderer) -> str:
    helpers = mma.helpers(kernels, flash.tma_ranks(kernels)) + flash.helpers(kernels) + _bitcast_helpers(r.bitcasts)
    return PRELUDE + helpers + "\n" + "\n".join(bodies)


def render(sched: Schedule, prefix: str = "") -> str:
    """The program's kernels as one CUDA source (kernel names get the prefix)."""
    assert sched.target is not None
    return _source(sched.kernels, sched.target, prefix)


def render_units(kernels: list[Kernel], gpu: Target, cores: int | None = None) -> list[tuple[str, dict[str, str]]]:
    """The kernels as independent sources (each with the prelude and the helpers it uses), one
    per core (this machine's, or `cores`) but at least 8 kernels each, to compile in parallel;
    and for each unit, which of its functions each kernel launches. Kernels equal up to their
    names (render.kinds: a transformer's layers; GPT-2's step has 539 kernels of 66 kinds) are
    compiled once and launched with their own arguments: NVRTC's time is the kinds'."""
    r = CUDARenderer(gpu)
    body = {k.name: r.render_kernel(k) for k in kernels}
    runs = kinds(kernels, list(body.values()))   # kernel name -> the function it launches
    # heavy kernels (flash, tensor-core tiles) dealt out in turn, so that no unit gets them all
    unique = sorted((k for k in kernels if runs[k.name] == k.name),
                    key=lambda k: k.kind not in ("attention", "contraction"))
    parts = max(1, min(cores or os.cpu_count() or 1, len(unique) // 8))
    groups = [unique[i::parts] for i in range(parts)] if unique else [[]]
    units = []
    for group in groups:
        names = {k.name for k in group}
        source = _assemble(group, [body[k.name] for k in group], r)
        units.append((source, {n: f for n, f in runs.items() if f in names}))
    return units


def units_source(units: list[tuple[str, dict[str, str]]]) -> str:
    """The units as one text (EMBER_DEBUG=2, EMBER_PROFILE_OUT's .cu): a kernel compiled as an
    earlier one's kind has no function of its own, so the text ends with whose each launches."""
    return "\n".join(src for src, _ in units) + "".join(
        f"/* {name} launches {f} */\n" for _, runs in units for name, f in runs.items() if name != f)
