"""The `ember` command: run, test, fmt, source.

Exit status: 0 success; 1 a test failed; 2 a malformed program (one `FILE:LINE: message` line on
stderr); 3 a program that cannot be run here for another reason.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import backends, data
from .backends import BackendError
from .text import EirError, Program, format_text, parse_file


def _fail(msg: str, status: int) -> int:
    print(msg, file=sys.stderr)
    return status


def _internal(path: str, e: BaseException) -> str:
    if os.environ.get("EMBER_DEBUG"):
        traceback.print_exc()
    return f"{path}: internal error: {type(e).__name__}: {e} (EMBER_DEBUG=1 shows the traceback)"


def _check_inputs(prog: Program) -> None:
    for name in prog.params:
        if name not in prog.inputs:
            msg = f"param '{name}' has no 'input' line, so the program cannot run"
            raise EirError(prog.path, prog.lines[name], msg)


def cmd_run(args: argparse.Namespace) -> int:
    median = None
    try:
        prog = parse_file(args.file)
        _check_inputs(prog)
        backend = args.backend or backends.default()
        if args.bench is None:
            values = backends.run_program(prog, backend)
        else:
            values, median = backends.bench_program(prog, backend, args.bench)
    except EirError as e:
        return _fail(str(e), 2)
    except BackendError as e:
        return _fail(f"{args.file}: {e}", 3)
    except Exception as e:  # a bug in Ember: one line, never a partial result
        return _fail(_internal(args.file, e), 3)
    lines = backends.output_lines(prog, values)
    if median is not None:
        lines.append(f"# bench runs={args.bench} median_ms={median:.6g}")
    print("\n".join(lines))
    return 0


def cmd_fmt(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_bytes().decode("ascii", errors="replace")
        parse_file(args.file)  # exact errors, bytes included
        out = format_text(text, args.file)
    except EirError as e:
        return _fail(str(e), 2)
    except OSError as e:
        return _fail(f"{args.file}:0: cannot read the file: {e.strerror}", 2)
    if args.check:
        if out != text:
            return _fail(f"{args.file}: not in canonical form (ember fmt -w rewrites it)", 1)
        return 0
    if args.write:
        tmp = f"{args.file}.{os.getpid()}.tmp"
        Path(tmp).write_text(out)
        os.replace(tmp, args.file)  # atomic: the file is never half written
    else:
        sys.stdout.write(out)
    return 0


def cmd_source(args: argparse.Namespace) -> int:
    backend = args.backend or ("cuda" if "cuda" in backends.available() else "c")
    try:
        prog = parse_file(args.file)
        print(backends.BACKENDS[backend].source(prog.output_nodes, args.arch))
    except EirError as e:
        return _fail(str(e), 2)
    except BackendError as e:
        return _fail(f"{args.file}: {e}", 3)
    except Exception as e:
        return _fail(_internal(args.file, e), 3)
    return 0


# -------------------------------------------------------------------------------------- test

def _files(paths: list[str]) -> list[str]:
    found: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            found += sorted(str(f) for f in Path(p).rglob("*.eir"))
        else:
            found.append(p)
    return found


def _parse_output(stdout: str, prog: Program) -> dict[str, np.ndarray]:
    """Read the protocol's `NAME = [...]` lines back into each name's dtype (spec 9)."""
    got: dict[str, np.ndarray] = {}
    for line in stdout.splitlines():
        name, eq, rest = line.partition(" = ")
        if not eq or name not in prog.nodes:
            continue
        inner = rest.strip()
        if not (inner.startswith("[") and inner.endswith("]")):
            raise ValueError(f"bad output line for {name}: {line[:80]}")
        items = [s.strip() for s in inner[1:-1].split(",")] if inner[1:-1].strip() else []
        dtype = prog.nodes[name].dtype
        nums = [data.read_back(s, dtype) for s in items]
        bad = next((s for s, v in zip(items, nums) if v is None), None)
        if bad is not None:
            raise ValueError(f"'{bad[:40]}' in the output line for {name} is not a value of {dtype}")
        got[name] = np.array(nums, dtype=np.float64 if dtype.is_float else object)
    return got


def _compare(prog: Program, got: dict[str, np.ndarray], answers: dict[str, np.ndarray] | None = None,
             tolerance: tuple[float | None, float | None] = (None, None)) -> str | None:
    """None if every expect matches, else a line naming the first mismatching element. With
    answers (name -> values, e.g. the reference's output), those are expected instead, at the
    given tolerance (None: spec 8's defaults)."""
    for name in answers if answers is not None else prog.expects:
        node = prog.nodes[name]
        if name not in got:
            return f"no output for '{name}'"
        actual = np.asarray(got[name]).reshape(-1)
        if actual.size != node.numel:
            return f"'{name}' has {actual.size} values, expected {node.numel} ({node.dtype}{list(node.shape)})"
        if answers is not None:
            expected, (atol, rtol) = answers[name].reshape(-1), tolerance
        else:
            spec = prog.expects[name]
            expected, atol, rtol = prog.expected_values(name).reshape(-1), spec.atol, spec.rtol
        i = data.first_mismatch(actual, expected, node.dtype, atol, rtol)
        if i is not None:
            idx = ",".join(map(str, np.unravel_index(i, node.shape))) if node.shape else ""
            show = lambda v: data.format_values(np.array([v]), node.dtype)[1:-1]  # noqa: E731
            return f"{name}[{idx}] = {show(actual[i])}, expected {show(expected[i])}"
    return None


ERROR_TEST = re.compile(r"# error: (\d+): (.*)")


def _expected_error(path: str) -> tuple[int, str] | None:
    """(line, words) for a test of an error message: a file whose first line is
    `# error: LINE: words of the message` passes when the program is rejected there."""
    try:
        with open(path, "rb") as f:
            first = f.readline().decode("ascii", errors="replace")
    except OSError:
        return None
    m = ERROR_TEST.match(first)
    return (int(m.group(1)), m.group(2).strip()) if m else None


def reported_error(status: int | None, stderr: str, line: int, path: str | None = None) -> bool:
    """Spec 9's answer to an invalid program: status 2 and `FILE:LINE: message` first on stderr
    (FILE is any path when path is None: a grader runs a copy of the file)."""
    first = (stderr.strip().splitlines() or [""])[0]
    return status == 2 and re.match(rf"{re.escape(path) if path else '.*'}:{line}:", first) is not None


def _check_error_test(path: str, want: tuple[int, str], compiler: list[str] | None, timeout: float) -> str | None:
    line, words = want
    if compiler is None:
        try:
            _check_inputs(parse_file(path))
        except EirError as e:
            if e.line == line and words in e.msg:
                return None
            return f"{path}: expected the error '{words}' on line {line}, got: {e}"
        return f"{path}: expected the error '{words}' on line {line}, but the program is valid"
    try:
        proc = subprocess.run(compiler + [path], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{path}: timed out after {timeout:g} s"
    if reported_error(proc.returncode, proc.stderr, line, path):
        return None
    first = (proc.stderr.strip().splitlines() or [""])[0]
    got = f"got status {proc.returncode}: {first[:120]}"
    return f"{path}: expected exit status 2 and '{path}:{line}: ...' on stderr, {got}"


def _test_one(path: str, backend: str | None, compiler: list[str] | None, timeout: float,
              bench: int | None = None) -> tuple[str | None, float | None]:
    """(None if the test file passes, else the failure line; the median ms with bench)."""
    want = _expected_error(path)
    if want is not None:
        return _check_error_test(path, want, compiler, timeout), None
    try:
        prog = parse_file(path)
        _check_inputs(prog)
    except EirError as e:
        return str(e), None
    median = None
    try:
        if compiler is None:
            if bench is None:
                values = backends.run_program(prog, backend or backends.default())
            else:
                values, median = backends.bench_program(prog, backend or backends.default(), bench)
            got = dict(zip(prog.outputs, values))
        else:
            cmd = compiler + [path] + (["--bench", str(bench)] if bench is not None else [])
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return f"{path}: timed out after {timeout:g} s", None
            except OSError as e:
                return f"{path}: cannot start the compiler: {e}", None
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["(no message)"])[0]
                return f"{path}: the compiler exited with status {proc.returncode}: {first}", None
            got = _parse_output(proc.stdout, prog)
            if bench is not None:
                median = bench_median(proc.stdout)
                if median is None:
                    return f"{path}: no '# bench runs=N median_ms=X' line (spec 10)", None
        problem = _compare(prog, got)
    except BackendError as e:
        return f"{path}: {e}", None
    except ValueError as e:
        return f"{path}: {e}", None
    except Exception as e:
        return _internal(path, e), None
    return (None if problem is None else f"{path}: {problem}"), median


BENCH_LINE = re.compile(r"# bench runs=(\d+) median_ms=([0-9.eE+-]+)\s*$")


def bench_median(stdout: str) -> float | None:
    """The median_ms of the spec's timing line, or None when there is none."""
    for line in reversed(stdout.splitlines()):
        m = BENCH_LINE.match(line.strip())
        if m:
            v = data.parse_number(m.group(2))
            return float(v) if v is not None and math.isfinite(v) and v >= 0 else None
    return None


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What makes a whole `ember test` run impossible, said once instead of once per file."""
    if args.compiler:
        try:
            cmd = shlex.split(args.compiler)
        except ValueError as e:
            return f"ember test: --compiler: {e}"
        if not cmd:
            return "ember test: --compiler is empty"
        exe = cmd[0]
        if not (shutil.which(exe) or (os.sep in exe and os.access(exe, os.X_OK))):
            return f"ember test: the compiler '{exe}' was not found or is not executable"
        return None
    try:
        backends.resolve(args.backend or backends.default())
    except BackendError as e:
        return f"ember test: {e}"
    return None


def cmd_test(args: argparse.Namespace) -> int:
    files = _files(args.paths)
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        return _fail(f"ember test: no such file or directory: {missing[0]}", 2)
    if not files:
        return _fail(f"ember test: no .eir files in {' '.join(args.paths)}", 2)
    problem = _usage_problem(args)
    if problem:
        return _fail(problem, 2)
    compiler = shlex.split(args.compiler) if args.compiler else None
    jobs = args.jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda f: _test_one(f, args.backend, compiler, args.timeout, args.bench), files))
    failed = [r for r, _ in results if r is not None]
    for line in failed:
        print(f"FAIL {line}")
    if args.bench is not None:
        for f, (r, median) in zip(files, results):
            if r is None and median is not None:
                print(f"{f}: median_ms={median:.6g}")
    print(f"{len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of runs >= 1, got '{text}'")
    return n


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; an unset one reads 'off'."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings or action.required:
            return text
        if action.default is None or action.default is False:
            return text + " (default: off)"
        return super()._get_help_string(action) or text


def build_parser() -> argparse.ArgumentParser:
    fmt = HelpWithDefaults
    ap = argparse.ArgumentParser(prog="ember", description="Ember: a tensor compiler for the Ember IR (.eir).",
                                 formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"ember {version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    backends_help = "ref, c or cuda (default: cuda with a GPU, else c)"

    p = sub.add_parser("run", help="run a test file and print its outputs (the compiler protocol)", formatter_class=fmt)
    p.add_argument("file", help="the .eir test file")
    p.add_argument("--backend", help=backends_help)
    p.add_argument("--bench", type=_positive, metavar="N", default=None,
                   help="then run N more times and print '# bench runs=N median_ms=X' (spec 10)")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("test", help="run test files (directories recursively) and check their expect lines",
                       formatter_class=fmt)
    p.add_argument("paths", nargs="+", help="test files and folders")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--backend", help=backends_help)
    group.add_argument("--compiler", help="an external command that follows the protocol, e.g. './mycc'")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per file with --compiler")
    p.add_argument("-j", "--jobs", type=int, default=0, help="files run at once (0: the core count)")
    p.add_argument("--bench", type=_positive, metavar="N", default=None,
                   help="time each passing file over N runs (spec 10) and print its median")
    p.set_defaults(fn=cmd_test)

    p = sub.add_parser("fmt", help="print a file in canonical form (comments and order kept)", formatter_class=fmt)
    p.add_argument("file", help="the .eir file")
    p.add_argument("-w", "--write", action="store_true", help="rewrite the file in place")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not in canonical form")
    p.set_defaults(fn=cmd_fmt)

    p = sub.add_parser("source", help="print the generated source of a program", formatter_class=fmt)
    p.add_argument("file", help="the .eir file")
    p.add_argument("--backend", choices=[n for n, b in backends.BACKENDS.items() if b.module],
                   help="which source (default: cuda with a GPU, else c)")
    from .backend.cuda import ARCHS
    p.add_argument("--arch", choices=ARCHS, default=None,
                   help="the GPU the CUDA source is for (default: this machine's GPU, else sm_86)")
    p.set_defaults(fn=cmd_source)

    from . import grade
    grade.add_commands(sub, fmt)

    p = sub.add_parser("train", help="train a small GPT on real text (ember train --help)", add_help=False)
    p.set_defaults(fn=None)
    p = sub.add_parser("sample", help="generate text from a training checkpoint", add_help=False)
    p.set_defaults(fn=None)
    return ap


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("ember")
    except PackageNotFoundError:
        return "0.1.0 (source tree)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("train", "sample"):  # their own argument parsers
        from . import train
        try:
            return (train.train if argv[0] == "train" else train.sample)(argv[1:])
        except (ValueError, KeyError, OSError, BackendError) as e:
            return _fail(f"ember {argv[0]}: {type(e).__name__}: {e}", 3)
        except Exception as e:
            return _fail(_internal(f"ember {argv[0]}", e), 3)
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except (ValueError, OSError) as e:  # bad folders or names given to grade and bench: one line
        return _fail(f"ember {args.cmd}: {e}", 2)


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `ember run FILE | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    sys.exit(code)
