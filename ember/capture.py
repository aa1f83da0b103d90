"""`ember.jit`: a training step replayed without its Python.

A lazy frontend builds the step's graph in Python every step (22 ms for a 2-layer GPT, more
than the GPU's 24 ms of kernels), while the GPU waits. `step = ember.jit(fn)` runs fn as written
twice, recording what it does: the programs it runs (each realize), where each program's
inputs come from (fn's tensor arguments, tensors that existed before the call such as weights
and optimizer state, or results of an earlier program in the step), which tensors take which
results (optimizer updates, batch-norm statistics), and the host-side updates the optimizer
makes (its step count and bias corrections, `ember.tensor.host`). When both calls did the same
thing, later calls only replay that record on the new arguments: the same compiled programs,
CUDA graphs included, and no graph is built.

As with other tracing JITs, Python side effects inside fn are not repeated, and fn must do the
same thing every call. What a replay cannot reproduce makes fn run as written, with one
warning: data made inside fn that differs between calls (random draws: dropout), a program
that differs, or arguments of other shapes (those retrace).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from . import tensor as T
from .ir import Node
from .tensor import Tensor


class Trace:
    """The events of one call: ("host", fn), ("run", canonical, sources, averaged outputs,
    donated outputs), ("assign", leaf node, (run index, output index), the run's slot for the leaf)."""

    def __init__(self, args: tuple) -> None:
        self.args = {a.node: i for i, a in enumerate(args) if isinstance(a, Tensor)}
        self.first_new = int(T.new_name()[1:])   # leaves named after this were made by the call
        self.events: list[tuple] = []
        self.outputs: dict[int, tuple[int, int]] = {}   # id(tensor) -> where its value comes from
        self.values: dict[int, tuple[int, int]] = {}    # id(value) -> the same
        self.runs = 0
        self.leaf_slots: list[dict[Node, Node]] = []   # per run: leaf node -> the slot it fed
        self.broken = ""    # why this call cannot be replayed, if it cannot
        self.alive: list = []   # what outputs and values are keyed by, alive until the call ends: an id
                                # is unique only while its object lives (a gradient replaced by a
                                # detached leaf would lend its id to a new tensor)

    def source(self, p: Node) -> tuple:
        if p in self.args:
            return ("arg", self.args[p])
        value = T._DATA[p]
        if id(value) in self.values:
            return ("result", *self.values[id(value)])
        if _order(p) < self.first_new:
            return ("leaf", p)
        return ("data", T._host(value))

    def on_run(self, canonical: list[Node], slots: dict[Node, Node], todo: list[Tensor], results: list,
               average: tuple[int, ...], donate: tuple[tuple[int, Node], ...]) -> None:
        sources = [(slot, self.source(p)) for p, slot in slots.items()]
        for i, (t, v) in enumerate(zip(todo, results)):
            self.outputs[id(t)] = self.values[id(v)] = (self.runs, i)
        self.alive += [*todo, *results]
        self.events.append(("run", tuple(canonical), sources, average, donate))
        self.leaf_slots.append({src[1]: slot for slot, src in sources if src[0] == "leaf"})
        self.runs += 1

    def on_assign(self, leaf: Tensor, source: Tensor) -> None:
        where = self.outputs.get(id(source)) or self.values.get(id(source.value()))
        if where is None or _order(leaf.node) >= self.first_new:
            self.broken = "a tensor took a value that no program of the step computed"
            return
        slot = self.leaf_slots[where[0]].get(leaf.node)   # where the run read the leaf, if it did
        self.events.append(("assign", leaf.node, where, slot))

    def on_host(self, fn: Callable[[], None]) -> None:
        self.events.append(("host", fn))

    def same(self, other: "Trace") -> bool:
        if len(self.events) != len(other.events):
            return False
        for a, b in zip(self.events, other.events):
            if a[0] != b[0] or a[0] == "assign" and a[1:] != b[1:]:
                return False
            if a[0] == "run" and (a[1:2] + a[3:] != b[1:2] + b[3:] or
                                  not all(_same_source(x, y) for x, y in zip(a[2], b[2]))):
                return False
        return True


def _order(p: Node) -> int:
    """A leaf's place in creation order (tensor.new_name); -1 for params named otherwise."""
    name = str(p.arg)
    return int(name[1:]) if name[:1] == "t" and name[1:].isdigit() else -1


def _same_source(a: tuple, b: tuple) -> bool:
    (slot_a, src_a), (slot_b, src_b) = a, b
    if slot_a is not slot_b or src_a[0] != src_b[0]:
        return False
    if src_a[0] == "data":
        return src_a[1].shape == src_b[1].shape and np.array_equal(src_a[1], src_b[1], equal_nan=True)
    return src_a[1:] == src_b[1:]


class jit:
    """`step = ember.jit(fn)`; `loss = step(x, y)`. See the module's text."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.trace: Trace | None = None      # the record replayed
        self.last: Trace | None = None       # the previous call's record, to compare with
        self.key: tuple | None = None        # the arguments' types and the other arguments
        self.returns: Any = None             # where each returned tensor comes from
        self.eager = False
        self._leaf_refs: list[_Sources] = []   # per run of the trace: its slots' sources, leaves by weak reference

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(f"ember.jit({getattr(self.fn, '__name__', 'fn')}): pass the arguments by position "
                            f"(got {', '.join(kwargs)} by name)")
        key = tuple((a.dtype, a.shape) if isinstance(a, Tensor) else a for a in args)
        if key != self.key:
            self.trace = self.last = None
            self.key = key
        if self.trace is not None:
            return self._replay(args)
        if self.eager:
            return self.fn(*args)
        trace = Trace(args)
        T.context.trace = trace
        try:
            out = self.fn(*args)
            returned = [out] if isinstance(out, Tensor) else list(out) if isinstance(out, (tuple, list)) else []
            T.realize(*[t for t in returned if isinstance(t, Tensor)])
            returns = [_returned(trace, t) if isinstance(t, Tensor) else t for t in returned]
        finally:
            T.context.trace = None
            trace.alive.clear()   # the record keeps positions, not objects: the step's values may go
        if trace.broken:
            self._give_up(trace.broken)
        elif self.last is not None and self.last.same(trace) and None not in returns:
            self.trace, self.returns = trace, (returns, isinstance(out, Tensor))
            self._leaf_refs = [_Sources(event[2]) for event in trace.events if event[0] == "run"]
        elif self.last is not None:
            self._give_up("two calls ran different programs or made different data (random draws?)")
        self.last = trace
        return out

    def _give_up(self, why: str) -> None:
        self.eager = True
        warnings.warn(f"ember.jit({getattr(self.fn, '__name__', 'fn')}): {why}; running it as written", stacklevel=3)

    def _replay(self, args: tuple) -> Any:
        assert self.trace is not None
        results: list[list] = []
        values: dict = {}   # the last run's inputs (only its: an array held longer is not updated in place)
        # this loop is on the step's critical path (the GPU idles through it): the leaves' values
        # are looked up in C (_Sources), by weak references made once (WeakKeyDictionary's own
        # lookup makes one per call: 452 a GPT-2 step)
        data, runs = T._DATA.data, iter(self._leaf_refs)
        for event in self.trace.events:
            if event[0] == "host":
                event[1]()
            elif event[0] == "run":
                run = next(runs)
                values = dict(zip(run.leaf_slots, map(data.__getitem__, run.leaf_refs)))
                for slot, src in run.others:
                    values[slot] = self._value(src, args, results)
                results.append(T.execute(list(event[1]), values, event[3], event[4]))
            else:
                _, node, (run, i), slot = event
                if run != len(results) - 1 or slot is None or results[run][i] is not values[slot]:
                    T._DATA[node] = results[run][i]   # (not when updated in place: the same array)
        returns, single = self.returns
        out = [Tensor(results[r.run][r.index], r.dtype) if isinstance(r, Returned) else r for r in returns]
        return out[0] if single else tuple(out)

    @staticmethod
    def _value(src: tuple, args: tuple, results: list[list]) -> Any:
        kind = src[0]
        if kind == "arg":
            return T._DATA[args[src[1]].node]
        if kind == "leaf":
            return T._DATA[src[1]]
        if kind == "result":
            return results[src[1]][src[2]]
        return src[1]


class _Sources:
    """A traced run's slots: those of leaves, with a weak reference to each (made once), and the
    rest with their sources (arguments, earlier results, constants)."""

    def __init__(self, sources: list[tuple]) -> None:
        leaves = [(slot, weakref.ref(src[1])) for slot, src in sources if src[0] == "leaf"]
        self.leaf_slots, self.leaf_refs = tuple(s for s, _ in leaves), tuple(r for _, r in leaves)
        self.others = [(slot, src) for slot, src in sources if src[0] != "leaf"]


class Returned(NamedTuple):
    """A returned tensor: which program's which output, and its dtype."""
    run: int
    index: int
    dtype: Any


def _returned(trace: Trace, t: Tensor) -> Returned | None:
    where = trace.outputs.get(id(t)) or trace.values.get(id(t.value()))
    return None if where is None else Returned(*where, t.dtype)

