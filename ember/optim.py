"""Optimizers. A step is one compiled program: the loss of the last backward(), every gradient
and every update come out of the same run. Values that change from step to step (the learning
rate, Adam's bias corrections) are data, not constants, so the program stays the same and is
compiled once."""
from __future__ import annotations

import numpy as np

from . import tensor as T
from .tensor import Tensor


class Optimizer:
    def __init__(self, params: list[Tensor], lr: float):
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.steps = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _advance(self) -> None:
        """The host's part of a step: the count, and the values that change with it or with the
        learning rate, given to the program as data (ember.jit repeats it on replay)."""
        self.steps += 1
        self.scalars()

    def scalars(self) -> None:
        pass

    def updates(self) -> list[tuple[Tensor, Tensor]]:
        """(tensor, its new value) pairs, built lazily."""
        raise NotImplementedError

    def step(self) -> None:
        T.host(self._advance)
        pairs = self.updates()
        loss, T.context.pending_loss = T.context.pending_loss, None
        extra = [loss] if loss is not None and loss.value() is None else []
        for target, new in pairs:   # taken at the realize: the GPU then updates in place (T._compute)
            target.assign(new, lazy=True)
        T.realize(*extra)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"steps": np.array(self.steps, np.int64)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.steps = int(state["steps"])


def _scalar(v: float) -> Tensor:
    return Tensor(np.array(v, np.float32))


class SGD(Optimizer):
    def __init__(self, params: list[Tensor], lr: float = 1e-2, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay
        self.velocity = [Tensor(np.zeros(p.shape, np.float32)) for p in self.params] if momentum else []
        self.lr_t = _scalar(lr)

    def scalars(self) -> None:
        self.lr_t.assign(_scalar(self.lr))

    def updates(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad + p * self.weight_decay if self.weight_decay else p.grad
            if self.momentum:
                v = self.velocity[i] * self.momentum + g
                out.append((self.velocity[i], v))
                g = v
            out.append((p, p - g * self.lr_t))
        return out


class AdamW(Optimizer):
    def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, lr)
        self.b1, self.b2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.m = [Tensor(np.zeros(p.shape, np.float32)) for p in self.params]
        self.v = [Tensor(np.zeros(p.shape, np.float32)) for p in self.params]
        self.step_size, self.decay, self.v_scale = _scalar(0.0), _scalar(1.0), _scalar(1.0)

    def scalars(self) -> None:
        t = self.steps
        # bias corrections and the learning rate enter as data: the program does not change
        self.step_size.assign(_scalar(self.lr / (1 - self.b1 ** t)))
        self.v_scale.assign(_scalar(1 / (1 - self.b2 ** t)))
        self.decay.assign(_scalar(1 - self.lr * self.weight_decay))

    def updates(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad
            m_new = m * self.b1 + g * (1 - self.b1)
            v_new = v * self.b2 + g * g * (1 - self.b2)
            update = m_new / ((v_new * self.v_scale).sqrt() + self.eps)
            out += [(m, m_new), (v, v_new), (p, p * self.decay - update * self.step_size)]
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        out = super().state_dict()
        for i, (m, v) in enumerate(zip(self.m, self.v)):
            out[f"m.{i}"], out[f"v.{i}"] = m.numpy(), v.numpy()
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        super().load_state_dict(state)
        for i, (m, v) in enumerate(zip(self.m, self.v)):
            m.assign(Tensor(state[f"m.{i}"]))
            v.assign(Tensor(state[f"v.{i}"]))
