"""Rendering a lowered kernel as C-like source; C and CUDA differ by a small table.

Placement: every node is computed in the outermost loop scope where all the ranges it depends
on are defined, so a row's max and sum are computed once per row, and a load that does not
depend on the inner loop is hoisted out of it. Hoisted statements are inserted before the loop
that is open in their scope.

Lanes: a lane range is a small loop that stays innermost (a register tile). A reduction that
depends on lanes is kept outside the lane loops, with an accumulator array over the lanes, and
its body reopens the lane loops inside the reduction loop: for a matmul tiled 4x16 this is
`for k: for li<4: a = A[..]; for lj<16: acc[li][lj] += a * B[..]`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import data
from .. import dtype as dt
from ..compiler import symbolic as sym
from ..compiler.loops import LoopPlan, MergedPlan, Stage
from ..compiler.lower import Kernel, free_ranges

if TYPE_CHECKING:
    from ..compiler.contraction import Contraction
from ..dtype import DType
from ..ir import Node, Op


@dataclass(eq=False)
class Scope:
    parent: "Scope | None"
    avail: frozenset[Node]          # ranges defined here
    header: list[str]               # lines that open the scope (pragmas, for); empty for the root
    lines: list["str | Scope"] = field(default_factory=list)
    cursor: int = 0                 # where statements placed in this scope go: before an open child

    def chain(self) -> list["Scope"]:
        out, s = [], self
        while s is not None:
            out.append(s)
            s = s.parent
        return out[::-1]            # outermost first

    def put(self, line: "str | Scope") -> None:
        self.lines.insert(self.cursor, line)
        self.cursor += 1

    def open(self, ranges: frozenset[Node], header: list[str]) -> "Scope":
        child = Scope(self, self.avail | ranges, header)
        self.lines.insert(self.cursor, child)   # the cursor stays before it: hoisted code goes first
        return child

    def close(self) -> None:
        assert self.parent is not None
        self.parent.cursor = self.parent.lines.index(self) + 1


INCLUDE = Path(__file__).with_name("include")


def include(name: str) -> str:
    """A file of hand-written device code shipped beside this module (backend/include/), verbatim."""
    return (INCLUDE / name).read_text(encoding="utf-8")


# f16/bf16 helpers, the same text in the C and CUDA preludes; each target defines EMBER_D (its
# function qualifiers), ember_as_float/ember_as_uint (bit casts) and ember_f32_to_f16_bits first.
HALF_HELPERS = include("half.h")

# ops whose f16/bf16 result needs no rounding: it is one of the operands, a bool, or already rounded
EXACT = {Op.CMPLT, Op.CMPEQ, Op.CMPNE, Op.WHERE, Op.MAX, Op.CAST, Op.BITCAST, Op.NEG}


def canonical(k: Kernel, text: str) -> str:
    """The kernel's text up to the names it chooses: its buffers by their place among its
    arguments, and the names it defines (its own, its members', and those the renderers derive
    from them: EmberScore_k12, k12_next) by their order. Kernels with the same canonical text
    (a model's layers) are compiled once and called with their own buffers: GPT-2's CUDA step
    has 65 kinds of 539 kernels."""
    own = [k.name] + [m.name for m in k.plan.members] if isinstance(k.plan, MergedPlan) else [k.name]
    names = {f"b{b.id}": f"a{i}" for i, b in enumerate(k.args)} | {n: f"K{i}" for i, n in enumerate(own)}
    return re.sub(r"(?<![A-Za-z0-9])[a-z]+\d+(?![A-Za-z0-9])", lambda m: names.get(m.group(0), m.group(0)), text)


def kinds(kernels: "list[Kernel] | tuple[Kernel, ...]", texts: list[str]) -> dict[str, str]:
    """Each kernel's name -> the name of the first kernel whose text (its rendering) is canonically
    the same: the function it runs (c.render, cuda_render.render_units and a merged launch's members)."""
    first: dict[str, str] = {}
    return {k.name: first.setdefault(canonical(k, text), k.name) for k, text in zip(kernels, texts)}


@dataclass
class LaneArray:
    """A value held per lane: name[flat index of the lanes]."""
    name: str
    lanes: tuple[Node, ...]


class CLike:
    """The shared renderer. Subclasses set the tables and the kernel signature."""

    store_rounded = False   # store an op's rounded result from its expression (CUDARenderer.store_value)
    restrict = "restrict"
    float_suffix = "f"
    math32 = {Op.SQRT: "sqrtf", Op.EXP2: "ember_exp2f", Op.LOG2: "log2f", Op.SIN: "sinf", Op.TRUNC: "truncf"}
    math64 = {Op.SQRT: "sqrt", Op.EXP2: "exp2", Op.LOG2: "log2", Op.SIN: "sin", Op.TRUNC: "trunc"}
    infix = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.AND: "&", Op.OR: "|", Op.XOR: "^",
             Op.CMPLT: "<", Op.CMPEQ: "==", Op.CMPNE: "!="}

    def __init__(self) -> None:
        self.bitcasts: set[tuple[DType, DType]] = set()

    # ----------------------------------------------------------------------------- types
    @staticmethod
    def ctype(d: DType) -> str:
        """The type values of d are computed in (f16 and bf16 in float)."""
        return "float" if d in (dt.f16, dt.bf16) else d.c_name

    # C: signed sums accumulate in the unsigned type (see CRenderer)
    unsigned_sums = False

    def unsigned_sum(self, op: Op, d: DType) -> bool:
        return self.unsigned_sums and op is Op.SUM and d.is_int and d.is_signed and d.bits >= 32

    def acc_ctype(self, op: Op, d: DType) -> str:
        """The type a reduction op of d accumulates in (a target may widen it)."""
        return self.wide_unsigned(d) if self.unsigned_sum(op, d) else self.ctype(d)

    @staticmethod
    def stype(d: DType) -> str:
        return d.c_name

    def literal(self, v: object, d: DType) -> str:
        if d.is_float:
            # as the dtype holds it: a 16-bit constant the compiler made (a count, a fold) may not
            # be one, and CUDA's bf16 arithmetic takes an operand's upper half as its value
            f = float(data.literal_value(v, d, True)) if d in (dt.f16, dt.bf16) else float(v)  # type: ignore[arg-type]
            if math.isnan(f):
                return "NAN"
            if math.isinf(f):
                return "INFINITY" if f > 0 else "(-INFINITY)"
            text = float.hex(f)  # exact
            return f"({text}{'' if d is dt.f64 else 'f'})" if f >= 0 or text.startswith("-") else text
        if d is dt.u64:
            return f"{int(v)}ull"  # type: ignore[call-overload]
        if d is dt.i64:
            return f"({int(v) + 1}ll - 1)" if int(v) == d.min else f"{int(v)}ll"  # type: ignore[call-overload]
        if d is dt.u32:
            return f"{int(v)}u"  # type: ignore[call-overload]
        if d is dt.i32 and int(v) == d.min:  # type: ignore[call-overload]
            return "(-2147483647 - 1)"
        return str(int(v))  # type: ignore[call-overload]

    # ------------------------------------------------------------------------------- ops
    def narrow(self, d: DType, expr: str) -> str:
        """C computes narrow ints in int: bring the result back to d's width, wrapping. For signed
        types the low bits are sign-extended in int first, so the final cast is in range: a cast
        of an out-of-range value is implementation-defined, and nvcc kept -(-32768) as 32768."""
        if not d.is_int or d.bits >= 32:
            return expr
        if not d.is_signed:
            return f"({d.c_name})({expr})"
        mask, sign = (1 << d.bits) - 1, 1 << (d.bits - 1)
        return f"(({d.c_name})((((int)(({expr}) & {mask})) ^ {sign}) - {sign}))"

    def load(self, buf: str, idx: str, d: DType) -> str:
        if d is dt.f16:
            return f"ember_f16_to_f32({buf}[{idx}])"
        if d is dt.bf16:
            return f"ember_bf16_to_f32({buf}[{idx}])"
        return f"{buf}[{idx}]"

    def store_value(self, v: str, d: DType) -> str:
        if d is dt.f16:
            return f"ember_f32_to_f16_bits({v})"
        if d is dt.bf16:
            return f"ember_f32_to_bf16_bits({v})"
        return v

    def round_to(self, d: DType, expr: str) -> str:
        """f16 and bf16 are computed in float and rounded after every op, as the spec says."""
        return f"ember_round_{d.name}f({expr})" if d in (dt.f16, dt.bf16) else expr

    def round_result(self, d: DType, expr: str) -> str:
        """An op's (or a sum's) result rounded to d; a target whose arithmetic makes NaNs of one
        kind may round it more cheaply than a cast must (CUDARenderer)."""
        return self.round_to(d, expr)

    def cast(self, x: str, src: DType, d: DType) -> str:
        if d is dt.bool_:
            return f"({x} != 0)"
        if d in (dt.f16, dt.bf16):
            if src is d:
                return x
            if src.is_float and src.bits <= 32:  # float holds it exactly: no double arithmetic
                return self.round_to(d, x)
            return f"ember_round_{d.name}((double)({x}))"
        if d.is_int and not src.is_float:
            return self.narrow(d, x) if d.bits < 32 else f"(({d.c_name})({x}))"
        return f"(({d.c_name})({x}))"

    def bitcast(self, x: str, src: DType, d: DType) -> str:
        if src in (dt.f16, dt.bf16):
            x, src = f"ember_f32_to_{src.name}_bits({x})", dt.u16
        if d in (dt.f16, dt.bf16):
            return f"ember_{d.name}_to_f32((unsigned short)({self.bitcast(x, src, dt.u16)}))"
        if src.c_name == d.c_name:
            return x
        self.bitcasts.add((src, d))
        return f"ember_bitcast_{src.name}_{d.name}({x})"

    @staticmethod
    def wide_unsigned(d: DType) -> str:
        return "unsigned long long" if d.bits == 64 else "unsigned"

    def wrapping(self, d: DType, op: str, a: list[str]) -> str:
        """Signed overflow is undefined in C but wraps in the spec: compute in the unsigned type."""
        u = self.wide_unsigned(d)
        expr = f"({u})({a[0]}) {op} ({u})({a[1]})" if len(a) == 2 else f"0u - ({u})({a[0]})"
        return self.narrow(d, expr) if d.bits < 32 else f"(({d.c_name})({expr}))"

    def alu(self, n: Node, a: list[str], no_overflow: bool = False) -> str:
        """C for n given its operands' expressions. no_overflow: bounds prove that int arithmetic
        stays in range (index math), so the plain form is exact and the compiler can analyze it."""
        op, d = n.op, n.dtype
        src = n.srcs[0].dtype if n.srcs else d
        if d.is_int and not no_overflow and op in (Op.ADD, Op.SUB, Op.MUL, Op.NEG) and \
                (d.is_signed or (d.bits < 32 and op is Op.MUL)):
            return self.wrapping(d, {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.NEG: ""}[op], a)
        if op is Op.NEG:
            return self.narrow(d, f"-{a[0]}")
        if op is Op.RECIP:
            return f"(1.0{self.float_suffix if d is not dt.f64 else ''} / {a[0]})"
        if op in self.math32:
            return f"{(self.math64 if d is dt.f64 else self.math32)[op]}({a[0]})"
        if op is Op.CAST:
            return self.cast(a[0], src, d)
        if op is Op.BITCAST:
            return self.bitcast(a[0], src, d)
        if op is Op.DIV:
            return f"({a[0]} / {a[1]})"
        if op in (Op.IDIV, Op.MOD):
            sym = "/" if op is Op.IDIV else "%"
            if n.srcs[1].op is Op.CONST and n.srcs[1].arg != 0:
                return self.narrow(d, f"({a[0]} {sym} {a[1]})")
            # division by zero is undefined in the spec but must not trap: masked lanes load zeros
            return self.narrow(d, f"({a[0]} {sym} ({a[1]} + ({a[1]} == 0)))")
        if op is Op.MAX:
            if d.is_float:
                return f"ember_max_{self.ctype(d)}({a[0]}, {a[1]})"
            return f"({a[0]} > {a[1]} ? {a[0]} : {a[1]})"
        if op is Op.SHL:
            unsigned = {8: "unsigned", 16: "unsigned", 32: "unsigned", 64: "unsigned long long"}[d.bits]
            shifted = f"(({unsigned})({a[0]}) << {a[1]})"
            return self.narrow(d, shifted) if d.bits < 32 else f"({d.c_name}){shifted}"
        if op is Op.SHR:
            return self.narrow(d, f"({a[0]} >> {a[1]})")
        if op is Op.WHERE:
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op in self.infix:
            expr = f"({a[0]} {self.infix[op]} {a[1]})"
            return expr if op in (Op.CMPLT, Op.CMPEQ, Op.CMPNE) else self.narrow(d, expr)
        raise NotImplementedError(f"no rendering for {op.name}")

    def stage_open(self, name: str, ctype: str, size: int, count: int, var: str) -> tuple[list[str], list[str]]:
        """Declaration of a stage's array (size elements) before its fill loop, and the header of
        the fill loop over its count values (CPU: one thread fills a local array; CUDA
        overrides: the block fills shared memory)."""
        return [f"{ctype} {name}[{size}];"], [f"for (int {var} = 0; {var} < {count}; {var}++)"]

    def stage_close(self) -> list[str]:
        return []

    def reduce_init(self, op: Op, d: DType) -> str:
        if op is Op.SUM:
            return "0"
        return "(-INFINITY)" if d.is_float else self.literal(d.min, d)

    def combine(self, op: Op, d: DType, acc: str, v: str) -> str:
        if self.unsigned_sum(op, d):
            return f"{acc} + ({self.wide_unsigned(d)})({v})"
        if op is Op.SUM:
            return self.wrapping(d, "+", [acc, v]) if d.is_signed else self.narrow(d, f"{acc} + {v}")
        if d.is_float:
            return f"ember_max_{self.ctype(d)}({acc}, {v})"
        return f"({v} > {acc} ? {v} : {acc})"

    # --------------------------------------------------------------------------- kernels
    def loop_header(self, r: Node, var: str, lane: bool, parallel: bool, uneven: bool = False) -> list[str]:
        """uneven: iterations of a parallel loop differ in cost (rows of causal attention), so
        threads take every n-th instead of a contiguous block each."""
        size = r.arg[1]
        pragma = []
        if parallel:
            pragma = ["#pragma omp parallel for" + (" schedule(static, 1)" if uneven else "")]
        elif lane:
            pragma = [f"#pragma GCC unroll {size}"]
        elif size <= 16:
            # Keep short loops loops. GCC 12.2 at -O3 peels loops of up to 16 iterations
            # completely, then vectorizes the loop around them with masked SLP groups, and got that
            # wrong (AVX2 and AVX-512: a 33x2x7 nest of selects, an 11x3x4 pad; issue 14,
            # tests/compiler/toolchain). Innermost loops of real sizes vectorize as before.
            pragma = ["#pragma GCC unroll 1"]
        return pragma + [f"for ({r.dtype.c_name} {var} = 0; {var} < {size}; {var}++)"]

    def render_kernel(self, k: Kernel, prefix: str = "") -> str:
        return KernelWriter(self, k, prefix).write()


VECTOR_TYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}   # CUDA's types of an aligned vector access


@dataclass
class Vector:
    """A lane's accesses as `count` aligned vectors of `type`, each `elements` long, from base."""
    lane: Node
    base: Node
    type: str
    elements: int
    count: int

    def addresses(self, buf: str, at: str) -> list[str]:
        return [f"{buf} + {at}" + (f" + {c * self.elements}" if c else "") for c in range(self.count)]


class KernelWriter:
    """Renders one kernel: places nodes in scopes, emits statements, prints the scope tree."""

    vector_bytes = 0   # the widest vector access a lane's loads and stores may merge into (0: none)

    def __init__(self, r: CLike, k: Kernel, prefix: str = ""):
        self.r, self.k, self.lanes = r, k, k.lanes
        self.online = k.plan.online if isinstance(k.plan, LoopPlan) else None   # (online.py)
        self.name = prefix + k.name
        self.staged: dict[Node, tuple[str, Stage]] = {}  # load -> (its array, the stage)
        self.deps = dict(free_ranges(k.store))   # added to below: not the remembered one
        self.names: dict[Node, str] = {}
        self.memo: dict[tuple[Node, int], str | LaneArray] = {}
        self.rounded: dict[str, str] = {}   # a temp holding an op's rounded result -> that expression
        self.counter = 0
        order = {rg: i for i, rg in enumerate(k.ranges)}
        self.range_order = order

    def var(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def range_var(self, r: Node) -> str:
        if r not in self.names:
            self.names[r] = ("l" if r in self.lanes else "i") + str(len(self.names))
        return self.names[r]

    def place_deps(self, n: Node) -> frozenset[Node]:
        if n not in self.deps:  # a node made while rendering (a stage's fill)
            self.deps.update(free_ranges(n))
        d = self.deps[n]
        return d - self.lanes if n.op is Op.REDUCE else d

    def target(self, n: Node, scope: Scope) -> Scope:
        need = self.place_deps(n)
        for s in scope.chain():
            if need <= s.avail:
                return s
        raise AssertionError(f"no scope defines the ranges of {n}")

    def write(self) -> str:
        root = Scope(None, frozenset(), [])
        scope = self.open_outputs(root)
        buf, idx, value = self.k.store.srcs
        v = self.value(value, scope)
        # a rounded op result is stored from its expression where the target converts that once
        stored = self.r.store_value(self.rounded.get(v, v) if self.r.store_rounded and isinstance(v, str)
                                    else self.ref(v, value), value.dtype)
        vec = None if self.k.atomic or self.store_guard(scope) else self.vector_lane(idx, value.dtype)
        if vec is not None and scope.parent is not None and scope.avail - scope.parent.avail == {vec.lane}:
            self.vector_store(scope, buf, value.dtype, stored, vec)
        else:
            target = f"{self.buf(buf)}[{self.value(idx, scope)}]"
            scope.put(self.store_guard(scope) + (f"atomicAdd(&{target}, {stored});" if self.k.atomic else
                                                 f"{target} = {stored};"))
        self.finish(root)
        return self.signature() + " {\n" + self.print_scope(root, 1) + "}\n"

    def finish(self, root: Scope) -> None:
        """A target's last changes to the kernel's statements before they are printed."""

    def stage_open(self, name: str, ctype: str, size: int, count: int, var: str) -> tuple[list[str], list[str]]:
        """A stage's declaration and fill-loop header (the renderer's; a target may change them)."""
        return self.r.stage_open(name, ctype, size, count, var)

    def vector_lane(self, index: Node, d: DType) -> "Vector | None":
        """The aligned vector access of a lane's loads or store at index = base + lane, base a
        multiple of the lane's size (buffers start 16-byte aligned), or None. Written out, since
        nvcc left a bf16 map's eight 2-byte stores apart."""
        terms, k = sym.linear(index)
        for lane in sorted(self.lanes, key=lambda r: self.range_order.get(r, 0)):
            size, nbytes = lane.arg[1], lane.arg[1] * d.itemsize
            step = min(nbytes, self.vector_bytes)
            if terms.get(lane) != 1 or step not in VECTOR_TYPES or nbytes % step:
                continue
            rest = {t: c for t, c in terms.items() if t is not lane}
            if k % size or any(c % size for c in rest.values()):
                continue
            base = sym.build(rest, k, index.dtype)
            if lane not in free_ranges(base)[base]:
                return Vector(lane, base, VECTOR_TYPES[step], step // d.itemsize, nbytes // step)
        return None

    def vector_load(self, n: Node, scope: Scope, vec: "Vector") -> str:
        """The lane's loads of n as vector reads before the lane's loop; n's value at a lane."""
        _, arr = self.vector_read(n, scope, vec)
        return self.r.load(arr, self.range_var(vec.lane), n.dtype)

    def vector_read(self, n: Node, scope: Scope, vec: "Vector") -> tuple[Scope, str]:
        """The vector reads of n, declared in the outermost scope its address and guard allow:
        (that scope, the name of the element view; the vectors are its name + "v")."""
        st = self.r.stype(n.dtype)
        chain = scope.chain()
        outer = max((self.target(x, scope) for x in [vec.base, *n.srcs[2:]]), key=chain.index)  # address, guard
        arr, at = self.var("v"), self.ref(self.value(vec.base, outer), vec.base)
        buf = self.operand(n.srcs[0], scope)
        parts = [f"*(const {vec.type}*)({a})" for a in vec.addresses(buf, at)]
        if len(n.srcs) == 3:   # guarded: zeros where the guard is false, nothing read
            guard = self.ref(self.value(n.srcs[2], outer), n.srcs[2])
            parts = [f"({guard} ? {read} : {vec.type}{{}})" for read in parts]
        outer.put(f"const {vec.type} {arr}v[{vec.count}] = {{{', '.join(parts)}}};")
        outer.put(f"const {st}* {arr} = (const {st}*){arr}v;")
        return outer, arr

    def vector_store(self, scope: Scope, buf: Node, d: DType, stored: str, vec: "Vector") -> None:
        """Each lane's value into a vector, written once after the lane's loop."""
        parent = scope.parent
        assert parent is not None
        st, arr = self.r.stype(d), self.var("o")
        parent.put(f"{vec.type} {arr}v[{vec.count}];")
        parent.put(f"{st}* {arr} = ({st}*){arr}v;")
        scope.put(f"{arr}[{self.range_var(vec.lane)}] = {stored};")
        at = self.ref(self.value(vec.base, parent), vec.base)
        writes = [f"*({vec.type}*)({a}) = {arr}v[{c}];" for c, a in enumerate(vec.addresses(self.buf(buf), at))]
        spot = parent.lines.index(scope) + 1
        parent.lines[spot:spot] = writes

    def open_outputs(self, root: Scope) -> Scope:
        """Open the loops of the output ranges (outer ones first, lanes innermost)."""
        scope = root
        outer = [r for r in self.k.ranges if r not in self.lanes]
        inner = [r for r in self.k.ranges if r in self.lanes]
        parallel = self.k.plan.parallel if isinstance(self.k.plan, LoopPlan) else 0
        uneven = self.online is not None and self.online.stop is not None
        for i, r in enumerate(outer + inner):
            scope = scope.open(frozenset([r]), self.r.loop_header(r, self.range_var(r), r in self.lanes,
                                                                  parallel=i < parallel, uneven=uneven))
            self.fill_stages(r, scope)
        return scope

    def decode(self, scope: Scope, flat: str, ranges: list[Node]) -> None:
        """Range variables from a flat index, the last range fastest."""
        stride = 1
        for r in reversed(ranges):
            n = r.arg[1]
            expr = flat if stride == 1 else f"({flat} / {stride})"
            scope.put(f"{r.dtype.c_name} {self.range_var(r)} = {expr}" + (f" % {n};" if r is not ranges[0] else ";"))
            stride *= n

    def fill_stages(self, at: Node | None, scope: Scope) -> None:
        """At the start of the loop of `at`, copy each stage's values into its array."""
        from ..compiler.rewrite import substitute
        for st in self.k.stages:
            if st.at is not at:
                continue
            name, e = self.var("stage"), self.var("e")
            fresh = {r: sym.rng(f"{r.arg[0]}f", r.arg[1]) for r in st.over}
            (load,) = substitute([st.load], fresh)
            count = math.prod(r.arg[1] for r in st.over)
            before, header = self.stage_open(name, self.r.ctype(st.load.dtype), st.size, count, e)
            for line in before:
                scope.put(line)
            fill = scope.open(frozenset(fresh.values()), header)
            self.decode(fill, e, [fresh[r] for r in st.over])
            where = e if st.size == count else self.ref(self.value(self.stage_index(st, fresh), fill), load)
            fill.put(f"{name}[{where}] = {self.ref(self.value(load, fill), load)};")
            fill.close()
            for line in self.r.stage_close():
                scope.put(line)
            self.staged[st.load] = (name, st)

    @staticmethod
    def stage_index(st: "Stage", ranges: dict[Node, Node] | None = None) -> Node:
        """Where the value at st.over's ranges (or their stand-ins) lives in the stage's array."""
        return sym.build({(ranges or {}).get(r, r): s for r, s in zip(st.over, st.strides())}, 0)

    def store_guard(self, scope: Scope) -> str:
        """A condition on the store (CUDA: one thread stores a value the whole block computed)."""
        return ""

    def reduce_header(self, n: Node, r: Node, last: bool, scope: Scope) -> list[str]:
        """The loop over one of a reduction's own ranges (CUDA: strided over the block's threads)."""
        return self.r.loop_header(r, self.range_var(r), False, False)

    def reduce_finish(self, n: Node, acc: str, scope: Scope) -> list[str]:
        """Statements after a reduction's loops (CUDA: combine the threads' partial results)."""
        return []

    def buf(self, b: Node) -> str:
        return f"b{b.arg}"

    def signature(self) -> str:
        k = self.k
        params = [f"{self.r.stype(k.out.dtype)}* {self.r.restrict} b{k.out.id}"]
        params += [f"const {self.r.stype(b.dtype)}* {self.r.restrict} b{b.id}" for b in k.args[1:]]
        return f"void {self.name}({', '.join(params)})"

    def print_scope(self, s: Scope, depth: int) -> str:
        out = []
        pad = "  " * depth
        for line in s.lines:
            if isinstance(line, Scope):
                out += [pad + h for h in line.header]
                out.append(pad + "{\n" + self.print_scope(line, depth + 1) + pad + "}")
            else:
                out.append(pad + line)
        return "".join(x + "\n" for x in out)

    # ------------------------------------------------------------------------ expressions
    def ref(self, v: "str | LaneArray", n: Node) -> str:
        if isinstance(v, LaneArray):
            return f"{v.name}[{self.lane_index(v.lanes)}]"
        return v

    def lane_index(self, lanes: tuple[Node, ...]) -> str:
        if not lanes:
            return "0"
        expr = self.range_var(lanes[0])
        for r in lanes[1:]:
            expr = f"({expr} * {r.arg[1]} + {self.range_var(r)})"
        return expr

    def value(self, root: Node, scope: Scope) -> "str | LaneArray":
        """Emit root (and what it needs) for use in scope; returns its expression."""
        for n in self._order(root):
            t = self.target(n, scope)
            if (n, id(t)) not in self.memo:
                self.memo[(n, id(t))] = self.emit(n, t)
        return self.memo[(root, id(self.target(root, scope)))]

    def _order(self, root: Node) -> list[Node]:
        """Nodes of root's expression, sources first, not entering REDUCE bodies."""
        order: list[Node] = []
        seen: set[Node] = set()
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            if n in seen:
                continue
            seen.add(n)
            stack.append((n, True))
            if n.op is not Op.REDUCE and n not in self.staged:  # a staged load's address is not needed
                stack.extend((s, False) for s in reversed(n.srcs))
        return order

    def operand(self, s: Node, scope: Scope) -> str:
        return self.ref(self.memo[(s, id(self.target(s, scope)))], s)

    def emit(self, n: Node, scope: Scope) -> "str | LaneArray":
        op = n.op
        if op is Op.RANGE:
            return self.range_var(n)
        if op is Op.CONST:
            return self.r.literal(n.arg, n.dtype)
        if op is Op.BUFFER:
            return self.buf(n)
        if op is Op.REDUCE:
            online = self.online
            if online is not None and (n is online.max or n in online.sums):
                return self.emit_online(n, scope)
            return self.emit_reduce(n, scope)
        if op is Op.LOAD and n in self.staged:  # read the staged copy
            name, st = self.staged[n]
            flat = self.stage_index(st)
            return f"{name}[{self.ref(self.value(flat, scope), flat)}]"
        args = [self.operand(s, scope) for s in n.srcs]
        vec = self.vector_lane(n.srcs[1], n.dtype) if op is Op.LOAD else None
        if vec is not None and len(n.srcs) == 3 and vec.lane in self.deps[n.srcs[2]]:
            vec = None   # a guard that differs between the lanes
        if vec is not None:
            expr = self.vector_load(n, scope, vec)
        elif op is Op.LOAD:
            expr = self.r.load(args[0], args[1], n.dtype)
            if len(args) == 3:
                expr = f"({args[2]} ? {expr} : 0)"
        else:
            no_overflow = n.dtype.is_int and sym.bounds(n) != (n.dtype.min, n.dtype.max)
            expr = self.r.alu(n, args, no_overflow)
            if op not in EXACT:
                expr = self.r.round_result(n.dtype, expr)
        name = self.var()
        scope.put(f"{self.r.ctype(n.dtype)} {name} = {expr};")
        if (op not in EXACT and op is not Op.LOAD and vec is None and n.dtype is dt.bf16) or \
                (op is Op.CAST and n.dtype in (dt.bf16, dt.f16) and n.srcs[0].dtype is dt.f32):
            self.rounded[name] = expr   # (a 16-bit result: the one whose store converts it again)
        return name

    def emit_reduce(self, n: Node, scope: Scope) -> "str | LaneArray":
        red_op, own = n.arg
        d, ct = n.dtype, self.r.acc_ctype(red_op, n.dtype)
        free_lanes = tuple(sorted(self.deps[n] & self.lanes, key=lambda r: self.range_order.get(r, 0)))
        own_lanes = tuple(r for r in own if r in self.lanes)
        loops = [r for r in own if r not in self.lanes]
        acc = self.var("acc")
        size = math.prod(r.arg[1] for r in free_lanes + own_lanes)
        init = self.r.reduce_init(red_op, d)
        scope.put(f"{ct} {acc}[{size}];" if size > 1 else f"{ct} {acc};")
        if size > 1:
            scope.put(f"for (int j = 0; j < {size}; j++) {acc}[j] = {init};")
        else:
            scope.put(f"{acc} = {init};")
        inner = scope
        opened = []
        for i, r in enumerate(loops):
            inner = inner.open(frozenset([r]), self.reduce_header(n, r, i == len(loops) - 1, scope))
            self.fill_stages(r, inner)
            opened.append(inner)
        opened += self.open_lanes(inner, free_lanes + own_lanes)
        inner = opened[-1] if opened else inner
        body = n.srcs[0]
        v = self.ref(self.value(body, inner), body)
        slot = f"{acc}[{self.lane_index(free_lanes + own_lanes)}]" if size > 1 else acc
        inner.put(f"{slot} = {self.r.combine(red_op, d, slot, v)};")
        for s in reversed(opened):
            s.close()
        if own_lanes:  # combine the reduction's own lanes into one value per free lane
            nfree = math.prod(r.arg[1] for r in free_lanes)
            nown = math.prod(r.arg[1] for r in own_lanes)
            red = self.var("red")
            scope.put(f"{ct} {red}[{nfree}];")
            scope.put(f"for (int j = 0; j < {nfree}; j++) {{ {red}[j] = {acc}[j * {nown}]; "
                      f"for (int q = 1; q < {nown}; q++) "
                      f"{red}[j] = {self.r.combine(red_op, d, f'{red}[j]', f'{acc}[j * {nown} + q]')}; }}")
            acc, size = red, nfree
        is_array = size > 1 or bool(own_lanes)
        for line in self.reduce_finish(n, f"{acc}[0]" if is_array and size == 1 else acc, scope):
            scope.put(line)
        if self.r.unsigned_sum(red_op, d):   # back to the signed type (wrapping, as the spec's sum)
            res = self.var("sum")
            vt = self.r.ctype(d)
            if is_array:
                scope.put(f"{vt} {res}[{size}]; for (int j = 0; j < {size}; j++) {res}[j] = ({vt})({acc}[j]);")
            else:
                scope.put(f"{vt} {res} = ({vt})({acc});")
            acc = res
        if d in (dt.f16, dt.bf16) and red_op is Op.SUM:  # summed in float, rounded once at the end
            if is_array:
                scope.put(f"for (int j = 0; j < {size}; j++) {acc}[j] = {self.r.round_result(d, f'{acc}[j]')};")
            else:
                scope.put(f"{acc} = {self.r.round_result(d, acc)};")
        if free_lanes:
            return LaneArray(acc, free_lanes)
        return f"{acc}[0]" if own_lanes else acc


    def open_lanes(self, scope: Scope, lanes: tuple[Node, ...]) -> list[Scope]:
        """The lane loops, one inside the other, opened in scope; the innermost is last."""
        opened: list[Scope] = []
        for r in lanes:
            opened.append((opened[-1] if opened else scope).open(
                frozenset([r]), self.r.loop_header(r, self.range_var(r), True, False)))
        return opened

    def emit_online(self, n: Node, scope: Scope) -> "str | LaneArray":
        """The max and its sums of an online group (compiler/online.py) in one loop: the sums
        follow the running max, rescaled by exp2((m - m') * c) whenever it grows."""
        g = self.online
        d, ct = g.max.dtype, self.r.ctype(g.max.dtype)
        (j,) = g.max.arg[1]
        m, c = self.var("m"), self.r.literal(g.scale.arg, d)
        scope.put(f"{ct} {m} = (-INFINITY);")
        accs: dict[Node, tuple[str, tuple[Node, ...]]] = {}
        for s in g.sums:
            assert self.target(s, scope) is scope, "an online sum placed apart from its max"
            lanes = tuple(sorted(self.deps[s] & self.lanes, key=lambda r: self.range_order.get(r, 0)))
            size = math.prod(r.arg[1] for r in lanes)
            accs[s] = (self.var("acc"), lanes)
            scope.put(f"{ct} {accs[s][0]}[{size}];")
            scope.put(f"for (int j = 0; j < {size}; j++) {accs[s][0]}[j] = 0;")
        header = self.reduce_header(g.max, j, True, scope)
        if g.stop is not None:   # a causal mask: no term past the diagonal is computed
            stop = self.ref(self.value(g.stop, scope), g.stop)
            v = self.range_var(j)
            header = [f"for ({j.dtype.c_name} {v} = 0; {v} < ({stop} < {j.arg[1]} ? {stop} : {j.arg[1]}); {v}++)"]
        loop = scope.open(frozenset([j]), header)
        sj = self.ref(self.value(g.max.srcs[0], loop), g.max.srcs[0])
        new, rescale = self.var("m"), self.var("r")
        exp2 = self.r.math64[Op.EXP2] if d is dt.f64 else self.r.math32[Op.EXP2]
        loop.put(f"{ct} {new} = {self.r.combine(Op.RMAX, d, m, sj)};")
        loop.put(f"{ct} {rescale} = {new} == {m} ? 1 : {exp2}(({m} - {new}) * {c});")
        loop.put(f"{m} = {new};")
        self.memo[(g.max, id(scope))] = m   # the terms read the running max
        # while it is -inf a term's exponential is exp2(nan): 0 with the final max (or the whole
        # sum is NaN, set after the loop); 0 * h keeps an inf or NaN of h, as the reference does
        e = self.ref(self.value(g.exp, loop), g.exp)
        guarded = self.var("e")
        loop.put(f"{ct} {guarded} = {m} == (-INFINITY) ? 0 : {e};")
        self.memo[(g.exp, id(self.target(g.exp, loop)))] = guarded
        for s, (acc, lanes) in accs.items():
            opened = self.open_lanes(loop, lanes)
            inner = opened[-1] if opened else loop
            v = self.ref(self.value(s.srcs[0], inner), s.srcs[0])
            slot = f"{acc}[{self.lane_index(lanes)}]"
            inner.put(f"{slot} = {slot} * {rescale} + {v};")
            for o in reversed(opened):
                o.close()
        loop.close()
        for s, h in zip(g.sums, g.others):   # past the diagonal a term is 0 * h: an inf or NaN of h counts
            if g.stop is None or h is None:
                continue
            acc, lanes = accs[s]
            v, t = self.range_var(j), j.dtype.c_name
            tail = scope.open(frozenset([j]), [f"for ({t} {v} = ({stop} > 0 ? {stop} : 0); {v} < {j.arg[1]}; {v}++)"])
            opened = [tail, *self.open_lanes(tail, lanes)]
            opened[-1].put(f"{acc}[{self.lane_index(lanes)}] += 0 * {self.ref(self.value(h, opened[-1]), h)};")
            for o in reversed(opened):
                o.close()
        for s, (acc, lanes) in accs.items():   # scores all -inf: every term was exp2(nan)
            size = math.prod(r.arg[1] for r in lanes)
            scope.put(f"if ({m} == (-INFINITY)) for (int j = 0; j < {size}; j++) {acc}[j] = NAN;")
            self.memo[(s, id(scope))] = LaneArray(acc, lanes) if lanes else f"{acc}[0]"
        return self.memo[(n, id(scope))]


class ElementWriter(KernelWriter):
    """One output element of a kernel whose reduction is already computed elsewhere (the
    tensor-core and packed contraction paths): the kernel's value and store index with that
    REDUCE replaced by a finished accumulator. names: the C variables of the output ranges;
    tag keeps the temporaries of two elements in one scope apart."""

    def __init__(self, r: CLike, k: Kernel, prefix: str, names: dict[Node, str], reduce: Node, tag: str = ""):
        super().__init__(r, k, prefix)
        self.names.update(names)
        self.reduce, self.tag = reduce, tag

    def var(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.tag}{self.counter}"

    def element(self, acc: str) -> tuple[list[str], str, str]:
        """(statements, the value to store in the buffer's storage type, the flat index)."""
        root = Scope(None, frozenset(self.k.ranges), [])
        self.memo[(self.reduce, id(root))] = self.r.round_result(self.reduce.dtype, acc)  # f16/bf16 sums round once
        _, idx, value = self.k.store.srcs
        v = self.value(value, root)
        i = self.value(idx, root)
        lines = [line for line in root.lines if isinstance(line, str)]
        if self.r.store_rounded and isinstance(v, str):
            v = self.rounded.get(v, v)
        return lines, self.r.store_value(self.ref(v, value), value.dtype), i


def operand_bases(c: "Contraction", flat: str, r: CLike) -> list[str]:
    """Statements decoding a contraction's batch ranges (z0, z1, ...) from the flat batch index
    `flat`, then pointing ga and gb at the batch's A and B (the GPU and CPU paths share them)."""
    lines, stride = [], 1
    for i, b in reversed(list(enumerate(c.batch))):
        lines.append(f"const int z{i} = (int)(({flat} / {stride}) % {b.arg[1]});")
        stride *= b.arg[1]
    for op, var in ((c.a, "ga"), (c.b, "gb")):
        off = " + ".join([str(op.offset)] + [f"(long long)z{i} * {op.strides[b]}"
                                             for i, b in enumerate(c.batch) if b in op.strides])
        lines.append(f"const {r.stype(op.load.dtype)}* {var} = b{op.load.srcs[0].arg} + {off};")
    return lines
