"""Grading: values read back into their dtype (spec 9), --bench (spec 10), `ember grade` and
`ember bench`'s command line with correct, wrong, crashing, hanging, flooding and hostile submissions."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember import data
from ember import dtype as dt
from ember.cli import main
from ember.grading.sandbox import BLOCK_UIDS, BLOCKS, UID_BASE

HERE = Path(__file__).parents[1]


@pytest.mark.parametrize("tok,dtype,want", [
    ("1.00000005960464477539062500000000001", dt.f32, 1 + 2**-23),   # just above an f32 midpoint
    ("1.000000059604644775390625", dt.f32, 1.0),                      # the midpoint: ties to even
    ("1.00390625000000000000001", dt.bf16, 1 + 2**-7),
    ("1.00390625", dt.bf16, 1.0),
    ("-1.000488281250000001", dt.f16, -(1 + 2**-10)),
    ("0.100000001", dt.f32, 0.10000000149011612),
    ("255", dt.u8, 255), ("256", dt.u8, None), ("1.5", dt.i32, None), ("x", dt.f32, None),
])
def test_read_back_rounds_decimal_once(tok: str, dtype: dt.DType, want: float | None) -> None:
    assert data.read_back(tok, dtype) == want


def test_test_compiler_reads_values_into_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    # these expectations are exact f32/bf16 values, which an f64 comparison of 9 digits failed
    files = [str(HERE / "eir" / "generator" / "float_seed_42.eir"), str(HERE / "eir" / "sources" / "const_bf16_rounding.eir")]
    code = main(["test", *files, "--compiler", f"{sys.executable} -m ember run --backend ref"])
    assert code == 0 and capsys.readouterr().out.splitlines()[-1] == "2 passed, 0 failed"


@pytest.mark.parametrize("backend", ["ref", "c"])
def test_run_bench_line(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(HERE / "eir" / "compositions" / "softmax.eir"), "--backend", backend, "--bench", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("p = [") and lines[1].startswith("# bench runs=3 median_ms=")
    assert float(lines[1].split("=")[-1]) >= 0


def test_error_tests_explain_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["test", str(HERE / "errors"), "--backend", "ref"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[-1].endswith(" passed, 0 failed"), out[:3]


def test_unknown_backend_is_one_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", str(HERE / "eir" / "unary"), "--backend", "tpu"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["test", str(HERE / "eir" / "unary"), "--compiler", "/no/such/compiler"]) == 2


def _compiler(folder: Path, name: str, body: str, build: str | None = None) -> None:
    d = folder / name
    d.mkdir(parents=True)
    exe = d / ("build" if build else "compiler")
    exe.write_text("#!/bin/sh\n" + (build or body) + "\n")
    exe.chmod(0o755)


def _tree_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


GOOD = 'exec python3 -m ember run --backend c "$@"'


@pytest.fixture
def course(tmp_path: Path) -> Path:
    tests = tmp_path / "tests"
    (tests / "ann").mkdir(parents=True)
    (tests / "bob").mkdir()
    (tests / "ann" / "neg.eir").write_text("ember 1\nx = param i32[3]\ny = neg x\nreturn y\ninput x = [1, 2, -3]\n"
                                           "expect y = [-1, -2, 3]\n")
    (tests / "ann" / "half.eir").write_text("ember 1\nx = param f32[2]\nh = const 0.5 f32[2]\ny = mul x h\nreturn y\n"
                                            "input x = [1, 3]\nexpect y = [0.5, 1.5]\n")
    (tests / "bob" / "bad.eir").write_text("ember 1\nx = param i32[1]\nreturn x\ninput x = [1]\nexpect x = [2]\n")
    subs = tmp_path / "subs"
    _compiler(subs, "good", GOOD)
    _compiler(subs, "built", "", build=f"printf '#!/bin/sh\\n{GOOD}\\n' > compiler && chmod +x compiler")
    _compiler(subs, "wrong", 'python3 -m ember run --backend c "$@" | sed "s/-1/-7/"')
    _compiler(subs, "crash", "kill -SEGV $$")
    _compiler(subs, "hang", "sleep 300")
    _compiler(subs, "flood", "yes 1")
    _compiler(subs, "forker", "while true; do sleep 300 & done")
    # reads every .eir it can find, tries to write beside the tests, leaves a process behind
    hostile = ('for f in $(find / -name "*.eir" 2>/dev/null); do grep -h "^expect" "$f"; done | head -1 >&2\n'
               f'echo pwned > {tests}/ann/pwned.eir; echo pwned > {tests}/ann/neg.eir\n'
               "setsid sleep 300 >/dev/null 2>&1 &\n" + GOOD)
    _compiler(subs, "hostile", hostile)
    return tmp_path


def test_grade_contains_misbehaving_compilers(course: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree_hash(course / "tests")
    out = course / "out"
    code = main(["grade", "--tests", str(course / "tests"), "--submissions", str(course / "subs"),
                 "--out", str(out), "--timeout", "30", "--jobs", "2", "--allow-ember"])
    assert code == 0
    report = json.loads((out / "grade.json").read_text())
    assert report["tests"]["bob/bad.eir"]["valid"] is False and "reference" in report["tests"]["bob/bad.eir"]["reason"]
    rates = {n: s["rate"] for n, s in report["submissions"].items()}
    assert rates["reference"] == rates["good"] == rates["built"] == 1.0
    assert rates["wrong"] == 0.5 and report["tests"]["ann/neg.eir"]["broken_by"] == sorted(
        ["crash", "hang", "flood", "forker", "wrong"] + (["hostile"] if rates["hostile"] < 1 else []))
    for bad in ("crash", "hang", "flood", "forker"):
        assert rates[bad] == 0.0, bad
    assert "timed out" in report["submissions"]["hang"]["failures"]["ann/neg.eir"]
    assert _tree_hash(course / "tests") == before           # nothing written beside the tests
    for name in ("summary.md", "submissions.csv", "tests.csv", "failures.csv"):
        assert (out / name).exists()
    if os.geteuid() == 0:  # no process of a sandbox user outlives the grading
        uids = subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
        assert not [u for u in map(int, uids) if UID_BASE <= u < UID_BASE + BLOCKS * BLOCK_UIDS]


def test_an_ember_the_runs_cannot_see_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """--allow-ember with the grader's Ember installed under /tmp: each contained run has an empty
    /tmp of its own, so every run would fail with "No module named 'ember'" (a fresh clone under
    /tmp did): one line and status 2 before any submission runs, for grade and bench."""
    from ember.grading import sandbox
    monkeypatch.setattr(sandbox, "EMBER", Path("/tmp/clone/ember"))
    monkeypatch.setattr(sandbox, "level", lambda: "namespaces")
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "a" / "x.eir").write_text("ember 1\nx = param i32[1]\nreturn x\ninput x = [1]\nexpect x = [1]\n")
    _compiler(tmp_path / "s", "ann", "exit 0")
    for command in (["grade", "--tests", str(tmp_path / "t")], ["bench", "--suite", str(tmp_path / "t" / "a")]):
        assert main([*command, "--submissions", str(tmp_path / "s"),
                     "--out", str(tmp_path / "o"), "--allow-ember"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "/tmp/clone" in err[0] and "install it from a checkout elsewhere" in err[0]
        assert not (tmp_path / "o").exists()
    assert sandbox.ember_hidden(False) is None


def test_bad_folders_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "a" / "x.eir").write_text("ember 1\nx = param i32[1]\nreturn x\ninput x = [1]\nexpect x = [1]\n")
    _compiler(tmp_path / "s", "reference", "exit 0")   # one student's folder name: skipped, the week graded
    assert main(["grade", "--tests", str(tmp_path / "t"), "--submissions", str(tmp_path / "s"),
                 "--out", str(tmp_path / "o")]) == 0
    assert "kept for Ember" in capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "grade.json").read_text())["submissions"]["reference"]["rate"] == 1.0
    assert main(["grade", "--tests", str(tmp_path / "none"), "--submissions", str(tmp_path / "s"),
                 "--out", str(tmp_path / "o")]) == 2
    assert main(["bench", "--suite", str(tmp_path / "none"), "--submissions", str(tmp_path / "s"),
                 "--out", str(tmp_path / "o")]) == 2
