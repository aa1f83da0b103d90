"""Which backends exist, which is the default, and running a parsed program on one of them.

A backend turns the output nodes of a program into values, given the values of its params.
The reference evaluator interprets; compiled backends generate, build and run code.
"""
from __future__ import annotations

import functools
import importlib
import statistics
import sys
import time
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from . import data, ref
from .ir import Node
from .text import Program


class BackendError(Exception):
    """A backend that cannot run here, or a program it cannot run (exit status 3)."""


@dataclass(frozen=True)
class Backend:
    """One target: its name, the frontend's device names for it, and for a compiled target the
    module that generates, builds and runs its code (ember.backend.c or ember.backend.cuda:
    available, prepare, source, program, run_values; a module with run_device keeps values in
    its device's memory between programs)."""
    name: str
    devices: tuple[str, ...]
    module: str | None = None

    @property
    def compiler(self) -> ModuleType | None:
        return importlib.import_module(f"ember.backend.{self.module}") if self.module else None

    def available(self) -> bool:
        return self.compiler is None or self.compiler.available()

    def why_unavailable(self) -> str:
        return self.compiler.why_unavailable() if self.compiler is not None else ""

    @property
    def keeps_values(self) -> bool:
        """Whether results stay on the device (run_device) instead of coming back to the host."""
        return hasattr(self.compiler, "run_device")

    def run(self, outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
        """Values of outputs, given the params' values, both as the reference evaluator holds them."""
        try:
            if self.compiler is None:
                return ref.evaluate(outputs, inputs, wide=self.name == "ref-wide", reverse=self.name == "ref-reversed")
            return self.compiler.run_values(outputs, inputs)
        except (ref.Unsupported, RuntimeError, NotImplementedError) as e:   # C's CompileError is a RuntimeError
            raise BackendError(str(e)) from None

    def source(self, outputs: list[Node], arch: str | None = None) -> str:
        """The generated source (arch: the GPU architecture, for CUDA)."""
        if self.compiler is None:
            raise BackendError(f"backend '{self.name}' generates no source (use c or cuda)")
        return self.compiler.source(outputs, arch) if self.name == "cuda" else self.compiler.source(outputs)


# ref-wide: the reference evaluator keeping every intermediate in the highest precision spec 4 allows;
# ref-reversed: its float sums added from the last element (spec 4 leaves the order free)
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("ref", ("ref",)), Backend("ref-wide", ("ref-wide",)), Backend("ref-reversed", ("ref-reversed",)),
    Backend("c", ("cpu", "c"), "c"),
    Backend("cuda", ("cuda",), "cuda"))}


def backend_of(device: object) -> str | None:
    """The backend a device name means ("cpu" and "cpu:0" are the C backend), or None."""
    name = str(device).split(":")[0]
    return next((b.name for b in BACKENDS.values() if name in b.devices), None)


def available() -> list[str]:
    return [name for name, b in BACKENDS.items() if b.available()]


def default() -> str:
    """CUDA when a GPU is present, else C when a C compiler is, else the reference evaluator."""
    found = available()
    return "cuda" if "cuda" in found else "c" if "c" in found else "ref"


def resolve(backend: str) -> str:
    """The backend that will run: a known, available one (CUDA falls back to C, said once)."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend '{backend}' (backends: {', '.join(BACKENDS)})")
    if backend == "cuda" and "cuda" not in available() and "c" in available():
        _notice_fallback()
        backend = "c"
    if backend not in available():
        here = ", ".join(available())
        raise BackendError(f"backend '{backend}' is not available on this machine (available: {here})")
    return backend


@functools.lru_cache(maxsize=None)
def _notice_fallback() -> None:
    print(f"ember: {BACKENDS['cuda'].why_unavailable()}; running on the C backend instead", file=sys.stderr)


def run_program(prog: Program, backend: str) -> list[np.ndarray]:
    """Values of the program's outputs (as the reference evaluator holds them)."""
    backend = resolve(backend)
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    return BACKENDS[backend].run(prog.output_nodes, inputs)


def bench_program(prog: Program, backend: str, runs: int) -> tuple[list[np.ndarray], float]:
    """The outputs of one run, then the median milliseconds of `runs` more runs on the same inputs
    (spec 10): compilation and host-device copies excluded, CUDA timed with events."""
    backend = resolve(backend)
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    outputs = prog.output_nodes
    compiler = BACKENDS[backend].compiler
    if compiler is None:
        values = BACKENDS[backend].run(outputs, inputs)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            ref.evaluate(outputs, inputs, wide=backend == "ref-wide", reverse=backend == "ref-reversed")
            times.append((time.perf_counter() - t) * 1e3)
    else:
        from .backend import timed_values
        try:
            values, times = timed_values(compiler.program(outputs), inputs, runs)
        except (RuntimeError, NotImplementedError) as e:   # C's CompileError is a RuntimeError
            raise BackendError(str(e)) from None
    return values, statistics.median(times)


def output_lines(prog: Program, values: list[np.ndarray]) -> list[str]:
    return [f"{name} = {data.format_values(v, prog.nodes[name].dtype)}" for name, v in zip(prog.outputs, values)]
