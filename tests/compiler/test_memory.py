"""The memory plan (schedule.plan_memory) and the footprint it gives (schedule.footprint, the
`peak device memory` line of `ember train --dry-run`)."""
from __future__ import annotations

import re

import pytest

from ember import dtype as dt
from ember import ir, optim
from ember import tensor as T
from ember.backend import c, cuda
from ember.compiler import merge, schedule
from ember.ir import Op
from ember.models.gpt import GPTConfig, build
from ember.train import step_memory, step_program


def gpt_step(device: str) -> tuple:
    T.manual_seed(0)
    model = build(GPTConfig(vocab=256, block=32, dim=64, n_layer=2, n_head=2))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    outputs, roles, donate = step_program(model, opt, 4, 32, T.autocast("bfloat16", enabled=device == "cuda"))
    sched = cuda.prepare(outputs, "sm_90a") if device == "cuda" else c.prepare(outputs)
    return model, sched, roles, donate


def test_a_program_without_temporaries_holds_its_inputs_and_outputs() -> None:
    x = ir.param("x", dt.f32, (64, 64))
    sched = c.prepare([ir.reduce(Op.SUM, ir.binary(Op.MUL, x, ir.const(2.0, dt.f32, (64, 64))), (1,))])
    assert not sched.temps and schedule.footprint(sched) == {"inputs": 64 * 64 * 4, "outputs": 64 * 4}


def test_a_member_output_that_dies_in_its_merged_kernel_is_freed() -> None:
    """A merged kernel's member output that only later members read dies with the kernel: its
    memory goes to later temporaries (it was never freed: 48 MiB a GPT-2 layer, 0.5 GiB). A
    step with a chunked head has a dozen such outputs (the chunks' row maxima and sums, the
    layernorms' statistics); best fit gives most of them to later temporaries, and none of
    them without the fix."""
    T.manual_seed(0)
    model = build(GPTConfig(vocab=4096, block=256, dim=64, n_layer=1, n_head=2))
    outputs, _, _ = step_program(model, optim.AdamW(model.parameters(), lr=1e-3), 8, 256, T.autocast("bfloat16"))
    sched = cuda.prepare(outputs, "sm_90a")
    size = {b.id: schedule._aligned(b.nbytes) for b in sched.temps}
    first, last = schedule.lifetimes(sched)
    at = sched.slots
    inner = [(i, m.out.id) for i, k in enumerate(sched.kernels) if k.members for m in k.members
             if m.out.id in size and m.out.id != k.out.id and last[m.out.id] == i]
    reused = [any(first[c] > i and at[c] < at[b] + size[b] and at[b] < at[c] + size[c] for c in size) for i, b in inner]
    assert len(inner) >= 6 and sum(reused) >= len(inner) // 2


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_temporaries_alive_together_never_share_memory(device: str) -> None:
    """Two temporaries alive at one kernel lie apart in the arena, unless the kernel writes its
    output over a temporary it reads for the last time, element by element (CUDA only; in a row
    chain, a member's output, merge.in_place)."""
    _, sched, _, _ = gpt_step(device)
    size = {b.id: schedule._aligned(b.nbytes) for b in sched.temps}
    first, last = schedule.lifetimes(sched)
    shared = chained = 0
    for i, k in enumerate(sched.kernels):
        alive = sorted((sched.slots[b], b) for b in first if first[b] <= i <= last[b])
        for (at, a), (next_at, b) in zip(alive, alive[1:]):
            if at + size[a] > next_at:   # (a row chain's member writes over what it reads, merge.in_place)
                outs = {m.out.id for m in k.members or [k]} if k.members and k.plan.rows else {k.out.id}
                out, donor = (b, a) if b in outs else (a, b)
                assert device == "cuda" and out in outs and last[donor] == i
                assert merge.in_place(k, out, next(r for r in k.reads if r.id == donor))
                shared += 1
                chained += out != k.out.id
    assert schedule.arena_bytes(sched) >= max(sched.slots[b] + size[b] for b in size)
    if device == "cuda":   # the logits' gradient over the logits, a member of the loss's row chain
        assert shared and chained


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_footprint_of_a_training_step(device: str) -> None:
    """The parts add up to what the runtime allocates: the inputs, the outputs not written over
    an input, the arena; parameters and the two moments are counted by hand."""
    model, sched, roles, donate = gpt_step(device)
    parts = step_memory(sched, roles, donate)
    params = sum(p.numel() for p in model.parameters())
    assert parts["parameters"] == 4 * params and parts["AdamW moments"] == 8 * params
    arena = sum(v for k, v in parts.items() if k in ("activations", "gradients", "temporaries", "arena gaps"))
    assert arena == schedule.arena_bytes(sched)
    inputs = sum(b.nbytes for b in sched.inputs.values())
    outputs = {b.id: b.nbytes for b in sched.outputs}
    # on the GPU every update is written over the value it replaces: only the loss is an output's own
    expect = 4 if device == "cuda" else sum(outputs.values())
    assert parts.get("outputs", 0) == expect
    assert sum(parts.values()) == inputs + expect + schedule.arena_bytes(sched)
    assert parts["activations"] > 0


def test_dry_run_prints_the_peak(capsys: pytest.CaptureFixture[str]) -> None:
    from ember.cli import main
    assert main(["train", "--dry-run", "--device", "cpu", "--dim", "32", "--layers", "1", "--heads", "2",
                 "--block", "16", "--batch", "2"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("peak device memory"))
    peak, parts = re.match(r"peak device memory ([\d.]+) GiB \((.*)\)", line).groups()
    figures = [float(p.rsplit(" ", 1)[1]) for p in parts.split(", ")]
    assert float(peak) > 0 and abs(sum(figures) - float(peak)) <= 0.01 * float(peak) and "parameters" in parts


def test_kernels_run_early_in_an_order_that_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """outputs_early with every temporary worth freeing early (EAGER_BYTES 0) on a step whose loss
    comes in chunks: a permutation of the kernels in which each reads only what earlier ones
    wrote."""
    from ember.models import gpt
    monkeypatch.setattr(gpt, "LOGITS_CHUNK", 64 * 256)   # two chunks of 64 rows
    _, sched, _, _ = gpt_step("cuda")
    monkeypatch.setattr(schedule, "EAGER_BYTES", 0)
    order = schedule.outputs_early(sched.kernels)
    assert sorted(map(id, order)) == sorted(map(id, sched.kernels))
    made = {k.out.id for k in sched.kernels}
    written: set[int] = set()
    for k in order:
        assert all(b.id in written for b in k.reads if b.id in made and b.id != k.out.id), k.name
        written.add(k.out.id)


def test_gpt2_step_holds_less_than_torch_compile() -> None:
    """Issue 31's bound, on the plan: GPT-2 124M's step (B = 16, T = 1024, bf16 autocast, an
    untied head as bench/train_gpu.py's) under PyTorch's 9.4 GiB peak allocated with
    torch.compile and fused AdamW; the loss's four chunks of logits never all alive."""
    T.manual_seed(0)
    model = build(GPTConfig(vocab=50304, block=1024, dim=768, n_layer=12, n_head=12))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    outputs, roles, donate = step_program(model, opt, 16, 1024, T.autocast("bfloat16"))
    sched = cuda.prepare(outputs, "sm_90a")
    assert sum(step_memory(sched, roles, donate).values()) < 9.4 * 2**30
    first, last = schedule.lifetimes(sched)
    logits = [b.id for b in sched.temps if b.size == 4096 * 50304]
    assert len(logits) == 8 and max(sum(first[b] <= i <= last[b] for b in logits) for i in range(len(sched.kernels))) == 2
