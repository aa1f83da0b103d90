"""Fusion decisions: how many kernels a program becomes, and what lives in memory."""
from __future__ import annotations

from pathlib import Path

from ember import text
from ember.compiler.schedule import schedule

EIR = Path(__file__).parents[1] / "eir"


def kernels(src: str) -> int:
    return len(schedule(text.parse(src).output_nodes).kernels)


def test_elementwise_chain_is_one_kernel() -> None:
    ops = "\n".join(f"y{i} = {op} y{i - 1} c" for i, op in enumerate(["add", "mul", "max", "sub", "mul", "add", "max",
                                                                        "mul"], 1))
    assert kernels(f"ember 1\ny0 = param f32[64]\nc = const 0.5 f32[64]\n{ops}\nreturn y8\n") == 1


def test_softmax_and_layernorm_are_one_kernel() -> None:
    assert len(schedule(text.parse_file(str(EIR / "compositions/softmax.eir")).output_nodes).kernels) == 1
    assert len(schedule(text.parse_file(str(EIR / "compositions/layernorm.eir")).output_nodes).kernels) == 1


def test_matmul_by_reshape_is_one_kernel() -> None:
    assert len(schedule(text.parse_file(str(EIR / "compositions/matmul_by_reshape.eir")).output_nodes).kernels) == 1


def test_reduction_with_epilogue_is_one_kernel() -> None:
    assert kernels("ember 1\nx = param f32[8,16]\ns = sum x axes=[1]\nr = sqrt s\nreturn r\n") == 1


def test_column_sum_used_across_rows_is_realized() -> None:
    # s depends on the column only: inside the row loop it would be recomputed for every row
    src = ("ember 1\nx = param f32[8,16]\ns = sum x axes=[0]\nsb = expand s shape=[8,16]\nd = sub x sb\nreturn d\n")
    sched = schedule(text.parse(src).output_nodes)
    assert len(sched.kernels) == 2 and len(sched.temps) == 1


def test_temporaries_share_memory() -> None:
    # a is dead once c is computed, so e can take a's memory
    src = ("ember 1\nx = param f32[8,16]\n"
           "a = sum x axes=[0]\nab = expand a shape=[8,16]\nb = mul x ab\n"
           "c = sum b axes=[0]\ncb = expand c shape=[8,16]\nd = sub x cb\n"
           "e = sum d axes=[0]\neb = expand e shape=[8,16]\nf = sub x eb\nreturn f\n")
    sched = schedule(text.parse(src).output_nodes)
    a, c, e = sched.temps
    assert len(sched.kernels) == 4 and sched.slots[a.id] == sched.slots[e.id] != sched.slots[c.id]


def test_a_selection_by_data_is_a_load() -> None:
    """max over v of where(v == idx, table[v, c], -inf), the IR's embedding lookup, loses its loop
    over the table (an index out of range still gives -inf, as the spec's ops do)."""
    import numpy as np

    from ember import ref, runners
    from ember.ir import Op, toposort
    src = ("ember 1\ntable = param f32[50,8]\nidx = param i32[4]\n"
           "v = iota i32[4,50,8] axis=1\nix = reshape idx shape=[4,1,1]\nie = expand ix shape=[4,50,8]\n"
           "hit = cmpeq ie v\nt = reshape table shape=[1,50,8]\nte = expand t shape=[4,50,8]\n"
           "low = const -inf f32[4,50,8]\nw = where hit te low\nrows = max w axes=[1]\nreturn rows\n")
    prog = text.parse(src)
    (k,) = schedule(prog.output_nodes).kernels
    assert not any(n.op is Op.REDUCE for n in toposort([k.store]))
    table, idx = (prog.nodes[p] for p in ("table", "idx"))
    inputs = {table: np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32),
              idx: np.array([3, 0, 49, 50], np.int32)}
    got = runners.BACKENDS["c"].run(prog.output_nodes, inputs)[0]
    assert np.array_equal(got, ref.evaluate(prog.output_nodes, inputs)[0])
    assert np.all(got[3] == -np.inf)


def test_attention_on_the_cpu_stores_no_scores() -> None:
    """softmax(q k^T) v from the primitive graph, causal: on the C backend one kernel that
    recomputes a row's scores on each pass over it, with no S x S buffer (issue 9)."""
    import sys

    import numpy as np

    from ember import ref, runners
    from ember.backend import c
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    from attention_cpu import program
    params, outputs = program(96, 64, causal=True)
    sched = schedule(outputs, nest=c.NEST)
    assert len(sched.kernels) == 1 and not sched.temps
    rng = np.random.default_rng(0)
    inputs = {p: rng.standard_normal(p.shape).astype(np.float32) for p in params}
    got = runners.BACKENDS["c"].run(outputs, inputs)[0]
    np.testing.assert_allclose(got, ref.evaluate(outputs, inputs)[0], rtol=1e-4, atol=1e-5)


def test_a_residual_stream_read_by_many_kernels_gets_buffers() -> None:
    """x_l = x_{l-1} + f(x_{l-1}) read by each layer's norm (a reduction) and the next layer:
    fused whole, layer l's kernels would read every earlier layer's output (O(L^2) traffic)."""
    from ember import dtype as dt
    from ember import ir
    from ember.ir import Op
    x = ir.param("x", dt.f32, (64, 1024))
    outs = []
    for layer in range(8):
        w = ir.param(f"w{layer}", x.dtype, (64, 1024))
        norm = ir.expand(ir.reduce(Op.SUM, ir.binary(Op.MUL, x, x), (1,)), x.shape)   # a row statistic
        x = ir.binary(Op.ADD, x, ir.binary(Op.MUL, w, ir.binary(Op.DIV, x, norm)))
        outs.append(norm)
    sched = schedule([x, *outs])
    assert max(len({b.id for b in k.reads}) for k in sched.kernels) <= 6
    assert any(b.node.op is Op.ADD for b in sched.temps)   # a residual sum has a buffer of its own


def test_linear_layer_on_a_batch_is_one_matmul_of_all_rows() -> None:
    """x [B, T, C] @ W [C, N]: one [B*T, C] @ [C, N] contraction; W is not broadcast over B."""
    import numpy as np

    import ember.tensor as et
    from ember import ir
    from ember.ir import Op
    x, w = et.Tensor(np.ones((4, 8, 16), np.float32)), et.Tensor(np.ones((16, 5), np.float32))
    y = x @ w
    assert y.shape == (4, 8, 5)
    sums = [n for n in ir.toposort([y.node]) if n.op is Op.SUM]
    assert [s.srcs[0].shape for s in sums] == [(32, 16, 5)]
    assert float(y.numpy()[3, 7, 4]) == 16.0


def test_a_bias_that_several_kernels_read_is_added_in_the_products_epilogue() -> None:
    """h = x @ w + b, read by two kernels (y = sin(h), and the gradient's cos(h)): the product's
    kernel stores h with the bias added, once (its epilogue); neither reader reads b again (each
    added it per element, GPT-2's GELU kernels converting the bias every time)."""
    from ember import dtype as dt
    from ember import ir
    from ember.ir import Op

    from .test_contractions import matmul
    x, w, b = ir.param("x", dt.f32, (256, 64)), ir.param("w", dt.f32, (64, 128)), ir.param("b", dt.f32, (128,))
    h = ir.binary(Op.ADD, matmul(x, w), ir.expand(ir.reshape(b, (1, 128)), (256, 128)))
    y = ir.unary(Op.SIN, h)
    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, y, y), (0, 1))
    sched = schedule([y, ir.grad(loss, x)])
    readers_of_b = [k for k in sched.kernels if any(buf.node is b for buf in k.reads)]
    assert [k.out.node for k in readers_of_b] == [h]   # the product's own kernel: h's buffer
    assert {buf.node for buf in readers_of_b[0].reads} == {x, w, b}
