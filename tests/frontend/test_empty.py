"""Tensors with an empty dim, against PyTorch: the frontend computes them without the compiler
(an empty result needs no kernel; reductions over nothing, padding and concatenation of
nothing become constants), and the text format still rejects a dim of 0 (spec 2)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ember.tensor as et
from ember import text
from ember.tensor import ShapeError

X = np.zeros((0, 3), np.float32)
Y = np.arange(6, dtype=np.float32).reshape(2, 3)
IDX = np.zeros(0, np.int64)

CASES = {
    "sum over the empty dim": lambda m, x, y: x.sum(0),
    "sum over the other dim": lambda m, x, y: x.sum(1),
    "sum of all": lambda m, x, y: x.sum(),
    "mean (NaN)": lambda m, x, y: x.mean(0),
    "prod (ones)": lambda m, x, y: x.prod(0),
    "any": lambda m, x, y: (x > 0).any(0),
    "all": lambda m, x, y: (x > 0).all(0),
    "broadcast with a dim of 1": lambda m, x, y: x + y[:1],
    "cat with an empty piece": lambda m, x, y: m.cat([x, y]),
    "empty slice": lambda m, x, y: y[1:1],
    "empty column slice": lambda m, x, y: y[:, 2:1],
    "matmul over K = 0": lambda m, x, y: x.t() @ x,
    "pad of nothing": lambda m, x, y: m.nn.functional.pad(x, [1, 1, 0, 2], value=3.0) if m is torch
    else x.pad([1, 1, 0, 2], value=3.0),
    "arange": lambda m, x, y: m.arange(3, 3),
    "zeros": lambda m, x, y: m.zeros(0, 4),
    "mask selecting nothing": lambda m, x, y: y[y > 100],
    "nonzero of nothing": lambda m, x, y: (y > 100).nonzero(),
    "reshape": lambda m, x, y: x.reshape(3, 0),
    "exp": lambda m, x, y: x.exp(),
    "transpose": lambda m, x, y: x.t(),
    "index_select with no index": lambda m, x, y: y.index_select(0, m.zeros(0, dtype=m.int64)),
    "softmax": lambda m, x, y: x.softmax(-1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_empty_dims_match_pytorch(name: str) -> None:
    fn = CASES[name]
    with np.errstate(all="ignore"):
        want = fn(torch, torch.tensor(X), torch.tensor(Y)).numpy()
        got = fn(et, et.Tensor(X), et.Tensor(Y)).numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_an_empty_result_runs_no_program() -> None:
    before = et.context.runs
    assert (et.Tensor(X).exp() * 2 + 1).numpy().shape == (0, 3)
    assert et.context.runs == before


def test_max_over_nothing_is_an_error() -> None:
    with pytest.raises(ShapeError, match="empty dim"):
        et.Tensor(X).max(0)


def test_the_text_format_rejects_a_dim_of_0() -> None:
    for line, src in ((2, "ember 1\nx = param f32[0,3]\nreturn x\n"),
                      (3, "ember 1\nx = param f32[3]\ny = shrink x start=[1] end=[1]\nreturn y\n")):
        with pytest.raises(text.EirError, match=f":{line}: .*>= 1"):
            text.parse(src)
