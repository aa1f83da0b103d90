"""Random valid programs: every available compiled backend against the reference evaluator."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember import backends, ref

from .randprog import compare, random_program

COMPILED = [b for b in ("c", "cuda") if b in backends.available()]


@pytest.mark.parametrize("backend", COMPILED)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(2, 12))
def test_random_programs_match_reference(backend: str, seed: int, steps: int) -> None:
    outputs, inputs = random_program(seed, steps)
    want = ref.evaluate(outputs, inputs)
    got = backends.RUNNERS[backend](outputs, inputs)
    problem = compare(outputs, got, want)
    assert problem is None, f"seed={seed} steps={steps}: {problem}"


@pytest.mark.skipif("c" not in backends.available(), reason="no C compiler")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_split_ranges_keep_meaning(seed: int) -> None:
    """Every kernel's innermost range split into lanes (as the GPU plan does), on the C backend:
    range splitting and the re-simplification after it must not change any result."""
    from ember.backend import c
    from ember.compiler import optimize

    original = optimize.cpu_lanes

    def split_all(k: "optimize.Kernel") -> None:
        if k.ranges:
            n = k.ranges[-1].arg[1]
            f = next((f for f in (2, 3, 5) if n % f == 0), None)
            if f:
                optimize.split_range(k, k.ranges[-1], f)
        original(k)

    outputs, inputs = random_program(seed, 10)
    want = ref.evaluate(outputs, inputs)
    optimize.cpu_lanes = split_all
    try:
        prog = c.CProgram(outputs)
    finally:
        optimize.cpu_lanes = original
    from ember import data
    got = [data.from_storage(a, b.dtype)
           for a, b in zip(prog({n: data.to_storage(v, n.dtype) for n, v in inputs.items()}), prog.sched.outputs)]
    assert compare(outputs, got, want) is None, f"seed={seed}"
