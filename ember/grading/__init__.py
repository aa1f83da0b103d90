"""Grading a course: `ember grade` (grade.py: students' tests against students' compilers),
`ember bench` (bench.py: a fixed suite timed through every compiler), the containment of
untrusted code (sandbox.py) and the reports (reports.py). docs/grading.md says how a course
uses them."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import bench, grade


def add_commands(sub: Any, fmt: type) -> None:
    from ..cli import bounded
    p = sub.add_parser("grade", help="grade students' tests and compilers (docs/grading.md)", formatter_class=fmt)
    p.add_argument("--tests", required=True, help="a folder with one subfolder of .eir tests per author")
    _submission_options(p, "grade.json", timeout=60.0, per="test")
    p.add_argument("--jobs", type=bounded(int, 0), default=0, help="runs at once (0: the core count)")
    p.set_defaults(fn=grade.cmd_grade)

    p = sub.add_parser("bench", help="time the benchmark suite through every compiler (docs/grading.md)",
                       formatter_class=fmt)
    p.add_argument("--suite", default=str(Path(__file__).resolve().parents[2] / "bench" / "suite"),
                   help="a folder of .eir programs")
    _submission_options(p, "bench.json", timeout=300.0, per="program")
    p.add_argument("--runs", type=bounded(int, 1), default=10, help="N of --bench N (the honesty check also runs 10N)")
    p.set_defaults(fn=bench.cmd_bench)


def _submission_options(p: argparse.ArgumentParser, report: str, timeout: float, per: str) -> None:
    from ..cli import bounded
    p.add_argument("--submissions", required=True, help="a folder with one folder (or git repository) per compiler")
    p.add_argument("--out", required=True, help=f"where {report}, summary.md and the CSV files go")
    seconds = bounded(float, 0.001)
    p.add_argument("--timeout", type=seconds, default=timeout, help=f"wall-clock seconds per {per} and compiler")
    p.add_argument("--build-timeout", type=seconds, default=600.0, help="wall-clock seconds for a submission's build")
    p.add_argument("--ref", default=None, help="check git submissions out at this tag or branch")
