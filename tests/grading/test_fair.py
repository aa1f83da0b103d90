"""Fair tests (spec 8, issue 28 problem 12): a test is valid only if it holds both when each op's
result is rounded to its dtype and when a compiler keeps every intermediate wide (spec 4)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember import protocol, ref, text
from ember.cli import main
from ember.grading import grade

ROOT = Path(__file__).resolve().parents[2]
UNFAIR = Path(__file__).parent / "unfair" / "f16_matmul_k256.eir"


def _both(tmp_path: Path, src: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    f = tmp_path / "t.eir"
    f.write_text("ember 1\n" + src)
    prog = text.parse_file(str(f))
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    return ref.evaluate(prog.output_nodes, inputs), ref.evaluate(prog.output_nodes, inputs, wide=True)


def test_unfair_f16_matmul_is_invalid_and_names_the_wide_mode() -> None:
    assert main(["test", str(UNFAIR), "--backend", "ref"]) == 0   # op-by-op rounding alone accepts it
    t = grade.Test("ann/f16_matmul_k256.eir", UNFAIR, UNFAIR.read_bytes())
    grade.validate(t)
    assert not t.valid and t.reason is not None
    assert t.reason.startswith("fails on the reference evaluator with intermediates kept wide (spec 8): "), t.reason
    assert "y[3,3] = 0.0044593811, expected 0.0069694519" in t.reason
    prog = text.parse_file(str(UNFAIR))
    f32 = np.float16(prog.input_values("x") @ prog.input_values("w"))[3, 3]  # products and sums kept in f32
    assert abs(f32 - 0.0069694519) > 2 * (1e-3 + 1e-2 * 0.0069694519)   # misses by more than twice the tolerance


def test_a_test_fair_only_to_wide_compilers_is_invalid_too(tmp_path: Path) -> None:
    # expects x + 1 - 1 == x in f16, true only when the sum is not rounded: the op-by-op mode names itself
    f = tmp_path / "bob" / "wide_only.eir"
    f.parent.mkdir()
    f.write_text("ember 1\nx = param f16[1]\nc = const 1 f16[1]\ny = add x c\nz = sub y c\nreturn z\n"
                 "input x = [0.0001]\nexpect z = [0.0001] atol=0 rtol=1e-3\n")
    t = grade.Test("bob/wide_only.eir", f, f.read_bytes())
    grade.validate(t)
    assert not t.valid and t.reason is not None and t.reason.startswith("fails on the reference evaluator: "), t.reason
    assert main(["test", str(f), "--backend", "ref-wide"]) == 0


def test_wide_mode_keeps_intermediates_and_rounds_what_it_must(tmp_path: Path) -> None:
    (ops_z, ops_r, ops_b), (wide_z, wide_r, wide_b) = _both(tmp_path, (
        "x = param f16[1]\nc = const 1 f16[1]\ny = add x c\nz = sub y c\n"  # an intermediate: kept wide
        "h = cast y dtype=f16\nr = sub h c\n"                               # an explicit cast rounds
        "b = bitcast y dtype=u16\n"                                          # the bits of the rounded y
        "return z r b\ninput x = [0.0001]\n"))
    assert ops_z[0] == 0 and wide_z[0] == np.float32(np.float16(0.0001))    # returned: rounded to f16
    assert ops_r[0] == wide_r[0] == 0
    assert wide_z.dtype == ops_z.dtype == np.float32 and ops_b[0] == wide_b[0] == 0x3C00


def test_wide_mode_keeps_gradients_wide(tmp_path: Path) -> None:
    # d(x^3)/dx in f16 sums x*x, x*x and m: op by op each term is rounded, kept wide only the sum
    ops, wide = _both(tmp_path, "x = param f16[1]\nm = mul x x\ny = mul m x\ng = grad y x\nreturn g\n"
                                "input x = [1.17]\n")
    x = float(np.float16(1.17))
    assert ops[0][0] == 4.109375 and wide[0][0] == np.float16(3 * x * x) == 4.10546875


CORPUS = sorted(p for d in ("tests/eir", "tests/errors", "examples") for p in (ROOT / d).rglob("*.eir"))


def test_corpus_is_valid_in_every_mode() -> None:
    assert len(CORPUS) > 150
    bad = []
    for path in CORPUS:
        t = grade.Test(str(path.relative_to(ROOT)), path, path.read_bytes())
        t.want = protocol.expected_error(t.source)
        if t.want and t.source.splitlines()[t.want[0] - 1].lstrip().startswith(b"expect"):
            continue   # an error in an expect line: `ember test` checks it; no graded compiler sees the line
        grade.validate(t)
        if not t.valid:
            bad.append(f"{t.key}: {t.reason}")
    assert bad == []


@pytest.mark.parametrize("backend", ["ref", "ref-wide"])
def test_run_backend_ref_wide(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(UNFAIR), "--backend", backend]) == 0
    last = capsys.readouterr().out.split(", ")[-1]
    assert last == ("0.0069694519]\n" if backend == "ref" else "0.0044593811]\n")


def test_a_test_that_holds_for_one_sum_order_only_is_invalid(tmp_path: Path) -> None:
    """Spec 4 leaves a float sum's order free: summed from the end, 1e8 - 1e8 + 1 + 1 is 0 in f32."""
    f = tmp_path / "eve" / "order.eir"
    f.parent.mkdir()
    f.write_text("ember 1\nx = param f32[4]\ns = sum x axes=[0]\nreturn s\ninput x = [1e8, -1e8, 1, 1]\n"
                 "expect s = [2]\n")
    t = grade.Test("eve/order.eir", f, f.read_bytes())
    grade.validate(t)
    assert not t.valid and t.reason is not None
    assert t.reason.startswith("fails on the reference evaluator with its float sums added in reverse order"), t.reason
    assert main(["test", str(f), "--backend", "ref"]) == 0 and main(["test", str(f), "--backend", "ref-wide"]) == 0
