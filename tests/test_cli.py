"""The command line: the protocol of spec section 9, exit statuses, and `ember test`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ember.cli import main

HERE = Path(__file__).parent
SOFTMAX = HERE / "eir" / "compositions" / "softmax.eir"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_run_prints_protocol_lines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["run", str(SOFTMAX), "--backend", "ref"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("p = [") and lines[0].count(",") == 13


def test_values_read_back_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.eir"
    f.write_text("ember 1\nx = param f32[3]\ny = param f64[2]\nh = param bf16[1]\nb = param bool[2]\nreturn x y h b\n"
                 "input x = [0.1, -0.0, 3.4028234663852886e38]\ninput y = [0.1, 1e-310]\ninput h = [0.1]\ninput b = [1, 0]\n")
    code, out, _ = run(["run", str(f), "--backend", "ref"], capsys)
    assert code == 0
    assert out.splitlines() == ["x = [0.100000001, -0, 3.40282347e+38]", "y = [0.10000000000000001, 9.9999999999999694e-311]",
                                "h = [0.100097656]", "b = [1, 0]"]


@pytest.mark.parametrize("path", sorted((HERE / "errors").glob("*.eir"))[:8], ids=lambda p: p.stem)
def test_malformed_exit_2_one_line(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["run", str(path), "--backend", "ref"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"{path}:")


@pytest.mark.parametrize("cmd", [["run"], ["fmt"], ["source", "--backend", "c"], ["run", "--bench", "2"]])
def test_missing_file_is_status_3(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*cmd, "/nonexistent/x.eir"], capsys)  # 2 means malformed; this file is not there
    assert code == 3 and out == "" and err == "/nonexistent/x.eir: cannot read the file: No such file or directory\n"
    assert run(["test", "/nonexistent/x.eir"], capsys)[0] == 3


def test_test_command_counts_and_reports_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.eir"
    good.write_text("ember 1\nx = param i32[2]\ny = neg x\nreturn y\ninput x = [1, 2]\nexpect y = [-1, -2]\n")
    bad = tmp_path / "sub" / "bad.eir"
    bad.parent.mkdir()
    bad.write_text("ember 1\nx = param f32[2,2]\ny = neg x\nreturn y\ninput x = [1, 2, 3, 4]\nexpect y = [-1, -2, -3, 4]\n")
    code, out, _ = run(["test", str(tmp_path), "--backend", "ref"], capsys)
    assert code == 1
    assert out.splitlines() == [f"FAIL {bad}: y[1,1] = -4, expected 4", "1 passed, 1 failed"]


def test_test_with_external_compiler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ember itself, run as an external command, grades the corpus through the protocol."""
    cmd = f"{sys.executable} -m ember run --backend ref"
    code, out, _ = run(["test", str(HERE / "eir" / "binary"), "--compiler", cmd], capsys)
    assert code == 0 and out.splitlines()[-1].endswith(" passed, 0 failed")
    liar = tmp_path / "liar.sh"
    liar.write_text("#!/bin/sh\necho 'y = [5, 5]'\n")
    liar.chmod(0o755)
    t = tmp_path / "t.eir"
    t.write_text("ember 1\nx = param u8[2]\ny = add x x\nreturn x y\ninput x = [1, 200]\nexpect y = [2, 144]\n")
    code, out, _ = run(["test", str(t), "--compiler", str(liar)], capsys)
    assert code == 1 and "y[0] = 5, expected 2" in out


def test_console_script_module_entry() -> None:
    proc = subprocess.run([sys.executable, "-m", "ember", "run", str(HERE / "errors" / "unknown_op.eir")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and ":4: unknown op" in proc.stderr


def test_fmt_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "f.eir"
    f.write_text("ember 1\nx =  param f32[2]\nreturn x\n")
    assert run(["fmt", str(f), "--check"], capsys)[0] == 1
    assert run(["fmt", "-w", str(f)], capsys)[0] == 0
    assert f.read_text() == "ember 1\nx = param f32[2]\nreturn x\n"
    assert run(["fmt", str(f), "--check"], capsys)[0] == 0


def test_every_option_has_help_with_its_default() -> None:
    import argparse

    from ember.cli import HelpWithDefaults, build_parser
    parsers = [p for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
               for p in a.choices.values() if p.add_help]
    for p in parsers:
        fmt = HelpWithDefaults(p.prog)
        for action in p._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS or "--help" in action.option_strings:
                continue
            text = fmt._get_help_string(action)
            assert action.help and ("default" in text or action.required), (p.prog, action.option_strings)


def test_version_and_broken_pipe(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ember", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ember ")
    f = tmp_path / "big.eir"
    f.write_text("ember 1\nx = param f32[200000]\ny = neg x\nreturn y\ninput x = rand seed=1\n")
    proc = subprocess.run(f"{sys.executable} -m ember run {f} --backend ref | head -c 10", shell=True,
                          capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
