"""The .eir text format (spec sections 1, 3, 7): tokenizer, parser, printer and formatter.

The parser reads one statement per line and builds nodes through the constructors of ir.py,
which check the type rules; every error becomes one EirError naming the file and line.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import data, ir
from . import dtype as dt
from .data import Rand
from .dtype import DType
from .ir import IRError, Node, Op


class EirError(Exception):
    """A malformed program: printed as `FILE:LINE: message`, exit status 2."""

    status = 2

    def __init__(self, path: str, line: int, msg: str):
        super().__init__(f"{path}:{line}: {msg}")
        self.path, self.line, self.msg = path, line, msg


class UnreadableFile(EirError):
    """A file that cannot be read: not malformed, so exit status 3 and no line number."""
    status = 3

    def __init__(self, path: str, err: OSError):
        Exception.__init__(self, f"{path}: cannot read the file: {err.strerror}")
        self.path, self.line, self.msg = path, 0, f"cannot read the file: {err.strerror}"


KEYWORDS = {"ember", "return", "input", "expect"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TYPE = re.compile(r"([A-Za-z0-9]+)\[(.*)\]\Z")

UNARY_OPS = {"neg": Op.NEG, "recip": Op.RECIP, "sqrt": Op.SQRT, "exp2": Op.EXP2, "log2": Op.LOG2,
             "sin": Op.SIN, "trunc": Op.TRUNC}
BINARY_OPS = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV, "idiv": Op.IDIV, "mod": Op.MOD,
              "max": Op.MAX, "cmplt": Op.CMPLT, "cmpeq": Op.CMPEQ, "cmpne": Op.CMPNE, "and": Op.AND,
              "or": Op.OR, "xor": Op.XOR, "shl": Op.SHL, "shr": Op.SHR}
# op name -> (operand count, {attribute: kind}, required attributes). Kinds: dtype, int, ints, number.
SCHEMA: dict[str, tuple[int, dict[str, str], tuple[str, ...]]] = {
    **{name: (1, {}, ()) for name in UNARY_OPS},
    **{name: (2, {}, ()) for name in BINARY_OPS},
    "cast": (1, {"dtype": "dtype"}, ("dtype",)),
    "bitcast": (1, {"dtype": "dtype"}, ("dtype",)),
    "where": (3, {}, ()),
    "reshape": (1, {"shape": "ints"}, ("shape",)),
    "permute": (1, {"order": "ints"}, ("order",)),
    "expand": (1, {"shape": "ints"}, ("shape",)),
    "pad": (1, {"before": "ints", "after": "ints", "value": "number"}, ("before", "after")),
    "shrink": (1, {"start": "ints", "end": "ints"}, ("start", "end")),
    "flip": (1, {"axes": "ints"}, ("axes",)),
    "sum": (1, {"axes": "ints"}, ("axes",)),
    "grad": (2, {}, ()),
}
REDUCE_MAX_SCHEMA = (1, {"axes": "ints"}, ("axes",))
DATA_ATTRS = {"seed": "int", "scale": "number", "lo": "int", "hi": "int"}
EXPECT_ATTRS = {"atol": "number", "rtol": "number"}


# ------------------------------------------------------------------------------------ tokens

_TOKEN = re.compile(r"(?:[^ \t\[\]]+|\[[^\]]*\])+")  # blanks end a token, except inside a [...] list
_BLANKS = re.compile(r"[ \t]*")


def tokenize(line: str) -> list[str]:
    """Split a line (comment already removed) on blanks; a `[...]` list is part of one token.
    Compiled patterns step over each token at once, so a line costs time linear in its length."""
    tokens: list[str] = []
    pos = _BLANKS.match(line).end()  # type: ignore[union-attr]
    while pos < len(line):
        m = _TOKEN.match(line, pos)
        if m is None:
            raise ValueError("']' without an opening '['" if line[pos] == "]" else
                             "a list opened with '[' is not closed with ']'")
        tokens.append(m.group())
        pos = _BLANKS.match(line, m.end()).end()  # type: ignore[union-attr]
    return tokens


def split_comment(line: str) -> tuple[str, str]:
    i = line.find("#")
    return (line, "") if i < 0 else (line[:i], line[i:])


def parse_list(tok: str) -> list[str]:
    inner = tok[1:-1].strip()
    if not inner:
        return []
    items = [s.strip() for s in inner.split(",")]
    if any(not s or " " in s or "\t" in s for s in items):
        raise ValueError(f"bad list {tok}: items are separated by single commas")
    return items


def number(tok: str, what: str) -> int | float:
    v = data.parse_number(tok)
    if v is None:
        raise ValueError(f"{what} must be a number, found '{tok}'")
    return v


def integer(tok: str, what: str) -> int:
    v = data.parse_number(tok)
    if not isinstance(v, int) or tok in ("true", "false"):
        raise ValueError(f"{what} must be an integer, found '{tok}'")
    return v


def parse_type(tok: str) -> tuple[DType, tuple[int, ...]]:
    m = _TYPE.match(tok)
    if not m:
        raise ValueError(f"expected a type such as f32[2,3], found '{tok}'")
    dtype = dt.BY_NAME.get(m.group(1))
    if dtype is None:
        raise ValueError(f"unknown dtype '{m.group(1)}' (dtypes: {' '.join(dt.BY_NAME)})")
    shape = tuple(integer(s, "a dim") for s in parse_list("[" + m.group(2) + "]"))
    return dtype, _nonempty(ir.check_shape(shape))


def _nonempty(shape: tuple[int, ...]) -> tuple[int, ...]:
    if 0 in shape:  # spec 2; the IR module itself also serves the frontend's empty tensors
        raise ValueError(f"every dim must be an integer >= 1, found 0 in {list(shape)}")
    return shape


def parse_attrs(tokens: list[str], kinds: dict[str, str], what: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for tok in tokens:
        key, eq, val = tok.partition("=")
        if not eq or not key:
            raise ValueError(f"expected an attribute key=value, found '{tok}'")
        if key not in kinds:
            known = ", ".join(kinds) or "none"
            raise ValueError(f"unknown attribute '{key}' for {what} (known: {known})")
        if key in attrs:
            raise ValueError(f"attribute '{key}' given twice")
        kind = kinds[key]
        if kind == "dtype":
            if val not in dt.BY_NAME:
                raise ValueError(f"{key}= must be a dtype, found '{val}'")
            attrs[key] = dt.BY_NAME[val]
        elif kind == "ints":
            if not (val.startswith("[") and val.endswith("]")):
                raise ValueError(f"{key}= must be a list such as [0,1], found '{val}'")
            attrs[key] = tuple(integer(s, f"an entry of {key}") for s in parse_list(val))
        elif kind == "int":
            attrs[key] = integer(val, f"{key}=")
        else:
            attrs[key] = number(val, f"{key}=")
    return attrs


# ----------------------------------------------------------------------------------- program

@dataclass
class DataSpec:
    """The right-hand side of an `input` or `expect` line, unresolved until the dtype is known."""
    line: int
    values: list[int | float] | None = None
    rand: Rand | None = None
    atol: float | None = None
    rtol: float | None = None


@dataclass
class Program:
    path: str
    nodes: dict[str, Node] = field(default_factory=dict)      # every defined name
    lines: dict[str, int] = field(default_factory=dict)       # name -> line that defined it
    params: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    return_line: int = 0
    inputs: dict[str, DataSpec] = field(default_factory=dict)
    expects: dict[str, DataSpec] = field(default_factory=dict)
    resolved: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def output_nodes(self) -> list[Node]:
        return [self.nodes[n] for n in self.outputs]

    def input_values(self, name: str) -> np.ndarray:
        """The value of a param, as the reference evaluator holds values, shaped."""
        node = self.nodes[name]
        return resolve(self.inputs[name], node.dtype, node.shape)

    def expected_values(self, name: str) -> np.ndarray:
        """The values an expect line gives, resolved once (a grader compares them with every compiler's)."""
        if name not in self.resolved:
            node = self.nodes[name]
            self.resolved[name] = resolve(self.expects[name], node.dtype, node.shape)
        return self.resolved[name]


def resolve(spec: DataSpec, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    if spec.rand is not None:
        return data.generate(spec.rand, dtype, n).reshape(shape)
    assert spec.values is not None
    return data.list_values(spec.values, dtype).reshape(shape)


def _data_spec(tokens: list[str], line: int, extra: dict[str, str]) -> DataSpec:
    if not tokens:
        raise ValueError("expected data: a list [v0, v1, ...] or rand seed=S")
    if tokens[0].startswith("["):
        attrs = parse_attrs(tokens[1:], extra, "this data")
        inner = tokens[0][1:-1]
        x = data.bulk_floats(inner, inner.count(",") + 1) if inner.strip() else None
        if x is not None and (np.abs(x[np.isfinite(x)]) < 2**53).all():  # decimals in bulk, exact for ints too
            values: list[int | float] = x.tolist()
        else:  # every number in a list is read as a float for a float dtype (spec 7): -0 stays -0.0
            values = [-0.0 if v == 0 and s.startswith("-") else v
                      for s in parse_list(tokens[0]) for v in (number(s, "a data value"),)]
        return DataSpec(line, values=values, **attrs)
    if tokens[0] != "rand":
        raise ValueError(f"expected data: a list [v0, v1, ...] or rand seed=S, found '{tokens[0]}'")
    attrs = parse_attrs(tokens[1:], {**DATA_ATTRS, **extra}, "rand")
    if "seed" not in attrs:
        raise ValueError("rand needs seed=S")
    rand = Rand(attrs.pop("seed"), attrs.pop("scale", None), attrs.pop("lo", None), attrs.pop("hi", None))
    return DataSpec(line, rand=rand, **attrs)


class Parser:
    def __init__(self, text: str, path: str):
        self.text, self.path = text, path
        self.prog = Program(path)
        self.seen_header = False
        self.name = ""

    def error(self, line: int, msg: str) -> EirError:
        return EirError(self.path, line, msg)

    def parse(self) -> Program:
        last = 0
        for lineno, raw in enumerate(self.text.split("\n"), 1):
            code, _ = split_comment(raw.removesuffix("\r"))  # CRLF reads as LF
            if not code.strip():
                continue
            last = lineno
            try:
                if not code.isascii():
                    raise ValueError("the format is ASCII text; found a non-ASCII character")
                if "\r" in code:
                    raise ValueError("a carriage return (\\r) inside a line: lines end with \\n or \\r\\n")
                self.statement(tokenize(code), lineno)
            except (ValueError, IRError, data.ValueError_) as e:
                raise self.error(lineno, str(e)) from None
        if not self.seen_header:
            raise self.error(1, "expected the header 'ember 1', found an empty file")
        if not self.prog.return_line:
            raise self.error(last, "missing 'return': a program ends with return NAME...")
        self.check_data()
        return self.prog

    def statement(self, toks: list[str], line: int) -> None:
        if not self.seen_header:
            if toks[0] != "ember":
                raise ValueError(f"expected the header 'ember 1' as the first statement, found '{toks[0]}'")
            if len(toks) != 2 or toks[1] != "1":
                raise ValueError(f"unsupported header '{' '.join(toks)}': this is format version 1, 'ember 1'")
            self.seen_header = True
            return
        head = toks[0]
        if head in KEYWORDS and len(toks) > 1 and toks[1] == "=":
            raise ValueError(f"'{head}' is a keyword, not a valid name")
        if head == "ember":
            raise ValueError("the header 'ember 1' may appear only once, as the first statement")
        if head in ("input", "expect"):
            return self.data_line(head, toks, line)
        if head == "return":
            if self.prog.return_line:
                raise ValueError(f"'return' repeated (first on line {self.prog.return_line})")
            if len(toks) < 2:
                raise ValueError("return needs at least one name")
            for name in toks[1:]:
                if self.use(name).numel >= ir.MAX_NUMEL:
                    raise ValueError(f"a returned value must have fewer than 2^31 elements: '{name}' has "
                                     f"{self.use(name).numel}")
            self.prog.outputs = toks[1:]
            self.prog.return_line = line
            return
        if len(toks) < 2 or toks[1] != "=":
            raise ValueError(f"expected 'NAME = OP ...', 'return', 'input' or 'expect', found '{' '.join(toks[:3])}'")
        if self.prog.return_line:
            raise ValueError(f"a definition after 'return' (line {self.prog.return_line}): "
                             "return is the last statement of the program")
        name = self.new_name(head)
        self.name = name  # a param's name is its identity: two params of one type are two inputs
        if len(toks) < 3:
            raise ValueError(f"expected an op after '{name} ='")
        node = self.node(toks[2], toks[3:])
        _nonempty(node.shape)
        self.prog.nodes[name] = node
        self.prog.lines[name] = line
        if toks[2] == "param":
            self.prog.params.append(name)

    def new_name(self, name: str) -> str:
        if not _NAME.match(name) or name in KEYWORDS:
            raise ValueError(f"'{name}' is not a valid name ([A-Za-z_][A-Za-z0-9_]*, not a keyword)")
        if name in self.prog.nodes:
            raise ValueError(f"'{name}' is already defined on line {self.prog.lines[name]}")
        return name

    def use(self, name: str) -> Node:
        if name not in self.prog.nodes:
            if not _NAME.match(name) or name in KEYWORDS:
                raise ValueError(f"expected an operand name, found '{name}'")
            raise ValueError(f"'{name}' is not defined (every name is defined before use)")
        return self.prog.nodes[name]

    def node(self, opname: str, toks: list[str]) -> Node:
        assert_type = None
        if ":" in toks:
            i = toks.index(":")
            if len(toks) != i + 2:
                raise ValueError("': TYPE' must end the line, with exactly one type after ':'")
            assert_type = parse_type(toks[i + 1])
            toks = toks[:i]
        operands = [t for t in toks if "=" not in t]
        attr_toks = [t for t in toks if "=" in t]
        if operands and attr_toks and toks.index(attr_toks[0]) < toks.index(operands[-1]):
            raise ValueError("attributes (key=value) come after the operands")
        node = self.build(opname, operands, attr_toks)
        if node.numel > ir.MAX_VALUE_NUMEL:
            raise ValueError(f"a value may have at most 2^62 - 1 elements, found {node.numel}")
        if node.op is Op.PARAM and node.numel >= ir.MAX_NUMEL:
            raise ValueError(f"a param must have fewer than 2^31 elements, found {node.numel}")
        if assert_type is not None and assert_type != (node.dtype, node.shape):
            raise ValueError(f"type assertion failed: inferred {ir.fmt_type(node.dtype, node.shape)}, "
                             f"asserted {ir.fmt_type(*assert_type)}")
        return node

    def build(self, opname: str, operands: list[str], attr_toks: list[str]) -> Node:
        if opname == "param":
            if len(operands) != 1 or attr_toks:
                raise ValueError("param takes exactly one type: NAME = param f32[2,3]")
            return ir.param(self.name, *parse_type(operands[0]))
        if opname == "const":
            if len(operands) != 2:
                raise ValueError(f"const takes a value and a type (const 1.5 f32[2]), found {len(operands)} operands")
            parse_attrs(attr_toks, {}, "const")
            dtype, shape = parse_type(operands[1])
            value = data.literal_value(number(operands[0], "the const value"), dtype, truncate=True)
            return ir.const(value, dtype, shape)
        if opname == "iota":
            if len(operands) != 1:
                raise ValueError(f"iota takes one type and axis=k, found {len(operands)} operands")
            attrs = parse_attrs(attr_toks, {"axis": "int"}, "iota")
            if "axis" not in attrs:
                raise ValueError("iota needs the attribute axis=k")
            return ir.iota(*parse_type(operands[0]), attrs["axis"])
        if opname == "max" and (len(operands) == 1 or any(t.startswith("axes=") for t in attr_toks)):
            count, kinds, required = REDUCE_MAX_SCHEMA
        elif opname in SCHEMA:
            count, kinds, required = SCHEMA[opname]
        else:
            near = difflib.get_close_matches(opname, [*SCHEMA, "param", "const", "iota", "max"], n=1)
            raise ValueError(f"unknown op '{opname}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
        if len(operands) != count:
            raise ValueError(f"{opname} takes {count} operand{'s' * (count > 1)}, found {len(operands)}")
        srcs = [self.use(t) for t in operands]
        attrs = parse_attrs(attr_toks, kinds, opname)
        for key in required:
            if key not in attrs:
                raise ValueError(f"{opname} needs the attribute {key}=")
        return apply(opname, srcs, attrs)

    def data_line(self, head: str, toks: list[str], line: int) -> None:
        if len(toks) < 3 or toks[2] != "=":
            raise ValueError(f"expected '{head} NAME = DATA'")
        name = toks[1]
        table = self.prog.inputs if head == "input" else self.prog.expects
        if name in table:
            raise ValueError(f"{head} for '{name}' given twice (first on line {table[name].line})")
        table[name] = _data_spec(toks[3:], line, {} if head == "input" else EXPECT_ATTRS)

    def check_data(self) -> None:
        p = self.prog
        for name, spec in p.inputs.items():
            if name not in p.nodes or p.nodes[name].op is not Op.PARAM:
                raise self.error(spec.line, f"input for '{name}', which is not a param")
        if p.inputs or p.expects:
            for name in p.params:
                if name not in p.inputs:
                    msg = f"param '{name}' has no 'input' line (a test gives every param a value)"
                    raise self.error(p.lines[name], msg)
        for name, spec in p.expects.items():
            if name not in p.outputs:
                returned = " ".join(p.outputs)
                raise self.error(spec.line, f"expect for '{name}', which is not returned (returned: {returned})")
        for table in (p.inputs, p.expects):
            for name, spec in table.items():
                node = p.nodes[name]
                try:
                    check_spec(spec, node)
                except (ValueError, data.ValueError_) as e:
                    raise self.error(spec.line, str(e)) from None


def check_spec(spec: DataSpec, node: Node) -> None:
    """Check data against its node's type, converting list literals to the dtype in place."""
    if spec.rand is not None:
        data.check_rand(spec.rand, node.dtype)
        return
    assert spec.values is not None
    if len(spec.values) != node.numel:
        raise ValueError(f"expected {node.numel} values for {ir.fmt_type(node.dtype, node.shape)}, "
                         f"found {len(spec.values)}")
    try:  # floats in bulk (a cast from f64, as literal_value does one at a time)
        floats = np.array(spec.values, np.float64) if node.dtype.is_float else None
    except OverflowError:  # an integer literal beyond f64
        floats = None
    if floats is not None:
        spec.values = data.round_float(floats, node.dtype).astype(np.float64).tolist()
    else:
        spec.values = [data.literal_value(v, node.dtype, truncate=False) for v in spec.values]


_BUILD = {
    "cast": lambda s, a: ir.unary(Op.CAST, s[0], a["dtype"]),
    "bitcast": lambda s, a: ir.unary(Op.BITCAST, s[0], a["dtype"]),
    "where": lambda s, a: ir.where(*s),
    "reshape": lambda s, a: ir.reshape(s[0], a["shape"]),
    "permute": lambda s, a: ir.permute(s[0], a["order"]),
    "expand": lambda s, a: ir.expand(s[0], a["shape"]),
    "pad": lambda s, a: ir.pad(s[0], a["before"], a["after"],
                               data.literal_value(a.get("value", 0), s[0].dtype, truncate=True)),
    "shrink": lambda s, a: ir.shrink(s[0], a["start"], a["end"]),
    "flip": lambda s, a: ir.flip(s[0], a["axes"]),
    "sum": lambda s, a: ir.reduce(Op.SUM, s[0], a["axes"]),
    "grad": lambda s, a: ir.grad(s[0], s[1]),
}


def apply(opname: str, srcs: list[Node], attrs: dict[str, Any]) -> Node:
    """Build the node of a (checked) op name with its operands and attributes."""
    if opname in UNARY_OPS:
        return ir.unary(UNARY_OPS[opname], srcs[0])
    if opname == "max" and "axes" in attrs:
        return ir.reduce(Op.RMAX, srcs[0], attrs["axes"])
    if opname in BINARY_OPS:
        return ir.binary(BINARY_OPS[opname], srcs[0], srcs[1])
    return _BUILD[opname](srcs, attrs)


def parse(text: str, path: str = "<string>") -> Program:
    """Parse .eir text into a Program. Raises EirError for any malformed input."""
    return Parser(text, path).parse()


def parse_file(path: str) -> Program:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UnreadableFile(path, e) from None
    return parse_bytes(raw, path)


def parse_bytes(raw: bytes, path: str) -> Program:
    """Parse a file's bytes; path names it in errors."""
    return parse(decode(raw, path), path)


def decode(raw: bytes, path: str) -> str:
    """The file's text: ASCII (spec 1), or an EirError saying where it is not."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise EirError(path, 1, "the file starts with a UTF-8 byte order mark (EF BB BF); the format is ASCII "
                                "text: save it without one")
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError as e:
        start = raw.rfind(b"\n", 0, e.start) + 1
        raise EirError(path, raw.count(b"\n", 0, e.start) + 1, f"the format is ASCII text; found a non-ASCII "
                       f"byte 0x{raw[e.start]:02x} at column {e.start - start + 1}") from None


# ---------------------------------------------------------------------------------- printing

ATTR_ORDER = ["dtype", "shape", "order", "before", "after", "value", "start", "end", "axes", "axis",
              "seed", "scale", "lo", "hi", "atol", "rtol"]
_OPNAMES = {**{v: k for k, v in UNARY_OPS.items()}, **{v: k for k, v in BINARY_OPS.items()},
            Op.CAST: "cast", Op.BITCAST: "bitcast", Op.WHERE: "where", Op.RESHAPE: "reshape",
            Op.PERMUTE: "permute", Op.EXPAND: "expand", Op.PAD: "pad", Op.SHRINK: "shrink",
            Op.FLIP: "flip", Op.SUM: "sum", Op.RMAX: "max", Op.GRAD: "grad"}


def fmt_number(v: int | float) -> str:
    """A literal that parses back to exactly v (repr is the shortest exact form)."""
    return str(v) if isinstance(v, int) else repr(v)


def _ints(values: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


def node_line(node: Node, name: str, names: dict[Node, str]) -> str:
    """One statement `name = op operands attrs : TYPE` for a tensor-level node."""
    typ = ir.fmt_type(node.dtype, node.shape)
    if node.op is Op.PARAM:
        return f"{name} = param {typ}"
    if node.op is Op.CONST:
        return f"{name} = const {fmt_number(node.arg)} {typ}"
    if node.op is Op.IOTA:
        return f"{name} = iota {typ} axis={node.arg}"
    parts = [name, "=", _OPNAMES.get(node.op, node.op.name.lower()), *(names[s] for s in node.srcs)]
    op, arg = node.op, node.arg
    if op is Op.FUSED:  # debug output only: the compiler makes these (compiler/attention.py)
        parts.append(f"kernel={arg}")
    elif op in (Op.CAST, Op.BITCAST):
        parts.append(f"dtype={node.dtype.name}")
    elif op in (Op.RESHAPE, Op.EXPAND):
        parts.append(f"shape={_ints(node.shape)}")
    elif op is Op.PERMUTE:
        parts.append(f"order={_ints(arg)}")
    elif op is Op.PAD:
        parts += [f"before={_ints(arg[0])}", f"after={_ints(arg[1])}"]
        if ir._key(arg[2]) != ir._key(data.literal_value(0, node.dtype, True)):
            parts.append(f"value={fmt_number(arg[2])}")
    elif op is Op.SHRINK:
        parts += [f"start={_ints(arg[0])}", f"end={_ints(arg[1])}"]
    elif op in (Op.FLIP, Op.SUM, Op.RMAX):
        parts.append(f"axes={_ints(arg)}")
    return " ".join(parts) + f" : {typ}"


def print_graph(outputs: list[Node], names: dict[Node, str] | None = None,
                extra_roots: list[Node] | tuple[Node, ...] = ()) -> list[str]:
    """The statements computing outputs (and extra_roots), sources first, with a return line.

    Nodes without a name in `names` get fresh ones (t0, t1, ...)."""
    named = dict(names or {})
    taken = set(named.values())
    lines = ["ember 1"]
    counter = 0
    for node in ir.toposort([*extra_roots, *outputs]):
        if node not in named:
            while f"t{counter}" in taken:
                counter += 1
            named[node] = f"t{counter}"
            taken.add(named[node])
        lines.append(node_line(node, named[node], named))
    lines.append("return " + " ".join(named[o] for o in outputs))
    return lines


def print_program(prog: Program) -> str:
    """The program as canonical text: graph statements, return, then input and expect lines."""
    names: dict[Node, str] = {}
    for name, node in prog.nodes.items():
        names.setdefault(node, name)
    params = [prog.nodes[p] for p in prog.params]
    lines = print_graph(prog.output_nodes, names, params)
    # `return` names the program's own names, which may alias one node
    lines[-1] = "return " + " ".join(names[prog.nodes[o]] for o in prog.outputs)
    for head, table in (("input", prog.inputs), ("expect", prog.expects)):
        for name, spec in table.items():
            target = names[prog.nodes[name]]
            lines.append(f"{head} {target} = {_data_text(spec)}")
    return "\n".join(lines) + "\n"


def _data_text(spec: DataSpec) -> str:
    if spec.rand is not None:
        r = spec.rand
        text = f"rand seed={r.seed}"
        text += f" scale={fmt_number(r.scale)}" if r.scale is not None else ""
        text += f" lo={r.lo} hi={r.hi}" if r.lo is not None else ""
    else:
        text = "[" + ", ".join(fmt_number(v) for v in spec.values or []) + "]"
    for key in ("atol", "rtol"):
        if getattr(spec, key) is not None:
            text += f" {key}={fmt_number(getattr(spec, key))}"
    return text


def format_text(text: str, path: str = "<string>") -> str:
    """`ember fmt`: canonical spacing, list style and attribute order, keeping every comment,
    the order of statements and the literals as written. The file must be valid."""
    parse(text, path)
    out: list[str] = []
    for raw in text.split("\n"):
        code, comment = split_comment(raw.removesuffix("\r"))  # canonical form ends lines with LF
        toks = tokenize(code)
        if not toks:
            if comment:
                out.append(comment.rstrip())
            elif out and out[-1] != "":
                out.append("")
            continue
        attrs = sorted((t for t in toks if "=" in t and t != "="), key=lambda t: ATTR_ORDER.index(t.split("=")[0]))
        rest = [t for t in toks if "=" not in t or t == "="]
        tail: list[str] = []
        if ":" in rest:
            i = rest.index(":")
            rest, tail = rest[:i], rest[i:]
        line = " ".join(_canon_token(t) for t in rest + attrs + tail)
        out.append(line + ("  " + comment.rstrip() if comment else ""))
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def _canon_token(tok: str) -> str:
    i = tok.find("[")
    if i < 0:
        return tok
    sep = ", " if i == 0 else ","
    return tok[:i] + "[" + sep.join(parse_list(tok[i:])) + "]"
