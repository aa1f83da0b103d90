"""Checkpoints of `ember train` as `ember sample` and a resumed `ember train` read them: every bad
file is one line naming it and the problem (exit 2), a config is checked before anything is
allocated, and sampling streams its tokens."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ember import nn, runners
from ember.cli import main
from ember.models.gpt import GPTConfig, build

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
CONFIG = GPTConfig(vocab=256, block=16, dim=16, n_layer=1, n_head=2)


def checkpoint(path: Path, config: dict | None = None, meta: str | None = None) -> Path:
    """A checkpoint as ember train writes it (the weights untrained)."""
    state = {f"model.{k}": v for k, v in build(CONFIG).state_dict().items()}
    run = {"config": config or CONFIG.to_dict(), "step": 0, "rng": None, "history": {"train": [], "val": []}}
    nn.save_safetensors(state, path, {"ember": meta if meta is not None else json.dumps(run)})
    return path


def edit_header(path: Path, change) -> Path:  # type: ignore[no-untyped-def]
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    change(header)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n:])
    return path


def first(header: dict, dtype: str) -> dict:
    return next(v for k, v in sorted(header.items()) if k != "__metadata__" and v["dtype"] == dtype)


def overlap(h: dict) -> None:  # the second tensor's offsets pointed into the first's bytes
    a, b = sorted((v for k, v in h.items() if k != "__metadata__"), key=lambda v: v["data_offsets"])[:2]
    b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + b["data_offsets"][1] - b["data_offsets"][0]]


CORRUPT = {
    "offsets into another tensor": lambda p: edit_header(p, overlap),
    "I32 declared for F32 data": lambda p: edit_header(p, lambda h: first(h, "F32").update(dtype="I32")),
    "I64 declared for F32 data": lambda p: edit_header(p, lambda h: first(h, "F32").update(dtype="I64")),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:5]),
    "cut in the data": lambda p: p.write_bytes(p.read_bytes()[:-7]),
    "not JSON": lambda p: p.write_bytes(struct.pack("<Q", 9) + b"{bad json" + b"\0" * 16),
    "not UTF-8": lambda p: p.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc" + b"\0" * 16),
    "metadata not JSON": lambda p: checkpoint(p, meta="{oops"),
    "no run in the metadata": lambda p: checkpoint(p, meta="[]"),
    "an unknown config key": lambda p: checkpoint(p, {**CONFIG.to_dict(), "width": 3}),
    "a config of other sizes": lambda p: checkpoint(p, {**CONFIG.to_dict(), "dim": 32}),
    "a string for a size": lambda p: checkpoint(p, {**CONFIG.to_dict(), "n_layer": "2"}),
}


@pytest.mark.parametrize("problem", list(CORRUPT))
def test_a_bad_checkpoint_is_one_line(problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = checkpoint(tmp_path / "ckpt.safetensors")
    CORRUPT[problem](path)
    assert main(["sample", "--ckpt", str(path), "--tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ember sample: {path}") and "Traceback" not in err, err
    assert "internal error" not in err and "unpack requires" not in err


def test_a_huge_config_is_refused_before_anything_is_allocated(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = checkpoint(tmp_path / "ckpt.safetensors", {**CONFIG.to_dict(), "dim": 1 << 16, "n_head": 64})
    t = time.perf_counter()
    assert main(["sample", "--ckpt", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GiB of memory" in err and time.perf_counter() - t < 5


def test_a_resumed_run_checks_the_checkpoint_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_header(checkpoint(tmp_path / "ckpt.safetensors"), overlap)
    args = ["train", "--out", str(tmp_path), "--dim", "16", "--layers", "1", "--heads", "2", "--block", "16",
            "--max-bytes", "200000", "--device", "cpu", "--steps", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"ember train: {tmp_path / 'ckpt.safetensors'}: not a valid")


class Recorder:
    """stdout that notes what had been written at each flush."""
    def __init__(self) -> None:
        self.text, self.flushed = "", []

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        self.flushed.append(self.text)


def test_sample_streams_its_tokens_and_temperature_0_is_greedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoint(tmp_path / "ckpt.safetensors")
    texts = []
    for seed in ("0", "1"):
        out = Recorder()
        monkeypatch.setattr(sys, "stdout", out)
        assert main(["sample", "--ckpt", str(path), "--tokens", "12", "--temperature", "0", "--seed", seed,
                     "--prompt", "ab"]) == 0
        monkeypatch.undo()
        texts.append(out.text)
        # the prompt first, then the text grows flush by flush (whole characters only)
        assert out.flushed[0] == "ab" and len(set(out.flushed)) >= 4 and out.text.startswith(out.flushed[-2])
    assert texts[0] == texts[1]   # greedy: the seed plays no part


def test_ctrl_c_in_set_up_is_one_line_and_130(tmp_path: Path) -> None:
    """Interrupted while it trains a BPE tokenizer, before any step: no traceback."""
    args = [sys.executable, "-m", "ember", "train", "--model", "gpt2", "--dim", "16", "--layers", "1", "--heads", "2",
            "--block", "16", "--batch", "2", "--max-bytes", "400000", "--device", "cpu", "--out", str(tmp_path / "r")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "EMBER_CACHE": str(tmp_path / "cache")}   # no cached tokenizer
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    line = proc.stderr.readline()   # (this blocks until set-up has begun)
    assert "training a byte-level BPE" in line, line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and err.strip() == "ember train: interrupted", err
    assert not (tmp_path / "r" / "ckpt.safetensors").exists()


def test_ctrl_c_while_sampling_is_one_line_and_130(tmp_path: Path) -> None:
    """Interrupted once the prompt is out: compiling or generating, no traceback."""
    path = checkpoint(tmp_path / "ckpt.safetensors")
    args = [sys.executable, "-m", "ember", "sample", "--ckpt", str(path), "--tokens", "100000", "--prompt", "ab"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.read(2) == b"ab"   # (streamed: it comes before any token)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and err.decode().strip() == "ember sample: interrupted", err
