"""`ember bench` against forged timings and answers, and its scores under a competing load.
The compilers are Python scripts (tests/grading/fakes.py) on a small CPU program; each forger is
written as a student would, and docs/grading.md ("Threat model: benchmarks") lists which test
checks which guarantee."""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ember.cli import main
from ember.grading import bench
from ember.grading.submissions import Submission
from ember.text import parse

from .fakes import SUM, fake

FLOOR_MS = 0.004   # between the skimp's median (1-2 us) and the reference's (0.009 ms: an AVX-512 sum from cache)
PEAK = bench.floor_bytes(parse(SUM)) / (FLOOR_MS * 1e-3)
FORGERS = ["zero", "nan", "inf", "negative", "tiny", "skip", "liar", "skimp", "athome", "stale", "fakerest",
           "sleeper", "halver"]


# a 4096^3 product summed to a vector: 2.7 s a run with a warm cache on a 2-core host, so that
# --bench 5 outlasts a 4 s timeout on any machine (a big sum's 2 s was within it once cached)
SLOW = """ember 1
a = param f32[4096,4096]
b = param f32[4096,4096]
ar = reshape a shape=[4096,4096,1]
ae = expand ar shape=[4096,4096,4096]
br = reshape b shape=[1,4096,4096]
be = expand br shape=[4096,4096,4096]
p = mul ae be
s = sum p axes=[1]
t = sum s axes=[1]
return t
input a = rand seed=1
input b = rand seed=2
"""


def run_bench(tmp: Path, subs: Path, *extra: str, rounds: int = 2, suite: dict[str, str] | None = None) -> dict:
    (tmp / "suite").mkdir()
    for name, text in (suite or {"sum.eir": SUM}).items():
        (tmp / "suite" / name).write_text(text)
    out = tmp / "out"
    code = main(["bench", "--suite", str(tmp / "suite"), "--submissions", str(subs), "--out", str(out),
                 "--runs", "5", "--rounds", str(rounds), "--clock-noise", "0.25", "--timeout", "120", *extra])
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    report["summary"] = (out / "summary.md").read_text()
    return report


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hostile")
    token = secrets.token_hex(4)
    fake(tmp / "subs", "honest")
    for mode in FORGERS:
        fake(tmp / "subs", mode, mode, work=3 if mode in ("liar", "halver") else 1, token=token)
    report = run_bench(tmp, tmp / "subs", "--peak-bandwidth", str(PEAK), rounds=1)  # 2 runs: enough to catch each
    stale = Path(f"/tmp/ember-test-stale-{token}")
    report["stale_kept"] = stale.is_dir() and any(stale.iterdir())  # /tmp shared between runs
    subprocess.run(["rm", "-rf", str(stale)])
    return report


def _row(report: dict[str, Any]) -> dict[str, Any]:
    assert not report["dropped"], report["dropped"]
    return report["programs"]["sum.eir"]


def test_honest_compilers_score_and_forgers_move_nothing(hostile: dict[str, Any]) -> None:
    row = _row(hostile)
    # with a private /tmp per run (the sandbox's namespaces level) stale keeps nothing, so it is honest
    honest = {"reference", "honest"} | (set() if hostile["stale_kept"] else {"stale"})
    assert {n for n, r in row.items() if r["status"] == "ok"} == honest, row
    assert row["reference"]["score"] == 100.0 and row["honest"]["score"] < 100.0  # the reference is faster
    for n in set(FORGERS) - honest:
        assert row[n]["score"] == 0.0 and hostile["submissions"][n]["score"] == 0.0, (n, row[n])


@pytest.mark.parametrize("mode", ["zero", "nan", "inf", "negative"])
def test_medians_at_or_below_zero_or_not_finite_are_rejected(hostile: dict[str, Any], mode: str) -> None:
    r = _row(hostile)[mode]
    assert r["status"] == "error" and ("median_ms=0" in r["note"] or "finite" in r["note"]), r


def test_median_below_the_physical_floor_is_rejected(hostile: dict[str, Any]) -> None:
    # skimp does a hundredth of the work and times it honestly: only the floor can tell
    r = _row(hostile)["skimp"]
    assert r["status"] == "error" and "physical floor" in r["note"], r
    r = _row(hostile)["tiny"]  # 1e-6 ms and no runs at all
    assert r["status"] == "error" and ("physical floor" in r["note"] or "cannot be checked" in r["note"]), r


def test_reports_below_the_graders_clock_are_dishonest(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["liar"]  # does every run, reports a tenth of its time
    assert r["status"] == "error" and "dishonest" in r["note"] and "took" in r["note"], r


def test_a_median_half_the_graders_clock_is_dishonest(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["halver"]  # does every run, reports its median divided by 2.2
    assert r["status"] == "error" and "dishonest" in r["note"], r


def _synthetic_round(ms: float, extra: int, wall: float, cpu: float) -> dict[str, Any]:
    """One compiler's round as bench_task records it: --bench 5, then --bench 5 + extra taking
    `wall` more seconds of the grader's clock and `cpu` more of CPU."""
    runs = [{"n": n, "stdout": f"s = [{v}]\n# bench runs={n} median_ms={ms}\n", "failure": None,
             "timeout": False, "wall": 0.3 + w, "cpu": 0.2 + c, "median": ms}
            for n, v, w, c in ((5, 7, 0.0, 0.0), (5 + extra, 9, wall, cpu))]
    return {"build_error": None, "runs": runs}


def test_the_clocks_noise_is_not_counted_as_load(tmp_path: Path) -> None:
    # the reference's extra runs took 1.35 s for the 1 s it claimed: 0.25 s of that may be the
    # clock's noise (two processes' start), so the load is 1.1, not 1.35. Counted as load, it let
    # a single-threaded halver (its extra runs at no load: 2.2 s for 1 s claimed) pass
    (tmp_path / "sum.eir").write_text(SUM)
    prog = parse(SUM, str(tmp_path / "sum.eir"))
    rnd = {"reference": _synthetic_round(0.1, 10_000, 1.35, 1.0), "twin": _synthetic_round(0.1, 10_000, 1.35, 1.0),
           "halver": _synthetic_round(0.1 / 2.2, 22_000, 2.2, 2.2)}
    row, info = bench.score_program(prog, ["reference", "twin", "halver"], [rnd], 0.0, 0.25, cpu=True)
    assert row is not None and isinstance(info, dict) and abs(info["load"] - 1.1) < 1e-9, info
    assert row["reference"]["status"] == row["twin"]["status"] == "ok", row
    assert row["halver"]["status"] == "error" and "dishonest" in row["halver"]["note"], row["halver"]


def test_reports_of_runs_not_done_are_dishonest(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["skip"]  # right answers, a plausible median, and no timed runs
    assert r["status"] == "error" and "dishonest" in r["note"] and "would take" in r["note"], r


def test_runs_slept_instead_of_done_are_dishonest(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["sleeper"]  # right answer once, then sleeps exactly what it claims: only the CPU can tell
    assert r["status"] == "error" and "runs not done" in r["note"], r


def test_answers_computed_at_home_are_wrong(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["athome"]  # the answer for the suite's own seed, by the file's shape
    assert r["status"] == "wrong", r


def test_answers_kept_from_an_earlier_run_are_wrong(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["stale"]  # one answer per program text without its seeds, kept in /tmp
    if hostile["stale_kept"]:  # (with a private /tmp per run it could keep nothing: then it is honest)
        assert r["status"] == "wrong", r


def test_results_of_the_timed_run_are_checked(hostile: dict[str, Any]) -> None:
    r = _row(hostile)["fakerest"]  # right at --bench N1, anything at --bench N2
    assert r["status"] == "wrong" and "--bench 5 " not in r["note"], r


def test_summary_states_the_band(hostile: dict[str, Any]) -> None:
    band = hostile["bands"]["sum.eir"]
    assert band >= bench.MIN_BAND and f"| sum.eir | {100 * band:.2g}% |" in hostile["summary"]


def test_output_past_what_the_answer_needs_is_a_failure_and_not_kept() -> None:
    """A run that prints more than its program's outputs can need (63 MiB of bytes that decode to
    four-byte characters, 0.5 GiB held a task until the report: a student's suite exhausted the
    grader) is a failure, and its output is dropped at once."""
    prog = parse(SUM)
    limit = bench.output_chars(prog)
    assert limit < 1 << 20   # a few values, a bench line and room for messages

    class Printer:   # a sandbox whose runs print `size` characters and a correct-looking bench line
        def __init__(self, size: int) -> None:
            self.size = size

        def run(self, cmd: list[str], **_: Any) -> bench.Result:
            return bench.Result(0, "\U0001F600" * self.size + f"\n# bench runs={cmd[-1]} median_ms=1\n", "", None, 0.1)
    sub = {"bloat": Submission("bloat", Path("/nonexistent"))}
    files = (("a.eir", SUM), ("b.eir", SUM))
    big = bench.bench_task(Printer(limit), sub, "bloat", 5, files, 60.0, 0.25, limit)   # type: ignore[arg-type]
    assert len(big["runs"]) == 1 and "more than" in big["runs"][0]["failure"] and big["runs"][0]["stdout"] == ""
    small = bench.bench_task(Printer(100), sub, "bloat", 5, files, 60.0, 0.25, limit)   # type: ignore[arg-type]
    assert [r["failure"] for r in small["runs"]] == [None, None] and small["runs"][0]["stdout"]


def test_reseed_gives_fresh_seeds_and_keeps_lines() -> None:
    text = SUM.replace("hi=1000", "hi=1000 # seed=7 in a comment stays")
    prog = parse(text)
    a, b = bench.reseed(text, prog), bench.reseed(text, prog)
    assert a != b and len(a.splitlines()) == len(text.splitlines()) and "# seed=7 in a comment stays" in a
    assert parse(a).inputs["x"].rand.seed != prog.inputs["x"].rand.seed  # type: ignore[union-attr]


def test_linear_scores_tie_within_the_band() -> None:
    assert bench.linear_scores({"a": 1.0, "b": 3.0, "c": 2.0, "d": None}) == {"a": 100.0, "b": 0.0, "c": 50.0, "d": 0.0}
    assert bench.linear_scores({"a": 19.321, "b": 19.324, "c": 38.6}) == {"a": 100.0, "b": 100.0, "c": 0.0}
    assert bench.linear_scores({"a": 0.614, "b": 0.647}, band=0.06) == {"a": 100.0, "b": 100.0}  # issue 28's 0 and 100
    assert bench.linear_scores({"a": 0.614, "b": 0.647}, band=0.01) == {"a": 100.0, "b": 0.0}


def test_an_order_that_a_round_reverses_is_a_tie() -> None:
    # twins under a load that fell twice on one of them (the 24th session's 34.8 and 0): the
    # medians are 17% apart, far outside the band, but round 3 ran the other way round
    times = {"ref": 0.0120, "twin1": 0.0236, "twin2": 0.0277}
    rounds = {"ref": [0.0118, 0.0120, 0.0121], "twin1": [0.0236, 0.0235, 0.0290], "twin2": [0.0277, 0.0280, 0.0236]}
    assert round(bench.linear_scores(times, 0.02)["twin1"]) == 26   # medians alone: 26 and 0
    assert bench.linear_scores(times, 0.02, rounds) == {"ref": 100.0, "twin1": 0.0, "twin2": 0.0}
    # slower in every round: the order stands
    rounds["twin2"][2] = 0.0295
    assert bench.linear_scores(times, 0.02, rounds)["twin1"] > 25


def test_programs_the_reference_cannot_run_score_no_one(tmp_path: Path) -> None:
    subs = tmp_path / "subs"
    (subs / "benchonly").mkdir(parents=True)  # the forger: a bench line and nothing else
    (subs / "benchonly" / "compiler").write_text('#!/bin/sh\necho "# bench runs=$3 median_ms=0.001"\n')
    (subs / "benchonly" / "compiler").chmod(0o755)
    cases = [("slow.eir", SLOW, "4", "timed out"),  # the reference times out, warm or cold
             ("fixed.eir", "ember 1\nx = param i32[2]\ny = neg x\nreturn y\ninput x = [1, 2]\n", "120",
              "every seed")]  # no seed for the grader to choose
    for name, text, timeout, why in cases:
        (tmp_path / name).mkdir()
        report = run_bench(tmp_path / name, subs, "--timeout", timeout, rounds=1, suite={name: text})
        assert report["programs"] == {} and why in report["dropped"][name], report["dropped"]
        assert report["submissions"] == {"reference": {"score": 0.0}, "benchonly": {"score": 0.0}}
        assert "Programs left out" in report["summary"]


def test_a_reference_that_compiles_into_its_cache_is_judged_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reference keeps a compile cache between runs: without a warm-up its N1 run would carry
    # the compile and its N2 run not, the extra wall time falling 1.5 s short of its claim.
    fake(tmp_path / "ref", "cold", "cold")
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "cache"))
    cold = [str(tmp_path / "ref" / "cold" / "compiler")]
    monkeypatch.setattr(Submission, "command", lambda self: cold if self.folder is None else [str(self.folder / "compiler")])
    fake(tmp_path / "subs", "honest")
    report = run_bench(tmp_path, tmp_path / "subs", rounds=1)
    assert _row(report)["reference"]["status"] == "ok"


def test_one_compiler_twice_under_load_scores_equal(tmp_path: Path) -> None:
    for name in ("twin1", "twin2"):
        fake(tmp_path / "subs", name)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a competing load on the 2 cores
    try:
        report = run_bench(tmp_path, tmp_path / "subs", rounds=3)
    finally:
        busy.kill()
        busy.wait()
    row = _row(report)  # the reference is not flagged, and the program is not dropped
    assert all(r["status"] == "ok" for r in row.values()), row
    assert abs(row["twin1"]["score"] - row["twin2"]["score"]) <= 5, row
    # alone on the curve, the twins' measured times would score 0 and 100 without the band
    band = report["bands"]["sum.eir"]
    twins = {n: row[n]["median_ms"] for n in ("twin1", "twin2")}
    assert bench.linear_scores(twins, band) == {"twin1": 100.0, "twin2": 100.0}, (twins, band)
