"""`ember train` and `ember sample` as a user runs them: a tiny model, a few steps, an exact
resume from the checkpoint, and generated text."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember import nn, runners
from ember.cli import main

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
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
    assert main(["train", "--data", "/nonexistent/text", "--steps", "1"]) == 3
    err = capsys.readouterr().err
    assert err == "ember train: --data /nonexistent/text: no such file or folder\n"


def test_ctrl_c_saves_a_checkpoint_and_says_one_line(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time
    args = [sys.executable, "-m", "ember", "train", "--steps", "100000", "--out", str(tmp_path / "r"), *TINY]
    args[args.index("--eval-every") + 1] = "1"
    # a shell without job control starts background jobs with SIGINT ignored, and Python keeps it
    # so: the child gets the default back, as a terminal's foreground job has it
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # the first checkpoint comes after the first step compiles, which on a loaded machine takes
    # minutes: the bound is for a hung run, not a slow one (while it runs, it is waited for)
    deadline = time.time() + 1200
    while not (tmp_path / "r" / "ckpt.safetensors").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None and (tmp_path / "r" / "ckpt.safetensors").exists(), "no checkpoint was written"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)   # it may be inside a compile of the next step: that ends first
    assert proc.returncode == 130
    last = err.strip().splitlines()[-1]
    assert last.startswith("ember train: interrupted after step") and "Traceback" not in err
    assert history(tmp_path / "r")["train"]  # the checkpoint holds the steps run


def test_ctrl_c_inside_a_weakref_callback_still_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # A KeyboardInterrupt raised inside a weakref callback is printed and dropped by Python, and
    # Ember's graphs run such callbacks all the time (ir.Node's hash-consing table): a Ctrl-C that
    # landed there was lost and the run went on (a fresh-clone run under load hung 10 minutes).
    import signal
    import threading
    import weakref

    from ember import train
    real = train.Run.step

    def step(self: train.Run, s: int, bar: object) -> None:
        real(self, s, bar)
        if s == 1:
            class Dying:
                pass
            x = Dying()

            def callback(_: object) -> None:
                # to this thread: a signal to the process may land on one of Ember's compile
                # threads, whose handler then waits for that thread to run (under load, past the
                # last step: main returned 0)
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
                for _ in range(100):   # bytecodes: Python runs the signal's handler in here
                    pass
            ref = weakref.ref(x, callback)  # noqa: F841
            del x
    monkeypatch.setattr(train.Run, "step", step)
    # as a terminal's Ctrl-C finds it: a shell's background job (`pytest &`) starts with SIGINT
    # ignored, where ember train rightly leaves Ctrl-C alone and this test's signal is dropped
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["train", "--steps", "6", "--out", str(tmp_path / "r"), *TINY]) == 130
    finally:
        signal.signal(signal.SIGINT, old)
    assert [s for s, _ in history(tmp_path / "r")["train"]] == [1, 2]   # it stopped after that step, and saved it
    assert "interrupted after step 2" in capsys.readouterr().err


def test_steps_zero_reports_no_file_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--steps", "0", "--out", str(tmp_path / "z"), *TINY]) == 0
    summary = json.loads((tmp_path / "z" / "summary.json").read_text())
    assert all(Path(f).exists() for f in summary["files"]) and summary["files"] == []


def test_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if "cuda" in runners.available():
        pytest.skip("a GPU is present")
    assert main(["train", "--device", "cuda", "--steps", "1"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda" in err


def test_train_with_autocast_and_clipping(tmp_path: Path) -> None:
    assert main(["train", "--steps", "3", "--out", str(tmp_path / "m"), "--autocast", "bf16", "--clip", "1.0",
                 *TINY]) == 0
    losses = [loss for _, loss in history(tmp_path / "m")["train"]]
    assert len(losses) == 3 and all(4.0 < x < 6.0 for x in losses)


def test_dry_run_compiles_one_step_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dry-run", "--out", str(tmp_path / "d"), *TINY]) == 0
    out = capsys.readouterr().out
    assert "kernels" in out and "schedule" in out and "codegen" in out and " s\n" in out
    assert not (tmp_path / "d").exists()


def test_dry_run_generates_cuda_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cuda.bindings")
    args = [*TINY]
    args[args.index("--device") + 1] = "cuda"
    assert main(["train", "--dry-run", "--autocast", "bf16", *args]) == 0
    assert "nvrtc" in capsys.readouterr().out


def test_learning_rate_schedule() -> None:
    from ember.train import learning_rate
    rates = [learning_rate(s, 10, 1.0, 3) for s in range(10)]
    assert rates[:3] == pytest.approx([1 / 3, 2 / 3, 1.0]) and rates[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(rates[2:], rates[3:]))  # decays after the warmup


def test_gradient_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    """--accum 2 with batch 2 takes the same steps as batch 4: the same sequences (one stream of
    batch draws), the mean loss over them, one update per step."""
    args = [*TINY]
    args[args.index("--batch") + 1] = "2"
    assert main(["train", "--steps", "2", "--out", str(tmp_path / "acc"), "--accum", "2", *args]) == 0
    assert main(["train", "--steps", "2", "--out", str(tmp_path / "big"), *TINY]) == 0
    a = [loss for _, loss in history(tmp_path / "acc")["train"]]
    b = [loss for _, loss in history(tmp_path / "big")["train"]]
    assert a == pytest.approx(b, rel=1e-4)


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_bpe_models_train_resume_and_sample(model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--model gpt2 and llama (small here) with a byte-level BPE trained on the data by the
    tokenizers library: the tokenizer lands beside the checkpoint, the run resumes exactly,
    and ember sample decodes tokens back to text."""
    pytest.importorskip("tokenizers")
    args = ["--model", model, *TINY, "--max-bytes", "60000", "--eval-every", "2"]
    assert main(["train", "--steps", "4", "--out", str(tmp_path / "a"), *args]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert str(tmp_path / "a" / "tokenizer.json") in summary["files"]
    assert main(["train", "--steps", "2", "--out", str(tmp_path / "b"), *args]) == 0
    assert main(["train", "--steps", "4", "--out", str(tmp_path / "b"), *args]) == 0
    assert history(tmp_path / "a") == history(tmp_path / "b")
    config = json.loads(nn.load_safetensors(tmp_path / "a" / "ckpt.safetensors")[1]["ember"])["config"]
    assert config["vocab"] == 50304 and config["arch"] == ("llama" if model == "llama" else "gpt")
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(tmp_path / "a" / "ckpt.safetensors"), "--tokens", "5", "--prompt", "def "]) == 0
    assert capsys.readouterr().out.startswith("def ")


def test_rope_depends_only_on_relative_position() -> None:
    """q at position m and k at n, turned by RoPE, have the dot product of q at m + s and k at
    n + s: attention sees how far apart tokens are, not where they are."""
    import numpy as np

    import ember.tensor as et
    from ember.models.gpt import GPTConfig, Llama, rope
    m = Llama(GPTConfig(vocab=8, block=32, dim=16, n_layer=0, n_head=2, arch="llama"))
    rng = np.random.default_rng(0)
    q, k = (et.Tensor(rng.standard_normal((1, 8)).astype(np.float32)) for _ in range(2))

    def score(i: int, j: int) -> float:
        return float((rope(q, m.cos[i:i + 1], m.sin[i:i + 1]) * rope(k, m.cos[j:j + 1], m.sin[j:j + 1])).sum().item())
    assert abs(score(3, 1) - score(20, 18)) < 1e-4 and abs(score(3, 1) - score(3, 2)) > 1e-3


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_kv_cache_decoding_matches_the_full_forward(arch: str) -> None:
    """One token at a time through the KV cache (ember sample's way) gives the logits of the
    whole sequence's forward pass, position by position, from one compiled program."""
    import numpy as np

    import ember.tensor as et
    from ember.models.gpt import GPTConfig, build, kv_caches
    et.manual_seed(0)
    model = build(GPTConfig(vocab=40, block=12, dim=16, n_layer=2, n_head=2, arch=arch))
    model.eval()
    ids = np.random.default_rng(0).integers(0, 40, (2, 7))
    full = model(et.Tensor(ids)).numpy()
    from ember.backend import c
    caches = kv_caches(model, 2)
    steps = []
    for i in range(7):
        caches[0].pos.assign(et.Tensor(np.array([i], np.int64)))
        steps.append(model.decode(et.Tensor(ids[:, i:i + 1]), caches).numpy())
        if i == 0:
            programs = len(c.program.programs)
    np.testing.assert_allclose(np.stack(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert len(c.program.programs) == programs  # positions 1-6 compiled nothing new


def test_tied_embedding_is_one_parameter() -> None:
    """GPT-2's head shares the token embedding: one tensor, listed once (as PyTorch's
    parameters()), so the optimizer updates it once with the sum of both gradients: 124M."""
    from ember.models.gpt import GPTConfig, build
    model = build(GPTConfig(vocab=50304, block=1024, dim=768, n_layer=12, n_head=12, tied=True))
    assert model.head.weight is model.tok.weight
    assert sum(p.numel() for p in model.parameters()) == 124_475_904
