"""The .eir format: every malformed file gets one FILE:LINE error; printing and formatting
round-trip; random and truncated files never raise anything but EirError."""
from __future__ import annotations

import random
import re
import time
from pathlib import Path

import numpy as np
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


def test_tokenizer_is_linear_in_long_names() -> None:
    name = "a" * (1 << 20)
    src = f"ember 1\n{name} = param f32[2]\n{name}b = neg {name}\n{name}c = add {name}b {name}\nreturn {name}c\n"
    assert len(src) > 4_000_000
    start = time.perf_counter()
    prog = text.parse(src)
    assert time.perf_counter() - start < 2.0 and prog.outputs == [name + "c"]
    assert text.tokenize("a [1, 2]b\tc[3] [] d") == ["a", "[1, 2]b", "c[3]", "[]", "d"]
    for bad, words in (("x [1", "not closed"), ("x ]", "without an opening"), ("x[1]]", "without an opening")):
        with pytest.raises(ValueError, match=words):
            text.tokenize(bad)


def test_crlf_line_endings_read_as_lf() -> None:
    src = "ember 1\nx = param f32[2]  # c\ny = neg x\nreturn y\ninput x = [1, -0]\nexpect y = [-1, 0]\n"
    crlf = text.parse(src.replace("\n", "\r\n"))
    assert crlf.output_nodes == text.parse(src).output_nodes and crlf.expects["y"].values == [-1.0, 0.0]
    assert text.format_text(src.replace("\n", "\r\n")) == text.format_text(src)
    with pytest.raises(EirError, match=r"^t.eir:3: a carriage return"):
        text.parse(src.replace("neg x", "neg\rx"), "t.eir")


def test_bom_and_non_ascii_bytes_say_where(tmp_path: Path) -> None:
    f = tmp_path / "t.eir"
    f.write_bytes(b"\xef\xbb\xbfember 1\nx = param f32[2]\nreturn x\n")
    with pytest.raises(EirError, match=r"t.eir:1: .*byte order mark"):
        text.parse_file(str(f))
    f.write_bytes(b"ember 1\nx = param f32[2]\ny = neg x  # caf\xc3\xa9\nreturn y\n")
    with pytest.raises(EirError, match=r"t.eir:3: .*non-ASCII byte 0xc3 at column 17"):
        text.parse_file(str(f))


def test_minus_zero_in_a_float_list_is_negative_zero() -> None:
    src = ("ember 1\nx = param f32[3]\nk = param i32[1]\nc = const -0 f32[1]\nreturn x k c\n"
           "input x = [-0, 0, -00]\ninput k = [-0]\n")
    prog = text.parse(src)
    assert list(np.signbit(prog.input_values("x"))) == [True, False, True]
    assert prog.input_values("k").tolist() == [0] and prog.nodes["c"].arg == 0.0  # const is a cast of the integer 0
    again = text.parse(text.print_program(prog))
    assert list(np.signbit(again.input_values("x"))) == [True, False, True]
    assert text.format_text(src) == src  # fmt keeps the literal as written


def test_unknown_op_suggests_the_nearest() -> None:
    with pytest.raises(EirError, match=r"unknown op 'nge' \(did you mean 'neg'\?\)"):
        text.parse("ember 1\nx = param f32[2]\ny = nge x\nreturn y\n")
    with pytest.raises(EirError, match=r"unknown op 'frobnicate'$"):
        text.parse("ember 1\nx = param f32[2]\ny = frobnicate x\nreturn y\n")


def test_long_data_lists_parse_in_bulk_with_the_same_values() -> None:
    n = 1_000_000
    start = time.perf_counter()
    prog = text.parse(f"ember 1\nx = param f32[{n}]\nreturn x\ninput x = [{', '.join(['0.1', '-0', '3'] * (n // 3) + ['7'])}]\n")
    assert time.perf_counter() - start < 2.0 and prog.inputs["x"].values[:4] == [float(np.float32(0.1)), -0.0, 3.0] * 1 + [float(np.float32(0.1))]
    edges = ["9007199254740993", "-9007199254740993", "123456789012345678", "1e3", "-0", "-00", "inf", "-inf", "nan",
             "2.5", "1e400", "-1e-400", "0.1", "65520"]
    ints = {"i64": ["9007199254740993", "123456789012345678", "1e3", "-0"], "u8": ["1e2", "-0", "255", "256", "1.5"]}
    for dtype in ("f32", "f64", "f16", "bf16", "i64", "u8"):
        for e in ints.get(dtype, edges):
            got = []
            for tail in ("1", "true"):  # true: every value one at a time
                try:
                    got.append(repr(text.parse(f"ember 1\nx = param {dtype}[2]\nreturn x\ninput x = [{e}, {tail}]\n")
                                    .inputs["x"].values[0]))
                except EirError as err:
                    got.append(str(err))
            assert got[0] == got[1], (dtype, e, got)
