"""The `ember` command: run, test, fmt, source.

Exit status: 0 success; 1 a test failed; 2 a malformed program (one `FILE:LINE: message` line on
stderr); 3 a program that cannot be run here for another reason.
"""
from __future__ import annotations

import argparse
import os
import shlex
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
    try:
        prog = parse_file(args.file)
        _check_inputs(prog)
        values = backends.run_program(prog, args.backend or backends.default())
    except EirError as e:
        return _fail(str(e), 2)
    except BackendError as e:
        return _fail(f"{args.file}: {e}", 3)
    except Exception as e:  # a bug in Ember: one line, never a partial result
        return _fail(_internal(args.file, e), 3)
    print("\n".join(backends.output_lines(prog, values)))
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
        if backend == "c":
            from .backend import c
            print(c.source(prog.output_nodes))
        elif backend == "cuda":
            from .backend import cuda
            print(cuda.source(prog.output_nodes))
        else:
            return _fail(f"ember source: backend '{backend}' generates no source (use c or cuda)", 3)
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
    """Read the protocol's `NAME = [...]` lines back into arrays of each name's dtype."""
    got: dict[str, np.ndarray] = {}
    for line in stdout.splitlines():
        name, eq, rest = line.partition(" = ")
        if not eq or name not in prog.nodes:
            continue
        inner = rest.strip()
        if not (inner.startswith("[") and inner.endswith("]")):
            raise ValueError(f"bad output line for {name}: {line[:80]}")
        items = [s.strip() for s in inner[1:-1].split(",")] if inner[1:-1].strip() else []
        nums = [data.parse_number(s) for s in items]
        if any(v is None for v in nums):
            raise ValueError(f"bad value in output line for {name}: {line[:80]}")
        got[name] = np.array(nums, dtype=object)
    return got


def _compare(prog: Program, got: dict[str, np.ndarray]) -> str | None:
    """None if every expect matches, else a line naming the first mismatching element."""
    for name, spec in prog.expects.items():
        node = prog.nodes[name]
        if name not in got:
            return f"no output for '{name}'"
        actual = np.asarray(got[name]).reshape(-1)
        if actual.size != node.numel:
            return f"'{name}' has {actual.size} values, expected {node.numel} ({node.dtype}{list(node.shape)})"
        expected = prog.expected_values(name).reshape(-1)
        if actual.dtype == object and node.dtype.is_float:  # read from text
            actual = actual.astype(np.float64)
        i = data.first_mismatch(actual, expected, node.dtype, spec.atol, spec.rtol)
        if i is not None:
            idx = ",".join(map(str, np.unravel_index(i, node.shape))) if node.shape else ""
            show = lambda v: data.format_values(np.array([v]), node.dtype)[1:-1]  # noqa: E731
            return f"{name}[{idx}] = {show(actual[i])}, expected {show(expected[i])}"
    return None


def _test_one(path: str, backend: str | None, compiler: list[str] | None, timeout: float) -> str | None:
    """None if the test file passes, else the failure line."""
    try:
        prog = parse_file(path)
        _check_inputs(prog)
    except EirError as e:
        return str(e)
    try:
        if compiler is None:
            values = backends.run_program(prog, backend or backends.default())
            got = dict(zip(prog.outputs, values))
        else:
            try:
                proc = subprocess.run(compiler + [path], capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return f"{path}: timed out after {timeout:g} s"
            except OSError as e:
                return f"{path}: cannot start the compiler: {e}"
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["(no message)"])[0]
                return f"{path}: the compiler exited with status {proc.returncode}: {first}"
            got = _parse_output(proc.stdout, prog)
        problem = _compare(prog, got)
    except BackendError as e:
        return f"{path}: {e}"
    except ValueError as e:
        return f"{path}: {e}"
    except Exception as e:
        return _internal(path, e)
    return None if problem is None else f"{path}: {problem}"


def cmd_test(args: argparse.Namespace) -> int:
    files = _files(args.paths)
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        return _fail(f"ember test: no such file or directory: {missing[0]}", 2)
    compiler = shlex.split(args.compiler) if args.compiler else None
    jobs = args.jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda f: _test_one(f, args.backend, compiler, args.timeout), files))
    failed = [r for r in results if r is not None]
    for line in failed:
        print(f"FAIL {line}")
    print(f"{len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ember", description="Ember: a tensor compiler for the Ember IR (.eir).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    backends_help = "ref, c or cuda (default: cuda with a GPU, else c)"

    p = sub.add_parser("run", help="run a test file and print its outputs (the compiler protocol)")
    p.add_argument("file")
    p.add_argument("--backend", help=backends_help)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("test", help="run test files (directories recursively) and check their expect lines")
    p.add_argument("paths", nargs="+")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--backend", help=backends_help)
    group.add_argument("--compiler", help="an external command that follows the protocol, e.g. './mycc'")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per file with --compiler")
    p.add_argument("-j", "--jobs", type=int, default=0, help="files run at once (default: the core count)")
    p.set_defaults(fn=cmd_test)

    p = sub.add_parser("fmt", help="print a file in canonical form (comments and order kept)")
    p.add_argument("file")
    p.add_argument("-w", "--write", action="store_true", help="rewrite the file in place")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not in canonical form")
    p.set_defaults(fn=cmd_fmt)

    p = sub.add_parser("source", help="print the generated source of a program")
    p.add_argument("file")
    p.add_argument("--backend", choices=["c", "cuda"])
    p.set_defaults(fn=cmd_source)

    p = sub.add_parser("train", help="train a small GPT on real text (ember train --help)", add_help=False)
    p.set_defaults(fn=None)
    p = sub.add_parser("sample", help="generate text from a training checkpoint", add_help=False)
    p.set_defaults(fn=None)

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("train", "sample"):  # their own argument parsers
        from . import train
        try:
            return (train.train if argv[0] == "train" else train.sample)(argv[1:])
        except (ValueError, KeyError, OSError, BackendError) as e:
            return _fail(f"ember {argv[0]}: {type(e).__name__}: {e}", 3)
        except Exception as e:
            return _fail(_internal(f"ember {argv[0]}", e), 3)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


def entry() -> None:
    sys.exit(main())
