"""Random valid programs: every available compiled backend against the reference evaluator."""
from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember import ref, runners
from ember.compiler import optimize

from .randprog import compare, random_program

COMPILED = [b for b in ("c", "cuda") if b in runners.available()]


@pytest.mark.parametrize("backend", COMPILED)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(2, 12))
def test_random_programs_match_reference(backend: str, seed: int, steps: int) -> None:
    outputs, inputs = random_program(seed, steps)
    want = ref.evaluate(outputs, inputs)
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as cache:
        mp.setattr(optimize, "TILE_WORK", 0)   # the C backend's lanes for these small kernels too,
        mp.setenv("EMBER_CACHE", cache)        # and no schedule cached without them
        got = runners.BACKENDS[backend].run(outputs, inputs)
    problem = compare(outputs, got, want)
    assert problem is None, f"seed={seed} steps={steps}: {problem}"


@pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_split_ranges_keep_meaning(seed: int) -> None:
    """Every kernel's innermost range split into lanes (as the GPU plan does), on the C backend:
    range splitting and the re-simplification after it must not change any result."""
    from ember.backend import c

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


def _fuzzer():  # type: ignore[no-untyped-def]
    import importlib.util
    from pathlib import Path
    path = Path(__file__).parents[1] / "tools" / "fuzz_backends.py"
    spec = importlib.util.spec_from_file_location("fuzz_backends", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
def test_fixed_fuzz_batch_on_c() -> None:
    """A CI-sized batch of the bulk fuzzer (seeds of its 10,000-program run), with its verdicts."""
    assert _fuzzer().fuzz(range(1000000, 1000040), "c", 10) == []


def test_minimizer_deletes_what_the_failure_does_not_need() -> None:
    from pathlib import Path

    from ember.text import parse
    text = (Path(__file__).parent / "toolchain" / "ptxas13_vimnmx3_neg.eir").read_text()
    small = _fuzzer().minimize(text, lambda t: " = neg " in t and " = and " in t)
    prog = parse(small, "small.eir")
    ops = [line.split()[2] for line in small.splitlines() if " = " in line and not line.startswith(("input", "expect"))]
    assert "neg" in ops and "and" in ops and "where" not in ops and len(prog.nodes) == 5, small  # param, const, and, neg, max
