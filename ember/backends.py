"""Which backends exist, which is the default, and running a parsed program on one of them.

A backend turns the output nodes of a program into values, given the values of its params.
The reference evaluator interprets; compiled backends generate, build and run code.
"""
from __future__ import annotations

import functools
import statistics
import sys
import time
from typing import Callable

import numpy as np

from . import data, ref
from .ir import Node
from .text import Program


class BackendError(Exception):
    """A backend that cannot run here, or a program it cannot run (exit status 3)."""


def _run_ref(outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    try:
        return ref.evaluate(outputs, inputs)
    except ref.Unsupported as e:
        raise BackendError(str(e)) from None


def _run_c(outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    from .backend import c
    try:
        return c.run_values(outputs, inputs)
    except (c.CompileError, NotImplementedError) as e:
        raise BackendError(str(e)) from None


def _run_cuda(outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    from .backend import cuda
    try:
        return cuda.run_values(outputs, inputs)
    except (RuntimeError, NotImplementedError) as e:
        raise BackendError(str(e)) from None


RUNNERS: dict[str, Callable[[list[Node], dict[Node, np.ndarray]], list[np.ndarray]]] = {
    "ref": _run_ref, "c": _run_c, "cuda": _run_cuda}


DEVICES = {"cpu": "c", "c": "c", "cuda": "cuda", "ref": "ref"}   # the frontend's device names -> backends


def backend_of(device: object) -> str | None:
    """The backend a device name means ("cpu" and "cpu:0" are the C backend), or None."""
    return DEVICES.get(str(device).split(":")[0])


def available() -> list[str]:
    found = ["ref"]
    from .backend import c, cuda
    if c.available():
        found.append("c")
    if cuda.available():
        found.append("cuda")
    return found


def default() -> str:
    """CUDA when a GPU is present, else C when a C compiler is, else the reference evaluator."""
    found = available()
    return "cuda" if "cuda" in found else "c" if "c" in found else "ref"


def resolve(backend: str) -> str:
    """The backend that will run: a known, available one (CUDA falls back to C, said once)."""
    if backend not in RUNNERS:
        raise BackendError(f"unknown backend '{backend}' (backends: {', '.join(RUNNERS)})")
    if backend == "cuda" and "cuda" not in available() and "c" in available():
        _notice_fallback()
        backend = "c"
    if backend not in available():
        here = ", ".join(available())
        raise BackendError(f"backend '{backend}' is not available on this machine (available: {here})")
    return backend


@functools.lru_cache(maxsize=None)
def _notice_fallback() -> None:
    from .backend import cuda
    print(f"ember: {cuda.why_unavailable()}; running on the C backend instead", file=sys.stderr)


def run_program(prog: Program, backend: str) -> list[np.ndarray]:
    """Values of the program's outputs (as the reference evaluator holds them)."""
    backend = resolve(backend)
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    return RUNNERS[backend](prog.output_nodes, inputs)


def bench_program(prog: Program, backend: str, runs: int) -> tuple[list[np.ndarray], float]:
    """The outputs of one run, then the median milliseconds of `runs` more runs on the same inputs
    (spec 10): compilation and host-device copies excluded, CUDA timed with events."""
    backend = resolve(backend)
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    outputs = prog.output_nodes
    if backend == "ref":
        values = _run_ref(outputs, inputs)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            ref.evaluate(outputs, inputs)
            times.append((time.perf_counter() - t) * 1e3)
    else:
        from .backend import c, cuda, timed_values
        try:
            values, times = timed_values((c if backend == "c" else cuda).compile(outputs), inputs, runs)
        except (c.CompileError, RuntimeError, NotImplementedError) as e:
            raise BackendError(str(e)) from None
    return values, statistics.median(times)


def output_lines(prog: Program, values: list[np.ndarray]) -> list[str]:
    return [f"{name} = {data.format_values(v, prog.nodes[name].dtype)}" for name, v in zip(prog.outputs, values)]
