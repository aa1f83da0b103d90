"""`ember bench`: a fixed suite of programs timed through every compiler, scored on a linear curve."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import protocol
from ..text import EirError, Program, parse_file
from . import course
from .grade import REFERENCE, Submission, _fail, judge, load_submissions, run_compiler
from .reports import _write_csv, _write_json, _write_text, prepare_out
from .sandbox import Limits, Result, Sandbox


def linear_scores(times: dict[str, float | None]) -> dict[str, float]:
    """100 for the fastest, 0 for the slowest, linear in time between; failures 0; equal times
    (to 3 significant digits) score equal (one working compiler, or all equally fast: 100 each)."""
    # medians equal to 3 significant digits are a tie: CUDA-event medians of one program move by
    # about 0.2% between processes (bench/grade_device.sh), so finer differences are noise
    ok = {n: float(f"{t:.3g}") for n, t in times.items() if t is not None}
    if not ok:
        return {n: 0.0 for n in times}
    lo, hi = min(ok.values()), max(ok.values())
    return {n: 0.0 if n not in ok else 100.0 if hi == lo else 100.0 * ((hi - ok[n]) / (hi - lo)) for n in times}


HONESTY_FACTOR = 10  # the honesty check's second run count is this many times --runs
NOISE_S = 2.0  # process runs of one program differed by up to 0.5 s on the H200 host: 4x margin


def honest(r1: Result, r2: Result, m1: float, m2: float, n1: int, n2: int) -> str | None:
    """Self-reported times against the wall time: the n2 - n1 extra runs cannot have taken much
    less time than the extra wall time they cost. Start-up, input generation and compilation
    make two processes differ by up to NOISE_S, so only a difference above it is judged.
    None when plausible, else why not."""
    extra_wall_ms = (r2.wall - r1.wall) * 1e3
    claimed_ms = max(m1, m2) * (n2 - n1)
    if extra_wall_ms > NOISE_S * 1e3 and claimed_ms * 4 < extra_wall_ms:  # 4x slack for per-run host overhead
        return (f"reported median {max(m1, m2):.4g} ms, but {n2 - n1} more runs took {extra_wall_ms:.4g} ms "
                f"of wall time")
    return None


def bench_one(sandbox: Sandbox, sub: Submission, prog: Program, expected: dict[str, np.ndarray] | None,
              runs: int, timeout: float) -> tuple[dict[str, Any], str]:
    """bench.json's entry for one compiler on one program, and what its first run printed."""
    entry, r1 = _bench_runs(sandbox, sub, prog, expected, runs, timeout)
    return entry, r1.stdout if r1 is not None else ""


def _bench_runs(sandbox: Sandbox, sub: Submission, prog: Program, expected: dict[str, np.ndarray] | None,
                runs: int, timeout: float) -> tuple[dict[str, Any], Result | None]:
    if sub.build_error:
        return {"median_ms": None, "status": "error", "note": sub.build_error.splitlines()[0]}, None
    path = Path(prog.path)
    n1, n2 = runs, HONESTY_FACTOR * runs
    r1 = run_compiler(sandbox, sub, path, ["--bench", str(n1)], timeout)
    if r1.killed == "timeout":
        return {"median_ms": None, "status": "timeout", "note": r1.failure()}, r1
    if r1.failure():
        return {"median_ms": None, "status": "error", "note": r1.failure()}, r1
    if expected is not None or prog.expects:
        problem = judge(prog, r1, expected)
        if problem:
            return {"median_ms": None, "status": "wrong", "note": problem}, r1
    m1 = protocol.bench_median(r1.stdout)
    if m1 is None:
        return {"median_ms": None, "status": "error", "note": "no '# bench runs=N median_ms=X' line (spec 10)"}, r1
    r2 = run_compiler(sandbox, sub, path, ["--bench", str(n2)], timeout)
    m2 = protocol.bench_median(r2.stdout)
    if r2.failure() or m2 is None:
        return {"median_ms": None, "status": "timeout" if r2.killed == "timeout" else "error",
                "note": r2.failure() or "no bench line at the second run count"}, r1
    lie = honest(r1, r2, m1, m2, n1, n2)
    if lie:
        return {"median_ms": None, "status": "error", "note": f"dishonest timing: {lie}"}, r1
    return {"median_ms": statistics.median([m1, m2]), "status": "ok", "note": None}, r1


def cmd_bench(args: argparse.Namespace) -> int:
    suite, out = Path(args.suite), Path(args.out)
    files = sorted(suite.glob("*.eir")) if suite.is_dir() else []
    if not files:
        return _fail(f"ember bench: no .eir programs in {suite}", 2)
    try:
        sources, hide = course.sources(args)
    except course.CourseError as e:
        return _fail(str(e), 2)
    try:
        progs = [parse_file(str(f)) for f in files]
    except EirError as e:
        return _fail(str(e), 2)
    out = prepare_out(out)  # before any submission runs (reports.py says why)
    # one at a time: timings do not share the GPU
    sandbox = Sandbox([*hide, out], 1, Limits(wall=args.timeout), allow_ember=args.allow_ember)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        from tqdm import tqdm
        subs = load_submissions(sources, sandbox, args.ref, args.build_timeout, lambda m: print(m, file=sys.stderr))
        bar = tqdm(total=len(progs) * len(subs), desc="benchmarking", file=sys.stderr)
        for prog in progs:
            name = Path(prog.path).name
            row = results[name] = {}
            ref, ref_stdout = bench_one(sandbox, subs[0], prog, None, args.runs, args.timeout)
            row[REFERENCE] = ref
            bar.update()
            expected = None
            if ref["status"] == "ok" and not prog.expects:  # the reference's result is the answer
                got = protocol.parse_output(ref_stdout, prog)
                expected = {n: got[n] for n in prog.outputs if n in got}
            for sub in subs[1:]:
                row[sub.name] = bench_one(sandbox, sub, prog, expected, args.runs, args.timeout)[0]
                bar.update()
            scores = linear_scores({n: r["median_ms"] for n, r in row.items()})
            for n, r in row.items():
                r["score"] = scores[n]
        bar.close()
    finally:
        sandbox.close()
    names = [s.name for s in subs]
    report = {"programs": results,
              "submissions": {n: {"score": statistics.fmean(results[p][n]["score"] for p in results)} for n in names}}
    write_bench(out, report)
    print(f"benchmarked {len(names)} compilers on {len(progs)} programs: {out / 'bench.json'}, {out / 'summary.md'}")
    return 0


def write_bench(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "bench.json", report)
    names = list(report["submissions"])
    rows = [[p, n, r["median_ms"] if r["median_ms"] is not None else "", r["status"], f"{r['score']:.1f}",
             r.get("note") or ""] for p, row in report["programs"].items() for n, r in row.items()]
    _write_csv(out / "programs.csv", ["program", "name", "median_ms", "status", "score", "note"], rows)
    _write_csv(out / "submissions.csv", ["name", "score"],
               [[n, f"{report['submissions'][n]['score']:.2f}"] for n in names])
    md = ["# Benchmark", "", "Score per program: 100 for the fastest correct compiler, 0 for the slowest, linear in "
          "time; wrong, failed and timed-out runs score 0. The total is the mean over programs.", "",
          "| compiler | score |", "|---|---|"]
    md += [f"| {n} | {report['submissions'][n]['score']:.1f} |"
           for n in sorted(names, key=lambda n: -report["submissions"][n]["score"])]
    md += ["", "| program | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for p, row in report["programs"].items():
        cells = [f"{r['median_ms']:.4g} ms ({r['score']:.0f})" if r["status"] == "ok" else r["status"]
                 for r in (row[n] for n in names)]
        md.append(f"| {p} | " + " | ".join(cells) + " |")
    _write_text(out / "summary.md", "\n".join(md) + "\n")


