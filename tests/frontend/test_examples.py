"""The PyTorch tutorial scripts in examples/ (issue 32, item 7), run as a user runs them: only
their imports differ from PyTorch's. Each trains and must reach its goal."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ember import runners

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")


def run(script: str, tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_torch_style_cnn(tmp_path: Path) -> None:
    out = run("torch_cnn.py", tmp_path)
    losses = [float(v) for v in re.findall(r"loss ([0-9.]+)", out)]
    assert losses[-1] < 0.1 * losses[0], out
    assert float(re.search(r"accuracy on the test images: ([0-9.]+) %", out).group(1)) > 90, out
    assert "same outputs True" in out and (tmp_path / "cnn.safetensors").exists()


def test_torch_style_transformer(tmp_path: Path) -> None:
    out = run("torch_transformer.py", tmp_path)
    val = [float(v) for v in re.findall(r"val loss ([0-9.]+)", out)]
    assert val[-1] < 0.5 * val[0], out
    assert out.strip().splitlines()[-1].startswith("the quick brown fox jumps"), out
