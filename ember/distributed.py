"""Data-parallel training over several GPUs, through NCCL.

One process per GPU. Each process holds the whole model, computes the gradients of its share
of the batch, and NCCL averages them over the processes (ranks) before the optimizer's update,
so every rank takes the same step as one GPU would on the whole batch.

    ember train --gpus 2 ...                       # one process per GPU of this host
    ember.distributed.spawn(fn, 2, *args)          # the same from Python: fn(*args) on each rank
    RANK=.. WORLD_SIZE=.. LOCAL_RANK=.. MASTER_ADDR=.. MASTER_PORT=.. python3 train.py
                                                   # a cluster launcher (torchrun's variables)

In a rank: `distributed.init()`, then `model = distributed.DataParallel(model)`: the model's
parameters are broadcast from rank 0, and every `loss.backward()` computes the gradients at
once, in one program whose kernels hand each bucket of gradients (about BUCKET_BYTES) to NCCL's
all-reduce as soon as its last gradient is written. The all-reduce runs on a stream of its own,
so the last layers' gradients travel while the first layers' are still being computed; the
step's stream waits for all buckets at the end of the program (backend/cuda.py, _averaging).
The loss is averaged too: every rank reports the whole batch's loss.

NCCL is reached through ctypes on the library itself (libnccl.so.2, from the nvidia-nccl-cu13
wheel or the system): its C API is the few calls below, and every framework's bindings wrap the
same calls, so a binding package would add a dependency and nothing else. The ranks find each
other with NCCL's unique id, which rank 0 sends to the others over a TCP socket at
MASTER_ADDR:MASTER_PORT.
"""
from __future__ import annotations

import ctypes
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from . import nn
from . import tensor as T
from .tensor import Tensor

BUCKET_BYTES = 25 << 20   # PyTorch DDP's default: big enough for the links' bandwidth, small enough to overlap
ID_BYTES = 128            # sizeof(ncclUniqueId)
_DTYPES = {"f16": 6, "f32": 7, "f64": 8, "bf16": 9, "i32": 2, "i64": 4, "i8": 0, "u8": 1}   # ncclDataType_t
_AVG = 4                  # ncclAvg (NCCL 2.10 and later)


class DistributedError(RuntimeError):
    """A data-parallel set-up that cannot work (no NCCL, too few GPUs, a rank that never came)."""


# ----------------------------------------------------------------------------- pure parts

@dataclass(frozen=True)
class Launch:
    """Where this process stands among the ranks: torchrun's environment variables."""
    rank: int
    world: int
    local_rank: int
    addr: str
    port: int


def from_env(env: dict[str, str] | None = None) -> Launch:
    """RANK, WORLD_SIZE, LOCAL_RANK (default RANK), MASTER_ADDR (default 127.0.0.1) and
    MASTER_PORT (default 29500); a process started alone is rank 0 of 1."""
    env = os.environ if env is None else env
    values = {}
    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", env.get("RANK", "0")),
                          ("MASTER_PORT", "29500")):
        raw = env.get(name, default)
        if not raw.isdigit():
            raise DistributedError(f"the environment variable {name}={raw!r} is not a non-negative integer")
        values[name] = int(raw)
    if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
        raise DistributedError(f"RANK={values['RANK']} is not below WORLD_SIZE={values['WORLD_SIZE']}")
    return Launch(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"], env.get("MASTER_ADDR", "127.0.0.1"),
                  values["MASTER_PORT"])


def shard(rows: int, rank: int, world: int) -> slice:
    """The rows of a global batch that this rank computes: equal contiguous shares, so the
    average of the ranks' mean gradients is the whole batch's mean gradient."""
    if rows % world:
        raise DistributedError(f"a batch of {rows} does not split over {world} GPUs; use a multiple of {world}")
    share = rows // world
    return slice(rank * share, (rank + 1) * share)


def bucket_plan(done_at: Sequence[int], nbytes: Sequence[int], cap: int) -> list[tuple[int, list[int]]]:
    """Group values into all-reduce buckets in the order their kernels finish them: (the launch
    after which the bucket starts, the values' positions). done_at[i]: the index of the launch
    that writes value i last; a bucket closes once it holds cap bytes."""
    order = sorted(range(len(done_at)), key=lambda i: done_at[i])
    plan: list[tuple[int, list[int]]] = []
    members: list[int] = []
    size = 0
    for i in order:
        members.append(i)
        size += nbytes[i]
        if size >= cap:
            plan.append((done_at[i], members))
            members, size = [], 0
    if members:
        plan.append((done_at[members[-1]], members))
    return plan


# ------------------------------------------------------------------------------ NCCL

class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * ID_BYTES)]


def _library() -> ctypes.CDLL:
    """libnccl: $EMBER_NCCL_LIB, the nvidia-nccl wheel's, or the system's."""
    import ctypes.util
    import importlib.util
    candidates = [os.environ["EMBER_NCCL_LIB"]] if os.environ.get("EMBER_NCCL_LIB") else []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(os.path.join(root, "nccl", "lib", "libnccl.so.2"))
    candidates += [n for n in (ctypes.util.find_library("nccl"), "libnccl.so.2") if n]
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, _UniqueId, ctypes.c_int]
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_void_p]
        lib.ncclBroadcast.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_void_p]
        return lib
    raise DistributedError("NCCL was not found: pip install nvidia-nccl-cu13 (or set EMBER_NCCL_LIB to libnccl.so.2)")


def _call(lib: ctypes.CDLL, name: str, *args: Any) -> None:
    result = getattr(lib, name)(*args)
    if result != 0:
        raise DistributedError(f"NCCL {name}: {lib.ncclGetErrorString(result).decode()} (ncclResult {result})")


def _exchange_id(lib: ctypes.CDLL, launch: Launch, timeout: float = 120.0) -> _UniqueId:
    """Rank 0 makes NCCL's unique id and sends it to every other rank over TCP."""
    uid = _UniqueId()
    if launch.rank == 0:
        _call(lib, "ncclGetUniqueId", ctypes.byref(uid))
        with socket.create_server(("", launch.port)) as server:
            server.settimeout(timeout)
            for _ in range(launch.world - 1):
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    raise DistributedError(f"rank 0: not every rank connected to port {launch.port} "
                                           f"within {timeout:.0f} s") from None
                with conn:   # the raw 128 bytes (uid.internal would stop at the first zero byte)
                    conn.sendall(ctypes.string_at(ctypes.addressof(uid), ID_BYTES))
        return uid
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((launch.addr, launch.port), timeout=5) as conn:
                raw = b""
                while len(raw) < ID_BYTES:
                    chunk = conn.recv(ID_BYTES - len(raw))
                    if not chunk:
                        break
                    raw += chunk
            if len(raw) == ID_BYTES:
                ctypes.memmove(ctypes.addressof(uid), raw, ID_BYTES)
                return uid
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise DistributedError(f"rank {launch.rank}: no rank 0 at {launch.addr}:{launch.port} "
                                   f"within {timeout:.0f} s")
        time.sleep(0.2)


class Group:
    """The ranks' NCCL communicator, and the stream its all-reduces run on."""

    def __init__(self, launch: Launch) -> None:
        from .backend import cuda
        self.rank, self.world, self.local_rank = launch.rank, launch.world, launch.local_rank
        gpus = cuda.device_count()
        if launch.local_rank >= gpus:
            raise DistributedError(f"rank {launch.rank} wants GPU {launch.local_rank}, and this host has {gpus}")
        self.lib = _library()
        cuda.set_device(launch.local_rank)
        T.set_default_device("cuda")
        from cuda.bindings import driver as cu
        self.cu = cu
        uid = _exchange_id(self.lib, launch)
        self.comm = ctypes.c_void_p()
        _call(self.lib, "ncclCommInitRank", ctypes.byref(self.comm), launch.world, uid, launch.rank)
        self.stream = cuda._check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self.forked, self.joined = cuda._check(cu.cuEventCreate(flags)), cuda._check(cu.cuEventCreate(flags))

    def _collective(self, name: str, arrays: Sequence[Any], *op: int) -> None:
        _call(self.lib, "ncclGroupStart")
        for a in arrays:
            count = a.nbytes // a.dtype.itemsize
            _call(self.lib, name, ctypes.c_void_p(a.ptr), ctypes.c_void_p(a.ptr), count, _DTYPES[a.dtype.name], *op,
                  self.comm, ctypes.c_void_p(int(self.stream)))
        _call(self.lib, "ncclGroupEnd")

    def all_reduce(self, arrays: Sequence[Any], stream: Any) -> None:
        """Average the device arrays over the ranks, in place, once the work enqueued so far on
        `stream` is done; on the group's own stream (join waits for it)."""
        from .backend.cuda import _check
        _check((self.cu.cuEventRecord(self.forked, stream)[0], None))
        _check((self.cu.cuStreamWaitEvent(self.stream, self.forked, 0)[0], None))
        self._collective("ncclAllReduce", arrays, _AVG)

    def buckets(self, done_at: Sequence[int], nbytes: Sequence[int]) -> list[tuple[int, list[int]]]:
        """The all-reduces of outputs finished at these launches (backend/cuda.py's averaging)."""
        return bucket_plan(done_at, nbytes, BUCKET_BYTES)

    def join(self, stream: Any) -> None:
        """Work enqueued on `stream` from now on waits for the all-reduces started so far."""
        from .backend.cuda import _check
        _check((self.cu.cuEventRecord(self.joined, self.stream)[0], None))
        _check((self.cu.cuStreamWaitEvent(stream, self.joined, 0)[0], None))

    def broadcast(self, arrays: Sequence[Any], root: int = 0) -> None:
        """Copy rank root's arrays into every rank's, and wait for it."""
        from .backend.cuda import _check
        _check((self.cu.cuCtxSynchronize()[0], None))
        self._collective("ncclBroadcast", arrays, root)
        _check((self.cu.cuStreamSynchronize(self.stream)[0], None))


_GROUP: Group | None = None


def init(launch: Launch | None = None) -> Group | None:
    """Join the ranks (torchrun's environment variables unless `launch` is given) and run on
    this rank's GPU. A world of one needs no NCCL: None."""
    global _GROUP
    launch = launch or from_env()
    if launch.world == 1:
        return None
    if _GROUP is None:
        _GROUP = Group(launch)
        from .backend import cuda
        cuda.AVERAGING[0] = _GROUP   # the runtime averages through it, without importing this module
    return _GROUP


def group() -> Group:
    if _GROUP is None:
        raise DistributedError("distributed.init() has not been called in this process")
    return _GROUP


def rank() -> int:
    return _GROUP.rank if _GROUP else 0


def world_size() -> int:
    return _GROUP.world if _GROUP else 1


def average(t: Tensor) -> Tensor:
    """t, a tensor not yet computed (a validation loss), computed on every rank and averaged
    over them; t itself without data parallelism."""
    if _GROUP is not None:
        if t.value() is not None:
            raise DistributedError("distributed.average(t): t is computed already; pass it before .item() or "
                                   "any use that computes it")
        T.realize(t, average=[t])
    return t


class DataParallel(nn.Module):
    """`model = DataParallel(model)`: the same module, with its parameters copied from rank 0
    and its gradients averaged over the ranks at every backward() (the module's text)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        params = module.parameters()
        if _GROUP is not None:
            T.realize(*params)
            arrays = []
            for p in params:   # host data (a fresh initialization) goes to the GPU first
                value = p.value()
                if isinstance(value, np.ndarray):
                    from .backend.cuda import DeviceArray
                    value = T._DATA[p.node] = DeviceArray.upload(value, p.dtype)
                arrays.append(value)
            _GROUP.broadcast(arrays)
            T.context.averaged.update(p.node for p in params)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:   # the module's own methods: loss, decode, ...
        if name == "module":
            raise AttributeError(name)
        return getattr(self.module, name)


# ------------------------------------------------------------------------------ launching

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(fn: Callable, rank: int, world: int, port: int, args: tuple, results: Any) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    try:
        if world > 1:
            init()
        results.put((rank, "ok", fn(*args)))
    except BaseException as e:   # the parent reports it; a traceback from each rank would bury it
        results.put((rank, "error", f"{type(e).__name__}: {e}"))
        raise SystemExit(1)


def spawn(fn: Callable, nprocs: int, *args: Any) -> list[Any]:
    """Run fn(*args) in nprocs processes, one per GPU of this host, each a rank of the group
    (init already called); returns each rank's result. fn must be importable (a module's
    function), as multiprocessing's spawn needs."""
    import multiprocessing as mp
    import queue

    from .backend import cuda
    gpus = cuda.device_count()
    if nprocs < 1 or nprocs > gpus:
        raise DistributedError(f"{nprocs} processes, one per GPU, and this host has {gpus} GPU"
                               f"{'' if gpus == 1 else 's'}")
    ctx = mp.get_context("spawn")   # a fresh interpreter each: CUDA contexts do not survive fork
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, nprocs, port, args, results)) for r in range(nprocs)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    failed: list[str] = []
    try:
        while len(out) + len(failed) < nprocs:
            try:
                rank_, status, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                if dead:
                    failed += [f"rank {r} exited with status {procs[r].exitcode}" for r in dead]
                    break
                continue
            if status == "ok":
                out[rank_] = value
            else:
                failed.append(f"rank {rank_}: {value}")
                break   # the others may wait for it forever inside NCCL
    except KeyboardInterrupt:   # Ctrl-C reached every rank too: give rank 0 time to save its checkpoint
        for p in procs:
            p.join(timeout=60)
        failed.append("interrupted")
        raise
    finally:
        if failed:
            for p in procs:
                p.terminate()
        for p in procs:
            p.join()
    if failed:
        raise DistributedError("; ".join(failed))
    return [out[r] for r in range(nprocs)]
