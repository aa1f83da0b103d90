"""Figures for the PyTorch comparison: one forward and backward of the GPT in Ember and in
PyTorch (float64) on the same weights and batch; prints the relative difference of the loss
and of every gradient.    python tests/tools/gpt_vs_torch.py"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ember.models.gpt import GPTConfig  # noqa: E402
from tests.frontend.test_gpt_torch import compare_with_pytorch  # noqa: E402

config = GPTConfig(block=32, dim=64, n_layer=2, n_head=4)
loss_diff, grads = compare_with_pytorch(config, batch=8)
print(f"config {config}, batch 8")
print(f"loss relative difference {loss_diff:.2e}")
for name, diff in grads.items():
    print(f"  grad {name:28s} max |diff| / max |grad| = {diff:.2e}")
print(f"worst gradient {max(grads.values()):.2e}")
