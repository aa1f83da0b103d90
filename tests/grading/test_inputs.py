"""Untrusted input the grader reads (students' tests, compilers' output) and the reports it
writes: each test attacks one guarantee of docs/grading.md's threat model."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ember import data, protocol, text
from ember import dtype as dt
from ember.cli import main

ROOT = Path(__file__).parents[2]
GOOD_TEST = "ember 1\nx = param i32[3]\ny = neg x\nreturn y\ninput x = [1, 2, -3]\nexpect y = [-1, -2, 3]\n"


def _compiler(folder: Path, name: str, body: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "compiler").write_text("#!/bin/sh\n" + body + "\n")
    (folder / name / "compiler").chmod(0o755)


def _grade(tmp: Path, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`ember grade` as its own process, its memory capped: an attack on the grader fails the test, not the machine."""
    (tmp / "subs").mkdir(exist_ok=True)
    cap = lambda: resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, resource.RLIM_INFINITY))  # noqa: E731
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBER_SECRET": "s3cr3t-env-value"}
    proc = subprocess.run([sys.executable, "-m", "ember", "grade", "--tests", str(tmp / "tests"), "--submissions",
                           str(tmp / "subs"), "--out", str(tmp / "out"), "--jobs", "2", *extra],
                          capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=cap)
    report = json.loads((tmp / "out" / "grade.json").read_text()) if (tmp / "out" / "grade.json").exists() else {}
    return proc, report


def _reports(out: Path) -> str:
    return "".join(p.read_text() for p in sorted(out.iterdir()))


def test_tests_are_regular_files_never_followed(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "ann").mkdir(parents=True)
    (tests / "ann" / "good.eir").write_text(GOOD_TEST)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-first-token and more\n")
    secret.chmod(0o600)
    (tests / "ann" / "secret.eir").symlink_to(secret)
    (tests / "ann" / "environ.eir").symlink_to("/proc/self/environ")
    (tests / "ann" / "zero.eir").symlink_to("/dev/zero")
    os.mkfifo(tests / "ann" / "fifo.eir")
    (tests / "ann" / "big.eir").write_text(GOOD_TEST + "#" * 2_000_000 + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stolen.eir").write_text(GOOD_TEST)
    (tests / "mallory").symlink_to(elsewhere)                  # an author folder that is a symlink: skipped
    (tests / "ann" / "sub").symlink_to(elsewhere)               # so is a symlinked folder inside one
    proc, report = _grade(tmp_path, "--max-test-mib", "1", timeout=240)
    assert proc.returncode == 0, proc.stderr
    got = report["tests"]
    assert set(got) == {"ann/good.eir", "ann/secret.eir", "ann/environ.eir", "ann/zero.eir", "ann/fifo.eir",
                        "ann/big.eir"}
    assert got["ann/good.eir"]["valid"]
    for key in ("ann/secret.eir", "ann/environ.eir", "ann/zero.eir"):
        assert not got[key]["valid"] and "symlink" in got[key]["reason"], got[key]
    assert not got["ann/fifo.eir"]["valid"] and "not a regular file" in got["ann/fifo.eir"]["reason"]
    assert not got["ann/big.eir"]["valid"] and "larger than" in got["ann/big.eir"]["reason"]
    published = _reports(tmp_path / "out")
    for leak in ("TOPSECRET", "s3cr3t-env-value", str(secret), "/proc/self/environ", "/dev/zero", str(tmp_path)):
        assert leak not in published, leak



def test_a_test_folder_thousands_deep_is_walked(tmp_path: Path) -> None:
    """os.walk recurses on Python 3.11: 1100 nested folders would be a RecursionError in the grader."""
    from ember.grading.grade import find_tests
    from ember.grading.sandbox import _rmtree
    author = tmp_path / "tests" / "deep"
    author.mkdir(parents=True)
    (author / "a.eir").write_text(GOOD_TEST)
    fd = os.open(author, os.O_RDONLY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    with open(os.open("b.eir", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
        f.write(GOOD_TEST + "# deep\n")   # other bytes than a.eir's (a copy would count once)
    os.close(fd)
    try:
        tests, _ = find_tests(tmp_path / "tests", 1 << 20)
        assert [t.key for t in tests] == ["deep/a.eir", "deep/" + "d/" * 1100 + "b.eir"] and all(t.valid for t in tests)
    finally:
        _rmtree(author / "d")   # pytest's own clean-up of tmp_path recurses too

HUGE = {
    "const.eir": "ember 1\nc = const 1 f64[2147483647]\nreturn c\nexpect c = rand seed=1\n",
    "sum.eir": "ember 1\nc = const 1 f32[65536,65536]\ns = sum c axes=[0,1]\nreturn s\nexpect s = [4294967296]\n",
    # under the element cap, but 4 of them do not fit in the validation memory limit
    "many.eir": "ember 1\nx = param f64[16384,16384]\ny = add x x\nz = mul y y\nw = add z y\nreturn w\n"
                "input x = rand seed=1\nexpect w = rand seed=2\n",
}


def test_huge_tests_are_invalid_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "tests" / "eve").mkdir(parents=True)
    (tmp_path / "tests" / "ann").mkdir(parents=True)
    (tmp_path / "tests" / "ann" / "good.eir").write_text(GOOD_TEST)
    for name, src in HUGE.items():
        (tmp_path / "tests" / "eve" / name).write_text(src)
    proc, report = _grade(tmp_path, "--validate-mib", "1024")
    assert proc.returncode == 0, proc.stderr
    got = report["tests"]
    assert got["ann/good.eir"]["valid"] and report["submissions"]["reference"]["rate"] == 1.0
    assert "too large" in got["eve/const.eir"]["reason"] and "too large" in got["eve/sum.eir"]["reason"]
    assert "memory limit" in got["eve/many.eir"]["reason"], got["eve/many.eir"]


def test_validation_has_a_time_limit(tmp_path: Path) -> None:
    (tmp_path / "tests" / "eve").mkdir(parents=True)
    (tmp_path / "tests" / "eve" / "slow.eir").write_text(
        "ember 1\nx = param f32[4096,4096]\ns = sum x axes=[0,1]\nreturn s\ninput x = rand seed=1\nexpect s = [0]\n")
    proc, report = _grade(tmp_path, "--validate-timeout", "0.05")
    assert proc.returncode == 0, proc.stderr
    assert "took more than 0.05 s to validate" in report["tests"]["eve/slow.eir"]["reason"]


def test_error_tests_need_the_error_on_their_own_line(tmp_path: Path) -> None:
    tests = tmp_path / "tests" / "ann"
    tests.mkdir(parents=True)
    (tests / "err.eir").write_text("# error: 4: unknown op\nember 1\nx = param f32[2]\ny = frobnicate x\nreturn y\n")
    (tests / "good.eir").write_text(GOOD_TEST)
    subs = tmp_path / "subs"
    forged = "; ".join(f'echo "{w}" >&2' for w in ["f:1:2:3:4:5:6:7:8:9:10:11:12:13:14:15:16:17:18:19:20: no"])
    _compiler(subs, "colons", forged + "; exit 2")
    _compiler(subs, "elsewhere", 'echo "/tmp/other.eir:4: unknown op" >&2; exit 2')
    _compiler(subs, "wrongline", 'echo "$1:3: unknown op" >&2; exit 2')
    _compiler(subs, "honest", 'exec python3 -m ember run --backend ref "$@"')
    proc, report = _grade(tmp_path, "--allow-ember")
    assert proc.returncode == 0, proc.stderr
    assert report["tests"]["ann/err.eir"]["valid"], report["tests"]
    fails = {n: s["failures"] for n, s in report["submissions"].items()}
    assert "ann/err.eir" not in fails["reference"] and "ann/err.eir" not in fails["honest"], fails
    for liar in ("colons", "elsewhere", "wrongline"):
        assert "ann/err.eir" in fails[liar], liar
    assert protocol.reported_error(2, "/tmp/run7/err.eir:4: unknown op\n", 4, "err.eir", copy=True)
    assert not protocol.reported_error(2, "/tmp/run7/err.eir:44: unknown op\n", 4, "err.eir", copy=True)
    assert not protocol.reported_error(2, "x/err.eir:1:err.eir:4: x\n", 4, "err.eir", copy=True)
    assert not protocol.reported_error(2, "/tmp/run7/err.eir:4: x\n", 4, "/tmp/run8/err.eir")


def test_each_test_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tests" / "ann").mkdir(parents=True)
    for i in range(2):   # two tests of different bytes (a copy would count once)
        (tmp_path / "tests" / "ann" / f"t{i}.eir").write_text(GOOD_TEST + f"# test {i}\n")
    for name in ("a", "b", "c"):
        _compiler(tmp_path / "subs", name, 'exec python3 -m ember run --backend ref "$@"')
    calls, resolved = [], []
    real, real_resolve = text.Parser.parse, text.resolve
    monkeypatch.setattr(text.Parser, "parse", lambda self: calls.append(self.path) or real(self))
    monkeypatch.setattr(text, "resolve", lambda *a: resolved.append(1) or real_resolve(*a))
    assert main(["grade", "--tests", str(tmp_path / "tests"), "--submissions", str(tmp_path / "subs"),
                 "--out", str(tmp_path / "out"), "--jobs", "2", "--allow-ember"]) == 0
    assert json.loads((tmp_path / "out" / "grade.json").read_text())["submissions"]["c"]["rate"] == 1.0
    assert sorted(calls) == ["ann/t0.eir", "ann/t1.eir"]  # in this process: once each, not once per compiler
    assert len(resolved) == 2  # and each expect line's values resolved once


# ----------------------------------------------------------------------------- read back

EDGES = {
    dt.f32: ["1.00000005960464477539062500000000001", "1.000000059604644775390625", "1e-45", "7e-46", "-7e-46",
             "1.4e-45", "3.4028235677973366e38", "3.4028235677973362e38", "1e39", "-1e39", "inf", "-inf", "nan",
             "-0", "0", "-0.0", "0x1.000001p0", "16777217", "0.100000001", "1e-400", "2.5", "-3"],
    dt.f16: ["-1.000488281250000001", "1.00048828125", "65519.99", "65520", "6e-8", "2.98e-8", "-0", "nan", "1"],
    dt.bf16: ["1.00390625000000000000001", "1.00390625", "3.3895313892515355e38", "1e-41", "-0", "inf", "7"],
    dt.f64: ["0.1", "1e-320", "4.9e-324", "2e-324", "1.7976931348623157e308", "1.8e308", "-0", "nan", "-inf"],
    dt.i64: ["9223372036854775807", "-9223372036854775808", "0", "-5", "3.0", "1e3"],
    dt.u64: ["18446744073709551615", "0", "123"],
    dt.u8: ["0", "255", "17"], dt.bool_: ["0", "1", "true", "false"],
}


def _prog(dtype: dt.DType, n: int) -> text.Program:
    return text.parse(f"ember 1\nx = param {dtype.name}[{n}]\nreturn x\n")


@pytest.mark.parametrize("dtype", list(EDGES), ids=lambda d: d.name)
def test_read_back_in_bulk_is_the_exact_read_back(dtype: dt.DType) -> None:
    toks = EDGES[dtype] * 3
    got = protocol.parse_output(f"x = [{', '.join(toks)}]\n", _prog(dtype, len(toks)))["x"]
    want = [data.read_back(t, dtype) for t in toks]
    assert None not in want
    if dtype.is_float:
        assert np.array_equal(np.asarray(want, np.float64).view(np.uint64), got.astype(np.float64).view(np.uint64))
    else:
        assert [int(v) for v in got] == want


@pytest.mark.parametrize("dtype,line,words", [
    (dt.i8, "x = [1, 128]", "'128'"), (dt.u64, "x = [1, 18446744073709551616]", "'18446744073709551616'"),
    (dt.i64, "x = [1, 9223372036854775808]", "'9223372036854775808'"), (dt.i32, "x = [1, 1.5]", "'1.5'"),
    (dt.f32, "x = [1, 1_0]", "'1_0'"), (dt.f32, "x = [1, +1]", "'+1'"), (dt.f32, "x = [1, infinity]", "'infinity'"),
    (dt.f32, "x = [1, -nan]", "'-nan'"), (dt.f32, "x = [1, 1.2.3]", "'1.2.3'"), (dt.f64, "x = [1e+, 1]", "'1e+'"),
    (dt.f32, "x = [1,]", "'' is not"), (dt.f32, "x = [1, 2, 3]", "3 values"), (dt.f32, "x = [1]", "1 values"),
    (dt.f32, "x = [1, " + "1" * 200 + "]", "longer than 100"),
])
def test_bad_values_are_one_clear_error(dtype: dt.DType, line: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        protocol.parse_output(line, _prog(dtype, 2))
    assert words in str(info.value), str(info.value)


def test_a_million_values_read_back_in_a_second_or_two() -> None:
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.standard_normal(10**6 - 4).astype(np.float32), np.float32([0, -0.0, np.inf, np.nan])])
    line = "x = " + data.format_values(vals, dt.f32)
    start = time.perf_counter()
    got = protocol.parse_output(line, _prog(dt.f32, 10**6))["x"]
    assert time.perf_counter() - start < 4.0  # about 1 s here; one value at a time took 33 s
    assert np.array_equal(got.astype(np.float32).view(np.uint32), vals.view(np.uint32))


# -------------------------------------------------------------------------------- reports

def _snapshot(folder: Path) -> dict[str, bytes | str]:
    return {str(p): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_reports_go_only_into_a_folder_no_one_else_can_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tests" / "ann").mkdir(parents=True)
    (tmp_path / "tests" / "ann" / "t.eir").write_text(GOOD_TEST)
    (tmp_path / "subs").mkdir()
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "keep").write_text("root's file\n")
    planted = tmp_path / "planted"        # an --out a student made: open to all, full of links into victim
    planted.mkdir()
    planted.chmod(0o777)
    for name in ("grade.json", "summary.md", "failures.csv", "tests.csv", "submissions.csv"):
        (planted / name).symlink_to(victim / name)
        for pid in range(os.getpid() - 3, os.getpid() + 50):
            (planted / f".{name}.{pid}.tmp").symlink_to(victim / f"{name}.{pid}")
    public = tmp_path / "public"           # a parent others may write (not sticky): they could swap --out
    public.mkdir()
    public.chmod(0o777)
    (tmp_path / "link").symlink_to(victim)    # an --out that leads elsewhere
    before = _snapshot(tmp_path)
    args = ["grade", "--tests", str(tmp_path / "tests"), "--submissions", str(tmp_path / "subs"), "--out"]
    for out, why in ((planted, "writable by others"), (public / "out", "writable by others"),
                     (tmp_path / "link", "is a symlink")):
        assert main(args + [str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(out) in err[0] and why in err[0], err
    assert _snapshot(tmp_path) == before       # nothing changed anywhere, --out's links included

    os.chmod(planted, 0o755)                    # the grader's own folder, closed to others: used, links replaced
    assert main(args + [str(planted)]) == 0
    assert sorted(os.listdir(victim)) == ["keep"]
    assert not (planted / "summary.md").is_symlink() and "# Grades" in (planted / "summary.md").read_text()
    fresh = tmp_path / "new" / "out"
    assert main(args + [str(fresh)]) == 0 and (fresh / "grade.json").is_file()
    assert fresh.stat().st_mode & 0o022 == 0


# ------------------------------------------------------------------- the red team's attacks

def test_hard_links_are_never_read(tmp_path: Path) -> None:
    """A hard link passes every test of a regular file: as a test, its first line would be quoted
    in a reason; inside a submission, the copy would hand a root-only file to the run."""
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("TOKEN=hunter2-SECRET\n")
    (secret / "key").chmod(0o600)
    (tmp_path / "tests" / "eve").mkdir(parents=True)
    (tmp_path / "tests" / "ann").mkdir()
    (tmp_path / "tests" / "ann" / "good.eir").write_text(GOOD_TEST)
    os.link(secret / "key", tmp_path / "tests" / "eve" / "leak.eir")
    _compiler(tmp_path / "subs", "thief", "cat loot >&2; exit 1")
    os.link(secret / "key", tmp_path / "subs" / "thief" / "loot")
    proc, report = _grade(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "hard link" in report["tests"]["eve/leak.eir"]["reason"]
    assert "hard-linked" in report["submissions"]["thief"]["failures"]["ann/good.eir"]
    assert "hunter2" not in _reports(tmp_path / "out")


def test_an_error_on_an_expect_line_is_no_error_test(tmp_path: Path) -> None:
    """A compiler gets the test with its expect lines blanked: an error there is one no compiler
    can report, so the test is invalid (it broke every compiler, the reference too)."""
    (tmp_path / "tests" / "eve").mkdir(parents=True)
    (tmp_path / "tests" / "eve" / "e.eir").write_text(
        "# error: 6: which is not returned\nember 1\nx = param f32[1]\ny = neg x\nreturn y\n"
        "expect q = [1]\ninput x = [1]\n")
    proc, report = _grade(tmp_path)
    assert proc.returncode == 0, proc.stderr
    t = report["tests"]["eve/e.eir"]
    assert not t["valid"] and "but the program is valid" in t["reason"], t


def test_a_test_the_reference_fails_counts_for_no_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.grading import submissions
    (tmp_path / "tests" / "ann").mkdir(parents=True)
    (tmp_path / "tests" / "ann" / "good.eir").write_text(GOOD_TEST)
    (tmp_path / "tests" / "ann" / "two.eir").write_text(GOOD_TEST.replace("1, 2, -3", "4, 2, -3").replace("-1, -2", "-4, -2"))
    _compiler(tmp_path / "subs", "right", "echo 'y = [-1, -2, 3]'")
    wrong_reference = tmp_path / "ref.sh"   # a reference that is right on good.eir alone
    wrong_reference.write_text("#!/bin/sh\necho 'y = [-1, -2, 3]'\n")
    wrong_reference.chmod(0o755)
    real = submissions.Submission.command
    monkeypatch.setattr(submissions.Submission, "command",
                        lambda self: [str(wrong_reference)] if self.folder is None else real(self))
    assert main(["grade", "--tests", str(tmp_path / "tests"), "--submissions", str(tmp_path / "subs"),
                 "--out", str(tmp_path / "out"), "--jobs", "2"]) == 0
    report = json.loads((tmp_path / "out" / "grade.json").read_text())
    assert report["tests"]["ann/two.eir"]["valid"] is False
    assert report["tests"]["ann/two.eir"]["reason"].startswith("the reference compiler fails it")
    assert {n: (s["passed"], s["failed"]) for n, s in report["submissions"].items()} == {"reference": (1, 0),
                                                                                         "right": (1, 0)}


def test_odd_names_and_floods_leave_the_reports_whole(tmp_path: Path) -> None:
    """A test named with a byte that is not UTF-8, a submission named `reference`, a forged table
    row in a name, an author's flood of tests and copies of one test: the grader writes every
    report, grades the rest, and counts each test once."""
    tests = tmp_path / "tests"
    (tests / "ann").mkdir(parents=True)
    (tests / "ann" / "good.eir").write_text(GOOD_TEST)
    with open(os.open(os.fsencode(tests / "ann") + b"/bad\xff.eir", os.O_WRONLY | os.O_CREAT), "w") as f:
        f.write(GOOD_TEST.replace("1, 2, -3", "5, 2, -3").replace("-1, -2", "-5, -2"))
    (tests / "flood").mkdir()
    for i in range(5):
        (tests / "flood" / f"t{i}.eir").write_text(GOOD_TEST.replace("1, 2, -3", f"1, 2, {i}")
                                                   .replace("-1, -2, 3", f"-1, -2, {-i}"))
    (tests / "flood" / "t0.eir").write_text(GOOD_TEST)   # a copy of ann/good.eir
    _compiler(tmp_path / "subs", "reference", "exit 1")
    _compiler(tmp_path / "subs", "bad| 100 | 0 | 100.0% |\n| mallory", "exit 1")
    proc, report = _grade(tmp_path, "--max-tests-per-author", "3")
    assert proc.returncode == 0, proc.stderr
    assert "the name 'reference' is kept for Ember itself" in proc.stderr
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"grade.json", "summary.md", "tests.csv", "failures.csv"}
    assert report["tests_not_read"] == {"flood": 2} and "flood/t3.eir" not in report["tests"]
    assert "same bytes as ann/good.eir" in report["tests"]["flood/t0.eir"]["reason"]
    assert report["submissions"]["reference"]["rate"] == 1.0 and len(report["submissions"]) == 2
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "\n| mallory" not in summary and "bad\\udcff.eir" in summary   # escaped, not a crash
