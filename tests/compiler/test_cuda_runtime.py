"""CUDAProgram.run_device's bookkeeping without a GPU: the driver's calls faked, blocks as
integers. A replayed run hands out its outputs' blocks before it makes their arrays (the graph is
launched first); these check that no block ends up in two live arrays and that a step fed its
own outputs replays one of a few graphs."""
from __future__ import annotations

import gc
import itertools

import pytest

from ember import dtype as dt
from ember import ir
from ember.ir import Op

cu = pytest.importorskip("cuda.bindings.driver")


@pytest.fixture
def fake_program(monkeypatch: pytest.MonkeyPatch):
    from ember.backend import cuda
    addresses = itertools.count(1 << 20, 1 << 12)
    ok = cu.CUresult.CUDA_SUCCESS
    launched: list = []
    monkeypatch.setattr(cu, "cuMemAlloc", lambda n: (ok, next(addresses)))
    monkeypatch.setattr(cu, "cuMemcpyHtoD", lambda *a: (ok, None))
    monkeypatch.setattr(cu, "cuGraphLaunch", lambda exe, stream: (launched.append(exe), (ok, None))[1])
    monkeypatch.setattr(cu, "cuStreamCreate", lambda *a: (ok, 1))
    # the replay stream is made once per process (lru_cache): a fake one kept there broke every
    # later real replay on a GPU (tests/frontend's, run after these in one pytest)
    monkeypatch.setattr(cuda, "_graph_stream", lambda: 1)
    monkeypatch.setattr(cuda, "POOL", cuda._Pool())

    def make(outputs: list) -> object:
        prog = object.__new__(cuda.CUDAProgram)
        prog.cu, prog.sched = cu, cuda.prepare(outputs, "sm_90a")
        prog.start_runs()
        prog._temp_ptr = {b.id: next(addresses) for b in prog.sched.temps}
        captures = itertools.count()
        prog._capture = lambda key, launches, after: prog._graphs.__setitem__(key, next(captures))
        prog._launch_list = lambda ptr: []
        prog._issue = lambda launches, stream, after=None: None
        prog.launched = launched
        made.append(prog)
        return prog
    made: list = []
    yield make
    # before the driver is real again (on a GPU): nothing of the fakes may reach it, the
    # programs' graphs and blocks are integers, the arrays' blocks go back to the fake pool
    for prog in made:
        prog._graphs.clear()
        prog._temp_ptr = prog._io = None
    made.clear()
    gc.collect()


def test_replayed_outputs_never_share_a_block(fake_program) -> None:
    from ember.backend.cuda import DeviceArray
    w, g = ir.param("w", dt.f32, (64,)), ir.param("g", dt.f32, (64,))
    new_w = ir.binary(Op.SUB, w, g)
    prog = fake_program([new_w, ir.binary(Op.MUL, new_w, new_w), g, new_w])   # one value returned twice
    weights, grad = DeviceArray((64,), dt.f32), DeviceArray((64,), dt.f32)
    inputs = {w: weights, g: grad}
    for step in range(8):
        results = prog.run_device(inputs)
        live = [weights, grad, *results]
        assert results[3] is results[0]                             # one buffer, one array
        assert len({a.ptr for a in live}) == len({id(a) for a in live})
        weights = results[0]                                        # the next step's weights
        inputs = {w: weights, g: grad}
        del results, live
    # the weights alternate between two blocks: two graphs, each captured on the second run with
    # its buffers (steps 3 and 4), then replayed (steps 5 to 8)
    assert len(prog._graphs) == 2 and prog.launched == [0, 1, 0, 1]


def test_a_device_value_of_the_wrong_shape_is_refused(fake_program) -> None:
    from ember.backend.cuda import DeviceArray
    x = ir.param("x", dt.f32, (8,))
    prog = fake_program([ir.binary(Op.ADD, x, x)])
    node = next(iter(prog.sched.inputs))
    with pytest.raises(RuntimeError, match="given for f32"):
        prog.run_device({node: DeviceArray((4,), dt.f32)})
    good = DeviceArray((8,), dt.f32)
    for _ in range(3):   # an input that is the last run's array is not checked again; another is
        prog.run_device({node: good})
    with pytest.raises(RuntimeError, match="given for f32"):
        prog.run_device({node: DeviceArray((4,), dt.f32)})
    with pytest.raises(RuntimeError, match="given for f32"):
        prog.run_device({node: DeviceArray((8,), dt.i32)})


def test_updates_in_place_replay_one_graph(fake_program) -> None:
    from ember.backend.cuda import DeviceArray
    w, g = ir.param("w", dt.f32, (64,)), ir.param("g", dt.f32, (64,))
    prog = fake_program([ir.binary(Op.SUB, w, g), ir.reduce(Op.SUM, g, (0,))])
    weights, grad = DeviceArray((64,), dt.f32), DeviceArray((64,), dt.f32)
    block = weights.ptr
    for step in range(6):
        results = prog.run_device({w: weights, g: grad}, donate=((0, w),))
        assert results[0] is weights and weights.ptr == block   # written over the old weights
        del results
    assert len(prog._graphs) == 1 and prog.launched == [0] * 4
    kept = weights   # a second holder (a detached copy) must keep its values: a new block
    results = prog.run_device({w: weights, g: grad}, donate=((0, w),))
    assert results[0] is not kept and results[0].ptr != block


def test_only_outputs_read_at_their_own_element_are_donated() -> None:
    from ember.backend import cuda
    from ember.compiler import schedule
    w, g = ir.param("w", dt.f32, (8, 8)), ir.param("g", dt.f32, (8, 8))
    cases = {"elementwise": (ir.binary(Op.SUB, w, g), True),
             "transposed": (ir.binary(Op.SUB, w, ir.permute(w, (1, 0))), False),
             "row sums": (ir.binary(Op.SUB, w, ir.expand(ir.reduce(Op.SUM, w, (1,)), (8, 8))), False)}
    for name, (new_w, ok) in cases.items():
        sched = cuda.prepare([new_w, ir.binary(Op.MUL, g, g)], "sm_90a")
        assert schedule.donatable(sched, [(sched.outputs[0], sched.inputs[w])]) == [ok], name
        assert schedule.donatable(sched, [(sched.outputs[1], sched.inputs[w])]) == [False], name   # another output


def test_programs_give_back_idle_arenas_when_the_gpu_is_full(fake_program, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each program keeps its temporaries' arena between runs; the Tensor API compiles one per
    set of tensors realized together. On a GPU with room for one arena, three programs run in
    turn: each allocation that fails gives back the idle ones' arenas and tries again (GPT-2's
    gradients read one by one filled an H200 before)."""
    from ember.backend import cuda
    from ember.compiler import schedule
    n = 256
    x = ir.param("x", dt.f32, (n, n))

    def mm(a: ir.Node, b: ir.Node) -> ir.Node:
        prod = ir.binary(Op.MUL, ir.expand(ir.reshape(a, (n, n, 1)), (n, n, n)), ir.expand(ir.reshape(b, (1, n, n)), (n, n, n)))
        return ir.reshape(ir.reduce(Op.SUM, prod, (1,)), (n, n))
    graphs = [[mm(mm(ir.binary(op, x, x), x), x)] for op in (Op.ADD, Op.MUL, Op.SUB)]   # x @ x: a temporary
    progs = [fake_program(g) for g in graphs]
    arena = max(schedule.arena_bytes(p.sched) for p in progs)
    assert arena > 0
    held: dict[int, int] = {}
    addresses = itertools.count(1 << 30, 1 << 20)
    ok, full = cu.CUresult.CUDA_SUCCESS, cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY

    def alloc(n: int):  # noqa: ANN202
        if sum(held.values()) + n > arena + 3 * x.numel * 4:   # one arena, the input, an output and a spare
            return full, None
        held[p := next(addresses)] = n
        return ok, p
    monkeypatch.setattr(cu, "cuMemAlloc", alloc)
    monkeypatch.setattr(cu, "cuMemFree", lambda p: (held.pop(int(p)), (ok,))[1])
    monkeypatch.setattr(cu, "cuCtxSynchronize", lambda: (ok,))
    monkeypatch.setattr(cu, "cuGraphExecDestroy", lambda exe: (ok,))
    for p in progs:
        p._temp_ptr = None   # the arena comes from the (fake) driver at the first run
    # only these programs are seen by _release_idle: a real one compiled by an earlier test would
    # have its blocks freed through the fake driver
    monkeypatch.setattr(cuda._programs, "programs", {tuple(g): p for p, g in zip(progs, graphs)})
    arrays = cuda.DeviceArray((256, 256), dt.f32)
    for p in [*progs, *progs]:
        del p.run_device({x: arrays})[0]
        assert p._arena and [q._arena for q in progs].count(0) == 2   # only the running one holds one
    # an arena that does not fit even alone: one clear error with the sizes
    monkeypatch.setattr(cu, "cuMemAlloc", lambda n: (full, None))
    progs[0].free()
    with pytest.raises(RuntimeError, match=r"out of device memory for a block of .* GiB \(this process holds"):
        progs[0].run_device({x: arrays})
    for p in progs:
        p._arena = 0   # the fixture's teardown must not free fake blocks through the real driver
