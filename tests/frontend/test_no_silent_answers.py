"""Calls that PyTorch refuses are refused, not answered: a class index past the class count,
integer division by zero. And gelu's zeros take its formula's sign."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ember.functional as F
import ember.tensor as et

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("target", [[0, 3], [-1, 0], [7]])
def test_cross_entropy_target_out_of_range_raises(target: list[int]) -> None:
    logits = np.zeros((len(target), 3), np.float32)
    with pytest.raises(IndexError):
        torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(target))
    with pytest.raises(IndexError, match=f"target {target[-1] if target != [-1, 0] else -1} is out of bounds"):
        F.cross_entropy(et.tensor(logits), et.tensor(target))
    with pytest.raises(IndexError):
        F.nll_loss(et.tensor(logits), et.tensor(target))


def test_cross_entropy_of_a_single_sample_and_ignored_targets() -> None:
    with pytest.raises(IndexError):
        F.cross_entropy(et.tensor(np.zeros(3, np.float32)), et.tensor(5))
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor([2, -100])).item()
    assert F.cross_entropy(et.tensor(logits), et.tensor([2, -100])).item() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("op", ["floordiv", "mod", "trunc", "rfloordiv", "tensor"])
def test_integer_division_by_zero_raises(op: str) -> None:
    calls = {"floordiv": lambda t, m: t.tensor([1, 2]) // 0, "mod": lambda t, m: t.tensor([1, 2]) % 0,
             "trunc": lambda t, m: t.tensor([1, 2]).div(0, rounding_mode="trunc"),
             "rfloordiv": lambda t, m: 5 // t.tensor([1, 0]),
             "tensor": lambda t, m: t.tensor([4, 6]) // t.tensor([2, 0])}
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        calls[op](torch, None)
    with pytest.raises(ZeroDivisionError):
        calls[op](et, None)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):   # torch's exception type, too
        calls[op](et, None)


def test_division_by_nonzero_and_float_division_by_zero_still_compute() -> None:
    a = [7, -7, 3]
    assert (et.tensor(a) // 2).tolist() == (torch.tensor(a) // 2).tolist()
    assert (et.tensor(a) % et.tensor([2, 3, -2])).tolist() == (torch.tensor(a) % torch.tensor([2, 3, -2])).tolist()
    assert (et.tensor(a) / 0).tolist() == (torch.tensor(a) / 0).tolist()
    assert (et.tensor([1.5]) // 0).tolist() == (torch.tensor([1.5]) // 0).tolist()


def test_gelu_zeros_have_the_formulas_sign() -> None:
    # x/2 (1 + erf(x/sqrt2)): where erf reaches -1, x/2 times +0, so -0 for x < 0. PyTorch's own
    # sign there is its build's: -0 (torch 2.13.0 on an Intel Xeon, every ATEN_CPU_CAPABILITY),
    # +0 (the same version on an AMD EPYC host), so the sign is pinned to the formula
    v = np.array([-1000.0, -90.0, -20.0, -10.0, -0.0, 0.0, 1e-30], np.float32)
    got, want = F.gelu(et.tensor(v)).numpy(), torch.nn.functional.gelu(torch.tensor(v)).numpy()
    np.testing.assert_array_equal(got, want)
    formula = np.array([x * np.float32(0.5) * np.float32(1 + math.erf(x / math.sqrt(2))) for x in v], np.float32)
    assert (np.signbit(got) == np.signbit(formula)).all() and np.signbit(got[:5]).all()
