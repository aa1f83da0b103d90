"""CUDA source for every corpus program builds for sm_86 and sm_90a, without a GPU (nvcc, or
NVRTC in CI), so a rendering error fails CI. All programs go into one translation unit."""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

from ember import dtype as dt
from ember import ir, ref, runners, text
from ember.backend import cuda, cuda_render
from ember.compiler import schedule
from ember.compiler.split import split_large_reductions
from ember.ir import Op
from ember.target import gpu

from .cuda_compile import COMPILER, compile_cuda
from .randprog import compare, layers_text, random_program

CORPUS = sorted((Path(__file__).parents[1] / "eir").rglob("*.eir"))


def _unit(arch: str) -> str:
    helpers: dict[str, None] = {}  # bitcast helpers, once each
    kernels: list[str] = []
    programs = [text.parse_file(str(p)).output_nodes for p in CORPUS]
    programs += [random_program(seed, 10)[0] for seed in range(60)]
    for i, outputs in enumerate(programs):
        sched = cuda.prepare(outputs, arch)
        assert not any(k.contraction for k in sched.kernels)  # their helpers are not one line each
        src = cuda.render(sched, prefix=f"p{i}_")[len(cuda.PRELUDE):]
        for line in src.splitlines(keepends=True):
            if line.startswith("EMBER_D "):
                helpers[line] = None
            else:
                kernels.append(line)
    return cuda.PRELUDE + "".join(helpers) + "".join(kernels)


@pytest.mark.skipif(COMPILER is None, reason="neither nvcc nor NVRTC is installed")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90a"])
def test_every_generated_kernel_compiles(arch: str, tmp_path: Path) -> None:
    assert compile_cuda(_unit(arch), arch, tmp_path) is None


def test_launch_shapes() -> None:
    softmax = text.parse_file(str(Path(__file__).parents[1] / "eir/compositions/softmax_129.eir")).output_nodes
    (k,) = (sched := cuda.prepare(softmax)).kernels
    assert cuda.launch_config(k, sched.target) == ((3, 1, 1), 64, 0)  # a block per row, of 64 threads for 129 values
    colsum = text.parse("ember 1\nx = param f32[64,300]\ns = sum x axes=[0]\nreturn s\n").output_nodes
    (k,) = (sched := cuda.prepare(colsum)).kernels
    assert cuda.launch_config(k, sched.target) == ((2, 1, 1), cuda.BLOCK, 0)  # a thread per column (too few to give each 4), coalesced
    big_colsum = text.parse("ember 1\nx = param f32[8192,4096]\ns = sum x axes=[0]\nreturn s\n").output_nodes
    assert len(cuda.prepare(big_colsum).kernels) == 2  # partial sums over groups of rows, then the groups
    full = text.parse("ember 1\nx = param f32[1024,1024]\ns = sum x axes=[0,1]\nreturn s\n").output_nodes
    assert len(cuda.prepare(full).kernels) == 2  # partial sums on many blocks, then one


def test_long_1d_full_reduction_is_split_across_blocks() -> None:
    """A 1-D sum of 2^26 values ran in one block (40 GB/s on the H200): it is now split like a
    2-D full sum, partial results then their total, and the split keeps the value (source only,
    no GPU needed)."""
    import numpy as np

    from ember import dtype as dt
    from ember import ir, ref
    from ember.backend import cuda
    from ember.ir import Op
    x = ir.param("x", dt.f64, (1 << 20,))
    out = ir.reduce(Op.SUM, x, (0,))
    (split,) = split_large_reductions([out], gpu("sm_86"))
    assert split is not out and len(cuda.prepare([out]).kernels) == 2
    v = np.random.default_rng(0).standard_normal(1 << 20)
    np.testing.assert_allclose(ref.evaluate([split], {x: v})[0], ref.evaluate([out], {x: v})[0], rtol=1e-12)


def test_a_16_bit_sum_in_two_stages_is_rounded_once() -> None:
    """A bf16 column sum over 16384 rows (a bias gradient) runs in two stages, partial sums over
    groups of rows then the groups: the partial sums are f32 and only the total is rounded to
    bf16, as the spec's 16-bit sum is (bf16 partial sums rounded 257 times)."""
    for axes, n in (("[0]", 768), ("[0,1]", 1)):
        prog = f"ember 1\nx = param bf16[16384,768]\ns = sum x axes={axes}\nreturn s\n"
        first, last = cuda.prepare(text.parse(prog).output_nodes, "sm_90a").kernels
        assert first.out.dtype is dt.f32 and first.out.size > n and last.out.dtype is dt.bf16 and last.out.size == n


def test_a_column_sums_partial_sums_keep_several_loads_in_flight() -> None:
    """The first stage of a bf16 column sum ([256, 768] partial sums of 64 rows each, a bias
    gradient): a thread per column, too few threads for lanes of outputs, its loads strided along
    the sum. It adds rows into 8 independent partial sums, whose loads are in flight together
    (one running sum kept four 2-byte loads in flight a thread, about half the bandwidth)."""
    prog = "ember 1\nx = param bf16[16384,768]\ns = sum x axes=[0]\nreturn s\n"
    first = cuda.prepare(text.parse(prog).output_nodes, "sm_90a").kernels[0]
    src = cuda.CUDARenderer(gpu("sm_90a")).render_kernel(first)
    assert "float acc1[8];" in src and "acc1[l3] = acc1[l3] +" in src, src


def test_a_column_sum_that_reads_per_row_statistics_reads_its_rows_coalesced() -> None:
    """A layernorm weight's gradient sums rows of dy times the normalized x, which reads each
    row's mean and rstd: loads contiguous along the sum (the statistics) beside strided ones. Its
    first stage ([128, 768] partial sums of GPT-2 B8's 8192 rows) was a block per output whose
    64 threads read 64 rows of one column, a 32-byte sector for each element; it is a thread per
    column with 4 partial sums. 768 outputs alone (256 rows, not split) are too few threads for
    that and keep a block each."""
    from ember.compiler.loops import RowPlan, ThreadPlan

    from .test_gpu_plans import layernorm_rows

    def weight_grad(rows: int) -> list:
        outs = layernorm_rows(rows=rows)
        w = next(n for n in ir.toposort(outs) if n.op is Op.PARAM and n.arg == "w")
        dy = ir.param("dy", dt.f32, (rows, 768))
        return [ir.grad(ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, outs[0], dt.f32), dy), (0, 1)), w)]
    for rows, plan in ((8192, ThreadPlan), (256, RowPlan)):
        kernels = cuda.prepare(weight_grad(rows), "sm_90a").kernels
        (first,) = [k for k in kernels if k.kind == "reduce" and k.out.size == (128 if rows > 256 else 1) * 768]
        assert isinstance(first.plan, plan), (rows, first.plan)
    src = cuda.CUDARenderer(gpu("sm_90a")).render_kernel(next(k for k in cuda.prepare(weight_grad(8192), "sm_90a").kernels
                                                              if k.out.size == 128 * 768))
    assert "float acc1[4];" in src and "ember_block_reduce" not in src   # (f32 loads: 4 lanes)
    # a row's dot with a small table's column, strided along the row and the same for every
    # output, keeps a block per row (a thread per row would read the rows 4 KB apart)
    x, w = ir.param("x", dt.f32, (131072, 1024)), ir.param("w", dt.f32, (1024, 4))
    column = ir.expand(ir.reshape(ir.shrink(w, (0, 0), (1024, 1)), (1, 1024)), x.shape)
    (k,) = cuda.prepare([ir.reduce(Op.SUM, ir.binary(Op.MUL, x, column), (1,))], "sm_90a").kernels
    assert isinstance(k.plan, RowPlan)


@pytest.mark.parametrize("batch, dim, block, arch", [(2, 768, 1024, "gpt"), (8, 768, 1024, "gpt"),
                                                    (32, 768, 1024, "gpt"), (8, 768, 1024, "llama"), (4, 1024, 512, "gpt")])
def test_no_training_step_reads_a_large_buffer_scattered(batch: int, dim: int, block: int, arch: str) -> None:
    """Training steps of shapes no benchmark runs: no kernel reads a buffer of 1 MB or more with
    neighbouring threads more than 16 bytes apart (cuda_render.scattered_loads; at GPT-2 B8 the
    layernorm weights' gradients did, 25 launches at a quarter of the memory's rate)."""
    from ember import optim
    from ember import tensor as T
    from ember.models.gpt import GPTConfig, build
    from ember.train import step_program
    T.manual_seed(0)
    model = build(GPTConfig(vocab=50304, block=block, dim=dim, n_layer=1, n_head=dim // 64, arch=arch))
    outputs, _, _ = step_program(model, optim.AdamW(model.parameters(), lr=1e-3), batch, block, T.autocast("bfloat16"))
    sched = cuda.prepare(outputs, "sm_90a")
    size = {b.id: b.nbytes for k in sched.kernels for b in k.args}
    scattered = [(k.name, str(k.plan), ld.srcs[0].arg) for k in sched.kernels for ld in cuda_render.scattered_loads(k)
                 if size[ld.srcs[0].arg] >= 1 << 20]
    assert not scattered, scattered


def test_embedding_gradient_is_a_scatter() -> None:
    from .test_gpu_plans import embedding_grad
    kernels = cuda.prepare([embedding_grad()], "sm_90a").kernels
    (scatter,) = [k for k in kernels if k.atomic]
    assert "atomicAdd(&" in cuda.CUDARenderer(gpu("sm_90a")).render_kernel(scatter)
    assert [r.arg[1] for r in scatter.ranges[:2]] == [5, 7]  # a thread per gathered row, not per table row


@pytest.mark.skipif(COMPILER is None, reason="neither nvcc nor NVRTC is installed")
def test_program_units_compile_on_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDAProgram compiles its kernels as several units at once: each unit stands alone."""
    import os

    from ember.compiler import merge
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    monkeypatch.setattr(merge, "SMALL_THREADS", 0)   # the corpus's kernels would be a few merged ones
    programs = [text.parse_file(str(p)).output_nodes for p in CORPUS[:40]]
    outputs = [o for outputs in programs for o in outputs]
    kernels = cuda.prepare(outputs, "sm_86").kernels
    units = cuda.render_units(kernels, gpu("sm_86"))
    assert 1 < len(units) <= 3 and sorted(name for _, runs in units for name in runs) == sorted(k.name for k in kernels)
    for i, (src, _) in enumerate(units):
        assert compile_cuda(src, "sm_86", tmp_path) is None, f"unit {i}"


def test_kernels_that_differ_only_in_buffers_compile_once() -> None:
    """Three layers of one shape: each kind of kernel is compiled once, and every kernel
    launches the function of its kind, whose code is its own up to the buffers' names."""
    program = text.parse(layers_text(3, 64, 256))
    kernels = cuda.prepare(program.output_nodes, "sm_90a").kernels
    units = cuda.render_units(kernels, gpu("sm_90a"))
    runs = {name: f for _, r in units for name, f in r.items()}
    assert sorted(runs) == sorted(k.name for k in kernels) and len(kernels) >= 3
    assert len(set(runs.values())) < len(kernels)
    source = cuda_render.units_source(units)
    for k in kernels:   # a kernel's own function is in the source only if it is its kind's first
        assert (runs[k.name] == k.name) == bool(re.search(rf"\b{k.name}\(", source))
        assert (runs[k.name] == k.name) != (f"/* {k.name} launches {runs[k.name]} */" in source)


def test_a_models_layers_compile_once() -> None:
    """A 3-layer GPT step: each layer's flash kernels and row chains launch their kind's one
    function (the functor and counter named after each flash kernel, and each chain's member
    functions, had made every layer a kind of its own: GPT-2's step compiled 185 kinds, 65 now),
    and the bias gradients' last stages, merged in one launch, are a function for each of their
    few kinds, called with each member's buffers."""
    from ember import optim
    from ember import tensor as T
    from ember.compiler.loops import MergedPlan
    from ember.models.gpt import GPTConfig, build
    from ember.train import step_program
    T.manual_seed(0)
    model = build(GPTConfig(vocab=256, block=1024, dim=768, n_layer=3, n_head=12))   # GPT-2's layer
    outputs, _, _ = step_program(model, optim.AdamW(model.parameters(), lr=1e-3), 2, 1024, T.autocast("bfloat16"))
    kernels = cuda.prepare(outputs, "sm_90a").kernels
    runs = {name: f for _, r in cuda.render_units(kernels, gpu("sm_90a")) for name, f in r.items()}
    flash = [k for k in kernels if k.fused is not None]
    chains = [k for k in kernels if isinstance(k.plan, MergedPlan) and k.plan.rows]
    assert len(flash) == 9 and len({runs[k.name] for k in flash}) == 3
    assert len(chains) >= 12 and len({runs[k.name] for k in chains}) <= len(chains) - 6
    merged = max((k for k in kernels if isinstance(k.plan, MergedPlan)), key=lambda k: len(k.plan.members))
    source = cuda.CUDARenderer(gpu("sm_90a")).render_kernel(merged)
    functions = re.findall(r"__device__ static __(?:force|no)inline__ void (\w+)\(", source)
    assert len(merged.plan.members) >= 9 and len(functions) <= len(merged.plan.members) // 3
    for m in merged.plan.members:   # each member is called with its own buffers
        assert re.search(rf"\b\w+\({', '.join(f'b{b.id}' for b in m.args)}, ember_block\)", source)


def test_few_outputs_of_long_reductions_are_split() -> None:
    """A bias gradient (sum of [B, T, C] over B and T) and batch norm's statistics (over N, H,
    W) reduce in two stages: one block per output left the H200 mostly idle (3.3 ms for C =
    3072). The split keeps the value."""
    import numpy as np

    from ember import dtype as dt
    from ember import ir, ref
    from ember.backend import cuda
    from ember.ir import Op
    for shape, axes in (((8, 1024, 384), (0, 1)), ((32, 16, 32, 32), (0, 2, 3))):
        x = ir.param("x", dt.f64, shape)
        out = ir.reduce(Op.SUM, x, axes)
        kernels = cuda.prepare([out]).kernels
        blocks = [cuda.launch_config(k, gpu("sm_86"))[0][0] for k in kernels]
        assert len(kernels) == 2 and blocks[0] >= 64, (shape, blocks)
        (split,) = split_large_reductions([out], gpu("sm_86"))
        v = np.random.default_rng(0).standard_normal(shape)
        np.testing.assert_allclose(ref.evaluate([split], {x: v})[0], ref.evaluate([out], {x: v})[0], rtol=1e-12,
                                   atol=1e-9)


def test_the_pool_gives_an_output_back_a_block_it_held() -> None:
    """run_device asks for the blocks an output held before, so a training step's buffers recur
    and its CUDA graph is replayed (without a GPU: the pool's bookkeeping alone)."""
    from ember.backend.cuda import _Pool
    pool = _Pool()
    for ptr in (100, 200, 300):
        pool.give(ptr, 64)
    assert pool.take(64, [200]) == 200      # held before and free: taken back
    assert pool.take(64, [200]) == 300      # no longer free: the last freed block
    assert pool.take(64) == 100


def test_lanes_of_a_bf16_map_are_16_byte_accesses() -> None:
    """A thread's eight bf16 lanes are one 16-byte load and one 16-byte store (nvcc kept them
    eight 2-byte accesses); a row read at an odd offset is read lane by lane, and stored whole."""
    src = cuda.source(text.parse("ember 1\nx = param bf16[64,256]\ny = exp2 x\nreturn y\n").output_nodes, "sm_90a")
    assert "const uint4 v" in src and "*(uint4*)(b" in src
    odd = text.parse("ember 1\nx = param bf16[64,257]\ny = shrink x start=[0,1] end=[64,257]\n"
                     "z = exp2 y\nreturn z\n").output_nodes
    src = cuda.source(odd, "sm_90a")
    assert "const uint4" not in src and "*(uint4*)(b" in src


def test_a_long_contraction_with_few_tiles_is_split_over_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight gradient's shape (few output tiles, K long) runs as a batch of contractions over
    parts of K on tensor cores, f32 parts summed after (split.split_k); its value stays."""
    import numpy as np

    from ember import dtype as dt
    from ember import ir, ref
    from ember.compiler import split
    from ember.ir import Op

    def weight_grad(k: int, m: int, n: int) -> tuple[ir.Node, ir.Node, ir.Node]:
        a, b = ir.param("a", dt.bf16, (k, m, 1)), ir.param("b", dt.bf16, (k, 1, n))
        return a, b, ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.expand(a, (k, m, n)), ir.expand(b, (k, m, n))), (0,))

    *_, dw = weight_grad(16384, 768, 768)   # GPT-2's attention projection: 18 tiles of 128 x 256
    (c,) = [k.contraction for k in cuda.prepare([dw], "sm_86").kernels if k.contraction]
    assert c.batch_size == 16 and c.mnk == (768, 768, 1024) and c.dtype is dt.bf16
    # sm_90a's persistent blocks share the last round out by K-steps: the fewest parts that fill
    # the SMs, each round an atomic epilogue (split._split_cost)
    (c,) = [k.contraction for k in cuda.prepare([dw], "sm_90a").kernels if k.contraction]
    assert c.batch_size == 8 and c.mnk == (768, 768, 2048)
    *_, fc = weight_grad(16384, 768, 3072)
    (c,) = [k.contraction for k in cuda.prepare([fc], "sm_90a").kernels if k.contraction]
    assert c.batch_size == 2 and c.mnk == (768, 3072, 8192)
    monkeypatch.setattr(split, "MIN_SPLIT_K", 64)   # the value, at a size the reference evaluates
    a, b, dw = weight_grad(512, 32, 16)
    parted = split.split_k(dw, 132)
    assert parted is not None
    rng = np.random.default_rng(0)
    values = {p: (rng.standard_normal(p.shape).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
              for p in (a, b)}   # bf16 values
    want, got = ref.evaluate([dw], values)[0], ref.evaluate([parted], values)[0]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=0.3)


@pytest.mark.skipif(COMPILER is None, reason="neither nvcc nor NVRTC is installed")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_86"])
def test_split_k_parts_add_into_their_sum(arch: str, tmp_path: Path) -> None:
    """GPT-2's attention projection's weight gradient, [768, 768] over 16384 tokens in parts of K
    (16 on sm_86, 8 on sm_90a): the product adds each part's tiles into the f32 sum (atomically, onto a zeroed output)
    instead of writing [16, 768, 768] partial sums for a reduce kernel (split.accumulate_parts)."""
    from .test_gpu_plans import weight_grad
    kernels = cuda.prepare([weight_grad(16384, 768, 768)], arch).kernels
    (c,) = [k for k in kernels if k.contraction]
    assert c.atomic and c.out.size == 768 * 768 and c.contraction.batch_size == (8 if arch == "sm_90a" else 16) and \
        c.plan.instruction != "fma"
    assert not [k for k in kernels if k.kind == "reduce"]
    src = cuda.render(cuda.prepare([weight_grad(16384, 768, 768)], arch))
    assert src.count("atomicAdd((float2*)") == (arch == "sm_90a") and "atomicAdd(&" in src or arch == "sm_90a"
    # on sm_90a (144 tiles of 128 x 256 for 132 SMs: a whole round and 12 tiles) the persistent
    # kernel shares its last round's tiles out by K-steps, producer and consumers alike
    assert src.count("const int rounds = 144 / gridDim.x;") == 2 * (arch == "sm_90a")
    assert cuda.launch_config(c, gpu(arch))[0] == ((132, 1, 1) if arch == "sm_90a" else (6, 6, 16))
    assert compile_cuda(src, arch, tmp_path) is None


def test_small_kernels_run_as_batches() -> None:
    """Small kernels whose outputs no large kernel reads go last, a batch per level of their own
    dependencies (a level of one stays a kernel); the large one stays in front (source only)."""
    from .test_gpu_plans import small_batches
    two_a, b1, c_sum, after, big = outputs = small_batches()
    kernels = cuda.prepare(outputs, "sm_90a").kernels
    writes = [[m.out.node for m in k.members or [k]] for k in kernels]
    assert writes == [[big], [two_a, b1, c_sum], [after]] and kernels[1].members and kernels[2].members is None
    assert cuda.launch_config(kernels[1], gpu("sm_90a"))[0] == (1 + 3 + 1, 1, 1)   # 768 / 4, 3000 / 4 and 5 threads
    assert cuda.render(cuda.prepare(outputs, "sm_90a")).count("int ember_block = blockIdx.x;") == 1


def test_maps_over_one_iteration_space_run_in_the_same_threads() -> None:
    """AdamW's update of a tensor (the gradient rounded to bf16, both moments, the parameter) is
    one kernel whose threads run the four maps in turn; a map reading another's output at other
    elements (reversed) stays out of the chain, and the value is kept (test_gpu_plans runs both)."""
    from ember.compiler.loops import MergedPlan

    from .test_gpu_plans import adam_chain
    for flipped in (False, True):
        outputs = adam_chain(flipped)
        kernels = cuda.prepare(outputs, "sm_90a").kernels
        chained = [k for k in kernels if isinstance(k.plan, MergedPlan) and k.plan.together]
        writes = {m.out.node for k in chained for m in k.members}
        assert set(outputs) <= writes if not flipped else outputs[2] not in writes and outputs[0] in writes
        assert len(kernels) == (1 if not flipped else 2)
        for k in chained:   # every member as many threads, of as many lanes
            assert len({(cuda.launch_config(m, gpu("sm_90a"))[0], len(m.lanes)) for m in k.members}) == 1
            assert cuda.launch_config(k, gpu("sm_90a")) == cuda.launch_config(k.members[0], gpu("sm_90a"))


def test_a_layernorm_runs_as_one_kernel_a_block_per_row(tmp_path: Path) -> None:
    """A residual add and its layernorm, whose mean and rstd are outputs too: one kernel, a block
    per row running the members in turn with a barrier between them, so a row is read from
    memory once (merge_rows). A normalized row that reads another row's statistics (flipped)
    stays out of the chain; test_gpu_plans runs both. What a member writes, a later member
    reads as ordinary memory (no const __restrict__: the read-only cache is not kept coherent
    with the kernel's own stores)."""
    from ember.compiler.loops import MergedPlan

    from .test_gpu_plans import layernorm_rows
    for shifted in (False, True):
        outputs = layernorm_rows(shifted)
        sched = cuda.prepare(outputs, "sm_90a")
        (k,) = [k for k in sched.kernels if isinstance(k.plan, MergedPlan) and k.plan.rows]
        assert len(sched.kernels) == (1 if not shifted else 2)
        written = {m.out.node for m in k.members}
        assert set(outputs) <= written if not shifted else outputs[0] not in written and outputs[1] in written
        grid, threads, _ = cuda.launch_config(k, gpu("sm_90a"))
        assert grid == (512, 1, 1) and threads == max(cuda_render.block_size(m) for m in k.members)
        src = cuda.render(dataclasses.replace(sched, kernels=[k]))
        assert src.split("extern \"C\"")[-1].count("__syncthreads();") == len(k.members) - 1
        for m in k.members[1:]:
            signature = next(line for line in src.splitlines() if f"void {m.name}(" in line)
            for w in k.members:
                if w is not m and any(b.id == w.out.id for b in m.reads):
                    assert f"float* b{w.out.id}," in signature and f"__restrict__ b{w.out.id}" not in signature
        if COMPILER is not None:
            assert compile_cuda(src, "sm_90a", tmp_path) is None


def test_a_long_row_that_several_members_read_is_read_from_memory_once(tmp_path: Path) -> None:
    """A row chain's members that read the same long row (a cross-entropy's 50304 logits: the
    max, the sum of exponentials, the gradient) read it from memory once: the first keeps it in
    shared memory, whose bytes the launch asks for (merge.row_cache). Rows that would pass half
    an SM's shared memory stay out (the logits on sm_86, 100 KB an SM), and so do shorter ones
    (x beside y in shared_rows, a layernorm's 768), left to the SM's L1."""
    from ember.compiler.loops import MergedPlan

    from .test_gpu_plans import cross_entropy_rows, layernorm_rows, shared_rows, softmax_rows
    wide = cross_entropy_rows(rows=48, classes=50304)
    # (outputs, arch, the shared memory asked for, param -> lines reading it from memory)
    cases = [(wide, "sm_90a", 50304 * 2, {}), (wide, "sm_86", 0, {}),
             (shared_rows(), "sm_90a", 20000 * 4, {"x": 3, "y": 1}), (layernorm_rows(), "sm_90a", 0, None)]
    for outputs, arch, cached, reads in cases:
        sched = cuda.prepare(outputs, arch)
        (k,) = [k for k in sched.kernels if isinstance(k.plan, MergedPlan) and k.plan.rows]
        assert cuda.launch_config(k, gpu(arch))[2] == k.plan.cache_bytes == cached
        src = cuda.render(dataclasses.replace(sched, kernels=[k]))
        if reads is None:
            continue
        named = {b.node.arg: b for b in k.reads if b.node.op.name == "PARAM"}
        logits = [b for b in k.reads if b.kind == "temp" and b.size == 48 * 50304]
        expected = {named[p].id: n for p, n in reads.items()} or {logits[0].id: 1 if cached else 3}
        for b, n in expected.items():
            lines = [line for line in src.splitlines() if f"*(const uint4*)(b{b} + " in line]
            assert len(lines) == n, (arch, b, lines)
        if COMPILER == "nvcc":
            assert compile_cuda(src, arch, tmp_path) is None
    # no cache where a later member's block is another row of x (members splitting x's 96 rows
    # as 6 x 8 and 3 x 16: block 8 is row 16 for one and row 8 for the other), nor where the
    # row's loads stay scalar (rows of 16387 f32, which no vector divides)
    x = ir.param("x", dt.f32, (96, 16384))
    first = ir.reduce(Op.RMAX, ir.shrink(ir.reshape(x, (6, 16, 16384)), (0, 0, 0), (6, 8, 16384)), (2,))
    second = ir.reduce(Op.SUM, ir.binary(Op.SUB, ir.reshape(ir.shrink(x, (0, 0), (48, 16384)), (3, 16, 16384)),
                                         ir.expand(ir.reshape(first, (3, 16, 1)), (3, 16, 16384))), (2,))
    y = ir.shrink(ir.param("y", dt.f32, (32, 16388)), (0, 0), (32, 16387))
    for outputs in ([first, second], softmax_rows(y)):
        (k,) = [k for k in cuda.prepare(outputs, "sm_90a").kernels if isinstance(k.plan, MergedPlan) and k.plan.rows]
        assert k.plan.cache == () and cuda.launch_config(k, gpu("sm_90a"))[2] == 0


def test_a_row_that_only_later_members_read_is_never_written_to_memory(tmp_path: Path) -> None:
    """A row chain's member output that no kernel after the chain reads, and that its later
    members read as their own block's row, lives in the block's shared memory alone
    (merge.private_rows): each member that touches it moves its pointer there, the launch asks
    for its bytes, and nothing else writes or reads it. A GPT layer's layernorm backward had
    three such f32 rows (300 MB a layer at GPT-2's B = 32), and the memory plan gives them no
    room. test_gpu_plans runs it."""
    from ember.compiler.loops import MergedPlan

    from .test_gpu_plans import gpt_layer_gradients
    sched = cuda.prepare(gpt_layer_gradients(), "sm_90a")
    chains = [k for k in sched.kernels if isinstance(k.plan, MergedPlan) and k.plan.private]
    assert max(len(k.plan.private) for k in chains) == 3
    for k in chains:
        private = {part.buffer for part, _ in k.plan.private}
        assert not any(b.id in private for other in sched.kernels if other is not k for b in other.reads)
        assert all(schedule.memory_bytes(sched)[b] == 0 for b in private)   # no room in the arena either
        assert cuda.launch_config(k, gpu("sm_90a"))[2] == k.plan.cache_bytes == sum(p.nbytes for p, _ in k.plan.private)
        src = cuda.render(dataclasses.replace(sched, kernels=[k]))
        for part, at in k.plan.private:
            touching = sum(any(b.id == part.buffer for b in [m.out, *m.reads]) for m in k.plan.members)
            assert src.count(f"b{part.buffer} = (float*)(ember_rows + {at}) - (") == touching >= 2
        if COMPILER == "nvcc":
            assert compile_cuda(src, "sm_90a", tmp_path) is None
    # on the course's GPU too (half of its 100 KB an SM holds them)
    assert any(isinstance(k.plan, MergedPlan) and k.plan.private for k in cuda.prepare(gpt_layer_gradients(), "sm_86").kernels)


def test_many_short_rows_take_a_group_of_a_warps_threads_each(tmp_path: Path) -> None:
    """More rows of 64 than the GPU has threads (a softmax, a log-sum-exp): 16 threads of a warp
    per row, each with a 16-byte vector of it, shuffles combining the sums; the last block's
    missing rows return. A column sum that also reads a per-row mean (its loads along the
    reduction strided) stays a thread per column. test_gpu_plans runs them."""
    from ember.compiler.loops import RowPlan, ThreadPlan

    from .test_gpu_plans import short_rows
    sched = cuda.prepare(short_rows(), "sm_90a")
    assert len(sched.kernels) == 2
    for k in sched.kernels:
        assert isinstance(k.plan, RowPlan) and k.plan.group == 16
        assert cuda.launch_config(k, gpu("sm_90a")) == ((-(-135171 // 16), 1, 1), 256, 0)
    src = cuda.render(sched)
    assert "ember_group_reduce<float, 1, 16>" in src and "ember_group_reduce<float, 0, 16>" in src
    assert "if (ember_row >= 135171) return;" in src and f"*(const uint4*)(b{sched.kernels[0].reads[0].id} + " in src
    if COMPILER is not None:
        assert compile_cuda(src, "sm_86", tmp_path) is None
    columns = cuda.prepare(text.parse_file(str(Path(__file__).parents[2] / "bench/suite/layernorm_f32.eir")).output_nodes,
                           "sm_90a")
    assert any(isinstance(k.plan, ThreadPlan) and k.kind == "reduce" for k in columns.kernels)
    assert not any(isinstance(k.plan, RowPlan) and k.plan.group for k in columns.kernels)


def test_a_row_read_by_three_loops_is_read_once(tmp_path: Path) -> None:
    """softmax's row is read by the max, the sum of exponentials and the output loops of one
    block; unrolled (the block divides the row), the first reads it into registers and the
    others take it from there: the kernel reads the input buffer in one statement. A bf16 row
    is read by each loop (from L2: caching it cost more registers than it saved)."""
    prog = ("ember 1\nx = param DT[16,32768]\nm = max x axes=[1]\nmb = expand m shape=[16,32768]\n"
            "d = sub x mb\ne = exp2 d\ns = sum e axes=[1]\nsb = expand s shape=[16,32768]\np = div e sb\nreturn p\n")
    for dtype, reads in (("f32", 1), ("bf16", 3)):
        sched = cuda.prepare(text.parse(prog.replace("DT", dtype)).output_nodes, "sm_90a")
        (k,) = sched.kernels
        src = cuda.render(sched)
        read = f"*(const uint4*)(b{k.reads[0].id} + "
        assert src.count(read) == reads and src.count("#pragma unroll\n  for (int i") == 3, dtype
        assert ("uint4 row" in src) == (reads == 1)
        if COMPILER is not None:
            assert compile_cuda(src, "sm_90a", tmp_path) is None


def test_a_row_the_block_does_not_divide_is_read_in_unrolled_steps(tmp_path: Path) -> None:
    """A bf16 softmax over rows of 50304 (6288 vectors for 1024 threads: 7 steps, the last
    partial): each loop unrolls, its steps counted by a constant, so that a thread's loads of
    the row are in flight together; the guard that skips the steps past the row's end folds
    away in the six that every thread takes."""
    prog = ("ember 1\nx = param bf16[16,50304]\nm = max x axes=[1]\nmb = expand m shape=[16,50304]\n"
            "d = sub x mb\ne = exp2 d\ns = sum e axes=[1]\nsb = expand s shape=[16,50304]\np = div e sb\nreturn p\n")
    sched = cuda.prepare(text.parse(prog).output_nodes, "sm_90a")
    src = cuda.render(sched)
    assert cuda.launch_config(sched.kernels[0], sched.target)[1] == 1024
    assert len(re.findall(r"#pragma unroll\n  for \(int (i\d+)s = 0, \1 = threadIdx.x; \1s < 7; \1s\+\+, \1 \+= 1024\)\n"
                          r"  if \(\1s < 6 \|\| \1 < 6288\)", src)) == 3
    if COMPILER is not None:
        assert compile_cuda(src, "sm_90a", tmp_path) is None


EDGES = {   # x and y where a quotient from the reciprocal, or 2^x from MUFU.EX2, could differ
    "bf16": ([1, 6, 2.0**127, 2.0**-130, 1, 0, math.inf, 1, math.nan, -3, 2.0**-126, 100, -130],
             [3, 3, 2.0**127, 2.0**-130, 0, 0, math.inf, math.inf, 1, 7, 2.0**-130, 2.0**-127, 1]),
    "f16": ([1, 6, 60000, 2.0**-20, 1, 0, math.inf, 1, math.nan, -3, 2.0**-14, 100, -30],
            [3, 3, 60000, 2.0**-20, 0, 0, math.inf, math.inf, 1, 7, 2.0**-24, 2.0**-10, 1]),
}


@pytest.mark.skipif("cuda" not in runners.available(), reason="no CUDA GPU")
@pytest.mark.parametrize("dtype", list(EDGES))
def test_16_bit_division_and_exp2_at_the_edges_match_the_reference(dtype: str) -> None:
    """f16 and bf16 results take a / b as a times the hardware's reciprocal (ember_div16) and 2^x
    from MUFU.EX2 alone (ember_ex2): the same values as the reference at subnormal, huge, zero,
    infinite and NaN operands."""
    n = len(EDGES[dtype][0])
    prog = text.parse(f"ember 1\nx = param {dtype}[{n}]\ny = param {dtype}[{n}]\nq = div x y\ne = exp2 x\n"
                      "return q e\n")
    inputs = {prog.nodes[name]: ref.cast(np.array(v, np.float64), dt.f64, prog.nodes[name].dtype)
              for name, v in zip("xy", EDGES[dtype])}
    want = ref.evaluate(prog.output_nodes, inputs)
    got = runners.BACKENDS["cuda"].run(prog.output_nodes, inputs)
    assert compare(prog.output_nodes, got, want) is None


def test_a_private_row_takes_no_memory_that_its_chain_still_reads() -> None:
    """A review's counter-case: a chain's private row P (size 0) may write "in place" over the
    matmul output D it reads; taking D's slot freed D's bytes inside the chain, and the row
    sums, which die in the same chain, were placed over D while other blocks still read it.
    No two temporaries with room alive in one kernel overlap."""
    from .test_gpu_plans import matmul
    h, w = ir.param("h", dt.f32, (256, 64)), ir.param("w", dt.f32, (64, 1024))
    p = matmul(h, w)
    for i in range(3):
        p = ir.binary(Op.ADD, p, ir.param(f"x{i}", dt.f32, (256, 1024)))
    p = ir.unary(Op.EXP2, p)
    s = ir.reduce(Op.SUM, p, (1,))
    out3 = ir.binary(Op.ADD, p, ir.expand(ir.binary(Op.MUL, s, ir.reduce(Op.RMAX, p, (1,))), p.shape))
    sched = cuda.prepare([ir.binary(Op.MUL, p, ir.expand(s, p.shape)), out3], "sm_90a")
    size, (first, last) = schedule.memory_bytes(sched), schedule.lifetimes(sched)
    for i, k in enumerate(sched.kernels):
        alive = [b for b in first if first[b] <= i <= last[b] and size[b]]
        spans = sorted((sched.slots[b], sched.slots[b] + size[b]) for b in alive)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (k.name, spans)


def test_a_bias_cast_for_a_matmul_epilogue_is_computed_once(tmp_path: Path) -> None:
    """x @ w + bias under autocast: the f32 bias is converted to bf16 once, by a kernel of its
    own (schedule.epilogue_casts), and the product's epilogue reads the bf16 values; it converted
    them per element of every tile, with the cast's NaN test (GPT-2's fc epilogue: 820 SASS
    instructions a thread a tile, then 203). A widening cast stays in the epilogue."""
    from .test_gpu_plans import matmul
    x, w = ir.param("x", dt.bf16, (256, 768)), ir.param("w", dt.bf16, (768, 3072))
    for bias_dtype, own in ((dt.f32, True), (dt.f16, False)):
        bias = ir.unary(Op.CAST, ir.param("b", bias_dtype, (3072,)), dt.bf16 if own else dt.f32)
        prod = matmul(x, w) if own else ir.unary(Op.CAST, matmul(x, w), dt.f32)
        y = ir.binary(Op.ADD, prod, ir.expand(ir.reshape(bias, (1, 3072)), (256, 3072)))
        sched = cuda.prepare([ir.unary(Op.CAST, y, dt.f32)] if own else [y], "sm_90a")
        (k,) = [k for k in sched.kernels if k.contraction is not None]
        casts = [m for m in sched.kernels if m.out.node.shape == (3072,)]
        assert len(casts) == own, [m.name for m in sched.kernels]
        body = cuda.render(dataclasses.replace(sched, kernels=[k])).split("__global__")[-1]
        assert "ember_round_bf16f(" not in body and ("ember_bf16_to_f32(b" in body) is own
        assert ("ember_f16_to_f32(b" in body) is not own
        if COMPILER == "nvcc" and own:
            assert compile_cuda(cuda.render(sched), "sm_90a", tmp_path) is None


def test_small_kernels_of_the_inputs_alone_run_first_in_one_launch() -> None:
    """A GPT step's biases converted to bf16 (qkv's and fc's here) are small kernels that read
    only the program's inputs, and large ones wait for them: they run first, as one launch
    (merge.merge_small), not one launch each before its product."""
    from ember import optim
    from ember import tensor as T
    from ember.compiler.loops import MergedPlan
    from ember.models.gpt import GPTConfig, build
    T.manual_seed(0)
    model = build(GPTConfig(vocab=256, block=64, dim=768, n_layer=2, n_head=12))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    with T.autocast("bfloat16"):
        loss = model.loss(*(T.Tensor(np.zeros((2, 64), np.int32)),) * 2)
    loss.backward()
    opt.steps += 1
    outputs, _ = T.canonical_program([loss.node] + [new.node for _, new in opt.updates()])
    kernels = cuda.prepare(outputs, "sm_90a").kernels
    first = kernels[0]
    assert isinstance(first.plan, MergedPlan) and all(b.kind == "input" for m in first.plan.members for b in m.reads)
    bias = lambda m: m.out.node.dtype is dt.bf16 and m.out.node.shape in ((2304,), (3072,))  # noqa: E731
    assert sorted(m.out.node.shape[0] for m in first.plan.members if bias(m)) == [2304, 2304, 3072, 3072]
    assert not any(bias(m) for k in kernels[1:] for m in (k.plan.members if isinstance(k.plan, MergedPlan) else [k]))


def test_an_op_result_stored_as_bf16_is_converted_once() -> None:
    """A bf16 map's last op is stored from its expression, not rounded into a temp and converted
    again: exp2 (MUFU.EX2 alone, ember_ex2) with one cvt (ember_bf16_bits_op); a mul, which the hardware's bf16 fma rounds
    itself, as its upper half. bf16 add, sub and mul are that fma."""
    def source(body: str) -> str:
        return cuda.source(text.parse(f"ember 1\nx = param bf16[64,256]\n{body}\nreturn z\n").output_nodes, "sm_90a")
    src = source("y = mul x x\nz = exp2 y")
    assert "= ember_bf16_bits_op(ember_ex2(t" in src and "ember_f32_to_bf16_bits(t" not in src
    assert "= ember_bf16_fma(t" in src and "ember_round_bf16_op(ember_bf16_fma" not in src
    src = source("y = exp2 x\nz = mul y y")
    assert "= ((unsigned short)(__float_as_uint(ember_bf16_fma(t" in src and "ember_f32_to_bf16_bits(t" not in src
    src = source("e = exp2 x\ny = add x e\nz = sub y e")   # y = fma(x, 1, e), z = fma(e, -1, y) (x + x is x * 2)
    assert re.search(r"float (t\d+) = ember_bf16_fma\((t\d+), 1.0f, (t\d+)\);.*ember_bf16_fma\(\3, -1.0f, \1\)", src, re.S)
    # an f32 value cast to bf16 (a GELU's output under autocast) is converted once where it is
    # stored, not rounded, widened and converted again: 5 of the 51 SASS instructions an element;
    # an arithmetic result's NaN is the canonical one, so without the cast's NaN test (a GELU
    # gradient's 480 SASS instructions -> 448), which a loaded value keeps
    prog = "ember 1\nx = param f32[64,256]\ne = exp2 x\ny = div x e\nz = cast y dtype=bf16\nreturn z\n"
    src = cuda.source(text.parse(prog).output_nodes, "sm_90a")
    assert re.search(r"float (t\d+) = \(t\d+ / t\d+\);", src) and "ember_round_bf16_op(" in src
    (stored,) = re.findall(r"= ember_bf16_bits_op\((t\d+)\);", src)
    assert f"float {stored} = (t" in src and "ember_f32_to_bf16_bits(" not in src.split("extern")[-1]
    for body in ("z = cast x dtype=bf16", "o = const 1.0 bf16[64,256]\nf = cast o dtype=f32\ny = mul x f\nz = cast y dtype=bf16"):
        # a loaded value, and an op nvcc may fold away with it (x * 1: the loaded NaN passes through)
        src = cuda.source(text.parse(f"ember 1\nx = param f32[64,256]\n{body}\nreturn z\n").output_nodes, "sm_90a")
        assert "ember_f32_to_bf16_bits(" in src.split("extern")[-1] and "ember_bf16_bits_op(" not in src.split("extern")[-1]
