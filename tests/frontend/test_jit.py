"""ember.jit: a replayed step gives exactly what running it as written gives (losses, weights,
optimizer state, batch-norm statistics), without running its Python; what it cannot replay
runs as written, with a warning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ember
import ember.tensor as et
from ember import functional as F
from ember import nn, optim, runners
from ember.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: et.Tensor) -> et.Tensor:
        return self.head(self.drop(F.relu(self.norm(self.conv(x))).mean((2, 3))))


def train(make, opt_cls, batch, use_jit: bool, steps: int = 5) -> tuple:  # type: ignore[no-untyped-def]
    et.manual_seed(0)
    model = make()
    opt = opt_cls(model.parameters(), lr=0.05)
    calls = [0]

    def step(x: et.Tensor, y: et.Tensor) -> et.Tensor:
        calls[0] += 1
        opt.zero_grad()
        loss = model.loss(x, y) if hasattr(model, "loss") else F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = ember.jit(step) if use_jit else step
    rng = np.random.default_rng(0)
    losses = [run(*batch(rng)).item() for _ in range(steps)]
    state = [t.numpy().copy() for t in model.parameters()]
    state += [t.numpy().copy() for m in model.modules() if isinstance(m, nn.BatchNorm2d)
              for t in (m.running_mean, m.running_var)]
    return losses, calls[0], state


def tokens(rng: np.random.Generator) -> tuple:
    tok = rng.integers(0, 64, (4, 17))
    return et.Tensor(tok[:, :-1]), et.Tensor(tok[:, 1:])


def images(rng: np.random.Generator) -> tuple:
    return et.Tensor(rng.standard_normal((6, 3, 8, 8)).astype(np.float32)), et.Tensor(rng.integers(0, 4, 6))


@pytest.mark.parametrize("case", ["gpt_adamw", "cnn_batchnorm_sgd"])
def test_replay_matches_running_as_written(case: str) -> None:
    if case == "gpt_adamw":
        args = (lambda: GPT(GPTConfig(vocab=64, block=16, n_layer=1, n_head=2, dim=32)), optim.AdamW, tokens)
    else:
        args = (Net, lambda p, lr: optim.SGD(p, lr=lr, momentum=0.9), images)
    eager, eager_calls, eager_state = train(*args, use_jit=False)
    jitted, jit_calls, jit_state = train(*args, use_jit=True)
    assert jitted == eager and eager_calls == 5 and jit_calls == 2
    assert all(np.array_equal(a, b) for a, b in zip(jit_state, eager_state))


def test_random_draws_run_as_written() -> None:
    args = (lambda: Net(dropout=0.5), optim.AdamW, images)
    eager, _, eager_state = train(*args, use_jit=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        jitted, calls, jit_state = train(*args, use_jit=True)
    assert calls == 5 and jitted == eager
    assert any("different data" in str(w.message) for w in seen)


def test_new_argument_shapes_trace_again() -> None:
    w = et.Tensor(np.ones((3,), np.float32))
    calls = [0]

    def f(x: et.Tensor) -> et.Tensor:
        calls[0] += 1
        return (x * w).sum()

    g = ember.jit(f)
    for n in (2, 2, 2, 4, 4, 4):
        x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
        assert g(et.Tensor(x)).item() == (x * 1.0).sum()
    assert calls[0] == 4  # two calls to capture each shape


def test_a_value_made_on_the_host_inside_the_step_runs_as_written() -> None:
    """A leaf given data made in Python inside the step cannot be replayed: one warning, and
    every call runs the function as written (here, counting its calls in a tensor)."""
    count = et.Tensor(np.zeros(1, np.float32))
    calls = [0]

    def f(x: et.Tensor) -> et.Tensor:
        calls[0] += 1
        count.assign(et.Tensor(np.array([calls[0]], np.float32)))
        return (x * count).sum()

    g = ember.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [g(et.Tensor(np.ones(3, np.float32))).item() for _ in range(4)]
    assert got == [3.0, 6.0, 9.0, 12.0] and calls[0] == 4
    assert sum("no program of the step computed" in str(w.message) for w in seen) == 1


def test_tensors_made_after_others_died_are_told_apart(monkeypatch) -> None:
    """DataParallel's backward() (here on one process: averaging is left out) realizes the
    gradients and replaces them by detached leaves, and the step returns a detached loss: the
    tensors the trace keyed by id die inside the call, and their ids must not be taken for the
    new tensors' (ember train --gpus 2 read a gradient for the loss)."""
    execute = et.execute
    monkeypatch.setattr(et, "execute", lambda canonical, values, average=(), donate=(): execute(canonical, values))

    def losses(jit: bool) -> list[float]:
        et.manual_seed(0)
        model = GPT(GPTConfig(vocab=32, block=8, dim=16, n_layer=1, n_head=2))
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        monkeypatch.setattr(et.context, "averaged", {p.node for p in model.parameters()})

        def step(x: et.Tensor, y: et.Tensor) -> et.Tensor:
            opt.zero_grad()
            loss = model.loss(x, y)
            loss.backward()
            loss = loss.detach()
            opt.step()
            return loss
        run = ember.jit(step) if jit else step
        rng = np.random.default_rng(0)
        tokens = [rng.integers(0, 32, (2, 9)).astype(np.int32) for _ in range(5)]
        return [run(et.Tensor(t[:, :-1]), et.Tensor(t[:, 1:])).item() for t in tokens]
    assert losses(True) == losses(False)
