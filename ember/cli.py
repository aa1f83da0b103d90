"""The `ember` command: run, test, fmt, source.

Exit status: 0 success; 1 a test failed; 2 a malformed program (one `FILE:LINE: message` line on
stderr), a bad option or checkpoint; 3 a program that cannot be run here for another reason;
130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from . import runners
from .cache import CacheError
from .commands import Failure, HelpWithDefaults, Parser, bounded, internal_error, test_one
from .commands import fail as _fail
from .protocol import check_inputs
from .runners import BackendError
from .text import EirError, format_text, parse_file


def _one_program(file: str, work: Callable[[], str]) -> int:
    """Print what work() makes of the program in file, or one line on stderr: malformed, status 2;
    unreadable or not runnable here, 3; a bug in Ember, 3 (never a partial result)."""
    try:
        text = work()
    except EirError as e:
        return _fail(str(e), e.status)
    except (BackendError, CacheError) as e:
        return _fail(f"{file}: {e}", 3)
    except Exception as e:
        return _fail(internal_error(file, e), 3)
    print(text)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    def work() -> str:
        prog = parse_file(args.file)
        check_inputs(prog)
        backend, median = args.backend or runners.default(), None
        if args.bench is None:
            values = runners.run_program(prog, backend)
        else:
            values, median = runners.bench_program(prog, backend, args.bench)
        lines = runners.output_lines(prog, values)
        return "\n".join(lines + ([f"# bench runs={args.bench} median_ms={median:.6g}"] if median is not None else []))
    return _one_program(args.file, work)


def cmd_fmt(args: argparse.Namespace) -> int:
    try:
        parse_file(args.file)  # exact errors, bytes included
        text = Path(args.file).read_bytes().decode("ascii")
        out = format_text(text, args.file)
    except EirError as e:
        return _fail(str(e), e.status)
    except OSError as e:
        return _fail(f"{args.file}: cannot read the file: {e.strerror}", 3)
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
    backend = args.backend or ("cuda" if "cuda" in runners.available() else "c")
    return _one_program(args.file, lambda: runners.BACKENDS[backend].source(parse_file(args.file).output_nodes,
                                                                               args.arch))


# -------------------------------------------------------------------------------------- test

def _files(paths: list[str]) -> list[str]:
    found: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            found += sorted(str(f) for f in Path(p).rglob("*.eir"))
        else:
            found.append(p)
    return found




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
        runners.resolve(args.backend or runners.default())
    except (BackendError, CacheError) as e:
        return f"ember test: {e}"
    return None


def cmd_test(args: argparse.Namespace) -> int:
    files = _files(args.paths)
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        return _fail(f"ember test: no such file or directory: {missing[0]}", 3)
    if not files:
        return _fail(f"ember test: no .eir files in {' '.join(args.paths)}", 2)
    problem = _usage_problem(args)
    if problem:
        return _fail(problem, 2)
    compiler = shlex.split(args.compiler) if args.compiler else None
    jobs = args.jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda f: test_one(f, args.backend, compiler, args.timeout, args.bench), files))
    failed = [r for r, _ in results if r is not None]
    for line in failed:
        print(f"FAIL {line}")
    if args.bench is not None:
        for f, (r, median) in zip(files, results):
            if r is None and median is not None:
                print(f"{f}: median_ms={median:.6g}")
    print(f"{len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


_positive = bounded(int, 1, what="a whole number of runs")


def build_parser() -> argparse.ArgumentParser:
    fmt = HelpWithDefaults
    ap = Parser(prog="ember", description="Ember: a tensor compiler for the Ember IR (.eir).", formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"ember {version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    backends_help = ("ref, ref-wide (intermediates kept wide, spec 4), ref-reversed (float sums from the end), "
                     "c or cuda (default: cuda with a GPU, else c)")

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
    p.add_argument("--backend", choices=[n for n, b in runners.BACKENDS.items() if b.module],
                   help="which source (default: cuda with a GPU, else c)")
    from .target import ARCHS
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
            return _fail(internal_error(f"ember {argv[0]}", e), 3)
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
