"""Online reductions (compiler/online.py): a max and the sums weighted by its exponentials run
in one loop on the C backend, and agree with the reference evaluator, special values included."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ember import runners, text
from ember.backend import c

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")

SOFTMAX = """ember 1
x = param {t}[5,6]
m = max x axes=[1]
mb = expand m shape=[5,6]
d = sub x mb
k = const 1.4426950408889634 {t}[5,6]
a = mul d k
e = exp2 a
l = sum e axes=[1]
lb = expand l shape=[5,6]
p = div e lb
lg = log2 l
lse = add m lg
return {out}
"""

ROWS = np.array([[0.5, -1.0, 2.0, 3.0, 0.0, 1.0],
                 [-np.inf, -np.inf, 1.0, 2.0, -np.inf, 0.5],     # masked at the start: the running max is -inf
                 [-np.inf] * 6,                                  # all masked: NaN, as the reference
                 [1.0, np.inf, 2.0, 0.0, 3.0, 4.0],
                 [1.0, 2.0, np.nan, 0.0, 3.0, 4.0]], np.float32)


def both(outputs: list, inputs: dict) -> tuple[list, list]:
    return ([np.asarray(v) for v in runners.BACKENDS["c"].run(outputs, inputs)],
            [np.asarray(v) for v in runners.BACKENDS["ref"].run(outputs, inputs)])


@pytest.mark.parametrize("out", ["p", "lse"])
def test_softmax_and_logsumexp_in_one_pass_match_the_reference(out: str) -> None:
    prog = text.parse(SOFTMAX.format(t="f32", out=out))
    (k,) = c.prepare(prog.output_nodes).kernels
    assert k.plan.online is not None and len(k.plan.online.sums) == 1   # the max and the sum in one loop
    (got,), (want,) = both(prog.output_nodes, {prog.nodes["x"]: ROWS})
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True)


def test_half_precision_keeps_its_rounding_per_op() -> None:
    prog = text.parse(SOFTMAX.format(t="bf16", out="p"))
    assert all(getattr(k.plan, "online", None) is None for k in c.prepare(prog.output_nodes).kernels)


def attention(s: int, d: int, causal: bool) -> tuple[list, list]:
    """The primitive graph bench/attention_cpu.py times, with a batch of 2."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    from attention_cpu import program
    return program(s, d, causal, batch=2)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_one_loop_over_the_keys(causal: bool) -> None:
    params, outputs = attention(24, 8, causal)
    sched = c.prepare(outputs)
    assert len(sched.kernels) == 1 and not sched.temps
    (k,) = sched.kernels
    assert k.plan.online is not None and len(k.plan.online.sums) == 2   # the denominator and the weighted sum of v
    assert (k.plan.online.stop is not None) == causal     # past the diagonal, no score is computed
    source = "\n".join(c.render(sched).kernels)
    assert source.count("ember_exp2f(") == 2    # a term and a rescale, in the one loop: no other pass
    rng = np.random.default_rng(0)
    inputs = {p: rng.standard_normal(p.shape).astype(np.float32) * 2 for p in params}
    (got,), (want,) = both(outputs, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)   # sums of +-2 terms: absolute error


@pytest.mark.parametrize("mask", ["causal", "bool", "none"])
def test_the_frontends_attention_ends_its_loop_at_the_diagonal(mask: str) -> None:
    """F.scaled_dot_product_attention's causal mask (where(cols <= rows, s, -inf)) bounds the
    loop over the keys; a boolean mask of data does not (nothing is known of it)."""
    from ember import functional as F
    from ember import tensor as T
    rng = np.random.default_rng(0)
    q, k, v = (T.Tensor(rng.standard_normal((1, 2, 20, 8)).astype(np.float32)) for _ in range(3))
    keep = T.Tensor(rng.random((20, 20)) < 0.7)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep if mask == "bool" else None,
                                         is_causal=mask == "causal")
    outputs, slots = T.canonical_program([out.node])
    last = c.prepare(outputs).kernels[-1]
    assert last.plan.online is not None and (last.plan.online.stop is not None) == (mask == "causal")
    inputs = {slot: T._host(T._DATA[p]) for p, slot in slots.items()}
    (got,), (want,) = both(outputs, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(8))
def test_random_attention_matches_the_reference(seed: int) -> None:
    """Batches, heads, lengths of queries and keys, masks (causal, boolean, additive, none),
    scales, and an inf in v behind the mask: C against the reference evaluator."""
    from ember import functional as F
    from ember import tensor as T
    rng = np.random.default_rng(seed)
    b, h, s, t, d = (int(rng.choice(c)) for c in ([1, 2], [1, 3], [1, 5, 17], [1, 3, 17, 40], [1, 3, 8]))
    mask = str(rng.choice(["none", "causal", "bool", "float"]))
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) * 2 for n in (s, t, t))
    keep = rng.random((s, t)) < 0.6
    if mask == "bool":   # the first key is inf in v, and masked in half the rows: 0 * inf is NaN
        v[..., 0, :] = np.inf          # there (seen while the running max is still -inf), inf elsewhere
        keep[:, 0] = np.arange(s) % 2 == 0
    mine = T.Tensor(keep) if mask == "bool" else T.Tensor(rng.standard_normal((s, t)).astype(np.float32)) \
        if mask == "float" else None
    out = F.scaled_dot_product_attention(T.Tensor(q), T.Tensor(k), T.Tensor(v), attn_mask=mine,
                                         is_causal=mask == "causal" and s == t, scale=float(rng.choice([0.1, 1.0])))
    outputs, slots = T.canonical_program([out.node])
    inputs = {slot: T._host(T._DATA[p]) for p, slot in slots.items()}
    (got,), (want,) = both(outputs, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_cross_entropy_joins_its_max_and_sum() -> None:
    """The pick of the target's log-probability reads the finished max, so it stays a reduction
    after the loop; the max and the sum of exponentials run together (two passes, not three)."""
    from ember import functional as F
    from ember import tensor as T
    rng = np.random.default_rng(0)
    logits = T.Tensor(rng.standard_normal((16, 300)).astype(np.float32) * 4)
    target = T.Tensor(np.where(np.arange(16) % 5 == 0, -100, rng.integers(0, 300, 16)).astype(np.int64))
    outputs, slots = T.canonical_program([F.cross_entropy(logits, target).node])
    assert any(getattr(k.plan, "online", None) is not None for k in c.prepare(outputs).kernels)
    inputs = {slot: T._host(T._DATA[p]) for p, slot in slots.items()}
    (got,), (want,) = both(outputs, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-6)
