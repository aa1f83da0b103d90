"""Write the generated source of a fixed set of programs into a folder, one file per program and
target (c, cuda-sm_86, cuda-sm_90a), so that a refactor can prove `ember source` byte-identical:

    PYTHONPATH=$PWD python3 tests/tools/source_snapshot.py /tmp/before      # at the base commit
    PYTHONPATH=$PWD python3 tests/tools/source_snapshot.py /tmp/after       # after the change
    diff -r /tmp/before /tmp/after

The programs: every .eir of tests/eir and bench/suite, the benchmark programs that bench/cpu.py,
gpu.py, matmul.py, attention_gpu.py and cnn_gpu.py build, and a GPT-2 training step (bf16 autocast,
AdamW: a small config and one layer of the 124M shape), built as bench/step_kernels.py builds it.
No GPU needed (torch, which the bench files import, only for its CPU build). --only SUBSTR limits
the programs by name; --targets limits the targets.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TARGETS = {"c": ("c", None), "cuda-sm_86": ("cuda", "sm_86"), "cuda-sm_90a": ("cuda", "sm_90a")}


def source_of(outputs: list, backend: str, arch: str | None) -> str:
    """What `ember source --backend B --arch A` prints for these outputs (less print's newline)."""
    from ember.backend import c, cuda
    return c.source(outputs) if backend == "c" else cuda.source(outputs, arch)


def eir_programs() -> Iterator[tuple[str, Callable[[], list]]]:
    from ember.text import parse_file
    for folder in (ROOT / "tests" / "eir", ROOT / "bench" / "suite"):
        for path in sorted(folder.rglob("*.eir")):
            name = path.relative_to(ROOT).as_posix().replace("/", "__")
            yield name, lambda path=path: parse_file(str(path)).output_nodes


def bench_programs() -> Iterator[tuple[str, Callable[[], list]]]:
    import cpu
    import gpu

    from ember import dtype as dt
    from ember import ir
    from ember.ir import Op
    rows, cols, vec, big = 8192, 32768, 1 << 28, 4096
    cases = {
        "cpu_chain8": lambda: cpu.chain8(1 << 24), "gpu_chain8": lambda: cpu.chain8(vec),
        "cpu_softmax": lambda: cpu.softmax(big, big), "cpu_layernorm": lambda: cpu.layernorm(big, big),
        "cpu_colsum": lambda: cpu.reduce_sum(big, big, (0,)), "cpu_fullsum": lambda: cpu.reduce_sum(big, big, (0, 1)),
        "cpu_matmul2048": lambda: cpu.matmul(2048), "gpu_matmul4096": lambda: cpu.matmul(4096),
        "gpu_fullsum1d": lambda: cpu.reduce_sum(vec, None, (0,)), "gpu_transpose": lambda: gpu.transpose(8192),
    }
    for t in (dt.f32, dt.bf16):
        cases[f"gpu_rowsum_{t.name}"] = lambda t=t: cpu.reduce_sum(rows, cols, (1,), t)
        cases[f"gpu_colsum_{t.name}"] = lambda t=t: cpu.reduce_sum(rows, cols, (0,), t)
        cases[f"gpu_fullsum_{t.name}"] = lambda t=t: cpu.reduce_sum(rows, cols, (0, 1), t)
        cases[f"gpu_softmax_{t.name}"] = lambda t=t: cpu.softmax(rows, cols, t)
        cases[f"gpu_logsoftmax_{t.name}"] = lambda t=t: cpu.log_softmax(rows, cols, t)
        cases[f"gpu_layernorm_{t.name}"] = lambda t=t: cpu.layernorm(rows, cols, t)
    for name, fn in cases.items():
        yield f"bench__{name}", lambda fn=fn: fn()[1]
    import matmul
    for name, b, m, n, k, dtype, bt in matmul.CASES:
        tag = name.replace(" ", "_").replace("@", "at").replace("(", "").replace(")", "")
        yield f"bench__matmul_{tag}", lambda a=(b, m, n, k, dt.BY_NAME[dtype], bt): matmul.contraction(*a)[1]
    import attention_gpu as ag
    for d in (64, 128):
        for s in (512, 2048):
            for causal in (False, True):
                def att(d: int = d, s: int = s, causal: bool = causal, grad: bool = False) -> list:
                    b, h = max(1, 16384 // s), 2048 // d
                    q, k, v, w = (ir.param(n, dt.bf16, (b, h, s, d)) for n in "qkvw")
                    o = ag.attention(q, k, v, causal)
                    if not grad:
                        return [o]
                    loss = ir.reduce(Op.SUM, ir.binary(Op.MUL, ir.unary(Op.CAST, o, dt.f32),
                                                       ir.unary(Op.CAST, w, dt.f32)), (0, 1, 2, 3))
                    return [o] + [ir.grad(loss, x) for x in (q, k, v)]
                tag = f"d{d}_s{s}{'_causal' if causal else ''}"
                yield f"bench__attention_{tag}", att
                yield f"bench__attention_{tag}_bwd", lambda att=att: att(grad=True)
    import ember.functional as F
    import ember.tensor as et
    for n, c, o, h in ((64, 64, 64, 56), (32, 512, 512, 7)):
        for dtype in ("bfloat16", "float32"):
            def conv(n: int = n, c: int = c, o: int = o, h: int = h, dtype: str = dtype) -> list:
                x = et.Tensor(np.zeros((n, c, h, h), np.float32), dtype=dtype)
                w = et.Tensor(np.zeros((o, c, 3, 3), np.float32), dtype=dtype)
                return [F.conv2d(x, w, padding=1).node]
            yield f"bench__conv_{n}x{c}x{o}x{h}_{dtype}", conv


def gpt_step(vocab: int, block: int, dim: int, layers: int, batch: int) -> list:
    from ember import optim
    from ember import tensor as T
    from ember.models.gpt import GPT, GPTConfig
    T.manual_seed(0)
    model = GPT(GPTConfig(vocab=vocab, block=block, dim=dim, n_layer=layers, n_head=dim // 64))
    opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    x = T.Tensor(np.zeros((batch, block), np.int32))
    with T.autocast("bfloat16"):
        loss = model.loss(x, x)
    loss.backward()
    opt.steps += 1
    outputs, _ = T.canonical_program([loss.node] + [new.node for _, new in opt.updates()])
    return outputs


def gpt_programs() -> Iterator[tuple[str, Callable[[], list]]]:
    yield "gpt2__small", lambda: gpt_step(vocab=256, block=128, dim=128, layers=2, batch=4)
    yield "gpt2__124M_1layer", lambda: gpt_step(vocab=50304, block=1024, dim=768, layers=1, batch=16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="", help="only the programs whose name contains this")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: " + ", ".join(TARGETS))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    targets = args.targets.split(",")
    t0, count = time.perf_counter(), 0
    for gen in (eir_programs, bench_programs, gpt_programs):
        for name, build in gen():
            if args.only not in name:
                continue
            try:
                outputs = build()
            except Exception:
                (args.out / f"{name}.build-error").write_text(traceback.format_exc().splitlines()[-1] + "\n")
                continue
            for t in targets:
                backend, arch = TARGETS[t]
                try:
                    text = source_of(outputs, backend, arch) + "\n"
                except Exception as e:   # an error is part of the behaviour too
                    text = f"error: {type(e).__name__}: {e}\n"
                (args.out / f"{name}.{t}.txt").write_text(text)
                count += 1
    print(f"{count} sources in {args.out}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
