"""The `ember` command: run, test, fmt, source.

Exit status: 0 success; 1 a test failed; 2 a malformed program (one `FILE:LINE: message` line on
stderr), a bad option or checkpoint; 3 a program that cannot be run here for another reason;
130 interrupted.
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NoReturn

from . import backends
from .backends import BackendError
from .protocol import bench_median, check_inputs, compare, expected_error, parse_output, reported_error
from .text import EirError, format_text, parse_file


def _fail(msg: str, status: int) -> int:
    print(msg, file=sys.stderr)
    return status


class Failure(Exception):
    """A problem the user can fix, said in one line, with its exit status (the module's doc)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def _internal(path: str, e: BaseException) -> str:
    if os.environ.get("EMBER_DEBUG"):
        traceback.print_exc()
    return f"{path}: internal error: {type(e).__name__}: {e} (EMBER_DEBUG=1 shows the traceback)"


def cmd_run(args: argparse.Namespace) -> int:
    median = None
    try:
        prog = parse_file(args.file)
        check_inputs(prog)
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


def _check_error_test(path: str, want: tuple[int, str], compiler: list[str] | None, timeout: float) -> str | None:
    line, words = want
    if compiler is None:
        try:
            check_inputs(parse_file(path))
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
    want = expected_error(path)
    if want is not None:
        return _check_error_test(path, want, compiler, timeout), None
    try:
        prog = parse_file(path)
        check_inputs(prog)
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
            got = parse_output(proc.stdout, prog)
            if bench is not None:
                median = bench_median(proc.stdout)
                if median is None:
                    return f"{path}: no '# bench runs=N median_ms=X' line (spec 10)", None
        problem = compare(prog, got)
    except BackendError as e:
        return f"{path}: {e}", None
    except ValueError as e:
        return f"{path}: {e}", None
    except Exception as e:
        return _internal(path, e), None
    return (None if problem is None else f"{path}: {problem}"), median


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


def bounded(kind: type, low: float, high: float | None = None, what: str = "") -> Callable[[str], Any]:
    """An argparse type: a number of `kind` in [low, high], else argparse's one-line error."""
    what = what or {int: "a whole number"}.get(kind, "a number")

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        if not low <= value <= (math.inf if high is None else high):  # (NaN is in no range)
            top = f" and <= {high:g}" if high is not None else ""
            raise argparse.ArgumentTypeError(f"expected {what} >= {low:g}{top}, got '{text}'")
        return value
    parse.__name__ = kind.__name__
    return parse


_positive = bounded(int, 1, what="a whole number of runs")


class Parser(argparse.ArgumentParser):
    """argparse's errors in one line (no usage block), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


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
    ap = Parser(prog="ember", description="Ember: a tensor compiler for the Ember IR (.eir).", formatter_class=fmt)
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
    p.add_argument("--timeout", type=bounded(float, 0.001), default=120.0, help="seconds per file with --compiler")
    p.add_argument("-j", "--jobs", type=bounded(int, 0), default=0, help="files run at once (0: the core count)")
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

    from .grading import add_commands
    add_commands(sub, fmt)

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
        try:
            from . import train
            return (train.train if argv[0] == "train" else train.sample)(argv[1:])
        except KeyboardInterrupt:  # in set-up or compiling (the training loop saves a checkpoint first)
            return _fail(f"ember {argv[0]}: interrupted", 130)
        except Failure as e:
            return _fail(f"ember {argv[0]}: {e}", e.status)
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
