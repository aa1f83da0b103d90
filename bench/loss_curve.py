"""A longer real run beside PyTorch: `ember train --model gpt2` on the Python standard library's
source, then the same model in PyTorch from the same initial weights on the same batches (the
same text, tokenizer, split, sampler seed, AdamW and learning-rate schedule), and both loss
curves in one plot.

    PYTHONPATH=. python3 bench/loss_curve.py [--steps 500] [--batch 16] [--plot docs/loss_curve_gpt2.png]
    PYTHONPATH=. python3 bench/loss_curve.py --device cpu --model byte --steps 20 --dim 32 --layers 1 \\
        --heads 2 --block 32 --batch 4 --plot /tmp/curve.png        # a minute on a CPU

On the GPU (and with --bf16 on the CPU) both sides autocast to bf16 and PyTorch's attention is
SDPA (flash), as Ember's; the relative gap of the curves is printed (bench/loss_parity.py's
bound for bf16 is 2%). The model is GPT-2's shape (tied head) unless --dim, --layers, --heads, --block say otherwise.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loss_parity import torch_name  # noqa: E402
from train_gpu import TorchGPT  # noqa: E402

from ember import tensor as T  # noqa: E402
from ember import train  # noqa: E402


def ember_run(args: argparse.Namespace, out: Path) -> tuple[list[tuple[int, float]], float]:
    """The losses of `ember train` step by step (from its checkpoint's history), and its seconds."""
    argv = ["--model", args.model, "--device", args.device, "--steps", str(args.steps), "--batch", str(args.batch),
            "--lr", str(args.lr), "--warmup", str(args.warmup), "--cosine", "--seed", str(args.seed),
            "--eval-every", str(args.steps), "--max-bytes", str(args.max_bytes), "--out", str(out), "--fresh",
            "--autocast", "bf16" if args.bf16 else "none"]
    for name in ("dim", "layers", "heads", "block"):
        if getattr(args, name) is not None:
            argv += [f"--{name}", str(getattr(args, name))]
    t0 = time.perf_counter()
    if train.train(argv) != 0:
        raise SystemExit("ember train failed")
    seconds = time.perf_counter() - t0
    _, saved, _ = train.load_checkpoint(out / "ckpt.safetensors")
    return [(int(s), float(v)) for s, v in saved["history"]["train"]], seconds


def torch_run(args: argparse.Namespace, out: Path) -> tuple[list[tuple[int, float]], float]:
    """The same run in PyTorch: ember train's data and sampler, its initial weights, its schedule."""
    _, saved, config = train.load_checkpoint(out / "ckpt.safetensors")
    text, _ = train.load_text(None, args.max_bytes)
    tokens, _ = train.tokenize(text, args.model, None)
    data, _ = train.split_data(tokens)
    T.set_default_device("cpu")
    T.manual_seed(args.seed)   # as ember train initializes
    model = train.build(config)
    dev = torch.device(args.device)
    tm = TorchGPT(config).to(dev)
    if config.tied:
        tm.head.weight = tm.tok.weight
    state = {torch_name(n): torch.from_numpy(p.numpy().copy()) for n, p in model.named_parameters()}
    if config.tied:
        state["head.weight"] = state["tok.weight"]
    tm.load_state_dict({k: v.to(dev) for k, v in state.items()})
    opt = torch.optim.AdamW(tm.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)
    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = train.learning_rate(step, args.steps, args.lr, args.warmup, True)
        x, y = (torch.from_numpy(t.numpy()).long().to(dev) for t in train.batch(data, rng, args.batch, config.block))
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
            logits = tm(x, sdpa=True)
            loss = F.cross_entropy(logits.reshape(-1, config.vocab).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append((step + 1, loss.item()))
    return losses, time.perf_counter() - t0


def plot(ember: list[tuple[int, float]], peer: list[tuple[int, float]], title: str, path: Path,
         others: Sequence[list[tuple[int, float]]] = ()) -> None:
    """The curves in a PNG at path, and as JSON beside it (path with .json); others: PyTorch's
    further runs of the same seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"title": title, "ember": ember, "pytorch": peer,
                                                     "pytorch_reruns": list(others)}))
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: the curves are in the .json only", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    window = max(1, len(ember) // 40)   # each step's loss is one batch's: the means over windows show the trend

    def curve(points: list[tuple[int, float]], **style: object) -> None:
        steps, values = zip(*points)
        ax.plot(steps, values, alpha=0.12, linewidth=0.6, color=style["color"])
        kernel = np.ones(window) / window
        ax.plot(steps[window - 1:], np.convolve(values, kernel, "valid"), **style)
    curve(peer, label="PyTorch", color="C0")
    for i, other in enumerate(others):
        curve(other, label=f"PyTorch, run {i + 2} (same seed)", color=f"C{i + 2}", linestyle=":")
    curve(ember, label="Ember", color="C1", linestyle="--")
    ax.set_title(title + f"\n(faint: each step; lines: means over {window} steps)", fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, nats per token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "byte"])
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="autocast to bf16 on both sides (default: on the GPU only)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dim", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--block", type=int)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-bytes", type=int, default=4_000_000)
    ap.add_argument("--out", default="runs/loss_curve", help="ember train's run folder")
    ap.add_argument("--plot", default="docs/loss_curve_gpt2.png", help="the PNG (and its .json: both curves)")
    ap.add_argument("--peer-runs", type=int, default=1,
                    help="PyTorch's run this many times: past the plateau its own runs differ (cuDNN's backward is "
                         "not deterministic), and that spread is the yardstick for Ember's gap")
    args = ap.parse_args()
    if args.bf16 is None:
        args.bf16 = args.device == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(args.out)
    ember, ember_s = ember_run(args, out)
    peer, torch_s = torch_run(args, out)
    others = [torch_run(args, out)[0] for _ in range(args.peer_runs - 1)]
    gaps = [abs(a - b) / abs(b) for (_, a), (_, b) in zip(ember, peer)]
    worst = int(np.argmax(gaps))
    _, _, config = train.load_checkpoint(out / "ckpt.safetensors")
    title = (f"{args.model}: {config.n_layer} layers, dim {config.dim}, context {config.block}, batch {args.batch}, "
             f"vocab {config.vocab}, {args.device}" + (" bf16" if args.bf16 else "") +
             f", {args.max_bytes / 1e6:g} MB of stdlib source, seed {args.seed}")
    plot(ember, peer, title, Path(args.plot), others)
    print(title)
    for i in sorted({0, len(ember) // 4, len(ember) // 2, len(ember) - 1}):
        print(f"  step {ember[i][0]:5d}   Ember {ember[i][1]:.4f}   PyTorch {peer[i][1]:.4f}")
    print(f"largest relative gap {100 * gaps[worst]:.3f}% at step {ember[worst][0]}; mean {100 * np.mean(gaps):.3f}%; "
          f"last {100 * gaps[-1]:.3f}%  (Ember {ember_s:.0f} s with its compile, PyTorch {torch_s:.0f} s)")
    n = len(ember)
    for a, b in ((0, n // 2), (n // 2, 3 * n // 4), (3 * n // 4, n)):   # mean losses by range: the gap past the plateau
        mean = lambda curve: float(np.mean([v for _, v in curve[a:b]]))  # noqa: E731
        print(f"  steps {a + 1}-{b}: Ember / PyTorch {mean(ember) / mean(peer):.4f}"
              + "".join(f", PyTorch run {i + 2} / run 1 {mean(o) / mean(peer):.4f}" for i, o in enumerate(others)))
    print(json.dumps({"plot": args.plot, "ember": ember[-1], "pytorch": peer[-1]}))


if __name__ == "__main__":
    main()
