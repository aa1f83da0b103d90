"""The CUDA backend: the lowered kernels rendered for the GPU (cuda_render.py says how: thread
per output, or block per row), compiled with NVRTC and launched with the driver API (both through
cuda-python), all on one stream. Source generation needs no GPU (CI compiles every kernel with
nvcc); running needs cuda-python. This module is the backend's face (prepare, source) and its
runtime: NVRTC, the device's target, the memory pool, DeviceArray, graphs, the profiler, and the
data-parallel all-reduces, which distributed.py plugs in (set_averaging) so that this layer
never imports the frontend.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import math
import operator
import os
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .. import data, debug, target
from ..cache import cache_dir, cache_read, cache_write
from ..compiler import pipeline, schedule
from ..compiler.contraction import GpuPlan
from ..compiler.lower import Kernel
from ..compiler.schedule import Schedule
from ..dtype import DType
from ..ir import Node
from ..target import Target
from . import cached, cuda_render, flash, mma, search
from . import run_values as shared_run_values
from .cuda_render import BLOCK, PRELUDE, CUDARenderer, _source, check_grids, launch_config, render, render_units

__all__ = ["BLOCK", "PRELUDE", "CUDARenderer", "check_grids", "launch_config", "render", "render_units"]
GRAPHS = os.environ.get("EMBER_CUDA_GRAPHS", "1") != "0"  # replay device runs as CUDA graphs
LAST_REPLAY = [0.0]   # time.perf_counter() of the latest graph replay's launch (bench/train_gpu.py)
# the data-parallel group that averages outputs (distributed.init sets it): buckets(done_at, nbytes)
# -> [(launch, members)], all_reduce(arrays, stream), join(stream)
AVERAGING: list[Any] = [None]


def prepare(outputs: list[Node], arch: str | None = None) -> Schedule:
    """The program's kernels, scheduled and optimized for arch (default: this GPU, as it describes
    itself, else DEFAULT_ARCH's table entry)."""
    return pipeline.compile_schedule(outputs, target.gpu(arch) if arch else device_target())


def source(outputs: list[Node], arch: str | None = None) -> str:
    """The program's CUDA source for arch (default: the GPU's, else target.DEFAULT_ARCH)."""
    return render(prepare(outputs, arch))


# The references to an input's array that run_device may write over: the leaf's (T._DATA), the
# run's values, run_device's `given` and `held`, _donations' tuple and getrefcount's argument.
# One more (a detached copy, another leaf given the same array by assign) would see the array
# change: it is not donated.
DONOR_REFS = 6


def _check(result: Any) -> Any:
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"CUDA error: {err}")
    return result[1] if len(result) == 2 else result[1:]


_ORDINAL = 0   # the GPU this process uses (distributed.init sets one per rank)


def set_device(ordinal: int) -> None:
    """Run on GPU `ordinal` of this host: before anything has run on a GPU (a process uses one)."""
    global _ORDINAL
    if _device.cache_info().currsize and ordinal != _ORDINAL:
        raise RuntimeError(f"set_device({ordinal}): this process already runs on GPU {_ORDINAL}")
    _ORDINAL = ordinal


def device_count() -> int:
    """The GPUs cuda-python sees (0 without it or without a driver)."""
    try:
        from cuda.bindings import driver as cu
        _check((cu.cuInit(0)[0], None))
        return int(_check(cu.cuDeviceGetCount()))
    except (ImportError, RuntimeError):
        return 0


@functools.lru_cache(maxsize=None)
def _device() -> tuple[Any, str] | None:
    """The context and target architecture of this process's GPU (set_device; GPU 0 unless
    set), or None without cuda-python or a GPU."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return None
    try:
        _check((cu.cuInit(0)[0], None))
        if _check(cu.cuDeviceGetCount()) <= _ORDINAL:
            return None
        dev = _check(cu.cuDeviceGet(_ORDINAL))
        major = _check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        minor = _check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        ctx = _check(cu.cuDevicePrimaryCtxRetain(dev))
        _check((cu.cuCtxSetCurrent(ctx)[0], None))
        return ctx, f"sm_{major}{minor}" + ("a" if major == 9 else "")  # sm_90a: wgmma
    except RuntimeError:
        return None




@functools.lru_cache(maxsize=None)
def device_target() -> Target:
    """This process's GPU as its attributes describe it, over the table's entry for its
    architecture (the rates stay the table's); the table's DEFAULT_ARCH without a GPU."""
    dev = None if os.environ.get("EMBER_NO_CUDA") else _device()
    if dev is None:
        return target.gpu(target.DEFAULT_ARCH)
    from cuda.bindings import driver as cu
    device = _check(cu.cuDeviceGet(_ORDINAL))
    name = bytes(_check(cu.cuDeviceGetName(64, device))).split(b"\0")[0].decode()
    attr = cu.CUdevice_attribute

    def get(what: str) -> int:
        return int(_check(cu.cuDeviceGetAttribute(getattr(attr, f"CU_DEVICE_ATTRIBUTE_{what}"), device)))
    # an architecture the table lacks: sm_86's rates, and mma.sync only on 8.x (newer ones untried)
    base = target.GPUS.get(dev[1]) or dataclasses.replace(
        target.gpu("sm_86"), tensor_cores=("mma.sync",) if dev[1][3] == "8" and len(dev[1]) == 5 else ())
    return dataclasses.replace(
        base, arch=dev[1], name=name, sms=get("MULTIPROCESSOR_COUNT"), regs_sm=get("MAX_REGISTERS_PER_MULTIPROCESSOR"),
        smem_block=get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"), smem_sm=get("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        threads_sm=get("MAX_THREADS_PER_MULTIPROCESSOR"), l2=get("L2_CACHE_SIZE"))


def _allow_smem(fn: Any, smem: int) -> None:
    """Dynamic shared memory is opt-in per function above 48 KB less the function's static
    shared memory (a row chain's 48 KB of rows beside its block reduction's 256 bytes): asked
    for whenever there is any."""
    if smem > 0:
        from cuda.bindings import driver as cu
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check((cu.cuFuncSetAttribute(fn, attr, smem)[0], None))


def _launch_args(k: Kernel, ptr: dict[int, int]) -> tuple[list, np.ndarray]:
    """cuLaunchKernel's parameters for k: one array per buffer pointer, then a TMA kernel's
    tensor maps (all kept alive by the caller), and the array of their addresses."""
    args: list = [np.array([ptr[b.id]], dtype=np.uint64) for b in k.args]
    addrs = [a.ctypes.data for a in args]
    maps = mma.tensor_maps(k, ptr) if isinstance(k.plan, GpuPlan) and k.plan.tma else \
        flash.tensor_maps(k, ptr) if k.fused is not None and flash.ws_heads(k) is not None else []
    args += maps
    addrs += [m.getPtr() for m in maps]
    return args, np.array(addrs, dtype=np.uint64)


def time_kernel(k: Kernel, gpu: Target) -> float:
    """Seconds one launch of kernel k alone takes on zeroed buffers (for the plan search)."""
    from cuda.bindings import driver as cu
    module = _check(cu.cuModuleLoadData(compile_cubin(_source([k], gpu), gpu.arch)))
    fn = _check(cu.cuModuleGetFunction(module, k.name.encode()))
    (gx, gy, gz), block, smem = launch_config(k, gpu)
    _allow_smem(fn, smem)
    bufs = {b.id: b for b in k.args}
    ptr = {i: int(_check(cu.cuMemAlloc(max(1, b.nbytes)))) for i, b in bufs.items()}
    for i, b in bufs.items():
        _check((cu.cuMemsetD8(ptr[i], 0, max(1, b.nbytes))[0], None))
    args, addrs = _launch_args(k, ptr)  # args: the memory addrs points into
    start, end = _check(cu.cuEventCreate(0)), _check(cu.cuEventCreate(0))

    def run() -> float:
        _check((cu.cuEventRecord(start, 0)[0], None))
        _check((cu.cuLaunchKernel(fn, gx, gy, gz, block, 1, 1, smem, 0, addrs.ctypes.data, 0)[0], None))
        _check((cu.cuEventRecord(end, 0)[0], None))
        _check((cu.cuEventSynchronize(end)[0], None))
        return float(_check(cu.cuEventElapsedTime(start, end)))
    try:
        return search.median_seconds(run)
    finally:
        for ev in (start, end):
            cu.cuEventDestroy(ev)
        for p in ptr.values():
            cu.cuMemFree(p)
        cu.cuModuleUnload(module)


def available() -> bool:
    if os.environ.get("EMBER_NO_CUDA"):
        return False
    return _device() is not None


def why_unavailable() -> str:
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        return "cuda-python is not installed (pip install -e '.[cuda]')"
    return "no CUDA GPU was found"


def compile_cubin(src: str, arch: str, ptxas_o0: bool = False) -> bytes:
    """NVRTC, cached on disk by the hash of source and target. ptxas_o0: unoptimized, for the
    fuzzer asking whether a wrong answer is the toolchain's (never used to run programs)."""
    from cuda.bindings import nvrtc
    version = _check(nvrtc.nvrtcVersion())
    key = hashlib.sha256(f"{arch}\0{version}\0{ptxas_o0}\0{src}".encode()).hexdigest()[:32]
    path = cache_dir("cuda") / f"{key}.cubin"
    cached_cubin = cache_read(path)
    if cached_cubin is not None:
        return cached_cubin
    prog = _check(nvrtc.nvrtcCreateProgram(src.encode(), b"ember.cu", 0, [], []))
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--std=c++17"]
    if ptxas_o0:  # -G: NVVM unoptimized too (a miscompile may be in either), and ptxas at -O0
        opts += [b"-G", b"--ptxas-options=-O0"]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC failed on generated code:\n{log.decode(errors='replace')[:4000]}")
    size = _check(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    _check((nvrtc.nvrtcGetCUBIN(prog, cubin)[0], None))
    cache_write(path, cubin)
    return cubin


def _busy(method: Callable) -> Callable:
    """Marks the program busy for the call: _release_idle leaves its memory alone meanwhile."""
    @functools.wraps(method)
    def wrapper(self: "CUDAProgram", *args: Any, **kwargs: Any) -> Any:
        with _MEM_LOCK:
            _BUSY[id(self)] = _BUSY.get(id(self), 0) + 1
        try:
            return method(self, *args, **kwargs)
        finally:
            with _MEM_LOCK:
                _BUSY[id(self)] -= 1
                if not _BUSY[id(self)]:
                    del _BUSY[id(self)]
    return wrapper


class CUDAProgram:
    def __init__(self, outputs: list[Node], ptxas_o0: bool = False, plan_arch: str | None = None):
        """plan_arch: plan the kernels for another architecture than the GPU's (an sm_80 plan runs
        on sm_90a too: tests run both tensor-core paths on one GPU)."""
        from cuda.bindings import driver as cu
        self.cu = cu
        dev = _device()
        assert dev is not None
        t0 = time.perf_counter()
        self.sched = prepare(outputs, plan_arch)
        if plan_arch is None:  # a search when EMBER_SEARCH=1 (stored plans: the compiler's)
            search.choose(self.sched.kernels, device_target(), lambda k: time_kernel(k, device_target()))
        gpu = self.sched.target
        assert gpu is not None
        units = render_units(self.sched.kernels, gpu)
        self.source = cuda_render.units_source(units)
        t1 = time.perf_counter()
        # NVRTC releases the GIL: units compile in parallel (a GPT step's 250 kernels, 12 s as one
        # unit, 7 s as four on two cores)
        with ThreadPoolExecutor(len(units)) as pool:
            cubins = list(pool.map(lambda u: compile_cubin(u[0], dev[1], ptxas_o0), units))
        self.modules = [_check(cu.cuModuleLoadData(c)) for c in cubins]
        function = {name: _check(cu.cuModuleGetFunction(m, f.encode()))
                    for m, (_, runs) in zip(self.modules, units) for name, f in runs.items()}
        self.functions = [function[k.name] for k in self.sched.kernels]
        self.configs = [launch_config(k, gpu) for k in self.sched.kernels]
        check_grids(self.sched.kernels, self.configs)
        self.start_runs()
        for fn, (_, _, smem) in zip(self.functions, self.configs):
            _allow_smem(fn, smem)
        self.compile_seconds = (t1 - t0, time.perf_counter() - t1)
        debug.log(1, f"ember cuda: {len(self.sched.kernels)} kernels, codegen {self.compile_seconds[0] * 1e3:.1f} ms, "
                     f"nvrtc+load {self.compile_seconds[1] * 1e3:.1f} ms")
        debug.log(2, self.source)
        if PROFILE.enabled and os.environ.get("EMBER_PROFILE_OUT"):   # the profiled kernels' source beside it
            with open(os.environ["EMBER_PROFILE_OUT"] + ".cu", "a") as f:
                f.write(self.source)

    def start_runs(self) -> None:
        """The state its runs keep, empty: what a compiled program starts with (bench/host_step.py
        and tests/compiler/test_cuda_runtime.py give it to a program they build without a GPU)."""
        self._temp_ptr: dict[int, int] | None = None  # the temporaries' addresses (_temps)
        self._arena = 0   # the block they lie in
        self._io: tuple[dict[int, int], list] | None = None   # bind's buffers and launches
        self._graphs: collections.OrderedDict = collections.OrderedDict()  # buffers -> captured run
        self._seen: dict[tuple, int] = {}   # runs per set of buffers (graphs are captured on the second)
        self._blocks: dict[int, list[int]] = {}   # output buffer id -> device blocks it held lately
        self._staged: dict[int, DeviceArray] = {}  # input buffer id -> where host values are uploaded
        self._io_meta: tuple[list, list] | None = None   # run_device's view of the inputs and outputs
        self._donatable: dict[tuple, _Donations] = {}   # run_device's donate -> the pairs allowed
        self._last_donate: tuple = ((), None)   # the last donate given, and its entry

    def _temps(self) -> dict[int, int]:
        """Device memory for the program's temporaries, one block allocated at its first run and
        kept: later runs allocate nothing (each temporary at its offset in it, as
        schedule.plan_memory decided)."""
        if self._temp_ptr is None:
            sched = self.sched
            self._arena = _alloc(schedule.arena_bytes(sched))
            self._temp_ptr = {b.id: self._arena + sched.slots[b.id] for b in sched.temps}
        return self._temp_ptr

    def _launch_list(self, ptr: dict[int, int]) -> list:
        """(kernel, function, grid, block, shared bytes, argument arrays, their addresses) per
        kernel, for buffers at ptr."""
        return [(k, fn, grid, block, smem, *_launch_args(k, ptr))
                for k, fn, (grid, block, smem) in zip(self.sched.kernels, self.functions, self.configs)]

    def bind(self, inputs: dict[Node, np.ndarray]) -> tuple[Callable[[], None], Callable[[], list[np.ndarray]]]:
        """Copy inputs to the device; returns (launch all kernels, copy the outputs back). The
        host path's inputs and outputs get buffers of their own, kept for the next bind."""
        cu, sched = self.cu, self.sched
        if self._io is None:
            io = dict(self._temps())
            for buf in [*sched.inputs.values(), *sched.outputs]:
                if buf.id not in io:
                    io[buf.id] = _alloc(buf.nbytes)
            self._io = (io, self._launch_list(io))
        ptr, launches = self._io
        for node, buf in sched.inputs.items():
            arr = np.ascontiguousarray(inputs[node], dtype=np.dtype(buf.dtype.np_name))
            _check((cu.cuMemcpyHtoD(ptr[buf.id], arr.ctypes.data, arr.nbytes)[0], None))

        def fetch() -> list[np.ndarray]:
            _check((cu.cuCtxSynchronize()[0], None))
            outs = []
            for buf in sched.outputs:
                arr = np.empty(buf.size, dtype=np.dtype(buf.dtype.np_name))
                _check((cu.cuMemcpyDtoH(arr.ctypes.data, ptr[buf.id], arr.nbytes)[0], None))
                outs.append(arr.reshape(buf.node.shape))
            return outs
        return lambda: self._issue(launches, 0), fetch

    def _issue(self, launches: list, stream: Any, after: dict[int, list[Callable]] | None = None) -> None:
        """Launch every kernel on the stream; after[i]: what to start once launch i is enqueued
        (gradients' all-reduces, distributed.py). EMBER_PROFILE=1: timed one by one with events."""
        cu = self.cu
        profile = PROFILE.enabled and stream == 0
        for i, (k, fn, (gx, gy, gz), block, smem, args, addrs) in enumerate(launches):
            if profile:
                start, end = PROFILE.events()
                _check((cu.cuEventRecord(start, 0)[0], None))
            if k.atomic:  # a scatter adds into its output
                _check((cu.cuMemsetD8Async(int(args[0][0]), 0, k.out.nbytes, stream)[0], None))
            _check((cu.cuLaunchKernel(fn, gx, gy, gz, block, 1, 1, smem, stream, addrs.ctypes.data, 0)[0], None))
            if profile:
                _check((cu.cuEventRecord(end, 0)[0], None))
                PROFILE.pending.append((k, gx * gy * gz, start, end))
            for hook in (after or {}).get(i, ()):
                hook(stream)
        if debug.level() >= 1 or profile:
            _check((cu.cuCtxSynchronize()[0], None))
            PROFILE.collect()

    @_busy
    def timed(self, inputs: dict[Node, np.ndarray], runs: int) -> tuple[list[np.ndarray], list[float]]:
        """The outputs of one run, then the milliseconds of each of `runs` more, from CUDA events
        recorded on the stream around each run (inputs already on the device)."""
        cu = self.cu
        run, fetch = self.bind(inputs)
        run()
        outputs = fetch()
        events = [(_check(cu.cuEventCreate(0)), _check(cu.cuEventCreate(0))) for _ in range(runs)]
        for start, end in events:
            _check((cu.cuEventRecord(start, 0)[0], None))
            run()
            _check((cu.cuEventRecord(end, 0)[0], None))
        _check((cu.cuCtxSynchronize()[0], None))
        times = [float(_check(cu.cuEventElapsedTime(start, end))) for start, end in events]
        for pair in events:
            for ev in pair:
                cu.cuEventDestroy(ev)
        return outputs, times

    def free(self) -> None:
        """Give the program's device memory back (it is allocated again at the next run)."""
        for exe in self._graphs.values():
            self.cu.cuGraphExecDestroy(exe)
        self._graphs.clear()
        if self._arena:
            _free(self._arena, schedule.arena_bytes(self.sched))
        temps = {b.id for b in self.sched.temps}
        for buf in {b.id: b for b in [*self.sched.inputs.values(), *self.sched.outputs]}.values() if self._io else ():
            if buf.id not in temps:
                _free(self._io[0][buf.id], buf.nbytes)
        self._temp_ptr, self._io, self._arena = None, None, 0

    @_busy
    def __call__(self, inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
        run, fetch = self.bind(inputs)
        run()
        return fetch()

    @_busy
    def run_device(self, values: dict[Node, "np.ndarray | DeviceArray"], average: tuple[int, ...] = (),
                   donate: tuple[tuple[int, Node], ...] = ()) -> list[DeviceArray]:
        """One run with inputs taken where they are (host values are uploaded) and outputs left
        on the GPU: the training loop's path, where a step's new weights are the next step's
        inputs and nothing crosses PCIe but the batch and the loss. average: outputs averaged
        over the data-parallel ranks (distributed.py) as soon as their kernels are done.
        donate: (output index, input) pairs whose input value is dead after the run (an
        optimizer's update): where schedule.donatable allows, the output is written over the
        input's block and returned as the input's own array (PyTorch's in-place update: no
        block taken, no array made, one CUDA graph for every step)."""
        if self._io_meta is None:   # what run_device reads of each input and output, once
            ins = list(self.sched.inputs.items())
            self._io_meta = ([n for n, _ in ins], [b.id for _, b in ins], [b.dtype for _, b in ins],
                             [b.nbytes for _, b in ins],
                             [(b.id, b.node.shape, b.dtype, b.nbytes, self._blocks.setdefault(b.id, []))
                              for b in self.sched.outputs])
            self._checked, self._in_ptrs = [_DEAD] * len(ins), [0] * len(ins)
        in_nodes, in_bids, in_dtypes, in_nbytes, outs = self._io_meta
        # this is on a training step's critical path (the GPU idles until the launch), so the
        # per-input work runs in C where it can. An input that is the array the last run took
        # (weights donated back, the same every step) was checked then; the others are checked
        # now, and host values uploaded (the batch, the optimizer's scalars).
        given, ptrs = list(map(values.__getitem__, in_nodes)), self._in_ptrs
        self._check_inputs(given)
        held = dict(zip(in_bids, given))   # input buffer id -> its array (alive for the run)
        plan, donated = self._donations(donate, given) if donate else (None, {})
        del given
        # the outputs' blocks as bare addresses first: a replayed graph is launched before Python
        # makes their arrays, so that work (and the caller's) runs while the GPU does the step's
        out_ptr = dict(zip(in_bids, ptrs))   # an output that is an input's buffer shares it
        if plan is not None and donated is plan.every:   # (the usual case, in C)
            out_ptr.update(zip(plan.outs, map(ptrs.__getitem__, plan.places)))
            fresh = plan.fresh
        else:
            out_ptr.update({out_bid: held[in_bid].ptr for out_bid, in_bid in donated.items()})
            fresh = _fresh(outs, out_ptr)
        take = POOL.take
        for bid, _, _, nbytes, used in fresh:
            # each output takes back a block it had before if that one is free: a step's new
            # weights then alternate between two blocks, and the run's buffers recur, so its
            # CUDA graph is replayed (the pool's last-freed block makes a permutation of the
            # weights' blocks whose period can be longer than the run of a training job)
            p = out_ptr[bid] = take(nbytes, used)
            if p not in used:
                used.insert(0, p)
                del used[3:]
        key = (average, *out_ptr.values())   # the inputs' blocks, then the outputs' (dicts keep order)

        def arrays() -> list[DeviceArray]:
            made = dict(held)
            made.update({out_bid: held[in_bid] for out_bid, in_bid in donated.items()})
            for bid, shape, dtype, nbytes, _ in fresh:
                made[bid] = DeviceArray.adopt(out_ptr[bid], shape, dtype, nbytes)
            return [made[o[0]] for o in outs]
        if key in self._graphs and not PROFILE.enabled:  # the same buffers as a captured run: replay it
            self._graphs.move_to_end(key)
            _check((self.cu.cuGraphLaunch(self._graphs[key], _graph_stream())[0], None))
            LAST_REPLAY[0] = time.perf_counter()
            return arrays()
        results = arrays()
        launches = self._launch_list({**self._temps(), **out_ptr})
        after = self._averaging(average, results) if average else None
        if len(self._seen) >= 64 and key not in self._seen:  # buffers that never come back
            self._seen.clear()
        self._seen[key] = self._seen.get(key, 0) + 1
        if GRAPHS and self._seen[key] >= 2 and not PROFILE.enabled and debug.level() == 0:
            self._capture(key, launches, after)  # the second run on these buffers: they will likely recur
        else:
            self._issue(launches, 0, after)
        return results

    def _check_inputs(self, given: list) -> None:
        """Each input not the array the last run took checked (a device value of the program's
        type and size), host values uploaded into `given`; their addresses into _in_ptrs."""
        in_nodes, in_bids, in_dtypes, in_nbytes, _ = self._io_meta
        checked = self._checked
        for j in list(itertools.compress(itertools.count(), map(operator.is_not, given, map(operator.call, checked)))):
            v = given[j]
            if type(v) is not DeviceArray or v.dtype is not in_dtypes[j] or v.nbytes != in_nbytes[j]:
                v = given[j] = self._device_input(v, in_nodes[j], in_bids[j], in_dtypes[j], in_nbytes[j])
            checked[j], self._in_ptrs[j] = weakref.ref(v), v.ptr

    def _device_input(self, v: "np.ndarray | DeviceArray", node: Node, bid: int, dtype: DType,
                      nbytes: int) -> DeviceArray:
        """A host value uploaded into a block of the program's own (the same every run); a
        device value of another type or size refused."""
        if isinstance(v, DeviceArray):
            raise RuntimeError(f"a device value of {v.dtype}{list(v.shape)} given for {dtype}{list(node.shape)}")
        if bid not in self._staged:
            self._staged[bid] = DeviceArray(node.shape, dtype)
        self._staged[bid].copy_from(v)
        return self._staged[bid]

    def _donations(self, donate: tuple[tuple[int, Node], ...], given: list[DeviceArray]) \
            -> tuple["_Donations", dict[int, int]]:
        """The pairs of donate that schedule.donatable allows (decided once per donate), and of
        those, output buffer id -> input buffer id for the ones whose input array has no holder
        but this run's: one more (a detached copy, another leaf given it by assign, the program's
        upload block, a second input) would see it change."""
        # donate is the same tuple each replay of a step: known by identity, not hashed (447 pairs)
        plan = self._last_donate[1] if self._last_donate[0] is donate else self._donatable.get(donate)
        if plan is None:
            sched, outs = self.sched, self.sched.outputs
            place = {n: j for j, n in enumerate(sched.inputs)}
            known = [(i, n) for i, n in donate if n in sched.inputs]
            ok = schedule.donatable(sched, [(outs[i], sched.inputs[n]) for i, n in known])
            pairs = [(outs[i].id, sched.inputs[n].id, place[n]) for (i, n), yes in zip(known, ok) if yes]
            every = {o: i for o, i, _ in pairs}
            shared = dict.fromkeys([b.id for b in sched.inputs.values()] + list(every))   # outputs in inputs' blocks
            plan = self._donatable[donate] = _Donations(pairs, every, tuple(o for o, _, _ in pairs),
                                                        tuple(j for _, _, j in pairs), _fresh(self._io_meta[4], shared))
        self._last_donate = (donate, plan)
        if not plan.pairs:
            return plan, {}
        arrays = operator.itemgetter(*plan.places)(given) if len(plan.places) > 1 else (given[plan.places[0]],)
        refs = list(map(sys.getrefcount, arrays))
        if max(refs) <= DONOR_REFS:
            return plan, plan.every
        return plan, {o: i for (o, i, _), r in zip(plan.pairs, refs) if r <= DONOR_REFS}

    def _averaging(self, average: tuple[int, ...], results: list[DeviceArray]) -> dict[int, list[Callable]]:
        """The hooks that average the outputs `average` over the ranks: in buckets of about
        BUCKET_BYTES, each started right after the launch that finishes its last output, so the
        all-reduce of the last layers' gradients overlaps the backward pass of the first ones."""
        group = AVERAGING[0]
        if group is None:
            raise RuntimeError("distributed.init() has not been called in this process")
        # each output's writer (one each; a merged kernel writes its members')
        done_at = {m.out.id: i for i, k in enumerate(self.sched.kernels) for m in k.members or [k]}
        outs = [self.sched.outputs[i] for i in average]
        plan = group.buckets([done_at[b.id] for b in outs], [b.nbytes for b in outs])
        after: dict[int, list[Callable]] = {}
        for launch, members in plan:
            arrays = [results[average[m]] for m in members]
            after.setdefault(launch, []).append(lambda stream, arrays=arrays: group.all_reduce(arrays, stream))
        after.setdefault(len(self.sched.kernels) - 1, []).append(group.join)   # the step's stream waits for all
        return after

    def _capture(self, key: tuple, launches: list, after: dict[int, list[Callable]] | None) -> None:
        """Record the launches as a CUDA graph and run it: later runs on the same buffers replay
        it with one call instead of a Python loop over every kernel (5-9 us each, and the GPU
        waits whenever Python does). The pool hands a training step the same blocks every other
        step, so a few graphs per program cover the steady state. All-reduces (after) are
        captured too: NCCL's kernels on their stream, joined to this one by events."""
        cu = self.cu
        stream = _graph_stream()
        _check((cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)[0], None))
        try:
            self._issue(launches, stream, after)
        finally:
            graph = _check(cu.cuStreamEndCapture(stream))
        exe = _check(cu.cuGraphInstantiate(graph, 0))
        cu.cuGraphDestroy(graph)
        self._graphs[key] = exe
        if len(self._graphs) > 4:
            _, old = self._graphs.popitem(last=False)
            cu.cuGraphExecDestroy(old)
        _check((cu.cuGraphLaunch(exe, stream)[0], None))

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # the driver may already be gone at interpreter exit
            pass


@functools.lru_cache(maxsize=None)
def _graph_stream() -> Any:
    """The one stream graphs replay on, for every program: blocking, so ordered with the copies
    and launches on stream 0, and one stream, so memory the pool hands from one program to
    another is never in use on two streams at once."""
    from cuda.bindings import driver as cu
    return _check(cu.cuStreamCreate(0))


ALLOCATED = [0]   # the device bytes this process holds: the pool's blocks, free or not, and the programs' arenas


_MEM_LOCK = threading.Lock()   # held while idle memory is given back and while a run is marked busy
_BUSY: dict[int, int] = {}     # id(program) -> its calls under way (threads: `ember test -j`)


def _alloc(nbytes: int) -> int:
    """A new block of device memory (counted in ALLOCATED). If the GPU has none left, the memory
    this process holds idle is given back first (_release_idle) and the allocation tried again."""
    from cuda.bindings import driver as cu
    err, ptr = cu.cuMemAlloc(max(nbytes, 1))
    if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY and _release_idle():
        err, ptr = cu.cuMemAlloc(max(nbytes, 1))
    if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
        raise RuntimeError(f"CUDA error: out of device memory for a block of {nbytes / 2**30:.2f} GiB "
                           f"(this process holds {ALLOCATED[0] / 2**30:.2f} GiB, all in use)")
    ptr = int(_check((err, ptr)))
    ALLOCATED[0] += max(nbytes, 1)
    return ptr


def _release_idle() -> bool:
    """Give back the device memory no run uses: the pool's free blocks, and the temporaries'
    arenas of the programs not running now (each allocated again at its next run). A program
    keeps its arena between runs, and the Tensor API compiles a program per set of tensors
    realized together: a loop that reads one gradient at a time (`p.grad.numpy()` per parameter)
    compiles one whole backward each, and their arenas filled an H200 at GPT-2's size.
    Returns whether anything was given back."""
    from cuda.bindings import driver as cu
    before = ALLOCATED[0]
    with _MEM_LOCK:
        _check((cu.cuCtxSynchronize()[0], None))   # nothing queued may still use what is freed
        for size, blocks in POOL.free.items():
            for ptr in blocks:
                _free(ptr, size)
        POOL.free.clear()
        for prog in list(_programs.programs.values()):
            if id(prog) not in _BUSY:
                prog.free()
    debug.log(1, f"ember cuda: out of device memory; gave back {(before - ALLOCATED[0]) / 2**30:.2f} GiB held idle")
    return ALLOCATED[0] < before


def _free(ptr: int, nbytes: int) -> None:
    from cuda.bindings import driver as cu
    cu.cuMemFree(ptr)
    ALLOCATED[0] -= max(nbytes, 1)


class _Pool:
    """Device memory blocks by size, reused: a training step's values come and go with the same
    sizes every step, so after the first step nothing is allocated (cuMemAlloc synchronizes
    the device and costs milliseconds for large blocks)."""

    def __init__(self) -> None:
        self.free: dict[int, dict[int, None]] = {}   # size -> free blocks (an ordered set)

    def take(self, nbytes: int, prefer: Sequence[int] = ()) -> int:
        """A block of nbytes: one of `prefer` if one is free (see CUDAProgram.run_device), else
        the last freed, else a new one."""
        blocks = self.free.get(nbytes)
        if blocks:
            for p in prefer:
                if p in blocks:
                    del blocks[p]
                    return p
            return blocks.popitem()[0]
        return _alloc(nbytes)

    def give(self, ptr: int, nbytes: int) -> None:
        self.free.setdefault(nbytes, {})[ptr] = None


POOL = _Pool()


class _Donations(NamedTuple):
    """What a run_device's donate allows (schedule.donatable), worked out once: the pairs
    (output buffer id, input buffer id, the input's place), all of them as a dict, their output
    ids and input places apart, and the outputs left to take blocks of their own when every
    pair is donated."""
    pairs: list[tuple[int, int, int]]
    every: dict[int, int]
    outs: tuple[int, ...]
    places: tuple[int, ...]
    fresh: list


def _fresh(outs: list, out_ptr: dict) -> list:
    """The outputs (run_device's meta) that are neither an input's buffer nor written over one,
    each once (a buffer returned twice)."""
    return list({o[0]: o for o in outs if o[0] not in out_ptr}.values())


class _Gone:
    pass


_DEAD = weakref.ref(_Gone())   # a reference whose array is gone: the first run checks every input


class DeviceArray:
    """A value in GPU memory, in its storage type (what a realized tensor holds on "cuda").
    Copied to the host only when asked: numpy() (printing, .item(), checkpoints)."""

    __slots__ = ("ptr", "nbytes", "shape", "dtype", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: DType, prefer: Sequence[int] = ()):
        self.shape, self.dtype = shape, dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        self.ptr = POOL.take(self.nbytes, prefer)

    @classmethod
    def adopt(cls, ptr: int, shape: tuple[int, ...], dtype: DType, nbytes: int) -> "DeviceArray":
        """An array around a block already taken from the pool (run_device's outputs)."""
        out = object.__new__(cls)
        out.ptr, out.shape, out.dtype, out.nbytes = ptr, shape, dtype, nbytes
        return out

    @classmethod
    def upload(cls, values: np.ndarray, dtype: DType) -> "DeviceArray":
        out = cls(tuple(np.shape(values)), dtype)
        out.copy_from(values)
        return out

    def copy_from(self, values: np.ndarray) -> None:
        """Overwrite with host values (synchronous: work already queued that reads this block
        runs first, on the legacy default stream's ordering)."""
        from cuda.bindings import driver as cu
        stored = type(values) is np.ndarray and values.dtype == self.dtype.np_name and self.dtype.name != "bf16"
        arr = values if stored and values.flags.c_contiguous else \
            np.ascontiguousarray(data.to_storage(np.asarray(values), self.dtype))
        if arr.nbytes != self.nbytes:
            raise RuntimeError(f"{arr.nbytes} bytes given for a device value of {self.nbytes}")
        _check((cu.cuMemcpyHtoD(self.ptr, arr.ctypes.data, arr.nbytes)[0], None))

    def numpy(self) -> np.ndarray:
        """The values, as the reference evaluator holds them (f16/bf16 as f32)."""
        from cuda.bindings import driver as cu
        arr = np.empty(self.shape, dtype=np.dtype(self.dtype.np_name))
        _check((cu.cuMemcpyDtoH(arr.ctypes.data, self.ptr, self.nbytes)[0], None))  # waits for the stream
        return data.from_storage(arr, self.dtype)

    def __del__(self) -> None:
        try:
            POOL.give(self.ptr, self.nbytes)
        except (AttributeError, TypeError):  # at interpreter exit the module may be gone first
            pass


def run_device(outputs: list[Node], values: dict[Node, "np.ndarray | DeviceArray"],
               average: tuple[int, ...] = (), donate: tuple[tuple[int, Node], ...] = ()) -> list[DeviceArray]:
    """Run the program on values that may already be on the GPU; the results stay there.
    average, donate: as CUDAProgram.run_device."""
    return program(outputs).run_device(values, average, donate)


class _Profile:
    """EMBER_PROFILE=1: every kernel launch timed with CUDA events; at exit, the kernels that
    took the most time in total, with their launch counts, blocks, and the bandwidth of the
    bytes their buffers hold (what a kernel reading and writing each once moves: an estimate
    that is low for tiled contractions and high for gathers). EMBER_PROFILE_OUT=FILE: every
    kernel, as tab-separated lines."""

    def __init__(self) -> None:
        self.enabled = os.environ.get("EMBER_PROFILE") == "1"
        self.pending: list = []
        self.totals: dict[str, list] = {}   # key -> [ms, launches, blocks, bytes]
        self.free_events: list = []
        if self.enabled:
            import atexit
            atexit.register(self.report)

    def events(self) -> tuple:
        from cuda.bindings import driver as cu
        while len(self.free_events) < 2:
            self.free_events.append(_check(cu.cuEventCreate(0)))
        return self.free_events.pop(), self.free_events.pop()

    def collect(self) -> None:
        from cuda.bindings import driver as cu
        for k, blocks, start, end in self.pending:
            ms = float(_check(cu.cuEventElapsedTime(start, end)))
            key = f"{k.name} {k.out.node.dtype}{list(k.out.node.shape)} {k.kind}"
            entry = self.totals.setdefault(key, [0.0, 0, blocks, schedule.kernel_bytes(k)])
            entry[0] += ms
            entry[1] += 1
            self.free_events += [start, end]
        self.pending = []

    def report(self) -> None:
        total = sum(v[0] for v in self.totals.values())
        ranked = sorted(self.totals.items(), key=lambda kv: -kv[1][0])
        print(f"ember profile: {total:.1f} ms in kernels; the most expensive:", file=sys.stderr)
        for name, (ms, n, blocks, nbytes) in ranked[:30]:
            print(f"  {name:50s} {ms:9.2f} ms {100 * ms / max(total, 1e-9):5.1f}%  {n:5d} launches  {blocks:7d} blocks"
                  f"  {nbytes * n / max(ms, 1e-9) / 1e6:7.0f} GB/s", file=sys.stderr)
        out = os.environ.get("EMBER_PROFILE_OUT")
        if out:
            with open(out, "w") as f:
                f.write("kernel\tms\tlaunches\tblocks\tbytes\n")
                f.writelines(f"{name}\t{ms:.4f}\t{n}\t{blocks}\t{nbytes}\n" for name, (ms, n, blocks, nbytes) in ranked)


PROFILE = _Profile()


_programs = cached(CUDAProgram)
_thread = threading.local()


def program(outputs: list[Node]) -> CUDAProgram:
    """The compiled program of outputs, with this process's context current in the calling
    thread: a context is current per thread, and a thread pool's runs (`ember test -j`) would
    otherwise find none (CUDA_ERROR_INVALID_CONTEXT)."""
    dev = _device()
    if dev is not None and getattr(_thread, "ctx", None) is not dev[0]:
        from cuda.bindings import driver as cu
        _check((cu.cuCtxSetCurrent(dev[0])[0], None))
        _thread.ctx = dev[0]
    return _programs(outputs)


program.programs = _programs.programs  # type: ignore[attr-defined]


def run_values(outputs: list[Node], inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    return shared_run_values(program(outputs), inputs)
