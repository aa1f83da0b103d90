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
