"""Differential fuzzing in bulk: random programs run on a backend and on the reference.

    python tests/tools/fuzz_backends.py --count 2000 [--backend c] [--start 0]

Prints each mismatch with its seed (rerun one with --start SEED --count 1) and a final count."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from randprog import compare, random_program  # noqa: E402

from ember import backends, ref  # noqa: E402
from ember.text import print_graph  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--backend", default="c")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--show", action="store_true", help="print the program of each mismatch")
    args = ap.parse_args()
    run = backends.RUNNERS[args.backend]
    failed = 0
    t0 = time.time()
    for seed in range(args.start, args.start + args.count):
        outputs, inputs = random_program(seed, args.steps)
        want = ref.evaluate(outputs, inputs)
        try:
            got = run(outputs, inputs)
            problem = compare(outputs, got, want)
        except Exception as e:  # a crash is a finding too
            problem = f"{type(e).__name__}: {e}"
        if problem:
            failed += 1
            print(f"seed {seed}: {problem}")
            if args.show:
                print("\n".join(print_graph(outputs)))
    print(f"{args.count - failed} passed, {failed} failed  ({args.backend} vs ref, {time.time() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
