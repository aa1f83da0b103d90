"""Figures for the PyTorch comparison: one forward and backward of the GPT in Ember and in
PyTorch (float64) on the same weights and batch; prints the relative difference of the loss
and of every gradient.    python tests/tools/gpt_vs_torch.py"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ember.tensor as et  # noqa: E402
from ember.models.gpt import GPT, GPTConfig  # noqa: E402
from tests.frontend.test_gpt_torch import torch_gpt_loss  # noqa: E402

c = GPTConfig(block=32, dim=64, n_layer=2, n_head=4)
et.manual_seed(3)
model = GPT(c)
rng = np.random.default_rng(0)
x, y = (rng.integers(0, 256, (8, 32)).astype(np.int32) for _ in range(2))
loss = model.loss(et.tensor(x), et.tensor(y))
loss.backward()
named = dict(model.named_parameters())
et.realize(loss, *[p.grad for p in named.values()])
params = {k: torch.tensor(v.numpy(), dtype=torch.float64, requires_grad=True) for k, v in named.items()}
ref = torch_gpt_loss(params, x, y, c)
ref.backward()
print(f"config {c}")
print(f"loss: ember {loss.item():.7f}  pytorch(f64) {ref.item():.7f}  relative difference "
      f"{abs(loss.item() - ref.item()) / abs(ref.item()):.2e}")
for k, p in named.items():
    g, r = p.grad.numpy().astype(np.float64), params[k].grad.numpy()
    print(f"  grad {k:28s} max |diff| / max |grad| = {np.max(np.abs(g - r)) / (np.max(np.abs(r)) + 1e-30):.2e}")
