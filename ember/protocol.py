"""The compiler protocol (spec sections 9 and 10), as a grader reads it: a compiler's printed
values read back into each dtype, compared with `expect` lines or the reference's answer; the
error-test convention; the `# bench` timing line."""
from __future__ import annotations

import math
import os
import re

import numpy as np

from . import data, ir
from .text import EirError, Program


def check_inputs(prog: Program) -> None:
    for name in prog.params:
        if name not in prog.inputs:
            msg = f"param '{name}' has no 'input' line, so the program cannot run"
            raise EirError(prog.path, prog.lines[name], msg)


def parse_output(stdout: str, prog: Program) -> dict[str, np.ndarray]:
    """Read the protocol's `NAME = [...]` lines back into each name's dtype (spec 9)."""
    got: dict[str, np.ndarray] = {}
    for line in stdout.splitlines():
        name, eq, rest = line.partition(" = ")
        if not eq or name not in prog.nodes:
            continue
        inner = rest.strip()
        if not (inner.startswith("[") and inner.endswith("]")):
            raise ValueError(f"bad output line for {name}: {line[:80]}")
        node = prog.nodes[name]
        try:
            got[name] = data.read_values(inner[1:-1], node.dtype, node.numel)
        except data.ValueError_ as e:
            raise ValueError(f"the output line for {name} ({ir.fmt_type(node.dtype, node.shape)}): {e}") from None
    return got


def compare(prog: Program, got: dict[str, np.ndarray], answers: dict[str, np.ndarray] | None = None,
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


def expected_error(source: bytes) -> tuple[int, str] | None:
    """(line, words) for a test of an error message: a file whose first line is
    `# error: LINE: words of the message` passes when the program is rejected there."""
    m = ERROR_TEST.match(source.partition(b"\n")[0].decode("ascii", errors="replace"))
    return (int(m.group(1)), m.group(2).strip()) if m else None


def reported_error(status: int | None, stderr: str, line: int, path: str, copy: bool = False) -> bool:
    """Spec 9's answer to an invalid program: status 2 and `FILE:LINE: message` first on stderr.
    FILE is path as the compiler was given it; copy=True (a grader's copy of the file in a folder
    of its own): any folder, then path's file name. No other colon may come before LINE."""
    first = (stderr.strip().splitlines() or [""])[0]
    file = rf"(?:[^:\n]*/)?{re.escape(os.path.basename(path))}" if copy else re.escape(path)
    return status == 2 and re.match(rf"{file}:{line}:", first) is not None


BENCH_LINE = re.compile(r"# bench runs=(\d+) median_ms=([0-9.eE+-]+)\s*$")


def bench_median(stdout: str) -> float | None:
    """The median_ms of the spec's timing line, or None when there is none."""
    for line in reversed(stdout.splitlines()):
        m = BENCH_LINE.match(line.strip())
        if m:
            v = data.parse_number(m.group(2))
            return float(v) if v is not None and math.isfinite(v) and v >= 0 else None
    return None
