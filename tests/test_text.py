"""The .eir format: every malformed file gets one FILE:LINE error; printing and formatting
round-trip; random and truncated files never raise anything but EirError."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from ember import text
from ember.text import EirError

HERE = Path(__file__).parent
CORPUS = sorted((HERE / "eir").rglob("*.eir"))
ERRORS = sorted((HERE / "errors").glob("*.eir"))


@pytest.mark.parametrize("path", ERRORS, ids=lambda p: p.stem)
def test_error_files(path: Path) -> None:
    want = re.match(r"# error: (\d+): (.*)", path.read_text())
    assert want, "an error test starts with '# error: LINE: words of the message'"
    with pytest.raises(EirError) as info:
        text.parse_file(str(path))
    assert info.value.line == int(want.group(1)), str(info.value)
    assert want.group(2) in info.value.msg, str(info.value)
    assert str(info.value).startswith(f"{path}:{want.group(1)}: ")


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_print_round_trip(path: Path) -> None:
    prog = text.parse_file(str(path))
    printed = text.print_program(prog)
    again = text.parse(printed, "printed")
    assert [again.nodes[n] for n in again.outputs] == prog.output_nodes  # hash-consed: the same nodes
    for name in prog.params:
        assert (again.input_values(name) == prog.input_values(name)).all() or prog.nodes[name].dtype.is_float
    assert text.print_program(again) == printed


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_format_is_canonical(path: Path) -> None:
    src = path.read_text()
    out = text.format_text(src, str(path))
    assert text.format_text(out) == out  # idempotent
    assert text.parse(out).output_nodes == text.parse(src).output_nodes
    assert [ln for ln in out.splitlines() if ln.startswith("#")] == [ln for ln in src.splitlines() if ln.startswith("#")]


def test_format_normalizes_spacing_and_attribute_order() -> None:
    src = "ember 1\nx =  param f32[2, 3]   # in\np = pad x after=[0,1]  before=[ 1 , 0 ]\nreturn p\ninput x = [1,2,3,4,5,6]\n"
    assert text.format_text(src) == ("ember 1\nx = param f32[2,3]  # in\np = pad x before=[1,0] after=[0,1]\nreturn p\n"
                                     "input x = [1, 2, 3, 4, 5, 6]\n")


def test_name_may_equal_op_name() -> None:
    prog = text.parse("ember 1\nmax = param f32[2]\nsum = max max max\nreturn sum\n")
    assert prog.nodes["sum"].srcs == (prog.nodes["max"], prog.nodes["max"])


def test_params_of_one_type_are_distinct() -> None:
    prog = text.parse("ember 1\na = param f32[2]\nb = param f32[2]\nc = add a b\nreturn c\n")
    assert prog.nodes["a"] is not prog.nodes["b"]


def _mutations(src: str, rng: random.Random) -> str:
    lines = src.split("\n")
    kind = rng.randrange(6)
    if kind == 0:
        return src[: rng.randrange(len(src) + 1)]  # truncated
    if kind == 1 and lines:
        del lines[rng.randrange(len(lines))]
    elif kind == 2 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif kind == 3:
        toks = src.split(" ")
        i = rng.randrange(len(toks))
        toks[i] = rng.choice(["", "[", "]", "=", ":", "1e999", "-0", "nan", "x", "f32[]", "axes=[9]", "[1,,2]",
                              "rand", "0x1p", "return", "#", "\t", "i8[2,", "shape=[0]", "é"])
        return " ".join(toks)
    elif kind == 4:
        i = rng.randrange(len(src) + 1)
        return src[:i] + "".join(chr(rng.randrange(1, 128)) for _ in range(rng.randrange(1, 6))) + src[i:]
    else:
        i, j = sorted(rng.randrange(len(src) + 1) for _ in range(2))
        return src[:i] + src[j:]
    return "\n".join(lines)


def test_random_and_truncated_files_give_only_eir_errors() -> None:
    rng = random.Random(1234)
    sources = [p.read_text() for p in CORPUS + ERRORS]
    errors = 0
    for _ in range(3000):
        mutated = _mutations(rng.choice(sources), rng)
        try:
            text.parse(mutated, "fuzz.eir")
        except EirError as e:
            errors += 1
            assert re.match(r"fuzz\.eir:\d+: \S", str(e)), str(e)
    assert errors > 1000  # the mutations do break files
