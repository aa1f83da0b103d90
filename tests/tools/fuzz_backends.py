"""Differential fuzzing in bulk: random programs run on a compiled backend and on the reference.

    python tests/tools/fuzz_backends.py --count 10000 [--backend c|cuda] [--start 0] [--jobs N] [--out DIR]

When a backend disagrees with the reference, the same generated source is rebuilt without
optimization (C: -O0; CUDA: --ptxas-options=-O0). Right there means the toolchain miscompiled
correct source ("toolchain miscompile"); still wrong means Ember generated wrong code ("Ember
bug"). The program is then minimized, deleting statements while the failure persists, and
written to --out as a test file. Rerun one with --start SEED --count 1."""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from randprog import compare, program_text  # noqa: E402

from ember import ref  # noqa: E402
from ember.backend import run_values  # noqa: E402
from ember.text import EirError, Program, parse  # noqa: E402


def run(prog: Program, backend: str, unoptimized: bool) -> list:
    if backend == "c":
        from ember.backend import c
        program = c.CProgram(prog.output_nodes, opt="-O0" if unoptimized else "-O3")
    else:
        from ember.backend import cuda
        program = cuda.CUDAProgram(prog.output_nodes, ptxas_o0=unoptimized)
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    try:
        return run_values(program, inputs)
    finally:
        getattr(program, "free", lambda: None)()


def problem(text: str, backend: str, unoptimized: bool = False) -> str | None:
    """Why the backend's result differs from the reference's, or None (also None: not a program)."""
    try:
        prog = parse(text, "fuzz.eir")
    except EirError:
        return None
    want = ref.evaluate(prog.output_nodes, {prog.nodes[p]: prog.input_values(p) for p in prog.params})
    try:
        got = run(prog, backend, unoptimized)
    except Exception as e:  # a crash is a finding too
        return f"{type(e).__name__}: {e}"
    return compare(prog.output_nodes, got, want)


def minimize(text: str, fails) -> str:  # type: ignore[no-untyped-def]
    """Delete statements while the failure persists: a statement goes by handing its uses one of
    its operands of the same type; extra returned names go too."""
    changed = True
    while changed:
        changed = False
        prog = parse(text, "fuzz.eir")
        lines = text.splitlines()
        if len(prog.outputs) > 1:
            for keep in prog.outputs:
                cand = "\n".join(f"return {keep}" if ln.startswith("return ") else ln for ln in lines) + "\n"
                if fails(cand):
                    text, changed = cand, True
                    break
            if changed:
                continue
        for name in reversed([n for n in prog.nodes if n not in prog.params]):
            node, at = prog.nodes[name], prog.lines[name] - 1
            operands = [t for t in lines[at].split()[3:] if t in prog.nodes and t != name]
            for o in operands:
                if prog.nodes[o].dtype is not node.dtype or prog.nodes[o].shape != node.shape:
                    continue
                cand = lines[:at] + [re.sub(rf"\b{name}\b", o, ln) for ln in lines[at + 1:]]
                cand_text = "\n".join(cand) + "\n"
                if fails(cand_text):
                    text, changed = cand_text, True
                    break
            if changed:
                break
    return _drop_unused(text)


def _drop_unused(text: str) -> str:
    """Remove statements (and params with their input lines) that nothing uses any more."""
    while True:
        lines = text.splitlines()
        prog = parse(text, "fuzz.eir")
        used = " ".join(ln.split("#")[0] for ln in lines if not ln.startswith(("input ", "expect ")))
        dead = [n for n in prog.nodes if n not in prog.outputs and len(re.findall(rf"\b{n}\b", used)) == 1]
        if not dead:
            return text
        gone = {prog.lines[n] - 1 for n in dead}
        text = "\n".join(ln for i, ln in enumerate(lines) if i not in gone
                         and not any(ln.startswith(f"input {n} ") for n in dead)) + "\n"


def fuzz(seeds: range, backend: str, steps: int) -> list[tuple[int, str, str, str]]:
    """(seed, problem, verdict, minimized program) for each failing seed."""
    found = []
    for seed in seeds:
        text = program_text(seed, steps)
        p = problem(text, backend)
        if p is None:
            continue
        verdict = "toolchain miscompile" if problem(text, backend, unoptimized=True) is None else "Ember bug"
        small = minimize(text, lambda t: problem(t, backend) is not None and
                         (problem(t, backend, True) is None) == (verdict == "toolchain miscompile"))
        found.append((seed, p, verdict, small))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=500, help="programs to run")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--backend", default="c", choices=["c", "cuda"])
    ap.add_argument("--steps", type=int, default=10, help="ops per program")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    ap.add_argument("--out", default=None, help="folder for the minimized failing programs")
    args = ap.parse_args()
    from tqdm import tqdm
    t0 = time.time()
    chunk = 25
    starts = range(args.start, args.start + args.count, chunk)
    failed: list[tuple[int, str, str, str]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(fuzz, range(s, min(s + chunk, args.start + args.count)), args.backend, args.steps)
                   for s in starts]
        for f in tqdm(as_completed(futures), total=len(futures), desc=f"fuzz {args.backend}", file=sys.stderr,
                      mininterval=5):
            failed += f.result()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ember-fuzz-"))
    for seed, p, verdict, small in sorted(failed):
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"seed{seed}.eir"
        path.write_text(f"# {verdict} on {args.backend}: {p}\n{small}")
        print(f"seed {seed}: {verdict}: {p}  (minimized: {path})")
    print(f"seeds {args.start}..{args.start + args.count - 1}, {args.backend}, {time.time() - t0:.0f} s")
    print(f"{args.count - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
