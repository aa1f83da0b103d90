"""Contractions: recognized on the kernel graph from expand-mul-sum (plain, transposed operands,
batched, broadcast batch, fused epilogues, odd sizes); on the CPU as packed panels, against the
reference evaluator; on tensor cores, their CUDA source built with nvcc for sm_86 and sm_90a
without a GPU, and their results on the GPU against the reference evaluator.

Inputs are multiples of 1/8 in [-1, 1]: every product is exact in bf16 and f16 and every sum
exact in f32, so tensor cores (exact products, f32 sums) and the reference (products rounded to
the dtype) agree to the last bit, and a wrong fragment or a wrong edge shows as a mismatch."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from ember import data, ir, ref, runners
from ember import dtype as dt
from ember.backend import cuda, run_values
from ember.compiler import contraction, optimize, pipeline
from ember.compiler.schedule import schedule
from ember.ir import Node, Op
from ember.target import cpu, gpu

from .cuda_compile import COMPILER, NVCC, compile_cuda, spills
from .randprog import compare

BF16, F16 = dt.bf16, dt.f16


def matmul(a: Node, b: Node) -> Node:
    """a[..., m, k] @ b[..., k, n] by expand-mul-sum (leading dims broadcast like numpy)."""
    *ba, m, k = a.shape
    *bb, _, n = b.shape
    lead = tuple(np.broadcast_shapes(tuple(ba), tuple(bb)))
    ae = ir.expand(ir.reshape(a, (1,) * (len(lead) - len(ba)) + tuple(ba) + (m, k, 1)), lead + (m, k, n))
    be = ir.expand(ir.reshape(b, (1,) * (len(lead) - len(bb)) + tuple(bb) + (1, k, n)), lead + (m, k, n))
    return ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, ae, be), (len(lead) + 1,)), lead + (m, n))


def t(x: Node) -> Node:
    r = len(x.shape)
    return ir.permute(x, tuple(range(r - 2)) + (r - 1, r - 2))


def case(name: str) -> tuple[list[Node], tuple[bool, bool]]:
    """A program and the (A, B) k-major flags its contraction must have."""
    p = ir.param
    if name == "bf16_aligned":
        return [matmul(p("a", BF16, (256, 128)), p("b", BF16, (128, 192)))], (True, False)
    if name == "f16_odd":  # nothing divides: edge tiles everywhere, element-wise staging
        return [matmul(p("a", F16, (77, 100)), p("b", F16, (100, 45)))], (True, False)
    if name == "bf16_edges":  # 16-byte staging, partial last K-step and row tile
        return [matmul(p("a", BF16, (200, 72)), p("b", BF16, (72, 136)))], (True, False)
    if name == "a_transposed":
        return [matmul(t(p("a", BF16, (96, 160))), p("b", BF16, (96, 64)))], (False, False)
    if name == "b_transposed":  # x @ W.T, as in a linear layer
        return [matmul(p("x", BF16, (130, 64)), t(p("w", BF16, (48, 64))))], (True, True)
    if name == "both_transposed":
        return [matmul(t(p("a", F16, (64, 144))), t(p("b", F16, (80, 64))))], (False, True)
    if name == "batched":
        return [matmul(p("a", BF16, (4, 64, 32)), p("b", BF16, (4, 32, 80)))], (True, False)
    if name == "batched_wide":  # batched, 128 rows each (the wgmma plan on Hopper)
        return [matmul(p("a", BF16, (2, 128, 64)), t(p("b", BF16, (2, 96, 64))))], (True, True)
    if name == "broadcast_batch":  # [B, T, C] @ [C, N]
        return [matmul(p("x", BF16, (3, 50, 64)), p("w", BF16, (64, 40)))], (True, False)
    if name == "epilogue":  # relu(a @ b + bias), cast to f32
        c = matmul(p("a", BF16, (128, 64)), p("b", BF16, (64, 96)))
        y = ir.binary(Op.ADD, c, ir.expand(ir.reshape(p("bias", BF16, (96,)), (1, 96)), c.shape))
        y = ir.binary(Op.MAX, y, ir.const(0.0, BF16, c.shape))
        return [ir.unary(Op.CAST, y, dt.f32)], (True, False)
    if name == "weight_grad":  # x[b, t, i] dy[b, t, j] summed over b and t: one K of 3 * 40
        x, dy = p("x", BF16, (3, 40, 72)), p("dy", BF16, (3, 40, 48))
        prod = ir.binary(Op.MUL, ir.expand(ir.reshape(x, (3, 40, 72, 1)), (3, 40, 72, 48)),
                         ir.expand(ir.reshape(dy, (3, 40, 1, 48)), (3, 40, 72, 48)))
        return [ir.reshape(ir.reduce(Op.SUM, prod, (0, 1)), (72, 48))], (False, False)
    if name == "f32":  # the CPU's packed path only (tensor cores would need TF32)
        return [matmul(p("a", dt.f32, (70, 90)), t(p("b", dt.f32, (66, 90))))], (True, True)
    if name == "f64":
        return [matmul(t(p("a", dt.f64, (90, 70))), p("b", dt.f64, (90, 66)))], (False, False)
    if name == "f32_of_bf16":  # the operands widened first: products exact either way
        a = ir.unary(Op.CAST, p("a", BF16, (64, 128)), dt.f32)
        b = ir.unary(Op.CAST, p("b", BF16, (128, 64)), dt.f32)
        return [matmul(a, b)], (True, False)
    if name == "conv_like":  # out[n, o, h, w] = sum_k x[n, h, w, k] w[o, k]: N is n, h and w merged
        x, w = p("x", BF16, (2, 6, 10, 64)), p("w", BF16, (40, 64))
        prod = ir.binary(Op.MUL, ir.expand(ir.reshape(x, (2, 1, 6, 10, 64)), (2, 40, 6, 10, 64)),
                         ir.expand(ir.reshape(w, (1, 40, 1, 1, 64)), (2, 40, 6, 10, 64)))
        return [ir.reduce(Op.SUM, prod, (4,))], (True, True)
    if name == "k_parts":  # dW[o, c] = sum over n, p of dy[n, o, p] x[n, p, c]: dy's n and p do not chain
        dy, x = p("dy", BF16, (2, 40, 64)), p("x", BF16, (2, 64, 64))
        prod = ir.binary(Op.MUL, ir.expand(ir.reshape(ir.permute(dy, (0, 2, 1)), (2, 64, 40, 1)), (2, 64, 40, 64)),
                         ir.expand(ir.reshape(x, (2, 64, 1, 64)), (2, 64, 40, 64)))
        return [ir.reduce(Op.SUM, prod, (0, 1))], (True, False)
    if name == "rows_64":  # 64 rows, many columns: one warpgroup on Hopper
        return [matmul(p("a", BF16, (64, 96)), p("b", BF16, (96, 320)))], (True, False)
    if name == "activation_rows":  # x[b, t, :] @ W + bias, as a [B, T, C] activation: M is b and t, chained
        y = matmul(p("x", BF16, (3, 96, 64)), p("w", BF16, (64, 128)))
        bias = ir.expand(ir.reshape(p("bias", dt.f32, (128,)), (1, 1, 128)), y.shape)
        return [ir.unary(Op.CAST, ir.binary(Op.ADD, ir.unary(Op.CAST, y, dt.f32), bias), BF16)], (True, False)
    if name == "activation_rows_odd":  # three chained row parts, 2 x 3 x 97 rows: tiles across the parts
        return [matmul(p("x", BF16, (2, 3, 97, 64)), p("w", BF16, (64, 128)))], (True, False)
    if name == "activation_rows_permuted":  # rows that chain in x but not in the output: parts decoded
        return [matmul(ir.permute(p("x", BF16, (96, 3, 64)), (1, 0, 2)), p("w", BF16, (64, 128)))], (True, False)
    raise KeyError(name)


CASES = ["bf16_aligned", "f16_odd", "bf16_edges", "a_transposed", "b_transposed", "both_transposed", "batched",
         "batched_wide", "broadcast_batch", "weight_grad", "epilogue", "f32_of_bf16", "conv_like", "rows_64", "k_parts",
         "activation_rows", "activation_rows_odd", "activation_rows_permuted"]


CPU_CASES = CASES + ["f32", "f64"]
GPU_CASES = CASES + ["f32"]   # f32 on FMA register tiles


def _kernels(outputs: list[Node], arch: str = "sm_90", target: str = "cuda") -> list:
    sched = schedule(outputs)
    # sm_75: a GPU without the tensor-core instructions the plans use (ldmatrix, cp.async)
    turing = dataclasses.replace(gpu("sm_86"), arch="sm_75", tensor_cores=())
    optimize.optimize(sched, (turing if arch == "sm_75" else gpu(arch)) if target == "cuda" else cpu())
    return sched.kernels


def _inputs(outputs: list[Node]) -> dict[Node, np.ndarray]:
    rng = np.random.default_rng(0)
    params = [n for n in ir.toposort(outputs) if n.op is Op.PARAM]
    return {q: (rng.integers(-8, 9, q.shape) / 8).astype(np.float32) for q in params}


@pytest.mark.parametrize("name", CPU_CASES)
def test_packed_cpu_matches_reference(name: str) -> None:
    outputs, (a_kmajor, b_kmajor) = case(name)
    (k,) = _kernels(outputs, target="c")
    assert k.contraction is not None and (k.contraction.a.k_major, k.contraction.b.k_major) == (a_kmajor, b_kmajor)
    inputs = _inputs(outputs)
    got = runners.BACKENDS["c"].run(outputs, inputs)
    want = ref.evaluate(outputs, inputs)
    assert all(np.array_equal(np.asarray(g, np.float64), np.asarray(w, np.float64)) for g, w in zip(got, want))


@pytest.mark.parametrize("name", GPU_CASES)
def test_contraction_is_recognized(name: str) -> None:
    outputs, (a_kmajor, b_kmajor) = case(name)
    (k,) = _kernels(outputs)
    assert k.contraction is not None, name
    c = k.contraction
    assert (c.a.k_major, c.b.k_major) == (a_kmajor, b_kmajor)


def test_output_ranges_merge_into_one_side() -> None:
    (k,) = _kernels(case("conv_like")[0])
    c = k.contraction
    assert c.mnk == (40, 2 * 6 * 10, 64) and [r.arg[1] for r in c.j_parts] == [2, 6, 10] and not c.batch
    assert c.names("ei", "ej")[c.j_parts[1]] == "((ej / 10) % 6)" and c.pair_store


def test_reduced_ranges_that_do_not_chain_stay_parts_of_k() -> None:
    (k,) = _kernels(case("k_parts")[0])
    c = k.contraction
    assert c.mnk == (40, 64, 2 * 64) and [r.arg[1] for r in c.k_parts] == [2, 64]
    assert c.offset(c.a, c.k, "gk") == "((long long)(((gk) % 64)) * 1 + (long long)((gk) / 64) * 2560)"


def test_not_a_contraction() -> None:
    x = ir.param("x", BF16, (64, 64))
    row_sums = ir.reduce(Op.SUM, ir.binary(Op.MUL, x, x), (1,))  # both operands use both ranges
    matvec = matmul(ir.param("a", BF16, (64, 64)), ir.param("v", BF16, (64, 1)))
    f64 = matmul(ir.param("a", dt.f64, (64, 64)), ir.param("b", dt.f64, (64, 64)))
    for out in (row_sums, matvec, f64):
        assert all(k.contraction is None for k in _kernels([out]))
    assert _kernels(case("bf16_aligned")[0], arch="sm_75")[0].contraction is None  # no ldmatrix before sm_80


@pytest.mark.skipif(COMPILER is None, reason="neither nvcc nor NVRTC is installed")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
def test_contraction_source_compiles(arch: str, tmp_path: Path) -> None:
    outputs = [o for name in GPU_CASES for o in case(name)[0]]  # one program: one source, one compile
    src = cuda.source(outputs, arch)
    # a pipeline per kernel: cp.async issued by every warp, or TMA by a producer thread (wgmma)
    assert src.count("auto issue = ") + src.count("ember_mbar_expect(&full[s]") == len(GPU_CASES)
    if arch == "sm_90a":
        assert "cp.async.bulk.tensor" in src
    assert ("wgmma.mma_async" in src) == (arch == "sm_90a") and "mma.sync.aligned" in src
    if NVCC:   # and no register spilled: mma.sync's double-buffered fragments leave 254 of 255 in use
        assert {name: n for name, n in spills(src, arch, tmp_path).items() if n} == {}
    else:
        assert compile_cuda(src, arch, tmp_path) is None


@pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")
@pytest.mark.parametrize("plan", ["gpu", "sm_80"])  # the GPU's own plan (wgmma on an H200), and mma.sync
@pytest.mark.parametrize("name", GPU_CASES)
def test_tensor_core_matches_reference(name: str, plan: str) -> None:
    outputs, _ = case(name)
    inputs = _inputs(outputs)
    program = cuda.CUDAProgram(outputs, plan_arch=None if plan == "gpu" else plan)
    assert program.sched.kernels[0].contraction is not None
    got = run_values(program, inputs)
    want = ref.evaluate(outputs, inputs)
    assert compare(outputs, got, want) is None
    assert all(np.array_equal(np.asarray(g, np.float64), np.asarray(w, np.float64)) for g, w in zip(got, want))


def test_search_keeps_the_fastest_plan_and_the_plan_pass_reuses_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A searched winner goes into the stored plans' table; the compiler's plan pass gives it to
    every later compile for that device (a schedule cached before it misses: its key holds the
    table's digest), and another device keeps the heuristic's plan."""
    from ember.backend import search
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    monkeypatch.setenv("EMBER_SEARCH", "1")
    outputs = case("bf16_aligned")[0]
    fake, other_gpu = (dataclasses.replace(gpu("sm_90a"), name=n) for n in ("Fake GPU", "Other GPU"))
    (k,) = pipeline.compile_schedule(outputs, fake).kernels
    plans = search.candidates(k.contraction, fake)
    assert plans[0] == k.plan and len(plans) == len(set(plans)) > 4  # the heuristic's first
    assert all(contraction.smem_bytes(p) <= 227 * 1024 for p in plans)
    fastest = plans[3]
    timed = []

    def timer(kernel):  # a fake GPU: one plan is fastest
        timed.append(kernel.plan)
        return 1.0 if kernel.plan == fastest else 2.0
    search.choose([k], fake, timer)
    assert k.plan == fastest and timed == plans
    (again,) = pipeline.compile_schedule(outputs, fake).kernels
    assert again.plan == fastest
    search.choose([again], fake, lambda kernel: pytest.fail("searched again"))
    monkeypatch.delenv("EMBER_SEARCH")
    (other,) = pipeline.compile_schedule(outputs, other_gpu).kernels
    search.choose([other], other_gpu, timer)  # no search, nothing stored: the heuristic's plan
    assert other.plan == plans[0]

def _conv(dtype: str, channels: int) -> tuple[list[Node], list[Node]]:
    """A 3x3 convolution with padding from the frontend: (its params, its output)."""
    import ember.functional as F
    import ember.tensor as et
    x = et.Tensor(np.zeros((2, channels, 9, 11), np.float32), dtype=dtype)
    w = et.Tensor(np.zeros((24, channels, 3, 3), np.float32), dtype=dtype)
    return [x.node, w.node], [F.conv2d(x, w, padding=1).node]


@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
def test_convolution_reads_its_windows_in_place(arch: str) -> None:
    """Implicit GEMM: N runs over (n, h, w) and K over (kh, (kw, c)) of the padded input, whose
    windows overlap; no im2col buffer (3 kernels: the padded input, the weight in (kh, kw, c)
    order, the product). With 3 channels the 16-byte rows do not fit: im2col, 4 kernels."""
    _, outputs = _conv("bfloat16", 16)
    kernels = _kernels(outputs, arch=arch)
    (c,) = [k.contraction for k in kernels if k.contraction]
    assert len(kernels) == 3 and [r.arg[1] for r in c.j_parts] == [2, 9, 11] and [r.arg[1] for r in c.k_parts] == [3, 48]
    assert len(_kernels(_conv("bfloat16", 3)[1], arch=arch)) == 4


@pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_convolution_on_the_gpu_matches_reference(dtype: str) -> None:
    params, outputs = _conv(dtype, 16)
    inputs = _inputs(outputs)
    got = run_values(cuda.CUDAProgram(outputs), inputs)
    want = ref.evaluate(outputs, inputs)
    assert all(np.array_equal(np.asarray(g, np.float64), np.asarray(w, np.float64)) for g, w in zip(got, want))


def test_tma_boxes_and_where_tma_is_not_used() -> None:
    """The TMA path's view of each operand (no GPU: what tensor_maps encodes): a K-major operand
    is one box of 64 x its tile's rows, an MN-major one a box of 64 columns x 64 rows per panel,
    batch ranges add dimensions; operands TMA cannot address keep the cp.async pipeline."""
    from ember.backend import mma

    def plan_of(name: str) -> tuple:
        (k,) = [k for k in _kernels(case(name)[0], arch="sm_90a") if k.contraction]
        return k.contraction, k.plan

    c, p = plan_of("b_transposed")   # x [130, 64] @ W.T, W [48, 64]: both K-major
    assert p.tma and p.threads == 128 * (p.warps_m + 1)
    assert mma._tma_box(c, c.a, p) == ([64, 130], [1, 64], [64, p.block_m])
    assert mma._tma_box(c, c.b, p) == ([64, 48], [1, 64], [64, p.block_n])
    c, p = plan_of("a_transposed")   # A [96 (k), 160 (m)]: MN-major, panels of 64 columns
    assert p.tma and mma._tma_box(c, c.a, p) == ([160, 96], [1, 160], [64, 64])
    c, p = plan_of("batched_wide")   # a batch range: a third dimension, a box of 1 along it
    assert p.tma and mma._tma_box(c, c.a, p) == ([64, 128, 2], [1, 64, 8192], [64, p.block_m, 1])
    for name in ("f16_odd", "conv_like"):   # rows of 100 elements (not 16-byte); decoded parts
        assert not plan_of(name)[1].tma
    c, p = plan_of("bf16_aligned")   # B [128 (k), 192 (n)] row-major: MN-major
    assert p.tma and mma._tma_box(c, c.b, p) == ([192, 128], [1, 192], [64, 64])
    assert all(not k.plan.tma for k in _kernels(case("bf16_aligned")[0], arch="sm_86") if k.contraction)


def test_tile_order_is_a_permutation() -> None:
    """The persistent TMA kernels' tile order (groups of row tiles): every (m0, n0) exactly once,
    for whole and ragged groups, evaluated from the C it renders (integers >= 0: C's / and %
    are Python's // and %)."""
    from ember.backend import mma
    from ember.compiler.contraction import GpuPlan
    plan = GpuPlan("wgmma", 128, 256, 64, 2, 1, 4, True)
    for tm, tn in ((128, 197), (11, 12), (1, 1), (9, 3), (16, 1)):
        statements = [line.removeprefix("const int ").rstrip(";").replace("/", "//").split(" = ", 1)
                      for line in mma.tile_order(tm, tn, plan)]
        seen = set()
        for tile in range(3 * tm * tn):   # three batches: tile % (tm tn) is the place in one
            env = {"tile": tile}
            for name, expr in statements:
                env[name] = eval(expr, {"min": min}, env)
            seen.add((tile // (tm * tn), env["m0"], env["n0"]))
        assert seen == {(z, m * 128, n * 256) for z in range(3) for m in range(tm) for n in range(tn)}, (tm, tn)


def test_epilogue_of_whole_tiles_converts_once_and_tests_no_edges() -> None:
    """A bf16 product stored as is: its accumulator is converted to bf16 bits once (not rounded,
    widened and converted again: the same bits), and where every tile is whole (16384 x 3072 in
    128 x 256 tiles) the epilogue tests no edges; 50304 columns keep the guard."""
    from ember.backend.cuda_render import _one_call
    a, b = ir.param("a", BF16, (16384, 768)), ir.param("b", BF16, (768, 3072))
    src = cuda.source([matmul(a, b)], "sm_90a")
    assert "ember_bf16_bits_op(acc[y][h])" in src and "if (ei <" not in src
    b = ir.param("b", BF16, (768, 50304))
    assert "if (ei < 16384 && ej < 50304)" in cuda.source([matmul(a, b)], "sm_90a")
    assert _one_call("(acc[y][h])") and not _one_call("(a) + (b)") and not _one_call("(a")


def test_tma_store_where_the_output_allows() -> None:
    """The TMA store's view of the output (no GPU: what tensor_maps encodes for it): j, i, then
    the batch ranges, a box of 64 x 64 per panel of a warpgroup's rows; outputs TMA cannot write
    (4-byte elements, an odd row, a decoded range) keep the stores from registers. A plan with
    the store gives up slots to fit the output tile in shared memory."""
    from ember.backend import mma
    room = gpu("sm_90a").smem_block

    def plan_of(name: str) -> tuple:
        (k,) = [k for k in _kernels(case(name)[0], arch="sm_90a") if k.contraction]
        return k.contraction, k.plan

    c, p = plan_of("bf16_aligned")   # [256, 192] bf16
    assert p.tma_store and mma._tma_out_box(c) == ([192, 256], [1, 192], [64, 64])
    assert contraction.smem_bytes(p) <= room
    c, p = plan_of("batched_wide")   # [2, 128, 96]: the batch is a third dimension
    assert p.tma_store and mma._tma_out_box(c) == ([96, 128, 2], [1, 96, 128 * 96], [64, 64, 1])
    for name in ("epilogue", "f16_odd", "conv_like"):   # f32 output; 45 columns; rows n, h, w merged
        assert not plan_of(name)[1].tma_store, name
    c, p = plan_of("activation_rows")   # [3, 96, 128]: rows b and t chain, one range to TMA (GPT-2's qkv)
    assert c.chained and [r.arg[1] for r in c.i_parts] == [3, 96] and p.tma and p.tma_store
    assert mma._tma_box(c, c.a, p) == ([64, 288], [1, 64], [64, p.block_m])
    assert mma._tma_out_box(c) == ([128, 288], [1, 128], [64, 64])
    c, p = plan_of("activation_rows_odd")   # 582 rows: TMA's boxes stop at the edge
    assert c.chained and p.tma and p.tma_store and mma._tma_out_box(c)[0] == [128, 582]
    c, p = plan_of("activation_rows_permuted")   # x's rows chain, the output's do not: cp.async
    assert c.i_parts and not c.chained and not p.tma and not p.tma_store
    a, b = ir.param("a", BF16, (16384, 768)), ir.param("b", BF16, (768, 3072))   # GPT-2's fc
    (k,) = [k for k in _kernels([matmul(a, b)], arch="sm_90a") if k.contraction]
    p = k.plan
    assert p.tma_store and p.stages == 3 and contraction.smem_bytes(p) <= room
    src = cuda.source([matmul(a, b)], "sm_90a")
    assert src.count("ember_tma_store2(ep + ") == p.block_n // 64 and "ember_bulk_wait();" in src


# Odd shapes (issue 30): rows that are not 16-byte aligned read from padded copies, TMA-fed
# wgmma at 128 x 128 where 128 x 256 tiles would leave a last round of blocks nearly empty.
ODD = {  # name: (M, N, K, dtype, B given as W [N, K] (x @ W.T))
    "bf16 4000x4100x3900": (4000, 4100, 3900, BF16, False),
    "bf16 3001x2047x1999": (3001, 2047, 1999, BF16, False),
    "f16 3001x2047x1999 W.T": (3001, 2047, 1999, F16, True),
    "f32 3001x2047x1999": (3001, 2047, 1999, dt.f32, False),
    "f32 2000x3000x1000": (2000, 3000, 1000, dt.f32, False),
    "f16 4096": (4096, 4096, 4096, F16, False),
}


def odd(name: str, params: bool = False) -> list[Node]:
    """The program [a @ b] (or [a @ w.T]); params: [a, b or w] after it."""
    m, n, k, d, wt = ODD[name]
    a, b = ir.param("a", d, (m, k)), ir.param("w", d, (n, k)) if wt else ir.param("b", d, (k, n))
    return [matmul(a, t(b) if wt else b)] + [a, b] * params


@pytest.mark.parametrize("name, arch, pads, plan", [
    ("bf16 4000x4100x3900", "sm_90a", 2, "wgmma: block 128x128x64, 2 warpgroups, TMA 4-stage"),
    ("bf16 3001x2047x1999", "sm_90a", 2, "wgmma: block 128x128x64, 2 warpgroups, TMA 4-stage"),
    ("f16 3001x2047x1999 W.T", "sm_90a", 2, "wgmma: block 128x128x64, 2 warpgroups, TMA 4-stage"),
    ("f16 4096", "sm_90a", 0, "wgmma: block 128x256x64, 2 warpgroups, TMA 3-stage, TMA store"),
    ("f32 3001x2047x1999", "sm_90a", 2, "FMA register tiles: block 128x128x16, 8x8 per thread, cp.async 4-stage"),
    ("f32 2000x3000x1000", "sm_90a", 0, "FMA register tiles: block 128x128x16, 8x8 per thread, cp.async 4-stage"),
    ("bf16 3001x2047x1999", "sm_86", 2, "mma.sync: block 128x128x32, warps 2x2, cp.async 3-stage"),
    # K = 3900 is not split on sm_86: parts of 1950 would start rows off 16 bytes (element-wise staging)
    ("bf16 4000x4100x3900", "sm_86", 2, "mma.sync: block 128x128x32, warps 2x2, cp.async 3-stage"),
])
def test_odd_shapes_take_padded_copies_and_fitting_tiles(name: str, arch: str, pads: int, plan: str,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each unaligned operand gets one copy kernel (its rows padded to 16 bytes), and the product
    reads it aligned (TMA on sm_90a); small products keep the element-wise staging."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    kernels = pipeline.compile_schedule(odd(name), gpu(arch)).kernels
    (k,) = [k for k in kernels if k.contraction]
    assert len(kernels) == pads + 1 and plan in str(k.plan), str(k.plan)
    assert k.contraction.a.aligned and k.contraction.b.aligned
    small = pipeline.compile_schedule(case("f16_odd")[0], gpu(arch)).kernels   # 77 x 100 x 45
    assert len(small) == 1 and not small[0].contraction.a.aligned


def test_mma_sync_loads_fragments_ahead_and_tests_only_the_bounds_tiles_pass(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """mma.sync's K loop waits for the next slot inside the step, before its last products, and
    loads the next step's first fragments there (double-buffered: no product waits on ldmatrix
    after a barrier); a chunk's bound test is written only where the tiles do not divide the
    sizes (4096: none; M = 3001: A's rows)."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    a, b = ir.param("a", BF16, (4096, 4096)), ir.param("b", BF16, (4096, 4096))
    src = cuda.source([matmul(a, b)], "sm_86")
    loop = src[src.index("for (int t = 0; t < 128; t++)"):]
    assert loop.index("__syncthreads();") < loop.index("frags((kk + 1) & 1, sa + ((t + 1) % 3)") < \
        loop.index("ember_mma_bf16(acc[x][y], fa[kk & 1][x]")
    assert "bool ok" not in src and src.count("ember_cp_async16(dst, (const void*)(") == 2
    rows = cuda.source([matmul(ir.param("a", BF16, (3001, 4096)), b)], "sm_86")
    assert rows.count("bool ok") == 1 and "bool ok = go < 3001;" in rows


def test_tiles_that_fill_the_sms_in_one_round_keep_k_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2's lm head dX, dlogits [4096, 50304] @ W [50304, 768]: 128 tiles of 128 x 192 fill
    the H200's 132 SMs in one round, one kernel; 128 x 256 tiles were 96, and K was split in 2
    (0.77 of cuBLAS against 1.08). A product whose 128 x 256 tiles fill the SMs keeps them (and
    its split)."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    dlogits, w = ir.param("g", BF16, (4096, 50304)), ir.param("w", BF16, (50304, 768))
    (k,) = pipeline.compile_schedule([matmul(dlogits, w)], gpu("sm_90a")).kernels
    assert "block 128x192x64" in str(k.plan) and not k.atomic, str(k.plan)
    wide = pipeline.compile_schedule([matmul(ir.param("x", BF16, (8192, 50304)), w)], gpu("sm_90a")).kernels
    assert ["block 128x256x64" in str(k.plan) for k in wide if k.contraction] == [True]


@pytest.mark.skipif(COMPILER is None, reason="neither nvcc nor NVRTC is installed")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
def test_odd_shapes_compile(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The padded copies and products of odd shapes, one program: rows whose last 16-byte chunk
    passes their end (K = 1999 in rows of 2000) are read by TMA's box (sm_90a) or by cp.async of
    a chunk's first bytes (sm_86; the f32 FMA tiles on both)."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    src = cuda.source([o for name in ("bf16 3001x2047x1999", "f16 3001x2047x1999 W.T", "f32 3001x2047x1999")
                       for o in odd(name)], arch)
    assert "ember_cp_async_n(dst" in src and ("cp.async.bulk.tensor" in src) == (arch == "sm_90a")
    assert compile_cuda(src, arch, tmp_path) is None


@pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")
@pytest.mark.parametrize("plan", ["gpu", "sm_80"])
@pytest.mark.parametrize("name", ["bf16 4000x4100x3900", "bf16 3001x2047x1999", "f16 3001x2047x1999 W.T",
                                  "f32 3001x2047x1999"])
def test_odd_shapes_on_the_gpu(name: str, plan: str) -> None:
    """Values against numpy's product of the same inputs (multiples of 1/8: every sum exact in
    f32 and f64), rounded to the dtype: the same bits."""
    out, pa, pb = odd(name, params=True)
    inputs = _inputs([out])
    program = cuda.CUDAProgram([out], plan_arch=None if plan == "gpu" else plan)
    assert len(program.sched.kernels) == 3   # the two padded copies and the product
    (got,) = run_values(program, inputs)
    a, b = inputs[pa].astype(np.float64), inputs[pb].astype(np.float64)
    want = a @ (b.T if ODD[name][4] else b)
    assert np.array_equal(np.asarray(got, np.float64), data.round_float(want, ODD[name][3]).astype(np.float64))


def test_only_the_aligning_pads_become_copies() -> None:
    """A contraction's operand padded by split.pad_operands (its last dim to 16 bytes) is read from
    a copy; any other pad under a shrink stays fused into the kernel that reads it (the flash
    kernels pack o with the logsumexp, [.., 64] -> [.., 65] in f32: a copy of it cost GPT-2's
    step a 51 MB kernel a layer)."""
    from ember import ir
    from ember.compiler.contraction import _padded_copy
    x = ir.param("x", dt.bf16, (64, 3900))
    aligning = ir.pad(x, (0, 0), (0, 4))
    assert _padded_copy(ir.shrink(aligning, (0, 0), (64, 3900))) is aligning
    packed = ir.pad(ir.param("o", dt.f32, (64, 64)), (0, 0), (0, 1))
    assert _padded_copy(ir.shrink(packed, (0, 0), (64, 64))) is None
    assert _padded_copy(ir.shrink(ir.pad(x, (1, 0), (0, 4)), (1, 0), (65, 3900))) is None


@pytest.mark.parametrize("forced", ["mma.sync,128,128,16,2,2,3", "mma.sync,128,128,48,2,2,3", "wgmma,128,128,64,2,1,2"])
def test_a_forced_plan_the_loop_cannot_run_is_refused(forced: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """mma.sync's fragments alternate between two buffers a 16-deep step and the next K-step
    starts on the first: an odd count of them a step would read the wrong buffer; wgmma keeps a
    step in flight beside the one filled."""
    from ember.compiler import plans
    monkeypatch.setenv("EMBER_TC_PLAN", forced)
    with pytest.raises(ValueError, match="EMBER_TC_PLAN"):
        plans.forced_contraction()
    monkeypatch.setenv("EMBER_TC_PLAN", "mma.sync,128,128,64,2,2,3")
    assert plans.forced_contraction().block_k == 64
