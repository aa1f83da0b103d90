"""The Tensor API against numpy, its errors, autograd against finite differences, and the
captured step (a repeated training step compiles once)."""
from __future__ import annotations

import numpy as np
import pytest

import ember.tensor as et
from ember import nn, optim, runners
from ember.backend import c

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
rng = np.random.default_rng(0)


def arr(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def close(t: et.Tensor, want: np.ndarray, tol: float = 1e-5) -> None:
    got = t.numpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_elementwise_and_broadcasting() -> None:
    a, b = arr(3, 1, 4), arr(5, 1)
    ta, tb = et.tensor(a), et.tensor(b)
    close(ta + tb, a + b)
    close(ta * 2 - tb / 3, a * 2 - b / 3)
    close((ta - 1).relu(), np.maximum(a - 1, 0))
    close(ta.exp(), np.exp(a), 1e-5)
    close(ta.abs().log(), np.log(np.abs(a)), 1e-5)
    close(ta.tanh(), np.tanh(a), 1e-5)
    close(ta.sigmoid(), 1 / (1 + np.exp(-a)), 1e-5)
    close(ta.clamp(-0.5, 0.5), np.clip(a, -0.5, 0.5))
    close(et.where(ta > 0, ta, tb), np.where(a > 0, a, b))
    close(ta.pow(3), a ** 3, 1e-5)
    assert (ta > 0).dtype is et.bool_


def test_movement_and_indexing() -> None:
    a = arr(2, 3, 4)
    t = et.tensor(a)
    close(t.reshape(4, -1), a.reshape(4, -1))
    close(t.permute(2, 0, 1), a.transpose(2, 0, 1))
    close(t.transpose(0, 2), a.swapaxes(0, 2))
    close(t[1], a[1])
    close(t[:, 1:3, ::-1], a[:, 1:3, ::-1])
    close(t[..., -1], a[..., -1])
    close(t.flatten(1), a.reshape(2, 12))
    close(t.unsqueeze(1).squeeze(1), a)
    close(et.cat([t, t * 2], 1), np.concatenate([a, a * 2], 1))
    close(et.stack([t, t], 0), np.stack([a, a]))
    close(t.repeat(1, 2, 1), np.tile(a, (1, 2, 1)))
    close(t.pad((1, 2)), np.pad(a, ((0, 0), (0, 0), (1, 2))))
    idx = et.tensor(np.array([2, 0, 1, 1], np.int32))
    close(et.tensor(a[0])[idx], a[0][[2, 0, 1, 1]])


def test_reductions() -> None:
    a = arr(4, 6)
    t = et.tensor(a)
    close(t.sum(), np.array(a.sum()), 1e-4)
    close(t.mean(1), a.mean(1))
    close(t.max(0).values, a.max(0))
    close(t.min(1, keepdim=True).values, a.min(1, keepdims=True))
    values, indices = t.max(1)  # PyTorch's (values, indices); amax is the plain reduction
    close(values, a.max(1))
    assert np.array_equal(indices.numpy(), a.argmax(1)) and indices.dtype is et.int64
    close(t.amin(0), a.min(0))
    close(t.max(), np.array(a.max()))
    close(t.max(et.tensor(a * 0)), np.maximum(a, 0))
    close(t.var(1), a.var(1, ddof=1), 1e-5)
    close(t.std(0, correction=0), a.std(0), 1e-5)
    close(t.softmax(-1), np.exp(a) / np.exp(a).sum(-1, keepdims=True))
    close(t.logsumexp(1), np.log(np.exp(a).sum(1)), 1e-5)
    close(t.log_softmax(0), a - np.log(np.exp(a).sum(0, keepdims=True)), 1e-5)
    assert (t.argmax(1).numpy() == a.argmax(1)).all()


def test_matmul_shapes() -> None:
    a, b, v = arr(2, 3, 4), arr(4, 5), arr(4)
    close(et.tensor(a) @ et.tensor(b), a @ b, 1e-5)
    close(et.tensor(a) @ et.tensor(v), a @ v, 1e-5)
    close(et.tensor(b).T @ et.tensor(b), b.T @ b, 1e-5)
    c = arr(3, 5)   # x @ W.T (the linear layer's form) and a permute that leaves the order as it is
    close(et.tensor(c) @ et.tensor(b).T, c @ b.T, 1e-5)
    close(et.tensor(b) @ et.tensor(c).permute(0, 1).T, b @ c.T, 1e-5)
    close(et.tensor(c) @ et.tensor(b.T).permute(0, 1), c @ b.T, 1e-5)


def test_errors_name_the_call_and_shapes() -> None:
    with pytest.raises(et.ShapeError, match=r"matmul: \[2, 3\] @ \[2, 3\]"):
        et.tensor(arr(2, 3)) @ et.tensor(arr(2, 3))
    with pytest.raises(et.ShapeError, match=r"add: shapes \[2, 3\] and \[4\] do not broadcast"):
        et.tensor(arr(2, 3)) + et.tensor(arr(4))
    with pytest.raises(et.ShapeError, match="reshape"):
        et.tensor(arr(2, 3)).reshape(4, 2)
    with pytest.raises(et.ShapeError, match="Linear"):
        nn.Linear(3, 2)(et.tensor(arr(4, 5)))


def test_backward_matches_finite_differences() -> None:
    x0 = arr(3, 4).astype(np.float64)
    w = arr(4, 2).astype(np.float64)

    def f(x: np.ndarray) -> float:
        h = np.tanh(x @ w)
        return float((h * h).sum() + np.log(np.exp(x).sum()))
    x = et.tensor(x0, dtype=et.float64, requires_grad=True)
    h = (x @ et.tensor(w, dtype=et.float64)).tanh()
    loss = (h * h).sum() + x.exp().sum().log()
    loss.backward()
    eps, fd = 1e-6, np.zeros_like(x0)
    for i in range(x0.size):
        e = np.zeros_like(x0)
        e.flat[i] = eps
        fd.flat[i] = (f(x0 + e) - f(x0 - e)) / (2 * eps)
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-6, atol=1e-8)


def test_rand_is_seeded_and_uniform() -> None:
    et.manual_seed(7)
    a = et.rand(4000).numpy()
    et.manual_seed(7)
    assert (et.rand(4000).numpy() == a).all()
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.02
    n = et.randn(20000).numpy()
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03


def test_training_step_compiles_once() -> None:
    et.manual_seed(0)
    model = nn.Linear(5, 3)
    opt = optim.AdamW(model.parameters(), lr=0.1)
    losses, data = [], arr(6, 5)
    for step in range(8):
        x = et.tensor(data)  # a new tensor every step, as from a data loader
        y = et.tensor(np.arange(6, dtype=np.int32) % 3)
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 1:
            programs = len(c.program.programs)
    assert len(c.program.programs) == programs  # steps 2..7 replayed the compiled program
    assert losses[-1] < losses[0]


def test_state_dict_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    et.manual_seed(1)
    model = nn.Linear(4, 2)
    nn.save_safetensors(model.state_dict(), tmp_path / "m.safetensors")
    arrays, _ = nn.load_safetensors(tmp_path / "m.safetensors")
    other = nn.Linear(4, 2)
    other.load_state_dict(arrays)
    x = et.tensor(arr(3, 4))
    close(other(x), model(x).numpy())
    try:
        from safetensors.numpy import load_file  # the reference reader, where installed
    except ImportError:
        return
    ref = load_file(str(tmp_path / "m.safetensors"))
    assert set(ref) == {"weight", "bias"} and np.array_equal(ref["weight"], model.weight.numpy())


def test_random_draws_of_a_shape_share_one_program() -> None:
    """The seed is data, not a constant: five draws of one shape compile one program."""
    before = len(c.program.programs)
    draws = [et.rand(37, 3).numpy() for _ in range(5)]
    assert len(c.program.programs) - before <= 1
    assert not np.array_equal(draws[0], draws[1])
