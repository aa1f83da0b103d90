"""Compiled schedules kept on disk, so that a second run of a program skips the compiler.

A GPT-2 step takes 4-7 s to schedule and optimize (2-core machine, H200 host); loading its
schedule takes a fraction of that. The key is the program's structure: every node of the graph
(op, dtype, shape, sources by position, arg), the target, the architecture, the plan knob
(EMBER_TC_PLAN) and the compiler's own source, so that any change to Ember misses. Hash-consing
(ir.Node) makes a loaded node the very object of the live graph that has its structure, so a
loaded schedule's params are the caller's.

Nodes are stored as one flat table, sources first, and pickled by their place in it: graphs are
thousands of nodes deep, beyond what pickle's recursion takes.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

from .. import debug
from ..ir import Node, _key, toposort

FORMAT = 1   # bump when what is stored changes shape


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
    h = hashlib.sha256(repr((FORMAT, _ember_source_hash(), options, os.environ.get("EMBER_TC_PLAN"))).encode())
    for n in order:
        h.update(repr((n.op.value, n.dtype.name, n.shape, tuple(index[id(s)] for s in n.srcs), _key(n.arg))).encode())
    h.update(repr([index[id(o)] for o in outputs]).encode())
    return h.hexdigest()[:32]


class _Ref(int):
    """A node inside another's arg (a REDUCE's ranges), by its place in the table."""


def _arg_nodes(arg: Any) -> list[Node]:
    if type(arg) is Node:
        return [arg]
    return [n for a in arg for n in _arg_nodes(a)] if isinstance(arg, tuple) else []


def _encode(arg: Any, index: dict[int, int]) -> Any:
    if type(arg) is Node:
        return _Ref(index[id(arg)])
    return tuple(_encode(a, index) for a in arg) if isinstance(arg, tuple) else arg


def _decode(arg: Any, nodes: list[Node]) -> Any:
    if type(arg) is _Ref:
        return nodes[arg]
    return tuple(_decode(a, nodes) for a in arg) if isinstance(arg, tuple) else arg


class _Pickler(pickle.Pickler):
    """Pickles a node as its place in `table`, which gets the node after what it refers to."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.index: dict[int, int] = {}
        self.table: list[tuple] = []
        self.keep: list[Node] = []   # the tabled nodes, alive while the pickle is made (ids stay theirs)

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is not Node:
            return None
        stack = [(obj, False)]   # iterative depth-first: sources and arg nodes before the node
        while stack:
            n, ready = stack.pop()
            if id(n) in self.index:
                continue
            if ready:
                self.index[id(n)] = len(self.table)
                self.table.append((n.op, n.dtype, tuple(self.index[id(s)] for s in n.srcs),
                                   _encode(n.arg, self.index), n.shape))
                self.keep.append(n)
                continue
            stack.append((n, True))
            stack.extend((d, False) for d in (*n.srcs, *_arg_nodes(n.arg)) if id(d) not in self.index)
        return self.index[id(obj)]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, nodes: list[Node]):
        super().__init__(file)
        self.nodes = nodes

    def persistent_load(self, pid: int) -> Node:
        return self.nodes[pid]


def _path(k: str) -> Path:
    from ..backend import cache_dir
    return cache_dir("schedules") / f"{k}.pkl"


def save(k: str, value: Any) -> None:
    """Store value (a schedule) under key k; written whole or not at all."""
    body = io.BytesIO()
    p = _Pickler(body)
    p.dump(value)
    path = _path(k)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps((p.table, body.getvalue()), protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(tmp, path)


def load(k: str) -> Any | None:
    """The value stored under key k, or None (never stored, or unreadable: compiled again)."""
    path = _path(k)
    if not path.exists() or debug.level() >= 3:   # level 3 prints the stages' graphs: compile them
        return None
    try:
        table, body = pickle.loads(path.read_bytes())
        nodes: list[Node] = []
        for op, dtype, srcs, arg, shape in table:
            nodes.append(Node(op, dtype, tuple(nodes[i] for i in srcs), _decode(arg, nodes), shape))
        return _Unpickler(io.BytesIO(body), nodes).load()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, IndexError, ValueError, TypeError) as e:
        debug.log(1, f"ember: schedule cache {path} unreadable ({e}); compiling again")
        return None
