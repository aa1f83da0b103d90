"""`ember grade`: every student's tests (read under caps, validated in a limited child, in both
of spec 8's precision modes) against every compiler (submissions.py), run where cluster.py says.
docs/grading.md says how a course uses it; sandbox.py how untrusted compilers are contained."""
from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import re
import resource
import stat
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import protocol, runners
from ..commands import fail
from ..text import EirError, Program, parse_bytes
from . import course, similarity, week
from .cluster import Context, Runner
from .reports import _cell, _write_csv, _write_json, _write_text, prepare_out
from .sandbox import Result, Sandbox, ember_hidden, level
from .submissions import REFERENCE, Submission, run_compiler, without_expects

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
    source: bytes = b""       # the file's bytes, read once (read_test)
    want: tuple[int, str] | None = None   # (line, words) of a test of an error message
    prog: Program | None = None           # parsed once, after validation
    valid: bool = True
    reason: str | None = None
    broken_by: list[str] = field(default_factory=list)

    def __getstate__(self) -> dict[str, Any]:   # sent to a cluster's worker: nodes do not pickle, it parses again
        return {**self.__dict__, "prog": None}

    def program(self) -> Program:
        """The test parsed once in this process (a worker's copy of a Test comes without it)."""
        if self.prog is None:
            self.prog = _parse_once(self.source, self.key)
        return self.prog


@functools.lru_cache(maxsize=4096)
def _parse_once(source: bytes, key: str) -> Program:
    return parse_bytes(source, key)


def find_tests(folder: Path, max_bytes: int, per_author: int = 100) -> tuple[list[Test], dict[str, int]]:
    """Every *.eir under each author's folder, read once, at most per_author of them (the
    uncounted rest per author is returned: a flood of tests would stall a week's grading). Links
    are never followed: a linked author or subfolder is skipped, a linked or special file is an
    invalid test. A test with the same bytes as an earlier one is invalid: it would count twice."""
    tests, skipped, seen = [], {}, {}
    authors = [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]
    for author in sorted(authors):
        for i, f in enumerate(_eir_files(author)):
            if i >= per_author:
                skipped[author.name] = skipped.get(author.name, 0) + 1
                continue
            t = Test(f"{author.name}/{f.relative_to(author).as_posix()}", f)
            try:
                t.source = read_test(f, max_bytes)
                t.want = protocol.expected_error(t.source)
            except ValueError as e:
                t.valid, t.reason = False, str(e)
            if t.valid and seen.setdefault(t.source, t.key) != t.key:
                t.valid, t.reason = False, f"has the same bytes as {seen[t.source]}, which counts already"
            tests.append(t)
    return tests, skipped


def _eir_files(author: Path) -> Iterator[Path]:
    """Every *.eir below an author's folder, in order, never through a link. Iterative: a tree
    a thousand folders deep is only deep (os.walk recurses on Python 3.11)."""
    stack = [author]
    while stack:
        try:
            entries = sorted(os.scandir(stack.pop()), key=lambda e: e.name)
        except OSError:   # a path past PATH_MAX, or a folder not readable: nothing in it is a test
            continue
        stack += [Path(e.path) for e in reversed(entries) if e.is_dir(follow_symlinks=False)]
        yield from (Path(e.path) for e in entries if e.name.endswith(".eir") and not e.is_dir(follow_symlinks=False))


def read_test(path: Path, max_bytes: int) -> bytes:
    """A student's test file: a regular file of at most max_bytes, never through a link, never
    blocking (a FIFO). The ValueError says why not, quoting nothing of what the path points to."""
    too_large = f"is larger than {max_bytes / 2**20:g} MiB (--max-test-mib)"
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise ValueError("is a symlink: a test must be a regular file (links are not followed)")
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("is not a regular file (a test must be one)")
            if st.st_nlink > 1:   # another name of a file elsewhere (a root-only secret, say)
                raise ValueError("is a hard link: a test must be a file of its own")
            if st.st_size > max_bytes:
                raise ValueError(too_large)
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise ValueError(f"cannot be read: {e.strerror}") from None
    if len(raw) > max_bytes:  # it grew after fstat
        raise ValueError(too_large)
    return raw


MAX_VALIDATE_NUMEL = 1 << 28  # elements of one value the reference evaluator materializes for validation


# the reference evaluator rounding each op's result, keeping every intermediate wide, and adding
# sums from their last element (spec 4: a fused kernel's precision and a sum's order are free)
VALIDITY_MODES = (("ref", ""), ("ref-wide", " with intermediates kept wide (spec 8)"),
                  ("ref-reversed", " with its float sums added in reverse order (spec 4)"))


def validate(t: Test) -> None:
    """A test is valid when it parses, has at least one expect line, and its expectations hold
    on the reference evaluator in every mode of VALIDITY_MODES (each op's result rounded to its
    dtype, every intermediate kept wide, sums added from the end); a test of an error message,
    when the reference rejects it on its line with its words, as a compiler gets it (its expect
    lines blanked: an error on an expect line is no error a compiler can find). Runs in a child
    process with limits (validate_limited)."""
    try:
        prog = parse_bytes(t.source if t.want is None else without_expects(t.source), t.key)
        protocol.check_inputs(prog)
    except EirError as e:
        if t.want is None or e.line != t.want[0] or t.want[1] not in e.msg:
            t.valid, t.reason = False, f"does not parse: {e}"
        return
    if t.want is not None:
        t.valid, t.reason = False, f"expects the error '{t.want[1]}' on line {t.want[0]}, but the program is valid"
        return
    if not prog.expects:
        t.valid, t.reason = False, "has no expect line, so it checks nothing"
        return
    big = max(prog.nodes, key=lambda n: prog.nodes[n].numel)
    if prog.nodes[big].numel > MAX_VALIDATE_NUMEL:
        t.valid, t.reason = False, (f"too large: '{big}' has {prog.nodes[big].numel} elements, and the grader "
                                    f"validates values of at most 2^28")
        return
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    for backend, how in VALIDITY_MODES:  # spec 8: valid only if it holds however a compiler may round
        try:  # the evaluator itself, not run_program, whose backend probe would start CUDA in every child
            values = runners.BACKENDS[backend].run(prog.output_nodes, inputs)
            problem = protocol.compare(prog, dict(zip(prog.outputs, values)))
        except runners.BackendError as e:
            problem = str(e)
        if problem is not None:
            t.valid, t.reason = False, f"fails on the reference evaluator{how}: {problem}"
            return


def validate_limited(t: Test, memory: int, seconds: float) -> None:
    """validate(t) in a child process limited to memory bytes of data and seconds of CPU and
    wall time; then, when it is valid, the test parsed once for grading. Children fork from
    a server that holds Ember already, so each starts in milliseconds."""
    if not t.valid:
        return
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_validate_child, args=(t, memory, seconds, send), daemon=True)
    child.start()
    send.close()
    try:
        result = recv.recv() if recv.poll(seconds) else None
    except EOFError:  # it died
        result = None
    child.join(1.0 if result is not None else 0.0)
    timed_out = child.is_alive()
    if timed_out:
        child.kill()
    child.join()
    recv.close()
    if result is not None:
        t.valid, t.reason = result
    elif timed_out or child.exitcode in (-9, -24):  # SIGKILL or SIGXCPU: the CPU time limit
        t.valid, t.reason = False, f"took more than {seconds:g} s to validate"
    else:
        t.valid, t.reason = False, f"stopped the validation (exit status {child.exitcode})"
    if t.valid and t.want is None:
        t.program()


def _validate_child(t: Test, memory: int, seconds: float, conn: Any) -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))  # numpy's arrays are private mappings: counted
    cpu = max(1, math.ceil(seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    try:
        validate(t)
    except MemoryError:
        t.valid, t.reason = False, f"too large: it exceeded the validation memory limit ({memory >> 20} MiB)"
    except Exception as e:  # a bug of the reference evaluator: the test cannot be judged
        t.valid, t.reason = False, f"the reference evaluator failed on it: {type(e).__name__}: {str(e)[:200]}"
    conn.send((t.valid, t.reason))


def grade_one(sandbox: Sandbox, sub: Submission, t: Test, timeout: float) -> str | None:
    """None when sub passes test t, else the first mismatch or error."""
    if sub.build_error:
        return sub.build_error
    r = run_compiler(sandbox, sub, t.path, [], timeout, t.source)
    if t.want is not None:  # a test of an error message: status 2 and FILE:LINE: first on stderr, FILE its copy
        if protocol.reported_error(r.status, r.stderr, t.want[0], t.path.name, copy=True):
            return None
        return (f"expected exit status 2 and '{t.path.name}:{t.want[0]}: ...' first on stderr (the path as given), "
                f"got {r.failure() or 'success'}")
    return judge(t.program(), r)


def grade_task(sandbox: Sandbox, subs: dict[str, Submission], name: str, t: Test, timeout: float) -> str | None:
    """grade_one as a task of cluster.Runner."""
    return grade_one(sandbox, subs[name], t, timeout)


def cmd_grade(args: argparse.Namespace) -> int:
    tests_dir, out = Path(args.tests), Path(args.out)
    if not tests_dir.is_dir():
        return fail(f"ember grade: --tests {tests_dir} is not a folder", 2)
    try:
        sources, hide = course.sources(args)
    except course.CourseError as e:
        return fail(str(e), 2)
    base = Path(args.similarity_base) if args.similarity_base else None
    if base is not None and not base.is_dir():
        return fail(f"ember grade: --similarity-base {base} is not a folder", 2)
    tests, skipped = find_tests(tests_dir, int(args.max_test_mib * 2**20), args.max_tests_per_author)
    for author, n in skipped.items():
        print(f"ember grade: {author}: {n} tests past --max-tests-per-author {args.max_tests_per_author} "
              "not read", file=sys.stderr)
    if not tests:
        return fail(f"ember grade: no tests in {tests_dir} (one subfolder of .eir files per author)", 2)
    if (hidden := ember_hidden(args.allow_ember)) is not None:
        return fail(f"ember grade: {hidden}", 2)
    out = prepare_out(out)
    jobs = args.jobs or os.cpu_count() or 1
    ctx = Context(tuple(sources), args.ref, args.build_timeout, tuple(str(p) for p in (tests_dir, *hide, out)),
                  args.timeout, jobs, allow_ember=args.allow_ember)
    if level() != "namespaces":
        print(f"ember grade: containment is '{level()}' here (see docs/grading.md)", file=sys.stderr)
    from tqdm import tqdm
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        memory = int(args.validate_mib * 2**20)
        checks = pool.map(lambda t: validate_limited(t, memory, args.validate_timeout), tests)
        list(tqdm(checks, total=len(tests), desc="validating tests", file=sys.stderr))
    valid = [t for t in tests if t.valid]
    with Runner(ctx, jobs, args.scheduler, args.workers, progress=lambda m: print(m, file=sys.stderr)) as runner:
        names = runner.names
        failures: dict[str, dict[str, str]] = {n: {} for n in names}
        tasks = [(n, t, args.timeout) for n in names for t in valid]
        for i, problem in tqdm(runner.map(grade_task, tasks), total=len(tasks), desc="grading", file=sys.stderr):
            n, t, _ = tasks[i]
            if problem is not None:
                failures[n][t.key] = problem
                t.broken_by.append(n)
    for t in valid:   # fail closed: a test the reference compiler fails counts for no one
        if REFERENCE in t.broken_by:
            t.valid, t.reason, t.broken_by = False, f"the reference compiler fails it: {failures[REFERENCE][t.key]}", []
            for f in failures.values():
                f.pop(t.key, None)
    valid = [t for t in valid if t.valid]
    report = {
        "tests": {t.key: {"valid": t.valid, "reason": t.reason, "broken_by": sorted(t.broken_by)} for t in tests},
        "submissions": {n: {"passed": len(valid) - len(failures[n]), "failed": len(failures[n]),
                            "rate": (len(valid) - len(failures[n])) / len(valid) if valid else 0.0,
                            "failures": dict(sorted(failures[n].items()))} for n in names}}
    if skipped:
        report["tests_not_read"] = skipped   # per author, past --max-tests-per-author
    if args.similarity is not None:
        report["similarity"] = _similarity(sources, args.similarity, base)
    write_grade(out, report)
    if args.compare_to:
        week.write_changes(out, Path(args.compare_to), report)
    print(f"graded {len(names)} compilers on {len(valid)} valid tests ({len(tests) - len(valid)} invalid): "
          f"{out / 'grade.json'}, {out / 'summary.md'}")
    return 0


def _similarity(sources: list[course.Source], threshold: float, base: Path | None) -> dict[str, Any]:
    """The similarity report over the submissions as handed in: a folder as it is, a collection's
    commit checked out from its bundle (never the built copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for src in sources:
            if src.path is not None and src.commit is None and src.path.is_dir():
                folders[src.name] = src.path
            elif src.path is not None and src.commit is not None:
                course.checkout(src.path, src.commit, Path(tmp) / src.name)
                folders[src.name] = Path(tmp) / src.name
        return similarity.report(folders, Path(__file__).resolve().parents[1], threshold, base)


def write_grade(out: Path, report: dict[str, Any]) -> None:
    _write_json(out / "grade.json", report)
    subs, tests = report["submissions"], report["tests"]
    _write_csv(out / "submissions.csv", ["name", "passed", "failed", "rate"],
               [[n, s["passed"], s["failed"], f"{s['rate']:.4f}"] for n, s in subs.items()])
    _write_csv(out / "tests.csv", ["test", "valid", "reason", "broken_by"],
               [[k, t["valid"], t["reason"] or "", " ".join(t["broken_by"])] for k, t in tests.items()])
    _write_csv(out / "failures.csv", ["name", "test", "failure"],
               [[n, k, f] for n, s in subs.items() for k, f in s["failures"].items()])
    md = ["# Grades", "", "| compiler | passed | failed | rate |", "|---|---|---|---|"]
    md += [f"| {_cell(n)} | {s['passed']} | {s['failed']} | {100 * s['rate']:.1f}% |"
           for n, s in sorted(subs.items(), key=lambda kv: -kv[1]["rate"])]
    md += ["", "## Tests that break compilers (the bonus)", "", "| test | broken by |", "|---|---|"]
    md += [f"| {_cell(k)} | {_cell(', '.join(t['broken_by']))} |" for k, t in tests.items()
           if t["valid"] and t["broken_by"]]
    md += [f"\n{_cell(a)}: {n} tests past the cap of tests per author were not read" for a, n in
           report.get("tests_not_read", {}).items()]
    md += ["", "## Invalid tests", "", "| test | reason |", "|---|---|"]
    md += [f"| {_cell(k)} | {_cell(t['reason'])} |" for k, t in tests.items() if not t["valid"]]
    if "similarity" in report:
        md += similarity.markdown(report["similarity"])
    _write_text(out / "summary.md", "\n".join(md) + "\n")
