"""A small CNN trained with Ember on a synthetic task: which quadrant of a 16x16 image holds
the bright square? Run: python examples/cnn.py  (about 5 s on 2 cores, most of it the first
step's compile; later steps replay the compiled program)."""
from __future__ import annotations

import numpy as np

import ember.tensor as et
from ember import functional as F
from ember import nn, optim


def batch(rng: np.random.Generator, n: int) -> tuple[et.Tensor, et.Tensor]:
    x = rng.standard_normal((n, 1, 16, 16)).astype(np.float32) * 0.3
    y = rng.integers(0, 4, n)
    for i, q in enumerate(y):
        r, c = (q // 2) * 8 + rng.integers(1, 5), (q % 2) * 8 + rng.integers(1, 5)
        x[i, 0, r:r + 3, c:c + 3] += 2.0
    return et.tensor(x), et.tensor(y)


class Net(nn.Module):
    def __init__(self) -> None:
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.norm = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 4 * 4, 4)

    def forward(self, x: et.Tensor) -> et.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)        # [N, 8, 8, 8]
        x = F.relu(self.norm(self.conv2(x)))                # [N, 16, 4, 4]
        return self.head(x.flatten(1))


def main() -> None:
    et.manual_seed(0)
    rng = np.random.default_rng(0)
    model = Net()
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(60):
        x, y = batch(rng, 32)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == 59:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    model.eval()
    x, y = batch(rng, 256)
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"held-out accuracy {accuracy:.3f} (chance 0.25)")


if __name__ == "__main__":
    main()
