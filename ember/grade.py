"""Grading a course: `ember grade` (students' tests against students' compilers) and
`ember bench` (a fixed suite of programs timed through every compiler). docs/grading.md says
how a course uses them; sandbox.py how untrusted compilers are contained.

A submission is a folder holding an executable `compiler` that follows the protocol (spec 9
and 10) and, optionally, an executable `build` run once first. The reference compiler (Ember)
takes part as the submission `reference`; it is trusted and runs as the grader.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import cli
from .sandbox import Limits, Result, Sandbox
from .text import EirError, Program, parse_file

REFERENCE = "reference"
EXPECT_LINE = re.compile(rb"^[ \t]*expect\b.*$", re.MULTILINE)


@dataclass
class Submission:
    name: str
    folder: Path | None              # the private copy (None: the reference)
    build_error: str | None = None   # set when its build failed: every test then fails with it

    def command(self) -> list[str]:
        if self.folder is None:
            return [sys.executable, "-m", "ember", "run"]
        return [str(self.folder / "compiler")]


def without_expects(path: Path) -> bytes:
    """The test as a compiler sees it: `expect` lines blanked, so line numbers stay the same."""
    return EXPECT_LINE.sub(b"", path.read_bytes())


def load_submissions(folder: Path, sandbox: Sandbox, ref: str | None, timeout: float,
                     progress: Callable[[str], None]) -> list[Submission]:
    """The reference, then each submission folder copied (or checked out) and built."""
    subs = [Submission(REFERENCE, None)]
    for src in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if src.name == REFERENCE:
            raise ValueError(f"{src}: the name '{REFERENCE}' is kept for Ember itself")
        is_repo = (src / ".git").exists()
        try:
            copy = sandbox.add_submission(src.name, src, ref if is_repo else None)
        except (OSError, ValueError) as e:
            subs.append(Submission(src.name, None, build_error=f"cannot be copied: {e}"))
            continue
        sub = Submission(src.name, copy)
        if (copy / "build").is_file():
            progress(f"building {src.name}")
            r = sandbox.run([str(copy / "build")], submission=copy, wall=timeout, build=True)
            if r.failure():
                log = (r.stdout + r.stderr).strip().splitlines()[-5:]
                sub.build_error = f"build {r.failure()}" + ("\n" + "\n".join(log) if log else "")
        if sub.build_error is None and not ((copy / "compiler").is_file() and os.access(copy / "compiler", os.X_OK)):
            sub.build_error = "no executable named 'compiler' in the submission"
        subs.append(sub)
    return subs


def run_compiler(sandbox: Sandbox, sub: Submission, test: Path, extra: list[str], wall: float) -> Result:
    files = {test.name: without_expects(test)}
    return sandbox.run(sub.command() + ["{dir}/" + test.name] + extra, files=files,
                       submission=sub.folder, wall=wall, trusted=sub.folder is None)


def judge(prog: Program, r: Result, expected: dict[str, np.ndarray] | None = None) -> str | None:
    """None when the compiler's output matches the test (or the reference's `expected`), else why not."""
    if r.failure():
        return r.failure()
    try:
        got = cli._parse_output(r.stdout, prog)
    except ValueError as e:
        return str(e)
    if expected is None:
        return cli._compare(prog, got)
    problem = cli._compare(prog, got, expected, tolerance(prog))
    return f"{problem} (the reference's value)" if problem else None


# --------------------------------------------------------------------------------- grade

@dataclass
class Test:
    key: str                  # author/file
    path: Path
    valid: bool = True
    reason: str | None = None
    broken_by: list[str] = field(default_factory=list)


def find_tests(folder: Path) -> list[Test]:
    tests = []
    for author in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for f in sorted(author.rglob("*.eir")):
            tests.append(Test(f"{author.name}/{f.relative_to(author).as_posix()}", f))
    return tests


def validate(t: Test) -> None:
    """A test is valid when it parses and its expectations hold on the reference evaluator."""
    want = cli._expected_error(str(t.path))
    if want is None:
        try:
            prog = parse_file(str(t.path))
        except EirError as e:
            t.valid, t.reason = False, f"does not parse: {e}"
            return
        if not prog.expects:
            t.valid, t.reason = False, "has no expect line, so it checks nothing"
            return
    problem, _ = cli._test_one(str(t.path), "ref", None, 0)
    if problem is not None:
        t.valid, t.reason = False, f"fails on the reference evaluator: {problem}"


def grade_one(sandbox: Sandbox, sub: Submission, t: Test, timeout: float) -> str | None:
    """None when sub passes test t, else the first mismatch or error."""
    if sub.build_error:
        return sub.build_error
    r = run_compiler(sandbox, sub, t.path, [], timeout)
    want = cli._expected_error(str(t.path))
    if want is not None:  # a test of an error message: status 2 and FILE:LINE: on stderr
        if cli.reported_error(r.status, r.stderr, want[0]):
            return None
        return f"expected exit status 2 and an error on line {want[0]}, got {r.failure() or 'success'}"
    return judge(parse_file(str(t.path)), r)


def cmd_grade(args: argparse.Namespace) -> int:
    tests_dir, subs_dir, out = Path(args.tests), Path(args.submissions), Path(args.out)
    for d, what in ((tests_dir, "--tests"), (subs_dir, "--submissions")):
        if not d.is_dir():
            return cli._fail(f"ember grade: {what} {d} is not a folder", 2)
    tests = find_tests(tests_dir)
    if not tests:
        return cli._fail(f"ember grade: no tests in {tests_dir} (one subfolder of .eir files per author)", 2)
    jobs = args.jobs or os.cpu_count() or 1
    sandbox = Sandbox([tests_dir, subs_dir, out], jobs, Limits(wall=args.timeout))
    if sandbox.level != "namespaces":
        print(f"ember grade: containment is '{sandbox.level}' here (see docs/grading.md)", file=sys.stderr)
    try:
        from tqdm import tqdm
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(tqdm(pool.map(validate, tests), total=len(tests), desc="validating tests", file=sys.stderr))
        subs = load_submissions(subs_dir, sandbox, args.ref, args.build_timeout, lambda m: print(m, file=sys.stderr))
        valid = [t for t in tests if t.valid]
        failures: dict[str, dict[str, str]] = {s.name: {} for s in subs}
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(grade_one, sandbox, s, t, args.timeout): (s, t) for s in subs for t in valid}
            for f in tqdm(as_completed(futures), total=len(futures), desc="grading", file=sys.stderr):
                s, t = futures[f]
                problem = f.result()
                if problem is not None:
                    failures[s.name][t.key] = problem
                    t.broken_by.append(s.name)
    finally:
        sandbox.close()
    report = {
        "tests": {t.key: {"valid": t.valid, "reason": t.reason, "broken_by": sorted(t.broken_by)} for t in tests},
        "submissions": {s.name: {"passed": len(valid) - len(failures[s.name]), "failed": len(failures[s.name]),
                                 "rate": (len(valid) - len(failures[s.name])) / len(valid) if valid else 0.0,
                                 "failures": dict(sorted(failures[s.name].items()))} for s in subs}}
    write_grade(out, report)
    print(f"graded {len(subs)} compilers on {len(valid)} valid tests ({len(tests) - len(valid)} invalid): "
          f"{out / 'grade.json'}, {out / 'summary.md'}")
    return 0


def write_grade(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "grade.json", report)
    subs, tests = report["submissions"], report["tests"]
    _write_csv(out / "submissions.csv", ["name", "passed", "failed", "rate"],
               [[n, s["passed"], s["failed"], f"{s['rate']:.4f}"] for n, s in subs.items()])
    _write_csv(out / "tests.csv", ["test", "valid", "reason", "broken_by"],
               [[k, t["valid"], t["reason"] or "", " ".join(t["broken_by"])] for k, t in tests.items()])
    _write_csv(out / "failures.csv", ["name", "test", "failure"],
               [[n, k, f] for n, s in subs.items() for k, f in s["failures"].items()])
    md = ["# Grades", "", "| compiler | passed | failed | rate |", "|---|---|---|---|"]
    md += [f"| {n} | {s['passed']} | {s['failed']} | {100 * s['rate']:.1f}% |"
           for n, s in sorted(subs.items(), key=lambda kv: -kv[1]["rate"])]
    md += ["", "## Tests that break compilers (the bonus)", "", "| test | broken by |", "|---|---|"]
    md += [f"| {k} | {', '.join(t['broken_by'])} |" for k, t in tests.items() if t["valid"] and t["broken_by"]]
    md += ["", "## Invalid tests", "", "| test | reason |", "|---|---|"]
    md += [f"| {k} | {_cell(t['reason'])} |" for k, t in tests.items() if not t["valid"]]
    _write_text(out / "summary.md", "\n".join(md) + "\n")


# --------------------------------------------------------------------------------- bench

TOLERANCE = re.compile(r"#\s*tolerance:\s*atol=(\S+)\s+rtol=(\S+)")


def tolerance(prog: Program) -> tuple[float | None, float | None]:
    """A suite file may set its float tolerance in a comment `# tolerance: atol=A rtol=R`
    (large sums and tensor-core matmuls differ from the reference by more than spec 8's defaults)."""
    m = TOLERANCE.search(Path(prog.path).read_text(errors="replace"))
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


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
    m1 = cli.bench_median(r1.stdout)
    if m1 is None:
        return {"median_ms": None, "status": "error", "note": "no '# bench runs=N median_ms=X' line (spec 10)"}, r1
    r2 = run_compiler(sandbox, sub, path, ["--bench", str(n2)], timeout)
    m2 = cli.bench_median(r2.stdout)
    if r2.failure() or m2 is None:
        return {"median_ms": None, "status": "timeout" if r2.killed == "timeout" else "error",
                "note": r2.failure() or "no bench line at the second run count"}, r1
    lie = honest(r1, r2, m1, m2, n1, n2)
    if lie:
        return {"median_ms": None, "status": "error", "note": f"dishonest timing: {lie}"}, r1
    return {"median_ms": statistics.median([m1, m2]), "status": "ok", "note": None}, r1


def cmd_bench(args: argparse.Namespace) -> int:
    suite, subs_dir, out = Path(args.suite), Path(args.submissions), Path(args.out)
    files = sorted(suite.glob("*.eir")) if suite.is_dir() else []
    if not files:
        return cli._fail(f"ember bench: no .eir programs in {suite}", 2)
    if not subs_dir.is_dir():
        return cli._fail(f"ember bench: --submissions {subs_dir} is not a folder", 2)
    try:
        progs = [parse_file(str(f)) for f in files]
    except EirError as e:
        return cli._fail(str(e), 2)
    sandbox = Sandbox([subs_dir, out], 1, Limits(wall=args.timeout))  # one at a time: timings do not share the GPU
    results: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        from tqdm import tqdm
        subs = load_submissions(subs_dir, sandbox, args.ref, args.build_timeout, lambda m: print(m, file=sys.stderr))
        bar = tqdm(total=len(progs) * len(subs), desc="benchmarking", file=sys.stderr)
        for prog in progs:
            name = Path(prog.path).name
            row = results[name] = {}
            ref, ref_stdout = bench_one(sandbox, subs[0], prog, None, args.runs, args.timeout)
            row[REFERENCE] = ref
            bar.update()
            expected = None
            if ref["status"] == "ok" and not prog.expects:  # the reference's result is the answer
                got = cli._parse_output(ref_stdout, prog)
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


# --------------------------------------------------------------------------------- files

def _cell(s: str | None) -> str:
    return (s or "").replace("|", "\\|").replace("\n", " ")[:300]


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a reader never sees half a report


def _write_json(path: Path, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=1, allow_nan=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON: {type(o).__name__}")


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    import io
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    _write_text(path, buf.getvalue())


# ------------------------------------------------------------------------------- the CLI

def add_commands(sub: Any, fmt: type) -> None:
    p = sub.add_parser("grade", help="grade students' tests and compilers (docs/grading.md)", formatter_class=fmt)
    p.add_argument("--tests", required=True, help="a folder with one subfolder of .eir tests per author")
    _submission_options(p, "grade.json", timeout=60.0, per="test")
    p.add_argument("--jobs", type=int, default=0, help="runs at once (0: the core count)")
    p.set_defaults(fn=cmd_grade)

    p = sub.add_parser("bench", help="time the benchmark suite through every compiler (docs/grading.md)",
                       formatter_class=fmt)
    p.add_argument("--suite", default=str(Path(__file__).resolve().parent.parent / "bench" / "suite"),
                   help="a folder of .eir programs")
    _submission_options(p, "bench.json", timeout=300.0, per="program")
    p.add_argument("--runs", type=int, default=10, help="N of --bench N (the honesty check also runs 10N)")
    p.set_defaults(fn=cmd_bench)


def _submission_options(p: argparse.ArgumentParser, report: str, timeout: float, per: str) -> None:
    p.add_argument("--submissions", required=True, help="a folder with one folder (or git repository) per compiler")
    p.add_argument("--out", required=True, help=f"where {report}, summary.md and the CSV files go")
    p.add_argument("--timeout", type=float, default=timeout, help=f"wall-clock seconds per {per} and compiler")
    p.add_argument("--build-timeout", type=float, default=600.0, help="wall-clock seconds for a submission's build")
    p.add_argument("--ref", default=None, help="check git submissions out at this tag or branch")
