"""`ember bench`: a fixed suite of programs timed through every compiler, scored on a linear curve
among the honest, correct ones. docs/grading.md ("Threat model: benchmarks") says what each
check guards against.

The grader chooses the inputs: every run gets the program with fresh random seeds on its `rand`
input lines, under a fresh random file name, and its printed result is checked against the
reference's on the same seeds. A task is one compiler on one program in one round: a run at
`--bench N1` (seed set A), then one at `--bench N2` (seed set B), N2 - N1 chosen from the first
report so that the extra runs last a few seconds by the compiler's own account; the grader's
clock must agree. Rounds interleave the compilers, and the per-program time is the median over
rounds.
"""
from __future__ import annotations

import argparse
import math
import re
import secrets
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import data, protocol, runners
from ..commands import fail
from ..text import EirError, Program, parse_file, split_comment
from . import course
from .cluster import Context, Runner
from .grade import judge
from .reports import _cell, _write_csv, _write_json, _write_text, prepare_out
from .sandbox import Result, Sandbox, ember_hidden
from .submissions import EXPECT_LINE, REFERENCE, Submission

# The floor: no run moves its inputs and outputs faster than the target's peak bandwidth (B/s).
# The H200's HBM3e for the GPU; for the CPU a bound no memory system of one reaches.
PEAK_BANDWIDTH = {"cuda": 4.0e12, "c": 1.0e12}
NOISE_S = 0.5        # --clock-noise: two processes of one program start up to 0.5 s apart (H200 host)
JUDGED = 4           # the extra runs last JUDGED x the noise by the compiler's own report ...
MIN_CLAIM = 2        # ... and a report that makes them shorter than MIN_CLAIM x the noise cannot be judged
SLACK, SHORT = 2.0, 1.5  # extra wall time within [claimed / SHORT - noise, SLACK x load x claimed + noise + host]
CPU_SLACK = 1.5      # on a CPU a run's wall time is its work (a GPU run adds host time its device clock skips)
PER_RUN_S = 20e-6    # host time a device clock does not see in one run (launches, a sync); a CPU's sees all
MAX_RUNS = 10**6     # at most this many extra runs
CPU_SHARE = 0.25     # a CPU target's extra runs use at least this part of the reference's CPU share
MIN_BAND = 0.005     # ties: CUDA-event medians of two processes of one program differ by about 0.2%

SEED = re.compile(r"(?<!\S)seed=\S+")


def reseed(text: str, prog: Program) -> str:
    """The program with a fresh random seed (secrets) on every `input NAME = rand` line."""
    lines = text.split("\n")
    for spec in prog.inputs.values():
        if spec.rand is not None:
            code, comment = split_comment(lines[spec.line - 1])
            lines[spec.line - 1] = SEED.sub(f"seed={secrets.randbits(63)}", code, count=1) + comment
    return "\n".join(lines)


def floor_bytes(prog: Program) -> int:
    """The bytes a run must move at least: every param read once, every result written once."""
    return sum(prog.nodes[n].numel * prog.nodes[n].dtype.itemsize for n in [*prog.params, *prog.outputs])


def linear_scores(times: dict[str, float | None], band: float = MIN_BAND,
                  rounds: dict[str, list[float]] | None = None) -> dict[str, float]:
    """100 for the fastest, 0 for the slowest, linear in time between; failures (None) 0. Ties:
    a time within the relative band above a faster one scores as that one (one working
    compiler, or all within the band of the fastest: 100 each), and so does a time that was not
    slower than it in every round (rounds: each compiler's time round by round; the compilers
    take turns within a round, so a round's times share its load, and an order that a round
    reverses is the load's, not the compilers')."""
    def slower(n: str, than: str) -> bool:
        return rounds is None or all(a > b for a, b in zip(rounds[n], rounds[than], strict=True))

    value: dict[str, float] = {}
    anchor: tuple[str, float] | None = None
    for n, t in sorted(((n, t) for n, t in times.items() if t is not None), key=lambda kv: kv[1]):
        if anchor is None or (t > anchor[1] * (1 + band) and slower(n, anchor[0])):
            anchor = (n, t)
        value[n] = anchor[1]
    if not value:
        return {n: 0.0 for n in times}
    lo, hi = min(value.values()), max(value.values())
    return {n: 0.0 if n not in value else 100.0 if hi == lo else 100.0 * (1 - (value[n] - lo) / (hi - lo))
            for n in times}


# ----------------------------------------------------------------------------------- a task

def output_chars(prog: Program) -> int:
    """The most characters of output a correct answer to prog needs (its output lines, each value
    at most data.MAX_ITEM characters, and room for a bench line and stray messages)."""
    return sum(len(n) + 8 + prog.nodes[n].numel * (data.MAX_ITEM + 2) for n in prog.outputs) + (64 << 10)


def bench_task(sandbox: Sandbox, subs: dict[str, Submission], name: str, runs: int,
               files: tuple[tuple[str, str], tuple[str, str]], timeout: float, noise: float,
               limit: int) -> dict[str, Any]:
    """One compiler on one program in one round: --bench N1 on the first file, then --bench N2 on
    the second. Idempotent (fresh folders; the grader chose the seeds), so a cluster may run it again.
    limit: output_chars of the program; a run that prints more is a failure and its output is not
    kept (the records live until the report: 63 MiB of output a run, decoded to four bytes a
    character, held 0.5 GiB a task, 22 GiB a student over a suite)."""
    sub = subs[name]
    if sub.build_error:
        return {"build_error": sub.build_error, "runs": []}

    def run(fname: str, text: str, *bench: str) -> Result:
        return sandbox.run(sub.command() + ["{dir}/" + fname, *bench],
                           files={fname: EXPECT_LINE.sub(b"", text.encode())}, submission=sub.folder,
                           wall=timeout, trusted=sub.folder is None)

    if sub.folder is None:
        # The reference keeps a compile cache between runs (a submission has none: a fresh HOME and
        # a read-only folder each run), so its N1 run would compile and its N2 run not: the extra
        # wall time would fall short of its claim by a compile. One plain run fills the cache.
        run(*files[0])
    out, n = [], runs
    for i, (fname, text) in enumerate(files):
        for _ in range(3 if i else 1):
            r = run(fname, text, "--bench", str(n))
            failure = r.failure() or (f"printed {len(r.stdout):,} characters, more than the {limit:,} its "
                                      "outputs need" if len(r.stdout) > limit else None)
            m = None if failure else protocol.bench_median(r.stdout)
            rec = {"n": n, "stdout": "" if failure else r.stdout, "failure": failure,
                   "timeout": r.killed == "timeout", "wall": r.wall, "cpu": r.cpu, "median": m}
            if i == 0 or m is None or not m > 0 or (n - runs) * m * 1e-3 >= MIN_CLAIM * noise or n - runs >= MAX_RUNS:
                break
            n = _runs_to_judge(runs, m, noise)   # warmer than its first run: judge it over more runs
        out.append(rec)
        if m is None or not m > 0:
            break
        n = _runs_to_judge(runs, m, noise)
    return {"build_error": None, "runs": out}


def _runs_to_judge(runs: int, ms: float, noise: float) -> int:
    """N2: enough runs past N1 that, at ms each, they last JUDGED x the clock's noise."""
    return runs + min(MAX_RUNS, max(1, math.ceil(JUDGED * noise / (ms * 1e-3))))


# ------------------------------------------------------------------------------ judging

def _round(prog: Program, rec: dict[str, Any], answers: list[dict[str, np.ndarray]], floor_ms: float,
           noise: float, load: float = 1.0, slack: float = SLACK, per_run: float = PER_RUN_S
           ) -> tuple[str, str] | dict[str, float]:
    """(status, why) when a round fails; else its time and the figures the clock check needs. load:
    how much longer than its reports the reference's extra runs took in this round (at least 1):
    on a loaded machine a process waits between runs, which its median does not count."""
    if rec["build_error"]:
        return "error", rec["build_error"].splitlines()[0]
    for run, want in zip(rec["runs"], answers):
        if run["failure"]:
            return "timeout" if run["timeout"] else "error", run["failure"]
        problem = judge(prog, Result(0, run["stdout"], "", None, run["wall"]), want)
        if problem:
            return "wrong", f"{problem} (--bench {run['n']})"
        m = run["median"]
        if m is None:
            return "error", "no '# bench runs=N median_ms=X' line with X finite and >= 0 (spec 10)"
        if not m > 0:
            return "error", f"reported median_ms={m:g}: a run takes time"
        if m < floor_ms:
            return "error", (f"reported median {m:.4g} ms is below the physical floor of {floor_ms:.4g} ms "
                             f"(the bytes the program moves at the target's peak bandwidth)")
    r1, r2 = rec["runs"]
    extra, wall = r2["n"] - r1["n"], r2["wall"] - r1["wall"]
    claimed = (r2["n"] * r2["median"] - r1["n"] * r1["median"]) * 1e-3
    return {"ms": r2["median"], "extra": extra, "wall": wall, "claimed": claimed,
            "over": wall - (slack * load * claimed + noise + per_run * extra),
            "under": claimed / SHORT - noise - wall, "cpu": r2["cpu"] - r1["cpu"]}


def reference_load(r: dict[str, float], noise: float) -> float:
    """L of one round: how much longer than it claimed the reference's extra runs took, beyond the
    clock's noise (at least 1). The noise is the start spread of two processes, not load: counted
    as load, it raised L by noise / claimed (a quarter with the default runs), and the slack it
    gave everyone let a median 2.2 times too small pass at a real load of 1.29."""
    return max(1.0, (r["wall"] - noise) / r["claimed"]) if r["claimed"] > 0 else 1.0


def judge_compiler(rounds: list[tuple[str, str] | dict[str, float]], noise: float,
                   cpu_share: float | None = None) -> dict[str, Any]:
    """bench.json's entry for one compiler on one program from its rounds (the clock check on
    the medians over rounds, so one round disturbed by load is forgiven). cpu_share: on a CPU
    target, the share of its claimed time the reference's extra runs spent on a CPU (at most 1):
    a compiler whose extra runs used under CPU_SHARE of that share did not do them (it slept)."""
    for k, r in enumerate(rounds, 1):
        if isinstance(r, tuple):
            return {"median_ms": None, "status": r[0], "note": f"round {k}: {r[1]}", "rounds_ms": []}
    ok: list[dict[str, float]] = rounds  # type: ignore[assignment]
    keys = ("ms", "extra", "wall", "claimed", "over", "under", "cpu")
    med = {key: statistics.median(r[key] for r in ok) for key in keys}
    lie = None
    if med["claimed"] < MIN_CLAIM * noise:
        lie = (f"its runs cannot be checked: {med['extra']:.0f} more runs at the {med['ms']:.4g} ms it reports "
               f"last {med['claimed']:.3g} s, less than {MIN_CLAIM * noise:.3g} s")
    elif med["over"] > 0:
        lie = (f"dishonest timing: reported median {med['ms']:.4g} ms, but {med['extra']:.0f} more runs took "
               f"{med['wall']:.4g} s of the grader's clock")
    elif med["under"] > 0:
        lie = (f"dishonest timing: {med['extra']:.0f} more runs of the reported {med['ms']:.4g} ms would take "
               f"{med['claimed']:.4g} s, but took {med['wall']:.4g} s of the grader's clock")
    elif cpu_share is not None and med["cpu"] < CPU_SHARE * cpu_share * med["claimed"]:
        lie = (f"dishonest timing: {med['extra']:.0f} more runs of the reported {med['ms']:.4g} ms would take "
               f"{med['claimed']:.4g} s, but used {med['cpu']:.3g} s of CPU (the reference's runs: "
               f"{cpu_share:.2g} s a second): runs not done")
    if lie:
        return {"median_ms": None, "status": "error", "note": lie, "rounds_ms": []}
    return {"median_ms": med["ms"], "status": "ok", "note": None, "rounds_ms": [r["ms"] for r in ok]}


def _answers(prog: Program, rec: dict[str, Any]) -> list[dict[str, np.ndarray]] | str:
    """The reference's results of one round (one per run), or why it gave none."""
    runs = rec["runs"]
    if rec["build_error"] or len(runs) < 2 or any(r["failure"] for r in runs):
        return next((r["failure"] for r in runs if r["failure"]), None) or "no bench line"
    try:
        got = [protocol.parse_output(r["stdout"], prog) for r in runs]
    except ValueError as e:
        return str(e)
    missing = next((n for g in got for n in prog.outputs if n not in g), None)
    return f"printed no value for '{missing}'" if missing else got


def score_program(prog: Program, names: list[str], recs: list[dict[str, dict[str, Any]]], floor_ms: float,
                  noise: float, cpu: bool = False) -> tuple[dict[str, dict[str, Any]] | None, str | dict[str, float]]:
    """(entries, {band, load}) for a program, or (None, why it leaves the suite): it fails closed when the
    reference cannot run it, or when its result does not depend on the seeds the grader chose."""
    answers = []
    for k, rec in enumerate(recs, 1):
        a = _answers(prog, rec[REFERENCE])
        if isinstance(a, str):
            return None, f"the reference failed in round {k}: {a}"
        answers.append(a)
    flat = [a for pair in answers for a in pair]
    if all(all(np.array_equal(a[n], flat[0][n]) for n in prog.outputs) for a in flat):
        return None, "its result is the same for every seed, so it could be known before the run"
    ref = [_round(prog, rec[REFERENCE], a, floor_ms, noise) for rec, a in zip(recs, answers)]
    bad = next((r for r in ref if isinstance(r, tuple)), None)
    if bad:
        return None, f"the reference failed: {bad[1]}"
    loads = [reference_load(r, noise) for r in ref]  # type: ignore[arg-type]
    share = (min(1.0, statistics.median(r["cpu"] / r["claimed"] if r["claimed"] > 0 else 1.0  # type: ignore[index]
                                        for r in ref)) if cpu else None)
    slack, per_run = (CPU_SLACK, 0.0) if cpu else (SLACK, PER_RUN_S)
    row = {n: judge_compiler([_round(prog, rec[n], a, floor_ms, noise, load, slack, per_run)
                              for rec, a, load in zip(recs, answers, loads)], noise, share) for n in names}
    if row[REFERENCE]["status"] != "ok":
        return None, f"the reference's own run failed the checks: {row[REFERENCE]['note']}"
    ok = [r for r in row.values() if r["status"] == "ok"]
    spreads = [(max(r["rounds_ms"]) - min(r["rounds_ms"])) / r["median_ms"] for r in ok]
    band = max(MIN_BAND, 2 * statistics.median_low(spreads))
    scores = linear_scores({n: r["median_ms"] for n, r in row.items()}, band,
                           {n: r["rounds_ms"] for n, r in row.items() if r["median_ms"] is not None})
    for n, r in row.items():
        r["score"] = scores[n]
    return row, {"band": band, "load": statistics.median(loads)}


# ------------------------------------------------------------------------------ command

def cmd_bench(args: argparse.Namespace) -> int:
    suite, out = Path(args.suite), Path(args.out)
    files = sorted(suite.glob("*.eir")) if suite.is_dir() else []
    if not files:
        return fail(f"ember bench: no .eir programs in {suite}", 2)
    try:
        sources, hide = course.sources(args)
    except course.CourseError as e:
        return fail(str(e), 2)
    try:
        progs = [parse_file(str(f)) for f in files]
        texts = [f.read_text() for f in files]
    except EirError as e:
        return fail(str(e), 2)
    peak = args.peak_bandwidth or PEAK_BANDWIDTH[runners.default()]
    fresh = lambda p, t: (f"p{secrets.token_hex(8)}.eir", reseed(t, p))  # noqa: E731
    plan = [[(fresh(p, t), fresh(p, t)) for p, t in zip(progs, texts)] for _ in range(args.rounds)]
    if (hidden := ember_hidden(args.allow_ember)) is not None:
        return fail(f"ember bench: {hidden}", 2)
    out = prepare_out(out)  # before any submission runs (reports.py says why)
    ctx = Context(tuple(sources), args.ref, args.build_timeout, tuple(str(p) for p in (*hide, out)), args.timeout,
                  allow_ember=args.allow_ember)
    from tqdm import tqdm
    with Runner(ctx, 1, args.scheduler, args.workers, gpu=True, progress=lambda m: print(m, file=sys.stderr)) as run:
        names = run.names
        # round-robin: each round runs every program through every compiler, one after another,
        # starting one further along each time, so no compiler always follows the same one
        keys = [(r, p, names[(i + r + p) % len(names)]) for r in range(args.rounds) for p in range(len(progs))
                for i in range(len(names))]
        limits = [output_chars(prog) for prog in progs]
        tasks = [(n, args.runs, plan[r][p], args.timeout, args.clock_noise, limits[p]) for r, p, n in keys]
        recs: dict[tuple[int, int, str], Any] = {}
        for i, rec in tqdm(run.map(bench_task, tasks), total=len(tasks), desc="benchmarking", file=sys.stderr):
            recs[keys[i]] = rec
    report: dict[str, Any] = {"programs": {}, "bands": {}, "load": {}, "dropped": {}, "peak_bandwidth": peak}
    for p, prog in enumerate(progs):
        name = files[p].name
        rounds = [{n: recs[r, p, n] for n in names} for r in range(args.rounds)]
        row, info = score_program(prog, names, rounds, floor_bytes(prog) / peak * 1e3, args.clock_noise,
                                  cpu=runners.default() == "c")   # on a GPU, waiting for it uses no CPU
        if isinstance(info, str):
            report["dropped"][name] = info
        else:
            report["programs"][name], report["bands"][name], report["load"][name] = row, info["band"], info["load"]
    kept = report["programs"]
    report["submissions"] = {n: {"score": statistics.fmean(kept[p][n]["score"] for p in kept) if kept else 0.0}
                             for n in names}
    write_bench(out, report)
    print(f"benchmarked {len(names)} compilers on {len(kept)} programs ({len(report['dropped'])} dropped): "
          f"{out / 'bench.json'}, {out / 'summary.md'}")
    return 0


def write_bench(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "bench.json", report)
    names = list(report["submissions"])
    rows = [[p, n, r["median_ms"] if r["median_ms"] is not None else "", r["status"], f"{r['score']:.1f}",
             r.get("note") or ""] for p, row in report["programs"].items() for n, r in row.items()]
    _write_csv(out / "programs.csv", ["program", "name", "median_ms", "status", "score", "note"], rows)
    _write_csv(out / "submissions.csv", ["name", "score"],
               [[n, f"{report['submissions'][n]['score']:.2f}"] for n in names])
    md = ["# Benchmark", "", "Score per program: among the correct compilers whose timings the grader's clock "
          "confirms, 100 for the fastest median over rounds, 0 for the slowest, linear in time; times within the "
          "program's tie band (twice the run-to-run spread, at least "
          f"{100 * MIN_BAND:g}%) of a faster one score as it. Wrong, failed, dishonest and timed-out runs score 0. "
          "The total is the mean over programs.", "",
          "| compiler | score |", "|---|---|"]
    md += [f"| {_cell(n)} | {report['submissions'][n]['score']:.1f} |"
           for n in sorted(names, key=lambda n: -report["submissions"][n]["score"])]
    md += ["", "Tie band: the program's tie band. Load: how much longer than it reported the reference's runs "
           "took on the grader's clock (the clock check allows that much more for every compiler).", "",
           "| program | tie band | load | " + " | ".join(map(_cell, names)) + " |",
           "|---|---|---|" + "---|" * len(names)]
    for p, row in report["programs"].items():
        cells = [f"{r['median_ms']:.4g} ms ({r['score']:.0f})" if r["status"] == "ok" else r["status"]
                 for r in (row[n] for n in names)]
        md.append(f"| {p} | {100 * report['bands'][p]:.2g}% | {report['load'][p]:.2g} | " + " | ".join(cells) + " |")
    if report["dropped"]:
        md += ["", "## Programs left out (they score no one)", "", "| program | why |", "|---|---|"]
        md += [f"| {p} | {_cell(why)} |" for p, why in report["dropped"].items()]
    _write_text(out / "summary.md", "\n".join(md) + "\n")
