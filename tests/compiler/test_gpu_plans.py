"""The GPU plans that only large or aligned shapes reach (tiles staged in shared memory,
1024-thread row blocks, two-stage reductions), against the reference evaluator. Needs a GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember import data, ir, ref, runners
from ember import dtype as dt
from ember.ir import Op

from .randprog import compare

pytestmark = pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")


def matmul(a: ir.Node, b: ir.Node) -> ir.Node:
    (m, k), (_, n) = a.shape, b.shape
    prod = ir.binary(Op.MUL, ir.expand(ir.reshape(a, (m, k, 1)), (m, k, n)), ir.expand(ir.reshape(b, (1, k, n)), (m, k, n)))
    return ir.reshape(ir.reduce(Op.SUM, prod, (1,)), (m, n))


def softmax(x: ir.Node) -> ir.Node:
    mx = ir.expand(ir.reduce(Op.RMAX, x, (1,)), x.shape)
    e = ir.unary(Op.EXP2, ir.binary(Op.SUB, x, mx))
    return ir.binary(Op.DIV, e, ir.expand(ir.reduce(Op.SUM, e, (1,)), x.shape))


def embedding_grad() -> ir.Node:
    """d/d table of sum(w * table[idx]), the gather written as the IR writes it (a max over
    rows of where(row == idx, table, -inf)); idx has an out-of-range entry."""
    table, idx, w = ir.param("table", dt.f32, (300, 24)), ir.param("idx", dt.i32, (5, 7)), ir.param("w", dt.f32, (5, 7, 24))
    hit = ir.binary(Op.CMPEQ, ir.expand(ir.reshape(idx, (5, 7, 1, 1)), (5, 7, 300, 24)), ir.iota(dt.i32, (5, 7, 300, 24), 2))
    rows = ir.where(hit, ir.expand(ir.reshape(table, (1, 1, 300, 24)), (5, 7, 300, 24)),
                    ir.const(-float("inf"), dt.f32, (5, 7, 300, 24)))
    y = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.reduce(Op.RMAX, rows, (2,)), ir.reshape(w, (5, 7, 1, 24))), (0, 1, 2, 3))
    return ir.grad(y, table)


def adam_chain(flipped: bool = False) -> list[ir.Node]:
    """AdamW's update of one tensor: the gradient rounded to bf16, the two moments, the parameter
    (reading both new moments). flipped: the parameter reads the first moment reversed, at
    elements other threads write (no chain may then hold both)."""
    f = lambda n: ir.param(n, dt.f32, (256, 768))  # noqa: E731
    g, m, v, w = f("g"), f("m"), f("v"), f("w")
    c = lambda x: ir.const(x, dt.f32, (256, 768))  # noqa: E731
    gb = ir.unary(Op.CAST, ir.unary(Op.CAST, g, dt.bf16), dt.f32)
    m1 = ir.binary(Op.ADD, ir.binary(Op.MUL, m, c(0.9)), ir.binary(Op.MUL, gb, c(0.1)))
    v1 = ir.binary(Op.ADD, ir.binary(Op.MUL, v, c(0.999)), ir.binary(Op.MUL, ir.binary(Op.MUL, gb, gb), c(0.001)))
    read = ir.flip(m1, (1,)) if flipped else m1
    step = ir.binary(Op.DIV, read, ir.binary(Op.ADD, ir.unary(Op.SQRT, v1), c(1e-8)))
    return [m1, v1, ir.binary(Op.SUB, w, ir.binary(Op.MUL, step, c(1e-3)))]


def layernorm_rows(shifted: bool = False, rows: int = 512, width: int = 768) -> list[ir.Node]:
    """A residual add and a layernorm whose mean and rstd are outputs too (the backward's):
    merge_rows makes them one kernel, a block per row. shifted: the normalized row reads the
    mean and rstd of another row (flipped), rows other blocks write (it then stays out)."""
    f = lambda n, s: ir.param(n, dt.f32, s)  # noqa: E731
    x0, proj, w, b = f("x0", (rows, width)), f("proj", (rows, width)), f("w", (width,)), f("b", (width,))
    c = lambda v, s: ir.const(v, dt.f32, s)  # noqa: E731
    x = ir.binary(Op.ADD, x0, proj)
    mean = ir.binary(Op.MUL, ir.reduce(Op.SUM, x, (1,)), c(1 / width, (rows, 1)))
    d = ir.binary(Op.SUB, x, ir.expand(mean, x.shape))
    var = ir.binary(Op.MUL, ir.reduce(Op.SUM, ir.binary(Op.MUL, d, d), (1,)), c(1 / width, (rows, 1)))
    rstd = ir.binary(Op.DIV, c(1.0, (rows, 1)), ir.unary(Op.SQRT, ir.binary(Op.ADD, var, c(1e-5, (rows, 1)))))
    m_used, r_used = mean, rstd
    if shifted:   # row i takes row rows - 1 - i's statistics
        m_used, r_used = ir.flip(mean, (0,)), ir.flip(rstd, (0,))
    y = ir.binary(Op.MUL, ir.binary(Op.SUB, x, ir.expand(m_used, x.shape)), ir.expand(r_used, x.shape))
    y = ir.binary(Op.ADD, ir.binary(Op.MUL, y, ir.expand(ir.reshape(w, (1, width)), x.shape)),
                  ir.expand(ir.reshape(b, (1, width)), x.shape))
    return [ir.unary(Op.CAST, y, dt.bf16), mean, rstd, x]


def cross_entropy_rows(rows: int = 64, classes: int = 5000) -> list[ir.Node]:
    """A cross-entropy's loss and its gradient over bf16 logits (a chunk of GPT-2's head): the
    row max, the sum of exponentials and the gradient over the logits, one row chain beside the
    picked logit (a gather by a target param). The logits are a matmul's, a temporary."""
    h, w = ir.param("h", dt.bf16, (rows, 64)), ir.param("w", dt.bf16, (64, classes))
    logits = ir.unary(Op.CAST, matmul(h, w), dt.bf16)
    x = ir.unary(Op.CAST, logits, dt.f32)
    target = ir.param("target", dt.i32, (rows, 1))
    mx = ir.expand(ir.reduce(Op.RMAX, x, (1,)), x.shape)
    e = ir.unary(Op.EXP2, ir.binary(Op.SUB, x, mx))
    s = ir.reduce(Op.SUM, e, (1,))
    hit = ir.binary(Op.CMPEQ, ir.iota(dt.i32, x.shape, 1), ir.expand(target, x.shape))
    zero = ir.const(0.0, dt.f32, x.shape)
    picked = ir.reduce(Op.SUM, ir.where(hit, x, zero), (1,))
    loss = ir.binary(Op.SUB, ir.binary(Op.ADD, ir.unary(Op.LOG2, s), ir.reduce(Op.RMAX, x, (1,))), picked)
    grad = ir.binary(Op.SUB, ir.binary(Op.DIV, e, ir.expand(s, x.shape)), ir.where(hit, ir.const(1.0, dt.f32, x.shape), zero))
    return [loss, ir.unary(Op.CAST, grad, dt.bf16)]


def shared_rows(rows: int = 64, width: int = 20000) -> list[ir.Node]:
    """A softmax of x * y whose row max and sum are outputs too: three members of a row chain,
    each reading a row of both params, x in bf16 (40 KB) and y in f32 (80 KB). On sm_90a y's
    rows are kept in shared memory (merge.row_cache); x's are left to the SM's L1."""
    x, y = ir.param("x", dt.bf16, (rows, width)), ir.param("y", dt.f32, (rows, width))
    p, mx, s = softmax_rows(ir.binary(Op.MUL, ir.unary(Op.CAST, x, dt.f32), y))
    return [ir.unary(Op.CAST, p, dt.bf16), mx, s]


def softmax_rows(x: ir.Node) -> list[ir.Node]:
    """A softmax over x's rows whose max and sum are outputs too: three members of a row chain."""
    mx = ir.reduce(Op.RMAX, x, (1,))
    e = ir.unary(Op.EXP2, ir.binary(Op.SUB, x, ir.expand(mx, x.shape)))
    s = ir.reduce(Op.SUM, e, (1,))
    return [ir.binary(Op.DIV, e, ir.expand(s, x.shape)), mx, s]


def short_rows(dtype: dt.DType = dt.f32, rows: int = 135171, width: int = 64) -> list[ir.Node]:
    """Many short rows (more rows than the GPU's threads, a ragged last block): a softmax and
    a log-sum-exp, each row a group of a warp's threads (RowPlan.group)."""
    x = ir.param("x", dtype, (rows, width))
    xf = ir.unary(Op.CAST, x, dt.f32) if dtype is not dt.f32 else x
    lse = ir.binary(Op.ADD, ir.unary(Op.LOG2, ir.reduce(Op.SUM, ir.unary(Op.EXP2, xf), (1,))), ir.const(0.0, dt.f32, (rows, 1)))
    return [softmax(xf), lse]


def weight_grad(k: int, m: int, n: int) -> ir.Node:
    """sum over k of a[k, m] b[k, n] in bf16: a weight gradient, whose long K split_k parts."""
    a, b = ir.param("a", dt.bf16, (k, m, 1)), ir.param("b", dt.bf16, (k, 1, n))
    return ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.expand(a, (k, m, n)), ir.expand(b, (k, m, n))), (0,))


def case(name: str) -> list[ir.Node]:
    f = lambda n, s: ir.param(n, dt.f32, s)  # noqa: E731
    if name == "transpose":
        return [ir.permute(f("x", (64, 96)), (1, 0))]
    if name == "permute3d":
        return [ir.binary(Op.ADD, ir.permute(f("x", (3, 64, 32)), (0, 2, 1)), ir.const(1.0, dt.f32, (3, 32, 64)))]
    if name == "matmul":
        return [matmul(f("a", (256, 64)), f("b", (64, 128)))]
    if name == "matmul_epilogue":
        c = matmul(f("a", (128, 72)), f("b", (72, 192)))
        return [ir.binary(Op.MAX, c, ir.const(0.0, dt.f32, c.shape))]
    if name == "matmul_bias_bf16":   # the f32 bias converted once, read by the epilogue (epilogue_casts)
        x, w = ir.param("x", dt.bf16, (256, 768)), ir.param("w", dt.bf16, (768, 384))
        bias = ir.unary(Op.CAST, f("bias", (384,)), dt.bf16)
        return [ir.binary(Op.ADD, matmul(x, w), ir.expand(ir.reshape(bias, (1, 384)), (256, 384)))]
    if name == "softmax_long_rows":
        return [softmax(f("x", (4, 8192)))]
    if name == "embedding_grad":  # a scatter: atomic adds into a zeroed output
        return [embedding_grad()]
    if name == "column_sum_two_stage":
        return [ir.reduce(Op.SUM, f("x", (4096, 40)), (0,))]
    if name == "small_batches":   # small kernels in two batches (the second reads the first's)
        return small_batches()
    if name in ("adam_chain", "adam_flipped"):   # maps in the same threads (merge.chains)
        return adam_chain(name == "adam_flipped")
    if name in ("short_rows_f32", "short_rows_bf16"):   # a group of a warp's threads per row
        return short_rows(dt.f32 if name.endswith("f32") else dt.bf16)
    if name in ("layernorm_rows", "layernorm_shifted"):   # row kernels in the same blocks (merge_rows)
        return layernorm_rows(name == "layernorm_shifted")
    if name == "layernorm_odd":   # rows of 1000 (no lanes divide them), 300 of them
        return layernorm_rows(rows=300, width=1000)
    if name == "cross_entropy_rows":   # max, sum, the picked logit by a gathered index, the gradient
        return cross_entropy_rows()
    if name == "cross_entropy_wide":   # rows of 50304: 6288 vectors for 1024 threads, the last step partial
        return cross_entropy_rows(rows=48, classes=50304)
    if name == "shared_rows":   # a row chain's rows kept in shared memory (merge.row_cache)
        return shared_rows()
    if name in ("layernorm_backward", "layernorm_backward_long"):   # the backward's row sums and maps, one chain
        rows = 256 if name == "layernorm_backward" else 8192   # long: w's partial sums a thread per column
        outs = layernorm_rows(rows=rows)
        params = [n for n in ir.toposort(outs) if n.op is Op.PARAM]
        y = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, outs[0], dt.f32), f("dy", (rows, 768))), (0, 1))
        return [ir.grad(y, p) for p in params if p.arg in ("x0", "w")]
    raise KeyError(name)


def small_batches() -> list[ir.Node]:
    """Small outputs, an optimizer's updates of biases: a level of independent kernels, a level
    that reads them, and a large kernel that reads a small one (which then stays in place)."""
    f = lambda n, s: ir.param(n, dt.f32, s)  # noqa: E731
    a, b, c, x = f("a", (768,)), f("b", (3000,)), f("c", (5, 7)), f("x", (2048, 768))
    two_a = ir.binary(Op.MUL, a, ir.const(2.0, dt.f32, a.shape))
    b1 = ir.binary(Op.ADD, b, ir.const(1.0, dt.f32, b.shape))
    c_sum = ir.reduce(Op.SUM, c, (1,))
    after = ir.binary(Op.ADD, two_a, ir.shrink(b1, (100,), (868,)))
    scale = ir.reduce(Op.SUM, a, (0,))
    big = ir.binary(Op.MUL, x, ir.expand(ir.reshape(scale, (1, 1)), x.shape))
    return [two_a, b1, c_sum, after, big]


@pytest.mark.parametrize("name", ["transpose", "permute3d", "matmul", "matmul_epilogue", "matmul_bias_bf16",
                                  "softmax_long_rows",
                                  "column_sum_two_stage", "embedding_grad", "small_batches",
                                  "adam_chain", "adam_flipped", "layernorm_rows", "layernorm_shifted",
                                  "layernorm_backward", "layernorm_backward_long", "layernorm_odd", "cross_entropy_rows", "cross_entropy_wide",
                                  "shared_rows", "short_rows_f32",
                                  "short_rows_bf16"])
def test_gpu_plan_matches_reference(name: str) -> None:
    outputs = case(name)
    rng = np.random.default_rng(0)
    params = [n for n in ir.toposort(outputs) if n.op is Op.PARAM]
    inputs = {p: data.round_float(rng.standard_normal(p.shape), p.dtype).astype(np.float32) if p.dtype.is_float
              else rng.integers(0, 301, p.shape).astype(np.int32) for p in params}
    got = runners.BACKENDS["cuda"].run(outputs, inputs)
    assert compare(outputs, got, ref.evaluate(outputs, inputs)) is None



@pytest.mark.parametrize("prog", ["bf16[16384,768] sum", "f32[4096,64] max", "i32[512,64] sum", "i8[512,64] max",
                                  "u8[512,64] sum", "f32[256,8,64] sum01"])
def test_column_reductions_in_lanes_match_the_reference(prog: str) -> None:
    """Column reductions whose first stage has too few outputs for lanes of its own: the sum (or
    max) is split into 8 or 4 independent partial results down the column
    (optimize.reduction_lanes). Integer sums wrap, a NaN in a column wins its max."""
    from ember import text
    ty, op = prog.split()
    axes = "[0,1]" if op == "sum01" else "[0]"
    program = text.parse(f"ember 1\nx = param {ty}\ns = {op[:3]} x axes={axes}\nreturn s\n").output_nodes
    (x,) = [n for n in ir.toposort(program) if n.op is Op.PARAM]
    values = np.random.default_rng(1).standard_normal(x.shape) * (50 if x.dtype.is_int else 1)
    if op == "max" and x.dtype.is_float:
        values.flat[7 * 64 + 3] = np.nan
    inputs = {x: ref.cast(values, dt.f64, x.dtype)}
    got = runners.BACKENDS["cuda"].run(program, inputs)
    assert compare(program, got, ref.evaluate(program, inputs)) is None


@pytest.mark.parametrize("blocks", [0, 7])
def test_split_k_parts_add_into_their_sum(monkeypatch: pytest.MonkeyPatch, blocks: int) -> None:
    """A weight gradient split along K (split.split_k) adds its parts into the sum atomically
    (split.accumulate_parts): the value is the reference's, within bf16's rounding. On 7 blocks
    (a GPU of 7 SMs) the persistent kernel runs whole rounds of its tiles, then shares the last
    round's tiles out by K-steps (mma._render_hopper)."""
    from ember.backend import mma
    from ember.compiler import split
    monkeypatch.setattr(split, "MIN_SPLIT_K", 64)
    if blocks:
        grid = mma.grid
        monkeypatch.setattr(mma, "grid", lambda c, p, sms, *rest: grid(c, p, min(sms, blocks), *rest))
    dw = weight_grad(4096, 256, 512)   # 16 parts of 16 tiles (wgmma with TMA on an H200): 256 tiles
    rng = np.random.default_rng(0)
    # bf16 values: a reference of unrounded inputs is off by their rounding (96 of 131072 sums
    # past the tolerance for any correct kernel)
    inputs = {p: data.round_float(rng.standard_normal(p.shape).astype(np.float32), p.dtype).astype(np.float32)
              for p in ir.toposort([dw]) if p.op is Op.PARAM}
    got = runners.BACKENDS["cuda"].run([dw], inputs)[0]
    a, b = (inputs[p] for p in sorted(inputs, key=lambda p: p.arg))   # "a" [k, m, 1], "b" [k, 1, n]
    # numpy's product, not the reference evaluator's 2^29 broadcast products (a minute of the test)
    want = a[:, :, 0].astype(np.float64).T @ b[:, 0, :].astype(np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float32).reshape(want.shape), want, rtol=2e-2, atol=0.5)  # [1, m, n]


def gpt_layer_gradients() -> list[ir.Node]:
    """The loss and every gradient of a one-layer GPT in f32 (width 768, 256 tokens): its
    layernorms' backward chains write rows that only their own later members read, which
    merge.private_rows keeps in shared memory alone."""
    from ember import tensor as T
    from ember.models.gpt import GPTConfig, build
    T.manual_seed(0)
    model = build(GPTConfig(vocab=256, block=256, dim=768, n_layer=1, n_head=12))
    x = T.Tensor(np.zeros((1, 256), np.int32))
    loss = model.loss(x, x)
    loss.backward()
    outputs, _ = T.canonical_program([loss.node] + [p.grad.node for p in model.parameters()])
    return outputs


def test_rows_kept_in_shared_memory_alone_give_the_same_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's results with the chains' private rows and with them written to memory, bit for
    bit (the token ids a permutation: the embedding's atomic adds then meet no other)."""
    from ember.backend import cuda, run_values
    from ember.compiler import merge
    from ember.compiler.loops import MergedPlan
    outputs = gpt_layer_gradients()
    private = [k.name for k in cuda.prepare(outputs, "sm_90a").kernels if isinstance(k.plan, MergedPlan) and k.plan.private]
    assert len(private) >= 2, private
    rng = np.random.default_rng(0)
    inputs = {p: rng.permutation(256).reshape(p.shape).astype(np.int32) if p.dtype is dt.i32
              else (0.05 * rng.standard_normal(p.shape)).astype(np.float32)
              for p in ir.toposort(outputs) if p.op is Op.PARAM}
    results = []
    for name, rows in (("private", merge.private_rows), ("written", lambda *args: ())):
        monkeypatch.setattr(merge, "private_rows", rows)
        monkeypatch.setenv("EMBER_CACHE", str(tmp_path / name))   # a fresh schedule cache each
        results.append(run_values(cuda.CUDAProgram(outputs), inputs))
    assert np.isfinite(results[0][0]).all()
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
