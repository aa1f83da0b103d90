"""Compiled schedules kept on disk, so that a second run of a program skips the compiler.

A GPT-2 step takes 4-7 s to schedule and optimize (2-core machine, H200 host); loading its
schedule takes a fraction of that. The key is the program's structure: every node of the graph
(op, dtype, shape, sources by position, arg), the target, what its plans depend on (the
overrides and stored plans: plans.choice_key) and the compiler's own source, so that any
change to Ember misses. Hash-consing (ir.Node) makes a loaded node the very object of the live
graph that has its structure, so a loaded schedule's params are the caller's.

An entry is JSON behind the sha256 of its bytes, never a pickle: loading one builds nodes,
dtypes and Ember's own dataclasses and enums, and nothing else, so a planted entry cannot run
code, and a damaged one (a full disk, an edit) fails its hash and is compiled again. Nodes are
one flat table, sources first, referred to by their place in it: graphs are thousands of nodes
deep, beyond what a recursive encoder takes.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from .. import debug
from ..dtype import BY_NAME, DType
from ..ir import Node, Op, _key, toposort

FORMAT = 2   # bump when what is stored changes shape



@functools.lru_cache(maxsize=None)
def _ember_source_hash() -> str:
    """The hash of every Python file of the ember package: a changed compiler misses the cache."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def key(outputs: list[Node], *options: Any) -> str:
    """The cache key of compiling these outputs with these options (target, arch...)."""
    order = toposort(outputs)
    index = {id(n): i for i, n in enumerate(order)}
    h = hashlib.sha256(repr((FORMAT, _ember_source_hash(), options)).encode())
    for n in order:
        h.update(repr((n.op.value, n.dtype.name, n.shape, tuple(index[id(s)] for s in n.srcs), _key(n.arg))).encode())
    h.update(repr([index[id(o)] for o in outputs]).encode())
    return h.hexdigest()[:32]


def _encode_node_table(roots: list[Node]) -> tuple[list[list], dict[int, int]]:
    """Every node reachable from roots (sources and arg nodes first), as rows of a flat table:
    graphs are thousands of nodes deep, beyond what a recursive encoder takes. Rows are keyed by
    id: every node is reachable from roots, which the caller holds, so no id is reused meanwhile."""
    index: dict[int, int] = {}
    table: list[list] = []
    stack = [(n, False) for n in reversed(roots)]
    while stack:
        n, ready = stack.pop()
        if id(n) in index:
            continue
        if ready:
            index[id(n)] = len(table)
            table.append([n.op.name, n.dtype.name, [index[id(s)] for s in n.srcs], _value(n.arg, index, None), n.shape])
            continue
        stack.append((n, True))
        stack.extend((d, False) for d in (*n.srcs, *_arg_nodes(n.arg)) if id(d) not in index)
    return table, index


def _arg_nodes(arg: Any) -> list[Node]:
    if type(arg) is Node:
        return [arg]
    return [n for a in arg for n in _arg_nodes(a)] if isinstance(arg, tuple) else []


def _nodes_in(obj: Any, found: list[Node], seen: set[int]) -> None:
    """The nodes a schedule refers to, for the table (objects are visited once: they share)."""
    if type(obj) is Node:
        found.append(obj)
    elif id(obj) in seen or obj is None or isinstance(obj, (bool, int, float, str, Enum, DType)):
        return
    else:
        seen.add(id(obj))
        if isinstance(obj, dict):
            for k, v in obj.items():
                _nodes_in(k, found, seen)
                _nodes_in(v, found, seen)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for v in obj:
                _nodes_in(v, found, seen)
        elif is_dataclass(obj):
            for f in fields(obj):
                _nodes_in(getattr(obj, f.name), found, seen)


def _value(obj: Any, index: dict[int, int], objects: dict[int, int] | None) -> Any:
    """obj as JSON: plain values as themselves, the rest as tagged lists. Nodes are their rows in
    the table; an object met again (a Buffer shared by kernels) is a reference to its first."""
    if obj is None or isinstance(obj, (bool, str)) or type(obj) is int:
        return obj
    if type(obj) is float:
        return ["f", obj.hex()]   # exact, and -0.0, inf and nan too
    if type(obj) is Node:
        return ["n", index[id(obj)]]
    if isinstance(obj, DType):
        return ["t", obj.name]
    if isinstance(obj, Enum):
        return ["e", _class_name(type(obj)), obj.name]
    if isinstance(obj, (tuple, list, set, frozenset)):
        tag = {tuple: "()", list: "[]", set: "{}", frozenset: "f{}"}[type(obj)]
        return [tag] + [_value(v, index, objects) for v in obj]
    if isinstance(obj, dict):
        return ["d"] + [[_value(k, index, objects), _value(v, index, objects)] for k, v in obj.items()]
    if is_dataclass(obj) and objects is not None:
        if id(obj) in objects:
            return ["r", objects[id(obj)]]
        objects[id(obj)] = len(objects)
        state = {f.name: _value(getattr(obj, f.name), index, objects) for f in fields(obj)}
        return ["o", _class_name(type(obj)), state]
    raise TypeError(f"a schedule holds a {type(obj).__name__}, which the cache cannot store")


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _class(name: str) -> type:
    """A class the cache may build: a dataclass or enum of Ember's own; nothing else is looked up."""
    module, _, qual = name.partition(":")
    if not (module == "ember" or module.startswith("ember.")) or module not in sys.modules:
        raise ValueError(f"class {name!r} is not Ember's")
    cls: Any = sys.modules[module]
    for part in qual.split("."):
        cls = getattr(cls, part)
    if not (isinstance(cls, type) and (is_dataclass(cls) or issubclass(cls, Enum))):
        raise ValueError(f"{name!r} is not a dataclass or an enum")
    return cls


def _build(v: Any, nodes: list[Node], objects: list[Any]) -> Any:
    if not isinstance(v, list):
        return v
    tag, rest = v[0], v[1:]
    if tag == "f":
        return float.fromhex(rest[0])
    if tag == "n":
        return nodes[rest[0]]
    if tag == "t":
        return BY_NAME[rest[0]]
    if tag == "e":
        return _class(rest[0])[rest[1]]
    if tag in ("()", "[]", "{}", "f{}"):
        kind = {"()": tuple, "[]": list, "{}": set, "f{}": frozenset}[tag]
        return kind(_build(x, nodes, objects) for x in rest)
    if tag == "d":
        return {_build(k, nodes, objects): _build(x, nodes, objects) for k, x in rest}
    if tag == "r":
        return objects[rest[0]]
    if tag == "o":
        cls = _class(rest[0])
        obj = object.__new__(cls)   # the stored state, as it was: no __init__ or __post_init__ runs
        objects.append(obj)
        names = {f.name for f in fields(cls)}
        for name, x in rest[1].items():
            if name not in names:
                raise ValueError(f"{rest[0]} has no field {name!r}")
            object.__setattr__(obj, name, _build(x, nodes, objects))
        return obj
    raise ValueError(f"unknown tag {tag!r}")


def _path(k: str) -> Path:
    from ..cache import cache_dir
    return cache_dir("schedules") / f"{k}.json"


def save(k: str, value: Any) -> None:
    """Store value (a schedule) under key k, as JSON behind its own sha256; written whole or not at all."""
    roots: list[Node] = []
    _nodes_in(value, roots, set())
    table, index = _encode_node_table(roots)
    body = json.dumps({"format": FORMAT, "nodes": table, "value": _value(value, index, {})},
                      separators=(",", ":")).encode()
    path = _path(k)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    os.replace(tmp, path)


def load(k: str) -> Any | None:
    """The value stored under key k, or None (never stored, or damaged: compiled again). Loading
    builds only nodes, dtypes and Ember's own dataclasses and enums: no stored byte can run code."""
    path = _path(k)
    if not path.exists() or debug.level() >= 3:   # level 3 prints the stages' graphs: compile them
        return None
    try:
        digest, _, body = path.read_bytes().partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise ValueError("its content does not match its hash")
        stored = json.loads(body)
        if stored["format"] != FORMAT:
            raise ValueError(f"format {stored['format']}, not {FORMAT}")
        nodes: list[Node] = []
        for op, dtype, srcs, arg, shape in stored["nodes"]:
            nodes.append(Node(Op[op], BY_NAME[dtype], tuple(nodes[i] for i in srcs), _build(arg, nodes, []),
                              tuple(shape)))
        return _build(stored["value"], nodes, [])
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        debug.log(1, f"ember: schedule cache {path} damaged ({e}); compiling again")
        return None
