"""Optimizers. A step is one compiled program: the loss of the last backward(), every gradient
and every update come out of the same run. Values that change from step to step (the learning
rate, Adam's bias corrections) are data, not constants, so the program stays the same and is
compiled once. As PyTorch's, they take parameters or param_groups (dicts with "params" and
their own options); `optimizer.param_groups[i]["lr"]` is read at every step (lr_scheduler)."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import lr_scheduler
from . import tensor as T
from .tensor import Tensor

sys.modules[f"{__name__}.lr_scheduler"] = lr_scheduler


class Optimizer:
    def __init__(self, params: Any, defaults: dict[str, Any]):
        self.defaults = defaults
        self.param_groups: list[dict[str, Any]] = []
        self.steps = 0
        groups = list(params)
        for g in groups if groups and isinstance(groups[0], dict) else [{"params": groups}]:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        params = group["params"]
        group = {**self.defaults, **group, "params": [params] if isinstance(params, Tensor) else list(params)}
        unknown = set(group) - set(self.defaults) - {"params", "initial_lr"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown options {sorted(unknown)} in a param group")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        group["state"] = [self.new_state(p, group) for p in group["params"]]
        group["scalars"] = {k: _scalar(0.0) for k in self.scalar_names}
        self.param_groups.append(group)

    @property
    def params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    @property
    def lr(self) -> float:
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:   # every group's (ember train's schedule)
        for g in self.param_groups:
            g["lr"] = value

    scalar_names: tuple[str, ...] = ()

    def new_state(self, p: Tensor, group: dict[str, Any]) -> list[Tensor]:
        return []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None if set_to_none or p.grad is None else T.zeros_like(p.grad)

    def _advance(self) -> None:
        """The host's part of a step: the count, and the values that change with it or with the
        learning rate, given to the program as data (ember.jit repeats it on replay)."""
        self.steps += 1
        for g in self.param_groups:
            for name, value in self.scalars(g).items():
                g["scalars"][name].assign(_scalar(value))

    def scalars(self, group: dict[str, Any]) -> dict[str, float]:
        return {}

    def update(self, p: Tensor, state: list[Tensor], group: dict[str, Any]) -> list[tuple[Tensor, Tensor]]:
        """(tensor, its new value) pairs for one parameter, built lazily."""
        raise NotImplementedError

    def updates(self) -> list[tuple[Tensor, Tensor]]:
        return [pair for g in self.param_groups for p, s in zip(g["params"], g["state"])
                if p.requires_grad and p.grad is not None for pair in self.update(p, s, g)]

    def step(self, closure: Any = None) -> Any:
        result = closure() if closure is not None else None
        T.host(self._advance)
        pairs = self.updates()
        loss, T.context.pending_loss = T.context.pending_loss, None
        extra = [loss] if loss is not None and loss.value() is None else []
        for target, new in pairs:   # taken at the realize: the GPU then updates in place (T._compute)
            target.assign(new, lazy=True)
        T.realize(*extra)
        return result

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat arrays (safetensors holds them): the step count, each group's options, and the
        state tensors of parameter i as "m.i", "v.i" or "velocity.i" (numbered over the groups)."""
        out = {"steps": np.array(self.steps, np.int64)}
        for i, g in enumerate(self.param_groups):
            out.update({f"group.{i}.{k}": np.array(v, np.float64) for k, v in g.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
        states = [s for g in self.param_groups for s in g["state"]]
        for i, s in enumerate(states):
            out.update({f"{name}.{i}": t.numpy() for name, t in zip(self.state_names, s)})
        return out

    state_names: tuple[str, ...] = ()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        for i, g in enumerate(self.param_groups):
            for k in [k for k in g if f"group.{i}.{k}" in state]:
                value = float(np.asarray(state[f"group.{i}.{k}"]))
                g[k] = int(value) if isinstance(g[k], int) and not isinstance(g[k], bool) else value
        states = [s for g in self.param_groups for s in g["state"]]
        for i, s in enumerate(states):
            for name, t in zip(self.state_names, s):
                t.assign(Tensor(np.asarray(state[f"{name}.{i}"]), t.dtype))


def _scalar(v: float) -> Tensor:
    return Tensor(np.array(v, np.float32))


class SGD(Optimizer):
    scalar_names, state_names = ("lr", "damp"), ("velocity",)

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def new_state(self, p: Tensor, group: dict[str, Any]) -> list[Tensor]:
        return [Tensor(np.zeros(p.shape, np.float32))] if group["momentum"] else []

    def scalars(self, group: dict[str, Any]) -> dict[str, float]:
        # PyTorch's first step takes the gradient itself as the momentum buffer: no dampening then
        return {"lr": group["lr"], "damp": 1.0 if self.steps == 1 else 1 - group["dampening"]}

    def update(self, p: Tensor, state: list[Tensor], group: dict[str, Any]) -> list[tuple[Tensor, Tensor]]:
        g, out = p.grad + p * group["weight_decay"] if group["weight_decay"] else p.grad, []
        if group["momentum"]:   # PyTorch's: the first step's buffer is the gradient itself
            (buf,) = state
            v = buf * group["momentum"] + g * group["scalars"]["damp"]
            out.append((buf, v))
            g = g + v * group["momentum"] if group["nesterov"] else v
        return out + [(p, p - g * group["scalars"]["lr"])]


class Adam(Optimizer):
    """Adam, and with decoupled weight decay AdamW; PyTorch's formulas and defaults."""
    scalar_names, state_names = ("step_size", "v_scale", "decay"), ("m", "v")
    decoupled = False

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float | None = None):
        wd = (0.01 if self.decoupled else 0.0) if weight_decay is None else weight_decay
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=wd))

    def new_state(self, p: Tensor, group: dict[str, Any]) -> list[Tensor]:
        return [Tensor(np.zeros(p.shape, np.float32)), Tensor(np.zeros(p.shape, np.float32))]

    def scalars(self, group: dict[str, Any]) -> dict[str, float]:
        (b1, b2), t, lr = group["betas"], self.steps, group["lr"]
        # bias corrections and the learning rate enter as data: the program does not change
        decay = 1 - lr * group["weight_decay"] if self.decoupled else 1.0
        return {"step_size": lr / (1 - b1 ** t), "v_scale": 1 / (1 - b2 ** t), "decay": decay}

    def update(self, p: Tensor, state: list[Tensor], group: dict[str, Any]) -> list[tuple[Tensor, Tensor]]:
        (m, v), (b1, b2), s = state, group["betas"], group["scalars"]
        g = p.grad + p * group["weight_decay"] if group["weight_decay"] and not self.decoupled else p.grad
        m_new = m * b1 + g * (1 - b1)
        v_new = v * b2 + g * g * (1 - b2)
        update = m_new / ((v_new * s["v_scale"]).sqrt() + group["eps"])
        new_p = p * s["decay"] if self.decoupled else p
        return [(m, m_new), (v, v_new), (p, new_p - update * s["step_size"])]


class AdamW(Adam):
    decoupled = True
