"""Code generators and runtimes: C for the CPU (c.py), CUDA for NVIDIA GPUs (cuda.py), sharing
the C-like renderer (render.py)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import data
from ..ir import Node


def cached(make: Callable[[list[Node]], Any]) -> Callable[[list[Node]], Any]:
    """One compiled program per list of output nodes (nodes are hash-consed: equal graphs hit)."""
    programs: dict[tuple[Node, ...], Any] = {}

    def program(outputs: list[Node]) -> Any:
        key = tuple(outputs)
        if key not in programs:
            programs[key] = make(outputs)
        return programs[key]
    program.programs = programs  # type: ignore[attr-defined]
    return program


def run_values(program: Any, inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    """Run a compiled program on values as the reference evaluator holds them; returns the same."""
    return _values(program, program(_stored(inputs)))


def timed_values(program: Any, inputs: dict[Node, np.ndarray], runs: int) -> tuple[list[np.ndarray], list[float]]:
    """run_values, then the milliseconds of each of `runs` more runs on the same bound inputs."""
    arrays, times = program.timed(_stored(inputs), runs)
    return _values(program, arrays), times


def _stored(inputs: dict[Node, np.ndarray]) -> dict[Node, np.ndarray]:
    return {n: data.to_storage(v, n.dtype) for n, v in inputs.items()}


def _values(program: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [data.from_storage(a, b.dtype) for a, b in zip(arrays, program.sched.outputs)]
