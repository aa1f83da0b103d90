"""Flash attention (compiler/attention.py, backend/flash.py): the primitive graph of attention is
found in its written forms and replaced by the FUSED kernels; the rewritten graph, evaluated by
the reference (which runs the FUSED kernels' math in f64), agrees with the graph it came from,
gradients included; forms that are not attention are left alone; the CUDA source builds for
sm_86 and sm_90a; and on a GPU, the kernels agree with the reference and PyTorch and hold no
S x S buffer."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from ember import dtype as dt
from ember import ir, ref, runners
from ember.compiler import attention, autodiff
from ember.ir import Node, Op, toposort

from .cuda_compile import COMPILER, NVCC, compile_cuda, ptx_counts, spills
from .randprog import compare
from .test_contractions import matmul, t


def softmax(s: Node) -> Node:
    """As Tensor.softmax writes it: exp(x) = exp2(x * log2 e)."""
    ax = len(s.shape) - 1
    m = ir.expand(ir.reduce(Op.RMAX, s, (ax,)), s.shape)
    e = ir.unary(Op.EXP2, ir.binary(Op.MUL, ir.binary(Op.SUB, s, m), ir.const(1 / math.log(2), s.dtype, s.shape)))
    return ir.binary(Op.DIV, e, ir.expand(ir.reduce(Op.SUM, e, (ax,)), s.shape))


def causal(s: Node, fill: float = -math.inf) -> Node:
    """where(j <= i, s, fill) from two iotas, as scaled_dot_product_attention writes it."""
    rows, cols = (ir.iota(dt.i64, s.shape[-2:], a) for a in (0, 1))
    keep = ir.binary(Op.CMPEQ, ir.binary(Op.CMPLT, rows, cols), ir.const(False, dt.bool_, s.shape[-2:]))
    return ir.where(ir.expand(ir.reshape(keep, (1,) * (len(s.shape) - 2) + s.shape[-2:]), s.shape), s,
                    ir.const(fill, s.dtype, s.shape))


def cast(x: Node, d: dt.DType) -> Node:
    return x if x.dtype is d else ir.unary(Op.CAST, x, d)


def attention_graph(q: Node, k: Node, v: Node, mask: bool, low: dt.DType, scale: float | None = None,
                    fill: float = -math.inf) -> Node:
    """softmax(q k^T * scale [masked]) v with the matmuls on `low` operands and the softmax in
    q's dtype (f32 params: autocast's form; bf16 params: everything bf16)."""
    hi = q.dtype
    d = q.shape[-1]
    s = cast(matmul(cast(q, low), t(cast(k, low))), hi)
    s = ir.binary(Op.MUL, s, ir.const(scale or 1 / math.sqrt(d), hi, s.shape))
    p = softmax(causal(s, fill) if mask else s)
    return cast(matmul(cast(p, low), cast(v, low)), hi)


def fused_kinds(outputs: list[Node]) -> list[str]:
    return sorted(n.arg[0] for n in toposort(autodiff.expand_grads(attention.fuse(outputs))) if n.op is Op.FUSED)


def inputs_for(outputs: list[Node], seed: int = 0) -> dict[Node, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = [n for n in toposort(outputs) if n.op is Op.PARAM]
    return {p: ref.cast(rng.standard_normal(p.shape), dt.f64, p.dtype) for p in params}


def loss_and_grads(o: Node, params: list[Node]) -> list[Node]:
    w = ir.param("w", o.dtype, o.shape)   # a weighted sum: every output element gets its own gradient
    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, o, w), tuple(range(len(o.shape))))
    return [o] + [ir.grad(loss, p) for p in params]


CASES = {
    # name: (q shape, k/v shape, mask, param dtype, operand dtype)
    "autocast_causal": ((2, 3, 80, 64), (2, 3, 80, 64), True, dt.f32, dt.bf16),
    "autocast_full": ((1, 2, 48, 64), (1, 2, 100, 64), False, dt.f32, dt.bf16),   # T != S, batch of 1
    "f16_causal_d128": ((2, 70, 128), (2, 70, 128), True, dt.f16, dt.f16),         # one batch axis, odd T
    "bf16_causal": ((1, 2, 65, 64), (1, 2, 65, 64), True, dt.bf16, dt.bf16),
    "bf16_heads": ((2, 2, 65, 64), (2, 2, 65, 64), True, dt.bf16, dt.bf16),   # q, k, v read in place (below)
    "f32_causal": ((2, 3, 80, 64), (2, 3, 80, 64), True, dt.f32, dt.f32),         # CUDA cores, no rounding
    "f32_full_d128": ((1, 2, 48, 128), (1, 2, 100, 128), False, dt.f32, dt.f32),
    "f32_heads": ((2, 2, 37, 64), (2, 2, 37, 64), True, dt.f32, dt.f32),
    "f32_causal_t_lt_s": ((1, 2, 40, 64), (1, 2, 72, 64), True, dt.f32, dt.f32),  # keys past every query
}
# the other head sizes (attention.HEAD_DIMS), each on tensor cores and on CUDA cores; S never a
# multiple of a tile
HEAD_CASES = {
    "bf16_causal_d32": ((1, 2, 70, 32), (1, 2, 70, 32), True, dt.bf16, dt.bf16),
    "autocast_full_d80": ((1, 2, 48, 80), (1, 2, 100, 80), False, dt.f32, dt.bf16),   # T != S
    "f16_causal_d96": ((2, 70, 96), (2, 70, 96), True, dt.f16, dt.f16),
    "bf16_causal_d256": ((1, 2, 65, 256), (1, 2, 65, 256), True, dt.bf16, dt.bf16),
    "f32_causal_d32": ((1, 2, 70, 32), (1, 2, 70, 32), True, dt.f32, dt.f32),
    "f32_full_d80": ((1, 2, 48, 80), (1, 2, 100, 80), False, dt.f32, dt.f32),
    "f32_causal_d96": ((2, 37, 96), (2, 37, 96), True, dt.f32, dt.f32),
    "f32_causal_d256": ((1, 2, 40, 256), (1, 2, 40, 256), True, dt.f32, dt.f32),
}
ALL_CASES = {**CASES, **HEAD_CASES}


def case(name: str) -> tuple[list[Node], list[Node]]:
    qs, ks, mask, hi, low = ALL_CASES[name]
    if name.endswith("_heads"):   # the heads of one [B, T, 3 H D] projection, as a GPT's attention
        b, h, t_len, d = qs
        x = ir.param("x", hi, (b, t_len, 3 * h * d))
        q, k, v = (ir.permute(ir.reshape(ir.shrink(x, (0, 0, i * h * d), (b, t_len, (i + 1) * h * d)),
                                         (b, t_len, h, d)), (0, 2, 1, 3)) for i in range(3))
        return loss_and_grads(attention_graph(q, k, v, mask, low), [x]), [x]
    q, k, v = ir.param("q", hi, qs), ir.param("k", hi, ks), ir.param("v", hi, ks)
    return loss_and_grads(attention_graph(q, k, v, mask, low), [q, k, v]), [q, k, v]


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_attention_and_its_gradient_are_fused(name: str) -> None:
    outputs, _ = case(name)
    assert fused_kinds(outputs) == ["attention", "attention_dkdv", "attention_dq"]


@pytest.mark.parametrize("low", [dt.bf16, dt.f16, dt.f32])
def test_a_forward_with_no_gradient_returns_o_alone(low: dt.DType, tmp_path: Path) -> None:
    """No gradient in the graph: 16-bit operands give o alone, in their dtype, from one kernel
    (no conversion after it); f32 keeps o beside the logsumexp. Both match the graph, and the
    kernels build for sm_86 and sm_90a."""
    from ember.backend import cuda
    q, k, v = (ir.param(n, low, (2, 3, 80, 64)) for n in "qkv")
    outputs = [attention_graph(q, k, v, True, low)]
    fused = attention.fuse(outputs)
    (node,) = [n for n in toposort(fused) if n.op is Op.FUSED]
    assert node.dtype is low and node.numel == 6 * 80 * (65 if low is dt.f32 else 64)
    inputs = inputs_for(outputs)
    assert compare(outputs, ref.evaluate(fused, inputs), ref.evaluate(outputs, inputs), precision=low) is None
    if low is not dt.f32:
        assert [k.kind for k in cuda.prepare(outputs, "sm_90a").kernels] == ["attention"]
    for arch in ["sm_86", "sm_90a"] if COMPILER is not None else []:
        assert compile_cuda(cuda.render(cuda.prepare(outputs, arch)), arch, tmp_path) is None


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_fused_graph_matches_the_graph_it_came_from(name: str) -> None:
    """The rewrite's plumbing (axes, permutes, scale, mask, vjp) on the reference evaluator: the
    FUSED nodes run in f64 there, so only the graph's own bf16/f16 roundings differ."""
    outputs, _ = case(name)
    inputs = inputs_for(outputs)
    want = ref.evaluate(outputs, inputs)
    got = ref.evaluate(autodiff.expand_grads(attention.fuse(outputs)), inputs)
    assert compare(outputs, got, want, precision=ALL_CASES[name][4]) is None


def test_layouts_of_the_products_do_not_matter() -> None:
    """q k^T written with k already transposed, and the contraction axis last."""
    q, k, v = (ir.param(n, dt.bf16, (2, 32, 64)) for n in "qkv")
    qe = ir.expand(ir.reshape(q, (2, 32, 1, 64)), (2, 32, 32, 64))     # [b, i, j, d]
    ke = ir.expand(ir.reshape(k, (2, 1, 32, 64)), (2, 32, 32, 64))
    s = ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, qe, ke), (3,)), (2, 32, 32))
    s = ir.binary(Op.MUL, s, ir.const(0.125, dt.bf16, s.shape))
    o = matmul(softmax(causal(s)), v)
    outputs = loss_and_grads(o, [q, k, v])
    assert fused_kinds(outputs) == ["attention", "attention_dkdv", "attention_dq"]
    inputs = inputs_for(outputs, 1)
    got = ref.evaluate(autodiff.expand_grads(attention.fuse(outputs)), inputs)
    assert compare(outputs, got, ref.evaluate(outputs, inputs)) is None


@pytest.mark.parametrize("autocast", [True, False])
def test_frontend_forms_are_fused(autocast: bool) -> None:
    """nn.CausalSelfAttention's causal_attention (mask value -1e9) and F.scaled_dot_product_attention,
    under autocast (bf16 operands) and in f32."""
    import ember
    from ember import functional as F
    from ember import nn
    from ember import tensor as T
    rng = np.random.default_rng(0)
    q, k, v = (T.Tensor(rng.standard_normal((2, 2, 40, 64)).astype(np.float32)) for _ in range(3))
    with ember.autocast("bfloat16", enabled=autocast):
        forms = [nn.causal_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 F.scaled_dot_product_attention(q, k, v, scale=0.3)]
    for o in forms:
        assert fused_kinds([o.node]) == ["attention"]
        inputs = inputs_for([o.node])
        got = ref.evaluate(attention.fuse([o.node]), inputs)
        assert compare([o.node], got, ref.evaluate([o.node], inputs), precision=dt.bf16 if autocast else None) is None


def _scored(what: str, hi: dt.DType, low: dt.DType, d: int) -> tuple[Node, list[Node]]:
    """Attention over [2, 40, d] whose scores are written in a way of `what`."""
    q, k, v = (ir.param(n, hi, (2, 40, d)) for n in "qkv")
    if what in ("strict_mask", "additive_mask", "bias_with_grad", "transposed", "flipped"):
        s = cast(matmul(cast(q, low), t(cast(k, low))), hi)
        rows, cols = (ir.iota(dt.i64, (40, 40), a) for a in (0, 1))
        bias = ir.param("bias", hi, s.shape)
        if what == "strict_mask":   # j < i: the first row has no key (NaN, as the graph says)
            s = ir.where(ir.expand(ir.reshape(ir.binary(Op.CMPLT, cols, rows), (1, 40, 40)), s.shape), s,
                         ir.const(-math.inf, hi, s.shape))
        elif what == "transposed":   # s + s^T: a score reads another position's
            s = ir.binary(Op.ADD, s, ir.permute(s, (0, 2, 1)))
        elif what == "flipped":   # the scores reversed along the keys
            s = ir.flip(s, (2,))
        else:
            s = ir.binary(Op.ADD, s, bias)
        o = cast(matmul(cast(softmax(s), low), cast(v, low)), hi)
        return o, [q, k, v, bias] if what == "bias_with_grad" else [q, k, v]
    o = attention_graph(q, k, v, True, low, scale=-0.1 if what == "negative_scale" else None,
                        fill=-100.0 if what == "small_fill" else -math.inf)
    return o, [q, k, v]


@pytest.mark.parametrize("what", ["strict_mask", "additive_mask", "small_fill", "negative_scale"])
def test_any_elementwise_score_is_fused(what: str) -> None:
    """Masks of any iota condition, a bias param, any mask constant and any scale: the score
    graph takes them, forward and backward, on bf16 and f32 operands, and matches the graph on
    the reference (f32: the graph's own roundings are f32's). A row with no key (strict_mask's
    first) is NaN, as in the graph; its gradients are NaN too (PyTorch's as well), where the
    graph's where-rule gives the masked scores none: forward only there."""
    for low in (dt.bf16, dt.f32):
        o, params = _scored(what, dt.f32, low, 64)
        outputs = [o] if what == "strict_mask" else loss_and_grads(o, params)
        assert fused_kinds(outputs) == (["attention"] if what == "strict_mask" else
                                        ["attention", "attention_dkdv", "attention_dq"])
    inputs = inputs_for(outputs, 4)
    got = ref.evaluate(autodiff.expand_grads(attention.fuse(outputs)), inputs)
    assert compare(outputs, got, ref.evaluate(outputs, inputs)) is None


@pytest.mark.parametrize("what", ["f64", "head_dim_48", "grad_of_grad", "transposed", "flipped", "bias_with_grad"])
def test_what_is_not_flash_attention_is_left_alone(what: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """Not fused, each with an EMBER_DEBUG=1 line saying why where the softmax was found: scores
    that read other positions' scores, a gradient asked of the score graph's bias."""
    monkeypatch.setenv("EMBER_DEBUG", "1")
    hi, low, d = (dt.f64, dt.f64, 64) if what == "f64" else (dt.f32, dt.bf16, 48 if what == "head_dim_48" else 64)
    o, params = _scored(what, hi, low, d)
    outputs = [o]
    if what == "grad_of_grad":
        g = ir.grad(ir.reduce(Op.SUM, o, (0, 1, 2)), params[0])
        outputs = [ir.grad(ir.reduce(Op.SUM, ir.binary(Op.MUL, g, g), (0, 1, 2)), params[2])]
    elif what == "bias_with_grad":
        outputs = loss_and_grads(o, params)
    assert fused_kinds(outputs) == []
    why = {"head_dim_48": "head sizes 48", "transposed": "other positions", "flipped": "no elementwise function",
           "bias_with_grad": "gradient is taken through the score graph"}
    if what in why:
        assert why[what] in capsys.readouterr().err


@pytest.mark.skipif(COMPILER is None, reason="neither nvcc nor NVRTC is installed")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
def test_flash_source_compiles(arch: str, tmp_path: Path) -> None:
    from ember.backend import cuda
    outputs = [o for name in CASES for o in case(name)[0]]
    outputs.append(matmul(ir.param("a", dt.bf16, (64, 64)), ir.param("b", dt.bf16, (64, 64))))  # a tensor-core neighbour
    sched = cuda.prepare(outputs, arch)
    assert sum(k.fused is not None for k in sched.kernels) == 3 * len(CASES)
    src = cuda.render(sched)
    assert ("struct EmberWg<true>" in src) == (arch == "sm_90a")   # every flash product on wgmma there
    err = compile_cuda(src, arch, tmp_path)
    assert err is None, err


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_sm86_forward_reads_its_q_fragments_once(tmp_path: Path) -> None:
    """The mma.sync forward (the course's sm_86 kernels) is bound by shared-memory reads: at D = 64
    a warp keeps q's fragments in registers, loaded once, and each v fragment serves both of its
    row tiles: 40 ldmatrix in the kernel's code for its 128 mma (56 before: 8 of q each tile and
    v's 16 twice)."""
    from ember.backend import cuda
    q, k, v = (ir.param(n, dt.bf16, (2, 4, 1024, 64)) for n in "qkv")
    sched = cuda.prepare([attention_graph(q, k, v, False, dt.bf16)], "sm_86")
    (fwd,) = [kn.name for kn in sched.kernels if kn.fused is not None]
    counts = ptx_counts(cuda.render(sched), "sm_86", tmp_path, ("ldmatrix", "mma.sync"))[fwd]
    assert counts == {"ldmatrix": 40, "mma.sync": 128}, counts


@pytest.mark.parametrize("low", [dt.bf16, dt.f32])
def test_no_score_sized_buffer_is_planned(low: dt.DType) -> None:
    """Causal attention with S = 1024, autocast's bf16 or f32 throughout: forward and backward
    hold O(S * D) values, never S x S."""
    from ember.backend import cuda
    q, k, v = (ir.param(n, dt.f32, (1, 2, 1024, 64)) for n in "qkv")
    outputs = loss_and_grads(attention_graph(q, k, v, True, low), [q, k, v])
    sched = cuda.prepare(outputs, "sm_90a")
    assert max(b.size for b in sched.buffers) < 1024 * 1024
    assert len(sched.kernels) <= 14, [k.name for k in sched.kernels]


@pytest.mark.parametrize("hi", [dt.f32, dt.bf16])
def test_products_around_attention_keep_their_tensor_cores(hi: dt.DType) -> None:
    """GPT-2's attention between its projections (q, k, v heads of one x @ Wqkv; o's heads put
    side by side, then @ Wproj): the backward's do is the projection's dx seen by heads, and a
    product stored through that permute lost its tensor cores (a "reduce" kernel of 19 GFLOP
    in GPT-2's step, 20 ms): every product is a contraction kernel."""
    from ember.backend import cuda
    b, h, tl, d = 2, 2, 128, 64
    x, wqkv, wproj = ir.param("x", hi, (b * tl, h * d)), ir.param("wqkv", hi, (h * d, 3 * h * d)), \
        ir.param("wproj", hi, (h * d, h * d))
    qkv = cast(matmul(cast(x, dt.bf16), cast(wqkv, dt.bf16)), hi)
    heads = ir.permute(ir.reshape(qkv, (b, tl, 3, h, d)), (2, 0, 3, 1, 4))
    q, k, v = (ir.reshape(ir.shrink(heads, (i, 0, 0, 0, 0), (i + 1, b, h, tl, d)), (b, h, tl, d)) for i in range(3))
    o = ir.reshape(ir.permute(attention_graph(q, k, v, True, dt.bf16), (0, 2, 1, 3)), (b * tl, h * d))
    y = cast(matmul(cast(o, dt.bf16), cast(wproj, dt.bf16)), hi)
    sched = cuda.prepare(loss_and_grads(y, [x, wqkv, wproj]), "sm_90a")
    kinds = [k.kind for k in sched.kernels]
    assert kinds.count("attention") == 3 and kinds.count("contraction") == 6, kinds


def _head_plans(arch: str, ws: bool, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The schedule of every HEAD_CASES program, for arch (ws: warp-specialized where it can be)."""
    from ember.backend import cuda
    monkeypatch.setenv("EMBER_FLASH_WS", "1" if ws else "0")
    return cuda.prepare([o for name in HEAD_CASES for o in case(name)[0]], arch)


@pytest.mark.parametrize("arch, ws", [("sm_86", True), ("sm_90a", True), ("sm_90a", False)])
def test_head_sizes_fit_the_target(arch: str, ws: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every head size's flash kernels ask for no more shared memory than a block of the target
    may have (sm_86: 99 KB), and D = 256's dk|dv splits its columns over two blocks (blockIdx.z)
    where the accumulators of 256 columns would not fit in registers (f32: they do)."""
    from ember.backend import cuda, flash
    from ember.target import gpu
    sched = _head_plans(arch, ws, monkeypatch)
    fused = [k for k in sched.kernels if k.fused is not None]
    assert len(fused) == 3 * len(HEAD_CASES)
    for k in fused:
        (_, _, z), _, smem = flash.launch(k, gpu(arch).sms)
        assert smem <= gpu(arch).smem_block, (k.fused[0].arg[0], k.fused[0].srcs[0].shape, smem)
        split = k.fused[0].arg[0] == "attention_dkdv" and k.fused[0].srcs[0].shape[2] == 256 and not flash._f32(k)
        assert z == (2 if split else 1)
    assert cuda.launch_config(fused[0], sched.target)   # the launch takes the plan's grid


def _spill_allowed(k) -> int:  # type: ignore[no-untyped-def]
    """The bytes ptxas may spill in a flash kernel: none, but sm_90a's warp-specialized dk|dv of
    128 accumulator columns (D = 80, 96, 128) at edge shapes keeps one to three values of its tile
    loop in local memory (f16_causal_d128: 8 bytes, one STL and two LDL a tile; D = 128 with T =
    70 and S = 90: 24), as it did before the other head sizes and grouped heads (a known miss)."""
    from ember.backend import flash
    node = k.fused[0]
    return 24 if flash.ws_heads(k) and node.arg[0] == "attention_dkdv" and flash.pitch(node.srcs[0].shape[2], True) == 128 \
        else 0


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch, ws", [("sm_86", True), ("sm_90a", True), ("sm_90a", False)])
def test_head_sizes_compile_without_spills(arch: str, ws: bool, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: the flash kernels of D = 32, 80, 96 and 256 (bf16, f16 and f32) build for sm_86 and
    sm_90a (warp-specialized, and with EMBER_FLASH_WS=0 the cp.async wgmma ones), and ptxas
    spills no register in any of them (but _spill_allowed's: f16 dk|dv at D = 96 spills 8 bytes,
    as D = 128's), nor serializes their wgmma (the forward's pipelined products)."""
    from ember.backend import cuda
    sched = _head_plans(arch, ws, monkeypatch)
    fused = {k.name: k for k in sched.kernels if k.fused is not None}
    serialized: set[str] = set()
    spilled = spills(cuda.render(sched), arch, tmp_path, serialized)
    assert set(fused) <= set(spilled) and {n: spilled[n] for n, k in fused.items() if spilled[n] > _spill_allowed(k)} == {}
    assert not serialized & set(fused)


needs_gpu = pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")


@needs_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_flash_kernels_on_the_gpu_match_the_reference(name: str) -> None:
    from ember.backend import cuda
    outputs, _ = case(name)
    inputs = inputs_for(outputs, 2)
    assert sum(k.fused is not None for k in cuda.prepare(outputs).kernels) == 3
    got = cuda.run_values(outputs, inputs)
    assert compare(outputs, got, ref.evaluate(outputs, inputs), precision=CASES[name][4]) is None
    # and closer still to what the kernels compute (the FUSED nodes in f64)
    fused = ref.evaluate(autodiff.expand_grads(attention.fuse(outputs)), inputs)
    assert compare(outputs, got, fused, precision=CASES[name][4]) is None


def run_on_plan(plan: str, outputs: list[Node], seed: int, flash: int,
                monkeypatch: pytest.MonkeyPatch) -> tuple[dict, Iterator]:
    """The outputs run as one program on a GPU plan ("gpu": its own; "sm_86": the course's, run
    here as a proxy; "ws0": EMBER_FLASH_WS=0's), which has `flash` flash kernels: the inputs,
    and the values in order."""
    from ember.backend import cuda, run_values
    monkeypatch.setenv("EMBER_FLASH_WS", "0" if plan == "ws0" else "1")
    inputs = inputs_for(outputs, seed)
    prog = cuda.CUDAProgram(outputs, plan_arch="sm_86" if plan == "sm_86" else None)
    assert sum(k.fused is not None for k in prog.sched.kernels) == flash
    got = iter(run_values(prog, inputs))
    prog.free()
    return inputs, got


@needs_gpu
@pytest.mark.parametrize("plan", ["gpu", "sm_86", "ws0"])
def test_head_sizes_on_the_gpu_match_the_reference(plan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """D = 32, 80, 96 and 256 on the GPU's own plans (sm_90a: warp-specialized), on sm_86's
    (mma.sync, run here as the course's proxy) and with EMBER_FLASH_WS=0 (sm_90a's cp.async
    wgmma kernels): forward and the gradients of q, k and v against the reference, one program
    (its kernels compile in parallel)."""
    built = {name: case(name)[0] for name in HEAD_CASES}
    outputs = [o for outs in built.values() for o in outs]
    inputs, got = run_on_plan(plan, outputs, 8, 3 * len(HEAD_CASES), monkeypatch)
    bad = []
    for name, outs in built.items():
        mine = [next(got) for _ in outs]
        want = ref.evaluate(outs, inputs)
        if (err := compare(outs, mine, want, precision=HEAD_CASES[name][4])) is not None:
            bad.append(f"{name}: {err}")
    assert bad == []


@needs_gpu
def test_runs_of_the_persistent_forward_agree() -> None:
    """sm_90a's forward takes its items from a counter in global memory that each launch puts
    back: three runs of one program (300 items, more than the SMs) agree bit for bit, and with
    the reference of the fused graph."""
    from ember.backend import cuda, run_values
    q, k, v = (ir.param(n, dt.bf16, (1, 150, 160, 64)) for n in "qkv")
    outputs = [attention_graph(q, k, v, True, dt.bf16)]
    inputs = inputs_for(outputs, 5)
    prog = cuda.CUDAProgram(outputs)
    runs = [run_values(prog, inputs) for _ in range(3)]
    prog.free()
    assert all(np.array_equal(runs[0][0], again[0]) for again in runs[1:])
    assert compare(outputs, runs[0], ref.evaluate(attention.fuse(outputs), inputs)) is None


@needs_gpu
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_on_the_gpu_matches_pytorch(causal: bool) -> None:
    """bf16 at GPT-2's head shape, forward and backward, against torch's SDPA in f32."""
    torch = pytest.importorskip("torch")
    from ember import functional as F
    from ember import tensor as T
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((2, 4, 300, 64)).astype(np.float32) for _ in range(4)]
    saved = T.context.device
    T.set_default_device("cuda")
    try:
        q, k, v = (T.Tensor(a, requires_grad=True) for a in arrays[:3])
        o = F.scaled_dot_product_attention(q.cast("bfloat16"), k.cast("bfloat16"), v.cast("bfloat16"), is_causal=causal)
        (o.cast("float32") * T.Tensor(arrays[3])).sum().backward()
        mine = [x.numpy() for x in (o, q.grad, k.grad, v.grad)]
    finally:
        T.context.device = saved
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    (to * torch.tensor(arrays[3])).sum().backward()
    for got, theirs in zip(mine, (to, tq.grad, tk.grad, tv.grad)):
        a, b = np.asarray(got, np.float64), theirs.detach().numpy().astype(np.float64)
        assert np.abs(a - b).max() <= 0.03 * np.abs(b).max() + 1e-3


def test_strided_views_of_heads_match_numpy() -> None:
    """lower.strided_view: q, k or v as heads of a [B, T, 3 H D] projection (a window, reshapes,
    a permute) is read in place; every element of the View's formula is numpy's element, and
    layouts a View cannot describe (d not contiguous) or the kernels cannot copy by 16 bytes
    (rows of 4 elements) are refused."""
    from ember.compiler.lower import Buffer, strided_view
    b, t, h, d = 2, 5, 3, 8
    x = ir.param("x", dt.bf16, (b, t, 3 * h * d))
    arr = np.arange(x.numel).reshape(x.shape)
    realized = {x: Buffer(0, dt.bf16, x.numel, "temp", x)}
    for part in range(3):
        s = ir.shrink(x, (0, 0, part * h * d), (b, t, (part + 1) * h * d))
        heads = ir.permute(ir.reshape(s, (b, t, h, d)), (0, 2, 1, 3))
        q = ir.reshape(heads, (b * h, t, d))
        base, view = strided_view(q, realized)
        assert base is x
        want = arr[:, :, part * h * d:(part + 1) * h * d].reshape(b, t, h, d).transpose(0, 2, 1, 3).reshape(b * h, t, d)
        n, r, e = np.meshgrid(np.arange(b * h), np.arange(t), np.arange(d), indexing="ij")
        got = view.offset + (n // view.heads) * view.sb + (n % view.heads) * view.sh + r * view.ld + e
        assert np.array_equal(got, want), (part, view)
    kt = ir.reshape(ir.permute(ir.reshape(x, (b, t, 3 * h, d)), (0, 2, 3, 1)), (b * 3 * h, d, t))   # d strided
    assert strided_view(kt, realized) is None
    y = ir.param("y", dt.bf16, (b, t, 3 * 4))   # heads of 4: rows 8 bytes apart
    realized = {y: Buffer(1, dt.bf16, y.numel, "temp", y)}
    q = ir.reshape(ir.permute(ir.reshape(ir.shrink(y, (0, 0, 0), (b, t, 12)), (b, t, 3, 4)), (0, 2, 1, 3)), (6, t, 4))
    assert strided_view(q, realized) is None


@pytest.mark.parametrize("name", ["bf16_heads", "bf16_causal", "f16_causal_d128"])
def test_tma_layouts_of_the_warp_specialized_kernels(name: str) -> None:
    """sm_90a's flash kernels read q, k, v (and do) by TMA as [N / H, H, rows, D] tensors
    (flash.tma_layouts): every element's offset there is the one the kernels' own addressing
    gives (a View's formula, or [N, rows, D] contiguous)."""
    from ember.backend import cuda, flash
    sched = cuda.prepare(case(name)[0], "sm_90a")
    fused = [k for k in sched.kernels if k.fused is not None]
    assert sorted(k.fused[0].arg[0] for k in fused) == ["attention", "attention_dkdv", "attention_dq"]
    for kernel in fused:
        assert flash.ws_heads(kernel) is not None and flash.launch(kernel, 132)[1] == attention.WS_THREADS
        node, bufs, views = kernel.fused
        for i, (buf, offset, dims, strides) in zip(flash._ws_sources(kernel), flash.tma_layouts(kernel)):
            (n_, rows, d), b, view = node.srcs[i].shape, bufs[i], views[i]
            assert buf == b.id and dims == [d, rows, dims[2], n_ // dims[2]] and dims[2] * dims[3] == n_
            n, r, e = np.meshgrid(np.arange(n_), np.arange(rows), np.arange(d), indexing="ij")
            got = offset + (n // dims[2]) * strides[2] + (n % dims[2]) * strides[1] + r * strides[0] + e
            want = (n * rows * d + r * d + e) if view is None else \
                view.offset + (n // view.heads) * view.sb + (n % view.heads) * view.sh + r * view.ld + e
            assert np.array_equal(got, want), (name, kernel.fused[0].arg[0], i, view)


def test_a_grid_past_the_gpus_limit_is_one_clear_error() -> None:
    """65536 heads x batch is one block too many along the flash kernels' y: said before any launch.
    sm_90a's persistent forward loops over them instead, from one block per SM."""
    from ember.backend import cuda
    q, k, v = (ir.param(n, dt.bf16, (1024, 64, 16, 64)) for n in "qkv")
    sched = cuda.prepare([attention_graph(q, k, v, True, dt.bf16)], "sm_86")
    configs = [cuda.launch_config(k, sched.target) for k in sched.kernels]
    assert max(gy for (_, gy, _), _, _ in configs) == 65536
    with pytest.raises(RuntimeError, match="allows 65535 along y and z"):
        cuda.check_grids(sched.kernels, configs)
    small = cuda.prepare([attention_graph(*(ir.param(n, dt.bf16, (2, 4, 16, 64)) for n in "qkv"), True, dt.bf16)], "sm_86")
    cuda.check_grids(small.kernels, [cuda.launch_config(k, small.target) for k in small.kernels])
    hopper = cuda.prepare([attention_graph(q, k, v, True, dt.bf16)], "sm_90a")
    configs = [cuda.launch_config(k, hopper.target) for k in hopper.kernels if k.fused is not None]
    assert configs and all(grid == (132, 1, 1) for grid, _, _ in configs)
    cuda.check_grids(hopper.kernels, [cuda.launch_config(k, hopper.target) for k in hopper.kernels])


def test_flash_plans_are_chosen_before_the_schedule_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    """optimize gives each flash kernel its FlashPlan (the warp-specialized one on sm_90a, the
    cp.async one with EMBER_FLASH_WS=0, a cached schedule missing for the other), and
    EMBER_DEBUG=2 prints the plans."""
    from ember.backend import cuda
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    outputs = case("bf16_heads")[0]

    def plans(arch: str) -> list:
        return [k.plan for k in cuda.prepare(outputs, arch).kernels if k.fused is not None]
    assert all(isinstance(p, attention.FlashPlan) and p.wgmma and p.heads for p in plans("sm_90a"))
    monkeypatch.setenv("EMBER_FLASH_WS", "0")
    assert all(p.wgmma and not p.heads for p in plans("sm_90a"))
    monkeypatch.setenv("EMBER_DEBUG", "2")
    assert not any(p.wgmma for p in plans("sm_86"))
    assert "attention: flash: 128 rows, tiles of 64, 128 threads, mma.sync" in capsys.readouterr().err


# ------------------------------------------------------------- the score forms of issue 30

VARIANTS = ["causal", "key_padding", "alibi", "softcap", "window", "prefix", "doubled", "q_prescaled"]
WINDOW, CAP = 100, 20.0


def variant(name: str, b: int = 2, h: int = 2, t_len: int = 80, s_len: int = 80, d: int = 64,
            low: dt.DType = dt.bf16) -> tuple[list[Node], list[Node]]:
    """The variant as a program writes it with the frontend (F.scaled_dot_product_attention,
    F.flex_attention, Tensor ops) on [B, H, T, D] params, forward and the gradients of q, k and
    v; and those three params. Key padding reads a bool param [B, S], ALiBi its slopes [H]."""
    from ember import functional as F
    from ember import tensor as T
    q, k, v = (ir.param(n, low, (b, h, x, d)) for n, x in zip("qkv", (t_len, s_len, s_len)))
    tq, tk, tv = (T.Tensor(x) for x in (q, k, v))
    scale = 1 / math.sqrt(d)
    if name == "causal":
        o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    elif name == "key_padding":
        pad = T.Tensor(ir.param("pad", dt.bool_, (b, s_len)))
        o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=pad.reshape(b, 1, 1, s_len))
    elif name == "alibi":
        slopes = T.Tensor(ir.param("slopes", dt.f32, (h,)))
        o = F.flex_attention(tq, tk, tv, score_mod=lambda s, _b, _h, i, j: s + slopes.reshape(1, h, 1, 1) * (j - i))
    elif name == "softcap":
        o = F.flex_attention(tq, tk, tv, score_mod=lambda s, *_: (s / CAP).tanh() * CAP)
    elif name == "window":
        o = F.flex_attention(tq, tk, tv, mask_mod=lambda _b, _h, i, j: (j <= i) & (i - j < WINDOW))
    elif name == "prefix":
        o = F.flex_attention(tq, tk, tv, mask_mod=lambda _b, _h, i, j: (j <= i) | (j < WINDOW))
    elif name == "doubled":
        sc = tq @ tk.transpose(-2, -1)
        o = ((sc + sc) * (0.5 * scale)).softmax(-1) @ tv
    else:
        o = F.scaled_dot_product_attention(tq * scale, tk, tv, is_causal=True, scale=1.0)
    return loss_and_grads(o.node, [q, k, v]), [q, k, v]


@pytest.mark.parametrize("name", VARIANTS)
def test_score_forms_take_the_flash_path(name: str) -> None:
    """Every variant fuses (bf16, f16 and f32 operands): three flash kernels on sm_86 and sm_90a,
    no S x S buffer (S = 1024); on f32 operands (the graph's roundings are f32's) the fused graph
    matches the graph, values and gradients."""
    from ember.backend import cuda
    for low in (dt.bf16, dt.f16, dt.f32):
        assert fused_kinds(variant(name, low=low)[0]) == ["attention", "attention_dkdv", "attention_dq"], low
    big = variant(name, 1, 2, 1024, 1024)[0]
    for arch in ("sm_86", "sm_90a"):
        sched = cuda.prepare(big, arch)
        assert sum(k.fused is not None for k in sched.kernels) == 3
        assert max(b.size for b in sched.buffers) < 1024 * 1024
    outputs, _ = variant(name, low=dt.f32)
    inputs = inputs_for(outputs, 6)
    got = ref.evaluate(autodiff.expand_grads(attention.fuse(outputs)), inputs)
    assert compare(outputs, got, ref.evaluate(outputs, inputs)) is None


def test_iota_masks_give_each_block_its_tiles() -> None:
    """The score graph's iota masks as linear formulas: a sliding window is one, the and of two
    atoms (not i < j, i - j - W < 0), which the kernels read as the tiles each block visits; a
    param mask (key padding) is per element, no formula; plain scores have none."""
    from ember.backend import cuda, flash
    got = {}
    for name in ("window", "key_padding", "doubled"):
        sched = cuda.prepare(variant(name, 1, 2, 256, 256)[0][:1], "sm_86")
        (k,) = [k for k in sched.kernels if k.fused is not None]
        got[name] = flash.scores(k).masks
    ((op, first, second),) = got["window"]
    assert op == "and" and first[0] == "not" and first[1][2] == 0 and second[0] == "lt" and second[2] == -WINDOW
    assert got["key_padding"] == () and got["doubled"] == ()


def test_score_functor_factors_its_scale() -> None:
    """A score that is a positive constant times the rest (plain scores: log2 e / sqrt(D), masks
    of -inf through) hands the kernels that constant apart (SM::scale), so that they fuse it into
    exp2(fma(part, scale, -max)); a graph that reads sources (key padding) keeps its product."""
    from ember.backend import cuda
    got = {}
    for name in ("causal", "key_padding"):
        sched = cuda.prepare(variant(name, 1, 2, 256, 256)[0][:1], "sm_86")
        src = cuda.render(sched)
        (k,) = [k for k in sched.kernels if k.fused is not None]
        start = src.index(f"struct EmberScore_{k.name} ")
        got[name] = src[start:src.index("};", start)]
    def scale(text: str) -> float:   # the functor's constant, as its hex literal
        return float.fromhex(text.split("scale = (")[1].split("f)")[0])
    assert scale(got["causal"]) == pytest.approx(math.log2(math.e) / 8, rel=0.01)
    assert "(-INFINITY)" in got["causal"].split("float part_edge")[1].split("part_inner")[0]   # the mask, over scale
    assert "part_inner(float s, int n, int i, int j) const {\n    return s;" in got["causal"]
    assert scale(got["key_padding"]) == 1.0


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
@pytest.mark.parametrize("low", [dt.bf16, dt.f16])
def test_score_forms_compile_without_spills(arch: str, low: dt.DType, tmp_path: Path) -> None:
    """CI: every variant's flash kernels build for sm_86 (mma.sync) and sm_90a (warp-specialized)
    and ptxas spills no register in them (the score graph adds registers; FA3's consumers have 240)."""
    from ember.backend import cuda
    for names, most in ((VARIANTS, 0), (["softcap"], 128)):
        # softcap's backward spills: tanh masks its polynomial's input (so that its gradient at
        # +-inf is finite), one more live value in the tile loop; sm_86's dq 4 bytes, sm_90a's
        # dk|dv 68 (its consumers are at 240 registers). A known miss (docs/performance.md).
        outputs = [o for name in names if name != "softcap" or most
                   for o in variant(name, 2, 4, 256, 256, low=low)[0]]
        sched = cuda.prepare(outputs, arch)
        flash_kernels = [k.name for k in sched.kernels if k.fused is not None]
        assert len(flash_kernels) == 3 * (len(names) - (not most))
        spilled = spills(cuda.render(sched), arch, tmp_path)
        assert {k: spilled.get(k, 0) for k in flash_kernels if spilled.get(k, 0) > most} == {}


def _torch_variant(name: str, q, k, v, pad, slopes):  # type: ignore[no-untyped-def]
    """The variant in PyTorch's math, f64 on the CPU: scores, mod, mask, softmax."""
    import torch
    t_len, s_len = q.shape[2], k.shape[2]
    i, j = torch.arange(t_len)[:, None], torch.arange(s_len)[None, :]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = torch.ones(t_len, s_len, dtype=torch.bool)
    if name in ("causal", "q_prescaled"):
        keep = j <= i
    elif name == "key_padding":
        keep = pad[:, None, None, :]
    elif name == "alibi":
        s = s + slopes[None, :, None, None] * (j - i)
    elif name == "softcap":
        s = torch.tanh(s / CAP) * CAP
    elif name == "window":
        keep = (j <= i) & (i - j < WINDOW)
    elif name == "prefix":
        keep = (j <= i) | (j < WINDOW)
    return torch.softmax(s.masked_fill(~keep, -math.inf), -1) @ v


@needs_gpu
@pytest.mark.parametrize("low, plan", [(dt.bf16, "gpu"), (dt.f16, "gpu"), (dt.f32, "gpu"), (dt.bf16, "sm_86")])
def test_score_forms_on_the_gpu_match_pytorch(low: dt.DType, plan: str) -> None:
    """Every variant's flash kernels (three each, on the GPU's own plans, or sm_86's: the course's
    mma.sync kernels, whose q fragments stay in registers for the variants that read no source;
    one program, so that its kernels compile in parallel) against PyTorch's math in f64: forward
    and the gradients of q, k and v, at S = 300 (edge tiles, skipped tiles of the window, keys
    padded at 290 and 150)."""
    torch = pytest.importorskip("torch")
    from ember.backend import cuda, run_values
    b, h, n, d = 2, 4, 300, 64
    built = {name: variant(name, b, h, n, n, d, low) for name in VARIANTS}
    outputs = [o for outs, _ in built.values() for o in outs]
    prog = cuda.CUDAProgram(outputs, plan_arch="sm_86" if plan == "sm_86" else None)
    assert sum(kk.fused is not None for kk in prog.sched.kernels) == 3 * len(VARIANTS)
    rng = np.random.default_rng(7)
    pad = np.arange(n)[None, :] < np.array([290, 150])[:, None]
    slopes = 2.0 ** (-8.0 * np.arange(1, h + 1) / h)
    params = {p.arg: p for p in toposort(outputs) if p.op is Op.PARAM}
    inputs = {p: ref.cast(rng.standard_normal(p.shape), dt.f64, p.dtype) for p in params.values() if p.dtype.is_float}
    inputs[params["pad"]], inputs[params["slopes"]] = pad, slopes.astype(np.float32)
    got = iter(run_values(prog, inputs))
    prog.free()
    bad = []
    for name, (outs, (q, k, v)) in built.items():
        tq, tk, tv = (torch.tensor(np.asarray(inputs[x], np.float64), requires_grad=True) for x in (q, k, v))
        to = _torch_variant(name, tq, tk, tv, torch.tensor(pad), torch.tensor(slopes))
        (to * torch.tensor(np.asarray(inputs[params["w"]], np.float64))).sum().backward()
        for what, theirs in zip(("o", "dq", "dk", "dv"), (to, tq.grad, tk.grad, tv.grad)):
            a, want = np.asarray(next(got), np.float64), theirs.detach().numpy()
            err = np.abs(a - want).max() / np.abs(want).max()
            if not err <= 0.03:
                bad.append(f"{name} {what}: {err:.3g} of the largest value")
    assert bad == []


# ------------------------------------------------------------- grouped-query attention (issue 30)

GQA = {   # name: (B, q heads, k/v heads, T, S, D, operand dtype, causal, [B, T, H, D] params)
    "gqa_4to1_bf16": (2, 8, 2, 100, 100, 64, dt.bf16, True, False),
    "mqa_bf16": (1, 4, 1, 70, 90, 128, dt.bf16, False, False),   # one k/v head, T != S
    "gqa_3to1_thd_f16": (1, 6, 2, 65, 65, 80, dt.f16, True, True),   # heads of [B, T, H, D] params
    "gqa_2to1_f32": (2, 4, 2, 37, 37, 64, dt.f32, True, False),
}


def gqa(name: str, low: dt.DType | None = None) -> tuple[list[Node], list[Node]]:
    """F.scaled_dot_product_attention(..., enable_gqa=True) over params whose k and v have fewer
    heads (repeat_interleave's expand in the graph), forward and the gradients of q, k and v;
    low: another dtype for the params."""
    from ember import functional as F
    from ember import tensor as T
    b, h, hk, t_len, s_len, d, own, is_causal, thd = GQA[name]
    low = low or own
    shapes = [(b, t_len, h, d), (b, s_len, hk, d), (b, s_len, hk, d)] if thd else \
        [(b, h, t_len, d), (b, hk, s_len, d), (b, hk, s_len, d)]
    params = [ir.param(n, low, sh) for n, sh in zip("qkv", shapes)]
    tq, tk, tv = (T.Tensor(p).transpose(1, 2) if thd else T.Tensor(p) for p in params)
    o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal, enable_gqa=True)
    return loss_and_grads(o.node, params), params


@pytest.mark.parametrize("name", list(GQA))
def test_grouped_heads_take_the_flash_path(name: str) -> None:
    """The flash kernels read k and v with their own heads (N / group batches, at n // group):
    no expanded copy is made, a forward is one kernel, and the fused graph (the dk|dv kernel's
    per-q-head shares summed over each group) matches the graph on the reference, values and
    gradients."""
    from ember.backend import cuda
    outputs, (q, k, v) = gqa(name)
    b, h, hk = GQA[name][:3]
    fused = autodiff.expand_grads(attention.fuse(outputs))
    nodes = [n for n in toposort(fused) if n.op is Op.FUSED]
    assert sorted(n.arg[0] for n in nodes) == ["attention", "attention_dkdv", "attention_dq"]
    assert all(n.srcs[0].shape[0] == b * h and n.srcs[1].shape[0] == n.srcs[2].shape[0] == b * hk for n in nodes)
    for arch in ("sm_86", "sm_90a"):   # f32: o is copied out of [N, T, D + 1] beside the logsumexp
        sched = cuda.prepare(outputs[:1], arch)
        assert [kk.kind for kk in sched.kernels] == ["attention"] + ["map"] * (q.dtype is dt.f32), arch
        (flash,) = [kk for kk in sched.kernels if kk.fused is not None]
        assert [bb.size for bb in flash.fused[1][1:3]] == [k.numel, v.numel]   # read as they are
    inputs = inputs_for(outputs, 9)
    got = ref.evaluate(fused, inputs)
    # against the graph in f64 (wide): the graph's own bf16 sum of dk over a group of 4 heads is
    # off by 1% of the largest value, the fused graph's (f32, rounded once) by 0.2%
    assert compare(outputs, got, ref.evaluate(outputs, inputs, wide=True), precision=GQA[name][6]) is None


def test_heads_shared_otherwise_are_expanded() -> None:
    """k and v broadcast over the batch rather than the heads (the broadcast not innermost in
    the flash kernels' N) keep their expanded copy, and stay correct."""
    from ember import functional as F
    from ember import tensor as T
    q = ir.param("q", dt.f32, (2, 3, 40, 64))
    k, v = (ir.param(n, dt.f32, (1, 3, 40, 64)) for n in "kv")
    o = F.scaled_dot_product_attention(T.Tensor(q), T.Tensor(k).expand(2, 3, 40, 64), T.Tensor(v).expand(2, 3, 40, 64))
    outputs = loss_and_grads(o.node, [q, k, v])
    fused = autodiff.expand_grads(attention.fuse(outputs))
    assert all(n.srcs[1].shape[0] == 6 for n in toposort(fused) if n.op is Op.FUSED)
    inputs = inputs_for(outputs, 10)
    assert compare(outputs, ref.evaluate(fused, inputs), ref.evaluate(outputs, inputs)) is None


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch, ws", [("sm_86", True), ("sm_90a", True), ("sm_90a", False)])
def test_grouped_heads_compile_without_spills(arch: str, ws: bool, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: every GQA case's flash kernels build for sm_86 and sm_90a (warp-specialized: k's and
    v's tensor maps with their own heads; EMBER_FLASH_WS=0: cp.async) with no spill but
    _spill_allowed's (D = 128's dk|dv at T = 70, S = 90: 24 bytes, with or without shared heads)."""
    from ember.backend import cuda, flash
    monkeypatch.setenv("EMBER_FLASH_WS", "1" if ws else "0")
    sched = cuda.prepare([o for name in GQA for o in gqa(name)[0]], arch)
    fused = {k.name: k for k in sched.kernels if k.fused is not None}
    assert len(fused) == 3 * len(GQA)
    assert all(bool(flash.ws_heads(k)) == (ws and arch == "sm_90a" and not flash._f32(k)) for k in fused.values())
    spilled = spills(cuda.render(sched), arch, tmp_path)
    assert {n: spilled[n] for n, k in fused.items() if spilled[n] > _spill_allowed(k)} == {}


@pytest.mark.parametrize("name", ["gqa_4to1_bf16", "gqa_3to1_thd_f16"])
def test_tma_layouts_of_shared_heads(name: str) -> None:
    """sm_90a's tensor maps of k and v count their own heads (q's over the group): every
    element's offset is the one of the kernels' addressing, at batch n // group."""
    from ember.backend import cuda, flash
    sched = cuda.prepare(gqa(name)[0], "sm_90a")
    for kernel in [k for k in sched.kernels if k.fused is not None]:
        node, bufs, views = kernel.fused
        for i, (buf, offset, dims, strides) in zip(flash._ws_sources(kernel), flash.tma_layouts(kernel)):
            (n_, rows, d), view = node.srcs[i].shape, views[i]
            assert dims[2] * dims[3] == n_ and dims[2] == (flash.kv_heads(kernel) if i in (1, 2) else flash.ws_heads(kernel))
            n, r, e = np.meshgrid(np.arange(n_), np.arange(rows), np.arange(d), indexing="ij")
            got = offset + (n // dims[2]) * strides[2] + (n % dims[2]) * strides[1] + r * strides[0] + e
            want = (n * rows * d + r * d + e) if view is None else \
                view.offset + (n // view.heads) * view.sb + (n % view.heads) * view.sh + r * view.ld + e
            assert np.array_equal(got, want), (name, node.arg[0], i, view)


@needs_gpu
@pytest.mark.parametrize("plan", ["gpu", "sm_86", "ws0"])
def test_grouped_heads_on_the_gpu_match_pytorch(plan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GQA case on the GPU's plans, sm_86's and EMBER_FLASH_WS=0's, against PyTorch's
    SDPA in f64 on k and v repeated over each group (enable_gqa's meaning): forward and the
    gradients of q, k and v (dk and dv summed over each group of q heads)."""
    torch = pytest.importorskip("torch")
    built = {name: gqa(name) for name in GQA}
    outputs = [o for outs, _ in built.values() for o in outs]
    inputs, got = run_on_plan(plan, outputs, 11, 3 * len(GQA), monkeypatch)
    bad = []
    for name, (outs, params) in built.items():
        thd = GQA[name][8]
        tq, tk, tv = (torch.tensor(np.asarray(inputs[p], np.float64), requires_grad=True) for p in params)
        # enable_gqa's meaning: k and v repeated over each group of q heads; o stays [B, H, T, D],
        # as the program's (its params may be [B, T, H, D])
        hq, hk = (x.transpose(1, 2) if thd else x for x in (tq, tk))
        hv = tv.transpose(1, 2) if thd else tv
        group = hq.shape[1] // hk.shape[1]
        to = torch.nn.functional.scaled_dot_product_attention(
            hq, hk.repeat_interleave(group, 1), hv.repeat_interleave(group, 1), is_causal=GQA[name][7])
        w = [p for p in toposort(outs) if p.op is Op.PARAM and p.arg == "w"][0]
        (to * torch.tensor(np.asarray(inputs[w], np.float64))).sum().backward()
        for what, theirs in zip(("o", "dq", "dk", "dv"), (to, tq.grad, tk.grad, tv.grad)):
            a, want = np.asarray(next(got), np.float64), theirs.detach().numpy()
            err = np.abs(a - want).max() / np.abs(want).max()
            if not err <= 0.03:
                bad.append(f"{name} {what}: {err:.3g} of the largest value")
    assert bad == []


# ------------------------------------------------------------- finite differences (issue 30)

@pytest.mark.parametrize("name", [*VARIANTS, "gqa_2to1_f32"])
def test_fused_gradients_are_the_forwards_derivative(name: str) -> None:
    """The fused program's dq, dk and dv (its FUSED nodes on the reference, f32 operands) against
    central differences of the unfused forward in f64, along random directions: the gradients are
    the derivative of what the forward computes, whatever autodiff and PyTorch say. S = 120 so that
    the window (100) and the prefix masks cut inside the rows."""
    def build(low: dt.DType) -> tuple[list[Node], list[Node]]:
        return gqa(name, low) if name in GQA else variant(name, 1, 2, 120, 120, 32, low)
    fused, qkv = build(dt.f32)
    assert fused_kinds(fused) == ["attention", "attention_dkdv", "attention_dq"]
    plain, qkv64 = build(dt.f64)
    rng = np.random.default_rng(11)
    inputs = inputs_for(fused, 3)
    by_name = {p.arg: v for p, v in inputs.items()}
    if "pad" in by_name:   # keys padded from 90 on (a row of the [1, S] mask)
        by_name["pad"] = np.arange(120)[None, :] < 90
    if "slopes" in by_name:
        by_name["slopes"] = (2.0 ** -np.arange(1.0, 3.0)).astype(np.float32)
    inputs = {p: by_name[p.arg] for p in inputs}
    grads = ref.evaluate(autodiff.expand_grads(attention.fuse(fused)), inputs)[1:]
    params64 = {p.arg: p for p in toposort(plain) if p.op is Op.PARAM}
    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, plain[0], params64["w"]), tuple(range(len(plain[0].shape))))
    base = {p: np.asarray(by_name[a], np.float64) if p.dtype is dt.f64 else by_name[a] for a, p in params64.items()}
    step = 1e-5
    for p, g in zip(qkv64, grads):
        for _ in range(2):
            u = rng.standard_normal(p.shape)
            ends = [ref.evaluate([loss], {**base, p: base[p] + sign * step * u})[0] for sign in (1, -1)]
            fd = float(np.asarray(ends[0] - ends[1]).reshape(())) / (2 * step)
            want = float(np.sum(np.asarray(g, np.float64) * u))
            # the f64 differences are exact to 1e-9; the fused gradient is f32's, 1e-7 an element
            assert abs(fd - want) <= 1e-5 * np.sum(np.abs(np.asarray(g, np.float64) * u)), (p.arg, fd, want)
