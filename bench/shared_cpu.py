"""Compiled programs on a CPU that something else also uses (issue 32): `ember sample`, `ember
train` and examples/cnn.py, alone and beside a busy process on the same cores, with OpenMP as
Ember sets it now (threads = free cores, passive waiting) and as it shipped (threads = cores,
libgomp's default spinning of 300000 rounds before a thread sleeps). Also the README's run:
`ember train` with a cold compile cache.

    python bench/shared_cpu.py                  # on the cores this process may use
    taskset -c 0,1 python bench/shared_cpu.py   # on two of them (the README's condition)

Each run is a fresh process; the compile cache is warmed once first, so only the README row
compiles. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORES = len(os.sched_getaffinity(0))
SHIPPED = {"OMP_NUM_THREADS": str(CORES), "GOMP_SPINCOUNT": "300000"}   # libgomp's defaults, set explicitly


def ember(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Runs `ember ARGS`; its wall seconds and stderr."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ember", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ember {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t, proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="ember-shared-cpu-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    base.update(PYTHONPATH=str(ROOT), EMBER_CACHE=str(work / "cache"), PYTHONUNBUFFERED="1")
    run = str(work / "run")
    rows = []

    # the README's run: the default training, cold cache, nothing else running
    seconds, err = ember(["train", "--out", run, "--device", "cpu"], base)
    summary = json.loads((Path(run) / "summary.json").read_text())
    rows.append(("`ember train` (300 steps, cold cache), alone", "now",
                 f"{seconds:.1f} s, of it first step {summary['first_step_s']:.1f} s; "
                 f"{summary['tokens_per_s'] / 1000:.1f}k tok/s after; val loss {summary['final_val_loss']:.2f}"))
    ember(["sample", "--ckpt", f"{run}/ckpt.safetensors", "--tokens", "5"], base)   # warms the cache
    ember(["train", "--out", f"{run}-w", "--steps", "3", "--eval-every", "1000", "--device", "cpu"], base)
    subprocess.run([sys.executable, "examples/cnn.py"], cwd=ROOT, env=base, capture_output=True, check=True)

    for busy in (False, True):
        hog = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if busy else None
        if hog:
            time.sleep(2)   # (the runnable count sees it at once; the 1-minute load average later)
        where = "beside a busy process" if busy else "alone"
        try:
            for name, extra in (("shipped", SHIPPED), ("now", {})):
                env = {**base, **extra}
                _, err = ember(["sample", "--ckpt", f"{run}/ckpt.safetensors", "--tokens", str(args.tokens)], env)
                rate = re.search(r"([\d.]+) tokens/s", err)
                rows.append((f"`ember sample --tokens {args.tokens}`, {where}", name, f"{rate and rate[1]} tok/s"))
                out = f"{run}-{name}-{busy}"
                seconds, _ = ember(["train", "--out", out, "--steps", str(args.steps), "--eval-every", "1000",
                                    "--device", "cpu"], env)
                s = json.loads((Path(out) / "summary.json").read_text())
                result = f"{s['tokens_per_s'] / 1000:.1f}k tok/s, {seconds:.1f} s, loss {s['final_train_loss']:.3f}"
                rows.append((f"`ember train --steps {args.steps}` (warm cache), {where}", name, result))
                t = time.perf_counter()
                subprocess.run([sys.executable, "examples/cnn.py"], cwd=ROOT, env=env, capture_output=True, check=True)
                rows.append((f"`examples/cnn.py` (warm cache), {where}", name, f"{time.perf_counter() - t:.1f} s"))
        finally:
            if hog:
                hog.kill()
                hog.wait()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{CORES} cores ({os.cpu_count()} on the machine), load average before: {load:.2f}\n")
    print("| command | OpenMP | result |\n|---|---|---|")
    for row in sorted(rows, key=lambda r: (r[0].split("`")[1], "busy" in r[0], r[1] == "now")):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
