"""Values that stay on the GPU (issue 10): a realized tensor on "cuda" holds a device array,
copied to the host only for .numpy()/.item(); an optimizer step feeds its new weights to the
next step without leaving the device. Needs a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from ember import optim, runners
from ember import tensor as T
from ember.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")


@pytest.fixture
def on_cuda():
    before = T.context.device
    T.set_default_device("cuda")
    yield
    T.context.device = before


def test_results_stay_on_the_device(on_cuda) -> None:
    from ember.backend.cuda import DeviceArray
    a = T.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = (a * 2 + 1).realize()
    assert isinstance(b.value(), DeviceArray)
    c = (b.sum(1)).realize()  # a device value as an input: no copy
    assert isinstance(c.value(), DeviceArray)
    np.testing.assert_array_equal(c.numpy(), [9.0, 27.0])
    assert b[1, 2].item() == 11.0
    h = T.Tensor(np.ones(3, np.float32), dtype="bfloat16")
    np.testing.assert_array_equal((h * 3).numpy(), [3, 3, 3])


def test_training_on_the_device_matches_the_cpu() -> None:
    tokens = np.random.default_rng(0).integers(0, 256, (3, 4, 17)).astype(np.int32)
    losses = {}
    for device in ("cpu", "cuda"):
        before = T.context.device
        T.set_default_device(device)
        try:
            T.manual_seed(0)
            model = GPT(GPTConfig(block=16, dim=32, n_layer=1, n_head=2))
            opt = optim.AdamW(model.parameters(), lr=1e-2)
            out = []
            for s in range(3):
                opt.zero_grad()
                loss = model.loss(T.Tensor(tokens[s][:, :-1]), T.Tensor(tokens[s][:, 1:]))
                loss.backward()
                opt.step()
                out.append(loss.item())
            losses[device] = out
            if device == "cuda":
                from ember.backend.cuda import DeviceArray
                assert all(isinstance(p.value(), DeviceArray) for p in model.parameters())
        finally:
            T.context.device = before
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4)


def test_replayed_runs_see_new_data(on_cuda) -> None:
    """A program run again on the same buffers replays its captured CUDA graph: the values are
    the new inputs' (uploads and the replay are ordered)."""
    for i in range(6):
        x = T.Tensor(np.full((64, 33), float(i), np.float32))
        y = (x * 2 + 1).sum(0)
        np.testing.assert_array_equal(y.numpy(), np.full(33, 64 * (2 * i + 1), np.float32))


def test_ember_test_runs_cuda_files_on_a_thread_pool(capsys: pytest.CaptureFixture[str]) -> None:
    """A CUDA context is current per thread: `ember test -j 4` runs each file on a pool thread."""
    from pathlib import Path

    from ember.cli import main
    folder = Path(__file__).parents[1] / "eir" / "unary"
    assert main(["test", str(folder), "--backend", "cuda", "-j", "4"]) == 0, capsys.readouterr().out
