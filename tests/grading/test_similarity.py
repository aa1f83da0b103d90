"""`ember grade --similarity` (issue 28, deliverable 4): winnowed fingerprints of normalised tokens."""
from __future__ import annotations

import io
import json
import keyword
import os
import shutil
import time
import tokenize
import tomllib
from pathlib import Path

import pytest

from ember.cli import main
from ember.grading import similarity

EMBER = Path(similarity.__file__).resolve().parents[1]
TOML = Path(tomllib.__file__).parent / "_parser.py"        # someone's parser: ann's code here
JSON = Path(json.__file__).parent                           # an independent one: carl's
OWN = "".join(f"def helper_{i}(table, key):\n    return table.get(key, {i}) * {i}\n\n" for i in range(10))  # 30 lines


def disguise(src: str) -> str:
    """src with every identifier renamed, comments dropped, blank lines added and spacing changed."""
    names: dict[str, str] = {}
    out = []
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        if t.type == tokenize.COMMENT:
            continue
        if t.type == tokenize.NAME and not keyword.iskeyword(t.string):
            out.append((t.type, names.setdefault(t.string, f"renamed_{len(names)}")))
        else:
            out.append((t.type, t.string))
    return tokenize.untokenize(out).replace("\n\n", "\n\n\n").replace("    ", "\t")


def _report(root: Path, base: Path | None = None, threshold: float = 0.25) -> dict:
    return similarity.report({p.name: p for p in sorted(root.iterdir())}, EMBER, threshold, base)


def _pairs(r: dict) -> dict[tuple[str, str], dict]:
    return {(p["a"], p["b"]): p for p in r["pairs"]}


def test_tokens_ignore_names_layout_and_comments() -> None:
    a = similarity.tokens("total = price * 3  # comment\nif total: print('x')\n")[0]
    b = similarity.tokens("/* c */ s=p*7 // other\n\n  if s :  f(\"yy\")")[0]
    assert a == b and a != similarity.tokens("while s: f('x')")[0]


def test_renamed_copy_is_found_with_its_regions(tmp_path: Path) -> None:
    for name in ("ann", "bob", "carl"):
        (tmp_path / name).mkdir()
    shutil.copy(TOML, tmp_path / "ann" / "parser.py")
    (tmp_path / "bob" / "main.py").write_text(OWN + disguise(TOML.read_text()))
    for f in ("decoder.py", "scanner.py", "encoder.py"):
        shutil.copy(JSON / f, tmp_path / "carl" / f)
    pairs = _pairs(_report(tmp_path))
    assert set(pairs) == {("ann", "bob")}, {k: v["similarity"] for k, v in pairs.items()}
    p = pairs["ann", "bob"]
    assert p["similarity"] > 0.9
    top = p["regions"][0]
    n = len(TOML.read_text().splitlines())
    assert (top["a_file"], top["b_file"]) == ("parser.py", "main.py")
    assert top["a_lines"][0] < 20 and top["a_lines"][1] > n - 20           # the whole of ann's file...
    assert 30 < top["b_lines"][0] < 60 and top["b_lines"][1] > n + 30     # ...after bob's own 30 lines


def test_independent_implementations_are_not_flagged(tmp_path: Path) -> None:
    for name, files in (("ann", [TOML]), ("carl", [JSON / "decoder.py", JSON / "scanner.py", JSON / "encoder.py"])):
        (tmp_path / name).mkdir()
        for f in files:
            shutil.copy(f, tmp_path / name)
    r = _report(tmp_path, threshold=0.05)
    assert r["pairs"] == [] and r["submissions"]["ann"]["fingerprints"] > 500


def test_copy_of_ember_is_flagged_against_ember(tmp_path: Path) -> None:
    (tmp_path / "dave" / "src").mkdir(parents=True)
    (tmp_path / "dave" / "src" / "front.py").write_text(disguise((EMBER / "text.py").read_text()))
    (tmp_path / "erin").mkdir()
    shutil.copy(TOML, tmp_path / "erin")
    pairs = _pairs(_report(tmp_path))
    assert set(pairs) == {("dave", "reference")}
    assert pairs["dave", "reference"]["similarity"] > 0.9
    top, n = pairs["dave", "reference"]["regions"][0], len((EMBER / "text.py").read_text().splitlines())
    assert (top["a_file"], top["b_file"]) == ("src/front.py", "text.py") and top["b_lines"][1] - top["b_lines"][0] > n / 3


def test_binary_files_symlinks_and_odd_files_are_ignored(tmp_path: Path) -> None:
    eve = tmp_path / "eve"
    eve.mkdir()
    (eve / "link.py").symlink_to(EMBER / "text.py")
    (eve / "pkg").symlink_to(EMBER)
    (eve / "blob.bin").write_bytes((EMBER / "text.py").read_bytes() + b"\0")
    (eve / "huge.py").write_text((EMBER / "text.py").read_text() + "#" * similarity.FILE_CAP)
    os.mkfifo(eve / "fifo.py")                                       # reading it would block
    deep = eve.joinpath(*["d"] * (similarity.DEPTH_CAP + 1))
    deep.mkdir(parents=True)
    shutil.copy(EMBER / "text.py", deep)                             # past the depth cap
    (tmp_path / "mallory").symlink_to(EMBER)                         # a submission that is a symlink
    t = time.perf_counter()
    r = _report(tmp_path, threshold=0.01)
    assert time.perf_counter() - t < 30
    assert r["pairs"] == []
    assert r["submissions"]["eve"] == {"files": 0, "fingerprints": 0, "skipped": 6}
    assert r["submissions"]["mallory"]["files"] == 0


def test_boilerplate_and_starter_code_do_not_count(tmp_path: Path) -> None:
    starter = JSON / "decoder.py"
    own = {"ann": [TOML], "bob": [JSON / "encoder.py"], "carl": [JSON / "scanner.py"]}
    for name, files in own.items():
        (tmp_path / "subs" / name).mkdir(parents=True)
        for f in files + [starter]:
            shutil.copy(f, tmp_path / "subs" / name)
    assert _report(tmp_path / "subs")["pairs"] == []                # in all three: boilerplate, as MOSS's -m
    shutil.rmtree(tmp_path / "subs" / "carl")
    assert set(_pairs(_report(tmp_path / "subs"))) == {("ann", "bob")}
    (tmp_path / "base").mkdir()
    shutil.copy(starter, tmp_path / "base")
    assert _report(tmp_path / "subs", base=tmp_path / "base")["pairs"] == []


def test_tokenizer_is_linear_on_hostile_text() -> None:
    t = time.perf_counter()
    for text in ('\\"' * 250_000, "\\'" * 250_000, "'" + "a" * 500_000, '"""' + "x" * 500_000, "/*" * 250_000):
        similarity.winnow(similarity.tokens(text)[0])   # each unterminated string once rescanned to its line's end
    assert time.perf_counter() - t < 3


def test_grade_similarity_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tests" / "ann").mkdir(parents=True)
    (tmp_path / "tests" / "ann" / "one.eir").write_text(
        "ember 1\nx = param i32[1]\nreturn x\ninput x = [1]\nexpect x = [1]\n")
    secret = 'TOKEN = "hunter2-in-anns-code"\n'
    for name, code in (("ann", secret + TOML.read_text()), ("bob", OWN + disguise(TOML.read_text()))):
        (tmp_path / "subs" / name).mkdir(parents=True)
        (tmp_path / "subs" / name / "compiler").write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / "subs" / name / "compiler").chmod(0o755)
        (tmp_path / "subs" / name / "c.py").write_text(code)
    args = ["grade", "--tests", str(tmp_path / "tests"), "--submissions", str(tmp_path / "subs"),
            "--out", str(tmp_path / "out"), "--jobs", "2"]
    assert main(args + ["--similarity", "0.5"]) == 0
    sim = json.loads((tmp_path / "out" / "grade.json").read_text())["similarity"]
    assert [(p["a"], p["b"]) for p in sim["pairs"]] == [("ann", "bob")] and sim["threshold"] == 0.5
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Similar code" in summary and "| ann | bob | " in summary and "c.py:" in summary
    assert "hunter2" not in summary + (tmp_path / "out" / "grade.json").read_text()   # places, never text
    capsys.readouterr()
    assert main(args + ["--similarity-base", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == f"ember grade: --similarity-base {tmp_path / 'none'} is not a folder"
    with pytest.raises(SystemExit):
        main(args + ["--similarity", "2"])
