"""Train the same GPT with the same seed on the CPU (C backend) and on the GPU (CUDA), and
compare the loss curves step by step.    PYTHONPATH=. python3 bench/train_compare.py [--steps N]"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember import nn, runners  # noqa: E402
from ember.train import train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    sizes = ["--dim", "64", "--layers", "2", "--heads", "4", "--block", "64", "--batch", "16",
             "--eval-every", "20", "--max-bytes", "2000000"]
    runs = {}
    with tempfile.TemporaryDirectory() as d:
        for device in ("cpu", "cuda"):
            if device == "cuda" and "cuda" not in runners.available():
                print("no GPU here: only the CPU run")
                break
            out = Path(d) / device
            train(["--steps", str(args.steps), "--out", str(out), "--device", device, *sizes])
            runs[device] = (json.loads((out / "summary.json").read_text()),
                            json.loads(nn.load_safetensors(out / "ckpt.safetensors")[1]["ember"])["history"])
    for device, (summary, _) in runs.items():
        print(f"{device:5s} first step {summary['first_step_s']:6.1f} s   {summary['tokens_per_s']:9.1f} tok/s   "
              f"final loss {summary['final_train_loss']:.4f}   val {summary['final_val_loss']:.4f}")
    if len(runs) == 2:
        cpu, gpu = runs["cpu"][1], runs["cuda"][1]
        diffs = [abs(a[1] - b[1]) for a, b in zip(cpu["train"], gpu["train"])]
        marks = ", ".join(f"{diffs[i]:.1e}" for i in (0, len(diffs) // 2 - 1, -1))
        print(f"loss curves, cpu vs cuda, same seed: max |difference| over {len(diffs)} steps {max(diffs):.2e}; "
              f"at steps 1/{len(diffs) // 2}/{len(diffs)}: {marks}")
        print("validation:", [(s, round(a, 5), round(b, 5)) for (s, a), (_, b) in zip(cpu["val"], gpu["val"])])


if __name__ == "__main__":
    main()
