"""EMBER_DEBUG: 1 lists the kernels run with their times, 2 adds generated source, 3 the graph
after each pass. Everything goes to stderr, so the protocol's stdout stays clean."""
from __future__ import annotations

import os
import sys

from .ir import Node


def level() -> int:
    try:
        return int(os.environ.get("EMBER_DEBUG", "0") or 0)
    except ValueError:
        return 0


def log(at: int, msg: str) -> None:
    if level() >= at:
        print(msg, file=sys.stderr)


def graph(at: int, title: str, outputs: list[Node]) -> None:
    if level() >= at:
        from .text import print_graph
        log(at, f"--- graph {title}\n" + "\n".join(print_graph(outputs)))


def plans(at: int, title: str, kernels: list) -> None:
    """Each kernel's plan (its family's value: compiler/loops.py, a contraction's tiling, a flash
    plan), with the lanes optimize split off and whether its store adds (a scatter)."""
    if level() < at:
        return
    out = [f"--- plans {title}"]
    for k in kernels:
        what = f"{k.plan}" + (f", lanes {sorted(r.arg[0] for r in k.lanes)}" if k.lanes else "") + (
            ", atomic" if k.atomic else "")
        out.append(f"{k.name} {k.kind}: {what}")
    log(at, "\n".join(out))


def kernels(at: int, title: str, kernels: list) -> None:
    """Each kernel's loops and its expression, one SSA line per node (kernel-level IR)."""
    if level() < at:
        return
    from .ir import toposort
    out = [f"--- kernels {title}"]
    for k in kernels:
        plan = f" [{k.plan}]" if getattr(k, "plan", None) is not None else ""
        out.append(f"{k.name}: ranges {[r.arg for r in k.ranges]} lanes {sorted(r.arg[0] for r in k.lanes)}{plan}")
        names: dict = {}
        for i, n in enumerate(toposort([k.store])):
            names[n] = f"%{i}"
            args = " ".join(names[s] for s in n.srcs)
            if n.op.name == "REDUCE":
                arg = f" {n.arg[0].name.lower()} over {[r.arg[0] for r in n.arg[1]]}"
            else:
                arg = "" if n.arg is None else f" {n.arg!r}"
            out.append(f"  %{i} = {n.op.name.lower()} {n.dtype}{arg} {args}".rstrip())
    log(at, "\n".join(out))
