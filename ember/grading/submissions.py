"""A submission: a folder holding an executable `compiler` that follows the protocol (spec 9
and 10) and, optionally, an executable `build` run once first; its private copy in the sandbox,
and one run of its compiler on a test. The reference compiler (Ember) takes part as the
submission `reference`; it is trusted and runs as the grader."""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import course
from .course import REFERENCE
from .sandbox import Result, Sandbox

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


def without_expects(source: bytes) -> bytes:
    """The test as a compiler sees it: `expect` lines blanked, so line numbers stay the same."""
    return EXPECT_LINE.sub(b"", source)


def load_submissions(sources: list[course.Source], sandbox: Sandbox, ref: str | None, timeout: float,
                     progress: Callable[[str], None]) -> list[Submission]:
    """The reference, then each submission copied (or checked out: course.copy_in) and built."""
    subs = [Submission(REFERENCE, None)]
    for src in sources:
        if src.name == REFERENCE:
            raise ValueError(f"{src.path}: the name '{REFERENCE}' is kept for Ember itself")
        try:
            copy = course.copy_in(sandbox, src, ref)
        except (OSError, ValueError) as e:
            subs.append(Submission(src.name, None, build_error=src.problem or f"cannot be copied: {e}"))
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


def run_compiler(sandbox: Sandbox, sub: Submission, test: Path, extra: list[str], wall: float,
                 source: bytes | None = None) -> Result:
    """sub's compiler on a copy of the test (source: its bytes as the grader read them, else read from test)."""
    files = {test.name: without_expects(test.read_bytes() if source is None else source)}
    return sandbox.run(sub.command() + ["{dir}/" + test.name] + extra, files=files,
                       submission=sub.folder, wall=wall, trusted=sub.folder is None)
