"""`ember train` and `ember sample` as a user runs them: a tiny model, a few steps, an exact
resume from the checkpoint, and generated text."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember import backends, nn
from ember.cli import main

pytestmark = pytest.mark.skipif("c" not in backends.available(), reason="no C compiler")
TINY = ["--dim", "16", "--layers", "1", "--heads", "2", "--block", "16", "--batch", "4", "--eval-every", "3",
        "--max-bytes", "200000", "--device", "cpu"]


def history(run: Path) -> dict:
    return json.loads(nn.load_safetensors(run / "ckpt.safetensors")[1]["ember"])["history"]


def test_train_resume_and_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--steps", "6", "--out", str(tmp_path / "a"), *TINY]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["final_train_loss"] < 5.6 and summary["tokens_per_s"] > 0  # it learns from ln(256) = 5.55
    assert (tmp_path / "a" / "loss.png").stat().st_size > 1000
    assert main(["train", "--steps", "3", "--out", str(tmp_path / "b"), *TINY]) == 0
    assert main(["train", "--steps", "6", "--out", str(tmp_path / "b"), *TINY]) == 0  # resumes at step 3
    assert history(tmp_path / "a") == history(tmp_path / "b")  # bit-exact resume
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(tmp_path / "a" / "ckpt.safetensors"), "--tokens", "20", "--prompt", "def "]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def ") and len(out) >= 10


def test_train_reports_bad_data_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="no such file or folder"):
        main(["train", "--data", "/nonexistent/text", "--steps", "1"])
