"""Grading a course: `ember grade` (grade.py: students' tests against students' compilers),
`ember bench` (bench.py: a fixed suite timed through every compiler), the containment of
untrusted code (sandbox.py), the reports (reports.py), the roster, `ember collect` and late days
(course.py), the students' week reports and regrades (week.py), and where the runs happen:
threads, or a Dask cluster (cluster.py). docs/grading.md says how a course uses them."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..commands import bounded
from . import bench, course, grade, week


def add_commands(sub: Any, fmt: type) -> None:
    p = sub.add_parser("grade", help="grade students' tests and compilers (docs/grading.md)", formatter_class=fmt)
    p.add_argument("--tests", required=True, help="a folder with one subfolder of .eir tests per author")
    _submission_options(p, "grade.json", timeout=60.0, per="test")
    p.add_argument("--jobs", type=bounded(int, 0), default=0, help="runs at once (0: the core count)")
    p.add_argument("--compare-to", default=None, metavar="DIR",
                   help="a regrade: write changes.md, each submission's changes against DIR/grade.json")
    p.add_argument("--similarity", type=_fraction, nargs="?", const=0.25, default=None, metavar="THRESHOLD",
                   help="also report pairs of submissions (and each against Ember) sharing at least THRESHOLD "
                        "of their code's fingerprints (0.25 when given alone)")
    p.add_argument("--similarity-base", metavar="DIR", help="starter code whose fingerprints never count")
    p.add_argument("--max-test-mib", type=bounded(float, 0.001), default=16.0, help="a larger test file is invalid")
    p.add_argument("--max-tests-per-author", type=bounded(int, 1), default=100,
                   help="an author's tests past this many (in path order) are not read")
    p.add_argument("--validate-mib", type=bounded(float, 1), default=2048.0, help="memory for validating one test")
    p.add_argument("--validate-timeout", type=bounded(float, 0.001), default=60.0,
                   help="CPU and wall seconds for validating one test")
    p.set_defaults(fn=grade.cmd_grade)

    p = sub.add_parser("bench", help="time the benchmark suite through every compiler (docs/grading.md)",
                       formatter_class=fmt)
    p.add_argument("--suite", default=str(Path(__file__).resolve().parents[2] / "bench" / "suite"),
                   help="a folder of .eir programs")
    _submission_options(p, "bench.json", timeout=300.0, per="run (process) of a program")
    p.add_argument("--runs", type=bounded(int, 1), default=10, help="N1 of --bench N1, each round's first run")
    p.add_argument("--rounds", type=bounded(int, 1), default=3,
                   help="rounds, each timing every program through every compiler")
    p.add_argument("--peak-bandwidth", type=bounded(float, 1), default=None,
                   help="bytes/s no run can beat: the floor of a median (default: 4e12 with a GPU, else 1e12)")
    p.add_argument("--clock-noise", type=bounded(float, 0.001), default=bench.NOISE_S,
                   help="seconds two processes of one program may differ by; the extra runs last 4 times it")
    p.set_defaults(fn=bench.cmd_bench)

    p = sub.add_parser("collect", help="fetch every roster repository at the week's tag; late days (docs/grading.md)",
                       formatter_class=fmt)
    p.add_argument("--roster", required=True, help="CSV file: student,team,repo,extra_late_days")
    p.add_argument("--week", required=True, type=bounded(int, 1), help="the week's number")
    p.add_argument("--tag", required=True, help="the git tag handed in, e.g. week3")
    p.add_argument("--deadline", required=True, help="ISO 8601; without an offset, in America/New_York")
    p.add_argument("--state", required=True, help="the grader's own folder: late-day balances, collected commits")
    p.add_argument("--out", required=True, help="where collection.json, log.json and repos/NAME.bundle go")
    p.add_argument("--now", default=None, help="ISO 8601 time standing in for the clock (tests, replays)")
    p.add_argument("--kind", choices=["compiler", "tests"], default="compiler",
                   help="tests are never late: after their deadline a collection changes nothing")
    p.add_argument("--checkout", default=None, metavar="DIR",
                   help="also write each submission's collected files to DIR/NAME (a tests week: --tests DIR)")
    p.add_argument("--git-timeout", type=bounded(float, 0.001), default=120.0,
                   help="wall-clock seconds per repository fetch")
    p.set_defaults(fn=course.cmd_collect)

    p = sub.add_parser("publish", help="write each student's or team's report of a week (docs/grading.md)",
                       formatter_class=fmt)
    p.add_argument("--roster", required=True, help="the roster CSV file")
    p.add_argument("--collection", required=True, help="the week's `ember collect --out` folder")
    p.add_argument("--grade", required=True, help="the week's `ember grade --out` folder")
    p.add_argument("--bench", default=None, help="the week's `ember bench --out` folder, if any")
    p.add_argument("--tests", required=True, help="the tests graded (for their `# visibility: hidden` comments)")
    p.add_argument("--release", action="store_true", help="show hidden tests too (after their release)")
    p.add_argument("--out", required=True, help="where NAME.md goes, one per student or team")
    p.set_defaults(fn=week.cmd_publish)


def _submission_options(p: argparse.ArgumentParser, report: str, timeout: float, per: str) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--submissions", help="a folder with one folder (or git repository) per compiler")
    which.add_argument("--roster", help="the roster CSV file: its submissions at the commits of --collection")
    p.add_argument("--collection", default=None, help="with --roster: the week's `ember collect --out` folder")
    p.add_argument("--only", action="append", metavar="NAME", help="grade only this submission (repeatable)")
    p.add_argument("--out", required=True, help=f"where {report}, summary.md and the CSV files go")
    seconds = bounded(float, 0.001)
    p.add_argument("--timeout", type=seconds, default=timeout, help=f"wall-clock seconds per {per} and compiler")
    p.add_argument("--build-timeout", type=seconds, default=600.0, help="wall-clock seconds for a submission's build")
    p.add_argument("--ref", default=None, help="check git submissions out at this tag or branch")
    p.add_argument("--allow-ember", action="store_true", help="let submissions import the grader's own Ember")
    p.add_argument("--workers", type=bounded(int, 0), default=0,
                   help="run on a local Dask cluster of this many workers (one GPU each; 0: no cluster)")
    p.add_argument("--scheduler", default=None, help="run on the Dask cluster of this scheduler (host:port)")


def _fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got '{text}'")
    return x
