"""Grading a course: `ember grade` (students' tests against students' compilers) and
`ember bench` (a fixed suite of programs timed through every compiler). docs/grading.md says
how a course uses them; sandbox.py how untrusted compilers are contained.

A submission is a folder holding an executable `compiler` that follows the protocol (spec 9
and 10) and, optionally, an executable `build` run once first. The reference compiler (Ember)
takes part as the submission `reference`; it is trusted and runs as the grader.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import commands, protocol
from ..text import EirError, Program, parse_file
from .reports import _cell, _write_csv, _write_json, _write_text
from .sandbox import Limits, Result, Sandbox

REFERENCE = "reference"


def _fail(msg: str, status: int) -> int:
    print(msg, file=sys.stderr)
    return status

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


TOLERANCE = re.compile(r"#\s*tolerance:\s*atol=(\S+)\s+rtol=(\S+)")


def tolerance(prog: Program) -> tuple[float | None, float | None]:
    """A suite file may set its float tolerance in a comment `# tolerance: atol=A rtol=R`
    (large sums and tensor-core matmuls differ from the reference by more than spec 8's defaults)."""
    m = TOLERANCE.search(Path(prog.path).read_text(errors="replace"))
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def judge(prog: Program, r: Result, expected: dict[str, np.ndarray] | None = None) -> str | None:
    """None when the compiler's output matches the test (or the reference's `expected`), else why not."""
    if r.failure():
        return r.failure()
    try:
        got = protocol.parse_output(r.stdout, prog)
    except ValueError as e:
        return str(e)
    if expected is None:
        return protocol.compare(prog, got)
    problem = protocol.compare(prog, got, expected, tolerance(prog))
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
    want = protocol.expected_error(str(t.path))
    if want is None:
        try:
            prog = parse_file(str(t.path))
        except EirError as e:
            t.valid, t.reason = False, f"does not parse: {e}"
            return
        if not prog.expects:
            t.valid, t.reason = False, "has no expect line, so it checks nothing"
            return
    problem, _ = commands.test_one(str(t.path), "ref", None, 0)
    if problem is not None:
        t.valid, t.reason = False, f"fails on the reference evaluator: {problem}"


def grade_one(sandbox: Sandbox, sub: Submission, t: Test, timeout: float) -> str | None:
    """None when sub passes test t, else the first mismatch or error."""
    if sub.build_error:
        return sub.build_error
    r = run_compiler(sandbox, sub, t.path, [], timeout)
    want = protocol.expected_error(str(t.path))
    if want is not None:  # a test of an error message: status 2 and FILE:LINE: on stderr
        if protocol.reported_error(r.status, r.stderr, want[0]):
            return None
        return f"expected exit status 2 and an error on line {want[0]}, got {r.failure() or 'success'}"
    return judge(parse_file(str(t.path)), r)


def cmd_grade(args: argparse.Namespace) -> int:
    tests_dir, subs_dir, out = Path(args.tests), Path(args.submissions), Path(args.out)
    for d, what in ((tests_dir, "--tests"), (subs_dir, "--submissions")):
        if not d.is_dir():
            return _fail(f"ember grade: {what} {d} is not a folder", 2)
    tests = find_tests(tests_dir)
    if not tests:
        return _fail(f"ember grade: no tests in {tests_dir} (one subfolder of .eir files per author)", 2)
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
