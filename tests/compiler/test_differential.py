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
