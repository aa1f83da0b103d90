"""Convolutions on the GPU: 3x3 conv2d forward beside cuDNN, and a ResNet block's training step
beside PyTorch eager, same GPU, same run.

    PYTHONPATH=. python3 bench/cnn_gpu.py [--steps 10] [--quick]

Ember's conv2d is written with movement ops (the windows of the input, channels last) and one
sum of products; the compiler stores the windows as an im2col buffer and runs the product on
tensor cores (bf16) or FMA register tiles (f32). FLOPs are 2 * N * H * W * O * C * 9. The
bytes floor counts reading the input and weight and writing the output once (what cuDNN's
implicit GEMM moves); Ember also writes and reads the 9x larger im2col buffer. cuDNN runs with
`cudnn.benchmark` on and TF32 off.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import cuda_time  # noqa: E402
from train_gpu import timed_steps  # noqa: E402

import ember.tensor as et  # noqa: E402
from ember import data, nn, optim  # noqa: E402
from ember import functional as F  # noqa: E402
from ember.backend import cuda  # noqa: E402

PEAK = {"bfloat16": 989e12, "float32": 67e12}
TORCH_DT = {"bfloat16": torch.bfloat16, "float32": torch.float32}
SHAPES = [  # N, C, O, H (=W)
    (64, 64, 64, 32),     # a CIFAR ResNet block
    (64, 128, 128, 16),
    (64, 256, 256, 14),   # ResNet-50's third stage
    (32, 512, 512, 7),
]


def conv_forward(n: int, c: int, o: int, h: int, dtype: str) -> str:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    tx, tw = et.Tensor(x, dtype=dtype), et.Tensor(w, dtype=dtype)
    y = F.conv2d(tx, tw, padding=1)
    t0 = time.perf_counter()
    prog = cuda.CUDAProgram([y.node])
    cold = time.perf_counter() - t0
    inputs = {t.node: data.to_storage(a, t.dtype) for t, a in ((tx, x), (tw, w))}
    (out,), times = prog.timed(inputs, 20)
    got = torch.from_numpy(np.asarray(data.from_storage(out, y.dtype), np.float32)).cuda()
    gx, gw = torch.from_numpy(x).cuda().to(TORCH_DT[dtype]), torch.from_numpy(w).cuda().to(TORCH_DT[dtype])
    want = torch.nn.functional.conv2d(gx, gw, padding=1).float()
    err = ((got - want).norm() / want.norm()).item()
    ember_s = statistics.median(times) / 1e3
    torch_s = cuda_time(lambda: torch.nn.functional.conv2d(gx, gw, padding=1))
    flops = 2.0 * n * h * h * o * c * 9
    size = 2 if dtype == "bfloat16" else 4
    floor = (n * c * h * h + o * c * 9 + n * o * h * h) * size / 4.0e12
    plan = next((str(k.plan) for k in prog.sched.kernels if k.contraction), "no contraction plan")
    ok = "" if err < 2e-2 else f"  WRONG (relative error {err:.2e})"
    return (f"{dtype:8} {n:3}x{c:3}x{h:2}x{h:2} -> {o:3}  {len(prog.sched.kernels):4} {ember_s * 1e6:9.1f} "
            f"{torch_s * 1e6:9.1f} {torch_s / ember_s:6.2f} {flops / ember_s / 1e12:7.1f} "
            f"{flops / torch_s / 1e12:7.1f} "
            f"{floor * 1e6:7.1f} {100 * flops / ember_s / PEAK[dtype]:5.1f}% {cold:6.2f}s  {plan}{ok}")


class Block(nn.Module):
    """conv-bn-relu-conv-bn, the skip, relu; then average pooling and a linear head."""

    def __init__(self, c: int) -> None:
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.head = nn.Linear(c, 10)

    def forward(self, x: et.Tensor) -> et.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + x)
        return self.head(y.mean((2, 3)))


class TorchBlock(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.head = torch.nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.head(y.mean((2, 3)))


def train_step_times(steps: int, b: int, c: int, h: int, low: str | None,
                     jit: bool = False) -> tuple[float, float, float, float]:
    """(Ember first step s, Ember median step s, PyTorch median step s, Ember's last loss);
    jit: the step through ember.jit."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, b, c, h, h)).astype(np.float32)
    ys = rng.integers(0, 10, (4, b))
    et.set_default_device("cuda")
    et.manual_seed(0)
    model = Block(c)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    times, losses = timed_steps(lambda x, y: F.cross_entropy(model(x), y), opt,
                                lambda s: (et.Tensor(xs[s % 4]), et.Tensor(ys[s % 4])), steps, low, jit)
    et.set_default_device("cpu")
    tm = TorchBlock(c).cuda()
    topt = torch.optim.SGD(tm.parameters(), lr=0.05, momentum=0.9)
    txs, tys = torch.from_numpy(xs).cuda(), torch.from_numpy(ys).cuda()
    ttimes = []
    for s in range(steps):
        t0 = time.perf_counter()
        topt.zero_grad()
        with torch.autocast("cuda", torch.bfloat16, enabled=low is not None):
            loss_t = torch.nn.functional.cross_entropy(tm(txs[s % 4]), tys[s % 4])
        loss_t.backward()
        topt.step()
        loss_t.item()
        ttimes.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[2 if jit else 1:]), statistics.median(ttimes[2:]), losses[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="training steps (the first compiles)")
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    ap.add_argument("--only", choices=["conv", "train"], default=None, help="one of the two tables")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.only != "train":
        conv_table(args.quick)
    if args.only != "conv":
        train_table(args.steps)


def conv_table(quick: bool) -> None:
    print("3x3 conv2d forward, padding 1 (us: median of 20 runs; floor: input + weight + output bytes / 4.0 TB/s)")
    print(f"{'dtype':8} {'shape':22} {'kern':>4} {'ember us':>9} {'cuDNN us':>9} {'ratio':>6} {'TF/s':>7} "
          f"{'cuDNN':>7} {'floor':>7} {'%peak':>6} {'cold':>7}  plan")
    for n, c, o, h in SHAPES[:1] if quick else SHAPES:
        for dtype in ("bfloat16", "float32"):
            print(conv_forward(n, c, o, h, dtype), flush=True)


def train_table(steps: int) -> None:
    b, c, h = 64, 64, 32
    print(f"\nResNet block training step (B={b}, {c} channels, {h}x{h}; SGD with momentum; "
          "the step includes reading the loss)")
    for low, jit in ((None, False), (None, True), ("bfloat16", False), ("bfloat16", True)):
        first, ember_s, torch_s, loss = train_step_times(steps, b, c, h, low, jit)
        name = ("f32" if low is None else "bf16 autocast") + (", jit" if jit else "")
        print(f"{name:14} Ember {ember_s * 1e3:8.2f} ms  PyTorch eager {torch_s * 1e3:8.2f} ms  "
              f"ratio {torch_s / ember_s:5.2f}  Ember first step {first:5.1f} s  loss {loss:.3f}", flush=True)


if __name__ == "__main__":
    main()
