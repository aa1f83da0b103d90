"""Data-parallel training (ember/distributed.py): the parts that need no GPU (the launch
variables, the batch's shards, the bucket plan, the errors), and, with two GPUs and NCCL, two
ranks against one GPU on the same global batch."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import ember
from ember import distributed, optim
from ember import tensor as T
from ember.backend import cuda
from ember.distributed import DistributedError, Launch, bucket_plan, from_env, shard
from ember.models.gpt import GPT, GPTConfig


def test_launch_variables() -> None:
    assert from_env({}) == Launch(0, 1, 0, "127.0.0.1", 29500)
    env = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "1234"}
    assert from_env(env) == Launch(3, 4, 3, "10.0.0.2", 1234)   # LOCAL_RANK defaults to RANK
    assert from_env({**env, "LOCAL_RANK": "1"}).local_rank == 1
    with pytest.raises(DistributedError, match="RANK=4 is not below WORLD_SIZE=4"):
        from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(DistributedError, match="WORLD_SIZE='two'"):
        from_env({"WORLD_SIZE": "two"})


def test_shards_cover_the_batch_once() -> None:
    rows = list(range(12))
    parts = [rows[shard(12, r, 3)] for r in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert shard(5, 0, 1) == slice(0, 5)
    with pytest.raises(DistributedError, match="a batch of 10 does not split over 4 GPUs"):
        shard(10, 0, 4)


def test_buckets_follow_the_order_gradients_finish() -> None:
    # values finished by launches 9, 2, 5, 2, 7, of 10, 30, 10, 5 and 40 bytes; buckets of 20
    plan = bucket_plan([9, 2, 5, 2, 7], [10, 30, 10, 5, 40], 20)
    assert plan == [(2, [1]), (7, [3, 2, 4]), (9, [0])]
    assert bucket_plan([4, 4, 4], [1, 1, 1], 1 << 20) == [(4, [0, 1, 2])]   # one bucket after the last
    assert bucket_plan([], [], 10) == []
    assert sorted(i for _, m in bucket_plan([3, 1, -1, 2], [8] * 4, 16) for i in m) == [0, 1, 2, 3]


def test_missing_nccl_is_one_clear_error(monkeypatch) -> None:
    def no_library(*_a, **_k):
        raise OSError("not here")
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    with pytest.raises(DistributedError, match="NCCL was not found: pip install nvidia-nccl-cu13"):
        distributed._library()


def test_a_world_of_one_changes_nothing() -> None:
    assert distributed.init(Launch(0, 1, 0, "127.0.0.1", 29500)) is None
    model = GPT(GPTConfig(vocab=16, block=8, dim=16, n_layer=1, n_head=1))
    before = set(T.context.averaged)
    wrapped = distributed.DataParallel(model)
    assert T.context.averaged == before and wrapped.loss == model.loss and distributed.world_size() == 1
    loss = model.loss(T.Tensor(np.zeros((2, 8), np.int32)), T.Tensor(np.zeros((2, 8), np.int32)))
    assert distributed.average(loss) is loss


def _whoami(x: int) -> tuple:
    return os.environ["RANK"], os.environ["WORLD_SIZE"], x


def _fails() -> None:
    raise ValueError("a wrong shape")


def test_spawn_returns_each_ranks_result_and_reports_a_failure(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "device_count", lambda: 1)   # one rank: no NCCL, no GPU touched
    assert distributed.spawn(_whoami, 1, 5) == [("0", "1", 5)]
    with pytest.raises(DistributedError, match="rank 0: ValueError: a wrong shape"):
        distributed.spawn(_fails, 1)


@pytest.mark.skipif(cuda.device_count() >= 2, reason="this host has the GPUs: the launch would start")
def test_too_few_gpus_is_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "ember", "train", "--gpus", "2", "--steps", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    assert r.stderr.strip().splitlines() == [f"ember train: 2 processes, one per GPU, and this host has "
                                             f"{cuda.device_count()} GPU{'' if cuda.device_count() == 1 else 's'}"]


@pytest.mark.parametrize("args, message", [(["--gpus", "0"], "ember train: error: argument --gpus: expected a whole "
                                            "number >= 1, got '0' (--help lists the options)"),
                                           (["--gpus", "2", "--device", "cpu"], "ember train: --gpus runs one process "
                                            "per GPU; it does not go with --device cpu")])
def test_gpus_that_cannot_be_are_one_line(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "ember", "train", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == message


def _train(world: int, steps: int, global_batch: int, accum: int = 1) -> tuple[list[float], list[np.ndarray]]:
    """A rank's run: a small GPT, this rank's share of each global batch (in accum micro-batches),
    AdamW through ember.jit."""
    T.set_default_device("cuda")
    T.manual_seed(0)
    model = GPT(GPTConfig(vocab=64, block=32, dim=64, n_layer=2, n_head=2))
    if world > 1:
        distributed.DataParallel(model)
    opt = optim.AdamW(model.parameters(), lr=3e-3)

    def step(x: T.Tensor, y: T.Tensor) -> T.Tensor:
        opt.zero_grad()
        rows, total = x.shape[0] // accum, None
        for i in range(accum):   # each backward() of a DataParallel model averages what it adds
            loss = model.loss(x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]) * (1.0 / accum)
            loss.backward()
            loss = loss.detach() if world > 1 else loss
            total = loss if total is None else total + loss
        T.context.pending_loss = total   # computed in the update's program, from the weights before it
        opt.step()
        return total
    run = ember.jit(step)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        tokens = rng.integers(0, 64, (global_batch, 33)).astype(np.int32)
        mine = tokens[shard(global_batch, distributed.rank(), world)]
        losses.append(run(T.Tensor(mine[:, :-1]), T.Tensor(mine[:, 1:])).item())
    return losses, [p.numpy() for p in model.parameters()]


def _nccl_present() -> bool:
    try:
        distributed._library()
        return True
    except DistributedError:
        return False


@pytest.mark.skipif(cuda.device_count() < 2 or not _nccl_present(), reason="needs 2 GPUs and NCCL")
@pytest.mark.parametrize("accum", [1, 2])
def test_two_gpus_take_the_same_steps_as_one(accum: int) -> None:
    (one,) = distributed.spawn(_train, 1, 1, 6, 8, accum)
    two = distributed.spawn(_train, 2, 2, 6, 8, accum)
    for losses, params in two:   # both ranks report the whole batch's loss and hold the same weights
        np.testing.assert_allclose(losses, one[0], rtol=2e-5)
        for a, b in zip(params, one[1]):   # Adam divides by sqrt(v): where a gradient is near zero, the
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)   # sums' order moves a step by some of lr


def test_the_nccl_id_reaches_every_rank_whole() -> None:
    """Rank 0 sends NCCL's 128-byte id over TCP; zero bytes inside it must travel too."""
    import threading
    raw = bytes([7, 0, 0, 9]) + bytes(60) + bytes(range(64))

    class Library:   # stands in for libnccl: only the id is made
        def ncclGetUniqueId(self, where) -> int:
            ctypes.memmove(where, raw, len(raw))
            return 0
    port = distributed._free_port()
    ids = {}

    def rank(r: int) -> None:
        ids[r] = distributed._exchange_id(Library(), Launch(r, 3, r, "127.0.0.1", port), timeout=20)
    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 2, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [ctypes.string_at(ctypes.addressof(ids[r]), 128) for r in range(3)] == [raw] * 3
