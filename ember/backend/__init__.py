"""Code generators and runtimes: C for the CPU (c.py), CUDA for NVIDIA GPUs (cuda.py), sharing
the C-like renderer (render.py)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import data
from ..ir import Node


def cached(build: Callable[[list[Node]], Any]) -> Callable[[list[Node]], Any]:
    """One compiled program per list of output nodes (nodes are hash-consed: equal graphs hit)."""
    programs: dict[tuple[Node, ...], Any] = {}

    def compile(outputs: list[Node]) -> Any:
        key = tuple(outputs)
        if key not in programs:
            programs[key] = build(outputs)
        return programs[key]
    compile.programs = programs  # type: ignore[attr-defined]
    return compile


def run_values(program: Any, inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    """Run a compiled program on values as the reference evaluator holds them; returns the same."""
    stored = {n: data.to_storage(v, n.dtype) for n, v in inputs.items()}
    return [data.from_storage(a, b.dtype) for a, b in zip(program(stored), program.sched.outputs)]


def timed_values(program: Any, inputs: dict[Node, np.ndarray], runs: int) -> tuple[list[np.ndarray], list[float]]:
    """run_values, then the milliseconds of each of `runs` more runs on the same bound inputs."""
    stored = {n: data.to_storage(v, n.dtype) for n, v in inputs.items()}
    arrays, times = program.timed(stored, runs)
    return [data.from_storage(a, b.dtype) for a, b in zip(arrays, program.sched.outputs)], times
