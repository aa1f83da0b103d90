"""Grading a course: `ember grade` (grade.py: students' tests against students' compilers),
`ember bench` (bench.py: a fixed suite timed through every compiler), the containment of
untrusted code (sandbox.py), the reports (reports.py), and where the runs happen: threads, or a
Dask cluster (cluster.py). docs/grading.md says how a course uses them."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import bench, grade


def add_commands(sub: Any, fmt: type) -> None:
    p = sub.add_parser("grade", help="grade students' tests and compilers (docs/grading.md)", formatter_class=fmt)
    p.add_argument("--tests", required=True, help="a folder with one subfolder of .eir tests per author")
    _submission_options(p, "grade.json", timeout=60.0, per="test")
    p.add_argument("--jobs", type=int, default=0, help="runs at once (0: the core count)")
    p.set_defaults(fn=grade.cmd_grade)

    p = sub.add_parser("bench", help="time the benchmark suite through every compiler (docs/grading.md)",
                       formatter_class=fmt)
    p.add_argument("--suite", default=str(Path(__file__).resolve().parents[2] / "bench" / "suite"),
                   help="a folder of .eir programs")
    _submission_options(p, "bench.json", timeout=300.0, per="run (process) of a program")
    p.add_argument("--runs", type=int, default=10, help="N1 of --bench N1, each round's first run")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each timing every program through every compiler")
    p.add_argument("--peak-bandwidth", type=float, default=None,
                   help="bytes/s no run can beat: the floor of a median (default: 4e12 with a GPU, else 1e12)")
    p.add_argument("--clock-noise", type=float, default=bench.NOISE_S,
                   help="seconds two processes of one program may differ by; the extra runs last 4 times it")
    p.set_defaults(fn=bench.cmd_bench)


def _submission_options(p: argparse.ArgumentParser, report: str, timeout: float, per: str) -> None:
    p.add_argument("--submissions", required=True, help="a folder with one folder (or git repository) per compiler")
    p.add_argument("--out", required=True, help=f"where {report}, summary.md and the CSV files go")
    p.add_argument("--timeout", type=float, default=timeout, help=f"wall-clock seconds per {per} and compiler")
    p.add_argument("--build-timeout", type=float, default=600.0, help="wall-clock seconds for a submission's build")
    p.add_argument("--ref", default=None, help="check git submissions out at this tag or branch")
    p.add_argument("--workers", type=int, default=0,
                   help="run on a local Dask cluster of this many workers (one GPU each; 0: no cluster)")
    p.add_argument("--scheduler", default=None, help="run on the Dask cluster of this scheduler (host:port)")
