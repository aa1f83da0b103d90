"""tests/tools/torch_sweep.py as a test: every method and function Ember shares with PyTorch, on
ordinary and edge inputs (empty, 0-d, odd shapes, inf, NaN, -0.0, ties), forward and gradients,
against PyTorch. It runs on the reference evaluator (the IR's semantics, seconds instead of a
compiled program per call: the backends' agreement with it is tested on their own); the tool
runs the same sweep on the default device. The disagreements left are listed with the reason."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
import torch_sweep  # noqa: E402

import ember.tensor as et  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")   # PyTorch on the calls it warns about

NAN_GRADIENT = "a NaN input's gradient: PyTorch gives every element NaN, or shares it among the NaNs"
HUGE = "|x| = 1e30: reduced by pi/2 in f64, exact only to |x| ~ 1e9 (no Payne-Hanek reduction)"
KNOWN = {
    ("methods, forward", "cos special"): HUGE, ("methods, forward", "tan special"): HUGE,
    ("functions, forward", "cos special"): HUGE, ("functions, forward", "tan special"): HUGE,
    **{("methods, gradients", f"{op} {case}"): HUGE for op in ("cos", "sin", "tan") for case in ("special",)},
    **{("methods, gradients", f"{op} {case}"): NAN_GRADIENT
       for op in ("amax", "amin", "aminmax", "max", "min", "median") for case in ("special", "ties", "ties,dim1")},
    **{("methods, gradients", f"{op} {case}"): "abs's gradient at NaN is 1 (PyTorch: 0), so that the NaN reaches "
       "the gradients of the formulas built on abs" for op in ("abs", "absolute", "norm")
       for case in ("special", "ties", "ties,dim1")},
    ("methods, gradients", "copysign ties,dim1"): "PyTorch's gradient is result / x: inf / inf is NaN",
    ("methods, gradients", "var ties,dim1"): "a row with NaNs: PyTorch's gradient is inf",
    ("methods, gradients", "prod special"): "zeros, infinities and NaN together: PyTorch gives 0",
    ("methods, gradients", "cumprod ties,dim1"): "a running product through -inf: PyTorch gives inf and NaN",
    ("methods, gradients", "fmod ties,dim1"): "fmod(-inf, 1) is NaN: PyTorch's gradient is 1, Ember's 0",
    ("methods, gradients", "remainder ties,dim1"): "as fmod",
    ("methods, gradients", "kthvalue ties,dim1"): "which of equal elements is the k-th: PyTorch picks another",
}


@pytest.fixture(scope="module")
def report() -> list:
    saved = et.context.device
    et.set_default_device("ref")
    try:
        return torch_sweep.sweep()
    finally:
        et.context.device = saved


@pytest.mark.parametrize("title", ["methods, forward", "methods, gradients", "functions, forward"])
def test_agrees_with_pytorch(report: list, title: str) -> None:
    tally = dict(report)[title]
    assert tally.run > 300, tally.line(title)
    assert not tally.raised, tally.raised
    unexplained = [(label, why) for label, why in tally.wrong if (title, label) not in KNOWN]
    assert not unexplained, unexplained
