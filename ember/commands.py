"""What the command line's parts share (cli.py, grading/, train.py): running one test file
through a backend or a compiler, the one-line internal error, and the help formatter."""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import traceback
from typing import Any, Callable, NoReturn

from . import runners
from .cache import CacheError
from .protocol import bench_median, check_inputs, compare, expected_error, parse_output, reported_error
from .runners import BackendError
from .text import EirError, parse_file


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; an unset one reads 'off'."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings or action.required:
            return text
        if action.default is None or action.default is False:
            return text + " (default: off)"
        return super()._get_help_string(action) or text


class Failure(Exception):
    """A problem the user can fix, said in one line, with its exit status (cli.py's doc)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


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


class Parser(argparse.ArgumentParser):
    """argparse's errors in one line (no usage block), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def fail(msg: str, status: int) -> int:
    """Say msg on stderr, in one line; the exit status to return."""
    print(msg, file=sys.stderr)
    return status


def internal_error(path: str, e: BaseException) -> str:
    if os.environ.get("EMBER_DEBUG"):
        traceback.print_exc()
    return f"{path}: internal error: {type(e).__name__}: {e} (EMBER_DEBUG=1 shows the traceback)"


def _first_line(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.readline()
    except OSError:
        return b""


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


def test_one(path: str, backend: str | None, compiler: list[str] | None, timeout: float,
              bench: int | None = None) -> tuple[str | None, float | None]:
    """(None if the test file passes, else the failure line; the median ms with bench)."""
    want = expected_error(_first_line(path))
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
                values = runners.run_program(prog, backend or runners.default())
            else:
                values, median = runners.bench_program(prog, backend or runners.default(), bench)
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
    except (BackendError, CacheError) as e:
        return f"{path}: {e}", None
    except ValueError as e:
        return f"{path}: {e}", None
    except Exception as e:
        return internal_error(path, e), None
    return (None if problem is None else f"{path}: {problem}"), median
