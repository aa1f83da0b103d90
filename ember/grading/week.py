"""A week's results for students (`ember publish`: one report per student or team) and the
changes a regrade makes against the published grades (`ember grade --compare-to`).

A test is visible unless its file has the comment `# visibility: hidden` (Gradescope's
"hidden until release"): a report then counts it but names it only with `--release`."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from .course import CourseError, read_collection, read_roster
from .reports import _cell, _write_text

VISIBILITY = re.compile(r"#\s*visibility:\s*(\S+)")


def read_report(path: Path, option: str) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
        assert isinstance(report["submissions"], dict)
        return report
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        raise CourseError(f"{option}: {path} is not a report of ember grade or bench ({e})") from None


def hidden(path: Path) -> bool:
    """Whether the test file says `# visibility: hidden` (else `visible`, the default)."""
    for n, line in enumerate(path.read_text(errors="replace").splitlines() if path.is_file() else [], 1):
        m = VISIBILITY.search(line)
        if m and m.group(1) not in ("visible", "hidden"):
            raise CourseError(f"{path}:{n}: visibility '{m.group(1)}' must be visible or hidden")
        if m:
            return m.group(1) == "hidden"
    return False


def cmd_publish(args: argparse.Namespace) -> int:
    try:
        return _publish(args)
    except CourseError as e:
        print(e, file=sys.stderr)
        return 2


def _publish(args: argparse.Namespace) -> int:
    roster, coll = read_roster(Path(args.roster)), read_collection(Path(args.collection))
    grade = read_report(Path(args.grade) / "grade.json", "--grade")
    bench = read_report(Path(args.bench) / "bench.json", "--bench") if args.bench else None
    tests = grade["tests"]
    secret = {k for k in tests if not args.release and hidden(Path(args.tests) / k)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, team in roster.items():
        c = coll["submissions"].get(name, {"commit": None, "fetched_at": "-", "late": False, "note": "not collected"})
        md = [f"# {name}", "", f"- Collected: {c['commit'] or 'nothing'} at {c['fetched_at']}"
              f"{' (late)' if c['late'] else ''}: {c['note']}",
              "- Late days left: " + ", ".join(f"{s.name} {coll['late_days'].get(s.name, '?')}" for s in team), ""]
        g = grade["submissions"].get(name)
        if g is None:
            md += ["Not graded this week.", ""]
        else:
            valid = [k for k, t in tests.items() if t["valid"]]
            md += ["## Tests", "", f"Passed {g['passed']} of {len(valid)} tests: {100 * g['rate']:.1f}%.", ""]
            shut = [k for k in valid if k in secret]
            if shut:
                failed = sum(k in g["failures"] for k in shut)
                md += [f"Hidden tests (named after their release): {len(shut)}, {len(shut) - failed} passed, "
                       f"{failed} failed.", ""]
            shown = [(k, f) for k, f in g["failures"].items() if k not in secret]
            if shown:
                md += ["| failing test | first mismatch |", "|---|---|"] + [f"| {k} | {_cell(f)} |" for k, f in shown]
                md.append("")
        own = [(k, t) for k, t in tests.items() if k.split("/")[0] in {s.name for s in team}]
        if own:
            md += ["## Your tests", "", "| test | valid | compilers it breaks (the bonus) |", "|---|---|---|"]
            md += [f"| {k} | {'yes' if t['valid'] else _cell('no: ' + (t['reason'] or ''))} | {len(t['broken_by'])} |"
                   for k, t in own]
            md.append("")
        b = bench["submissions"].get(name) if bench else None
        if b is not None:
            md += ["## Benchmark", "", f"Score {b['score']:.1f} (the mean of the program scores).", "",
                   "| program | median ms | status | score |", "|---|---|---|---|"]
            for prog, row in bench["programs"].items():
                r = row.get(name, {"median_ms": None, "status": "-", "score": 0.0})
                ms = f"{r['median_ms']:.4g}" if r["median_ms"] is not None else ""
                md.append(f"| {prog} | {ms} | {_cell(r['status'] + (': ' + r['note'] if r.get('note') else ''))} "
                          f"| {r['score']:.1f} |")
            md.append("")
        _write_text(out / f"{name}.md", "\n".join(md))
    print(f"wrote {len(roster)} reports to {out}" + ("" if args.release else f" ({len(secret)} tests hidden)"))
    return 0


def write_changes(out: Path, published: Path, report: dict[str, Any]) -> None:
    """A regrade's changes against the published grade.json, per test and per submission:
    printed and written to OUT/changes.md."""
    old = read_report(published / "grade.json", "--compare-to")
    md = [f"# Changes against {published}", ""]
    for k, t in report["tests"].items():
        was = old["tests"].get(k, {"valid": None})
        if was["valid"] != t["valid"]:
            md.append(f"- test {k}: " + ("now valid" if t["valid"] else f"now invalid: {t['reason']}"))
    for name, new in report["submissions"].items():
        was = old["submissions"].get(name)
        if was is None:
            md.append(f"- {name}: not in the published grades; {100 * new['rate']:.1f}% now")
            continue
        fixed = [k for k in was["failures"] if k not in new["failures"] and report["tests"].get(k, {}).get("valid")]
        broke = [k for k in new["failures"] if k not in was["failures"]]
        line = f"- {name}: {100 * was['rate']:.1f}% -> {100 * new['rate']:.1f}%"
        line += f"; now passes {', '.join(fixed)}" if fixed else ""
        line += f"; now fails {', '.join(broke)}" if broke else ""
        md.append(line if fixed or broke or was["rate"] != new["rate"] else f"- {name}: unchanged, "
                  f"{100 * new['rate']:.1f}%")
    _write_text(out / "changes.md", "\n".join(md) + "\n")
    print("\n".join(md[2:]))
