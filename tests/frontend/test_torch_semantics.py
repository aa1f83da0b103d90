"""PyTorch semantics the frontend must match exactly (issue 11): values and gradients against
PyTorch itself, including ties, -0.0, infinities and NaN."""
from __future__ import annotations

import numpy as np
import pytest

import ember.tensor as et
from ember import runners

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif("c" not in runners.available(), reason="no C compiler"),
              pytest.mark.filterwarnings("ignore:.*degrees of freedom:UserWarning")]

SPECIAL = np.array([-3.0, -2.0, -1.5, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, np.inf, -np.inf, np.nan], np.float32)


def same(got: et.Tensor, want: "torch.Tensor", tol: float = 1e-5, signs: bool = True) -> None:
    """signs: also the signs of zeros (not where PyTorch's own differ between builds)."""
    g, w = got.numpy(), want.detach().numpy()
    assert g.shape == w.shape and got.dtype.np_name == str(w.dtype) or (got.dtype.name, w.dtype) in (
        ("bool", np.bool_),), (got.dtype, w.dtype, g.shape, w.shape)
    if w.dtype.kind == "f":
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
        zeros = (w == 0) & (g == 0) & signs
        assert (np.signbit(g[zeros]) == np.signbit(w[zeros])).all(), "signs of zeros differ"
    else:
        np.testing.assert_array_equal(g, w)


def grads(fn, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    x = et.tensor(vals, requires_grad=True)
    fn(x).sum().backward()
    tx = torch.tensor(vals, requires_grad=True)
    fn(tx).sum().backward()
    return x.grad.numpy(), tx.grad.numpy()


@pytest.mark.parametrize("e", [0, 1, 2, 3, 4, 7, -1, -2, 0.5, 2.5, -2.5, 3.0, 1.5])
def test_pow_scalar_exponent(e: float) -> None:
    same(et.tensor(SPECIAL) ** e, torch.tensor(SPECIAL) ** e)


def test_pow_integers_tensors_and_reversed() -> None:
    a, b = np.array([-3, -1, 0, 2, 5]), np.array([2, 3, 0, -1, 1])
    same(et.tensor(a) ** 3, torch.tensor(a) ** 3)
    same(et.tensor(a) ** et.tensor(b), torch.tensor(a) ** torch.tensor(b))
    x, e = SPECIAL[:10], np.array([2.0, 3.0, 0.5, -1.0, 0.0, 2.5, -2.0, 1.0, 0.0, -0.5], np.float32)
    g, w = grads(lambda t: t ** (torch.tensor(e) if isinstance(t, torch.Tensor) else et.tensor(e)), np.abs(x) + 0.5)
    np.testing.assert_allclose(g, w, rtol=1e-5)
    same(et.tensor(x) ** et.tensor(e), torch.tensor(x) ** torch.tensor(e))
    same(2 ** et.tensor(x), 2 ** torch.tensor(x))
    with pytest.raises(ValueError):
        et.tensor(a) ** -1


@pytest.mark.parametrize("e", [0, 1, 2, 3, 2.5, 1.5])
def test_pow_gradients(e: float) -> None:
    g, w = grads(lambda x: x ** e, np.array([0.0, 0.7, 3.0, 1.0], np.float32))
    np.testing.assert_allclose(g, w, rtol=1e-5)


def test_argmax_argmin() -> None:
    v = np.array([[1.0, 3.0, 3.0], [np.nan, 2.0, np.nan], [-1.0, -5.0, -5.0]], np.float32)
    for name in ("argmax", "argmin"):
        for dim in (None, 0, 1, -1):
            same(getattr(et.tensor(v), name)(dim), getattr(torch.tensor(v), name)(dim))
        same(getattr(et.tensor(v), name)(1, keepdim=True), getattr(torch.tensor(v), name)(1, keepdim=True))


def test_out_of_range_dim_is_an_index_error() -> None:
    x = et.tensor(np.zeros((2, 3), np.float32))
    for call in (lambda: x.sum(2), lambda: x.softmax(-3), lambda: x.permute(0, 2), lambda: x.unsqueeze(4),
                 lambda: x.transpose(0, 5), lambda: x.argmax(2), lambda: et.cat([x, x], 2)):
        with pytest.raises(IndexError):
            call()


def test_min_is_exact_at_int_min() -> None:
    v = np.array([-2**31, 5, 0, 2**31 - 1], np.int32)
    same(et.tensor(v).min(), torch.tensor(v).min())
    same(et.tensor(v).minimum(et.tensor(v[::-1].copy())), torch.minimum(torch.tensor(v), torch.tensor(v[::-1].copy())))
    u = np.array([0, 255, 7], np.uint8)
    same(et.tensor(u).min(), torch.tensor(u).min())


def test_where_scalars_keep_their_dtype() -> None:
    c = np.array([True, False, True])
    same(et.where(et.tensor(c), 1, 0), torch.where(torch.tensor(c), 1, 0))
    same(et.where(et.tensor(c), 1.5, 0), torch.where(torch.tensor(c), 1.5, 0))
    x = np.array([1, 2, 3], np.int32)
    same(et.where(et.tensor(c), et.tensor(x), 7), torch.where(torch.tensor(c), torch.tensor(x), 7))
    same(et.where(et.tensor(c), et.tensor(x), 0.5), torch.where(torch.tensor(c), torch.tensor(x), 0.5))


def test_one_hot_int64_and_var_with_large_correction() -> None:
    i = np.array([0, 2, 1])
    same(et.tensor(i).one_hot(4), torch.nn.functional.one_hot(torch.tensor(i), 4))
    v = np.array([[1.0, 2.0], [3.0, 3.0]], np.float32)
    for corr in (1, 2, 3):
        same(et.tensor(v).var(1, correction=corr), torch.tensor(v).var(1, correction=corr))
        same(et.tensor(v).std(1, correction=corr), torch.tensor(v).std(1, correction=corr))
    same(et.tensor(np.array([5.0], np.float32)).var(), torch.tensor([5.0]).var())


def _act(x, name: str):  # type: ignore[no-untyped-def]
    return torch.nn.functional.gelu(x) if name == "gelu" and isinstance(x, torch.Tensor) else getattr(x, name)()


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu"])
def test_activation_gradients_stay_finite(name: str) -> None:
    v = np.array([-1000.0, -90.0, -20.0, -1.0, -1e-6, 0.0, 1e-6, 0.3, 20.0, 90.0, 1000.0], np.float32)
    # gelu's zeros: test_no_silent_answers.test_gelu_zeros_have_the_formulas_sign
    same(_act(et.tensor(v), name), _act(torch.tensor(v), name), signs=name != "gelu")
    g, w = grads(lambda x: _act(x, name), v)
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_gelu_tanh_approximation() -> None:
    v = np.linspace(-6, 6, 25).astype(np.float32)
    same(et.tensor(v).gelu(approximate="tanh"), torch.nn.functional.gelu(torch.tensor(v), approximate="tanh"))


def test_eq_ne_return_tensors_and_truth_value() -> None:
    a, b = np.array([1.0, np.nan, -0.0]), np.array([1.0, np.nan, 0.0])
    same(et.tensor(a) == et.tensor(b), torch.tensor(a) == torch.tensor(b))
    same(et.tensor(a) != et.tensor(b), torch.tensor(a) != torch.tensor(b))
    assert bool(et.tensor([3.0]) == 3.0)
    with pytest.raises(RuntimeError):
        bool(et.tensor([1.0, 2.0]) == 1.0)


def test_detach_stops_gradients_on_leaves() -> None:
    x = et.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    (x * x.detach()).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0])


def test_boolean_mask_indexing() -> None:
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = v % 3 == 1
    same(et.tensor(v)[et.tensor(m)], torch.tensor(v)[torch.tensor(m)])
    rows = np.array([True, False, True])
    same(et.tensor(v)[et.tensor(rows)], torch.tensor(v)[torch.tensor(rows)])
    with pytest.raises(IndexError):
        et.tensor(v)[et.tensor(np.array([True, False]))]


def test_zero_dim_with_dim_argument() -> None:
    x = np.float32(2.5)
    same(et.tensor(x).sum(0), torch.tensor(x).sum(0))
    same(et.tensor(x).amax(-1), torch.tensor(x).amax(-1))
    same(et.tensor(x).max(-1).indices, torch.tensor(x).max(-1).indices)
    same(et.tensor(x).softmax(0), torch.tensor(x).softmax(0))
    same(et.tensor(x).argmax(0), torch.tensor(x).argmax(0))


def test_arange_floats_and_factories_with_grad() -> None:
    same(et.arange(0, 1, 0.1), torch.arange(0, 1, 0.1))
    same(et.arange(5), torch.arange(5))
    same(et.arange(1.5, -2, -0.5), torch.arange(1.5, -2, -0.5))
    x = et.randn(3, 2, requires_grad=True)
    (x * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 2), 2.0, np.float32))


def test_dtype_names() -> None:
    for name, d in (("float32", et.float32), ("int64", et.int64), ("bfloat16", et.bfloat16), ("f16", et.float16)):
        assert et.zeros(2, dtype=name).dtype is d
    assert et.tensor([1, 2], dtype=np.int16).dtype.name == "i16"
    assert et.tensor([1.0]).to("float64").dtype.name == "f64"
    with pytest.raises(TypeError, match="dtype"):
        et.zeros(2, dtype="float33")


def test_cat_keeps_negative_zero_and_nan() -> None:
    a, b = np.array([-0.0, np.nan], np.float32), np.array([np.inf, -0.0], np.float32)
    same(et.cat([et.tensor(a), et.tensor(b)]), torch.cat([torch.tensor(a), torch.tensor(b)]))


def test_gather_rows_is_exact_with_infinities() -> None:
    v = np.array([[np.inf, 1.0], [-0.0, np.nan], [2.0, -np.inf]], np.float32)
    i = np.array([2, 0, 1, 2])
    same(et.tensor(v)[et.tensor(i)], torch.tensor(v)[torch.tensor(i)])


def test_bitwise_and_shifts() -> None:
    a = np.array([-3, -1, 0, 2, 5])
    ta, ea = torch.tensor(a), et.tensor(a)
    same(ea << 2, ta << 2)
    same(ea >> 1, ta >> 1)
    same(~ea, ~ta)
    same(1 & ea, 1 & ta)
    same(ea ^ 6, ta ^ 6)
    same(~et.tensor(np.array([True, False])), ~torch.tensor([True, False]))


GRID = np.concatenate([SPECIAL, np.array([-0.25, 0.25, 0.999, -0.999, 1e-7, -1e-7, 7.5, -7.5, 40.0, -40.0, 1e6, 2.5, -2.5],
                                         np.float32)])
UNARY = {  # name: (domain filter, tolerance)
    "floor": (None, 0), "ceil": (None, 0), "round": (None, 0), "trunc": (None, 0), "frac": (None, 0),
    "sign": (None, 0), "abs": (None, 0), "erf": (None, 1e-6), "erfc": (None, 1e-6), "log10": (None, 1e-6),
    "log1p": (None, 1e-6), "expm1": (None, 1e-6), "tan": (lambda v: np.abs(v) < 1e3, 1e-5),
    "atan": (None, 1e-6), "asin": (None, 1e-6), "acos": (None, 1e-6), "sinh": (lambda v: np.abs(v) < 80, 1e-6),
    "cosh": (lambda v: np.abs(v) < 80, 1e-6), "asinh": (None, 1e-6), "acosh": (None, 1e-6), "atanh": (None, 2e-5),
    "isnan": (None, 0), "isinf": (None, 0), "isfinite": (None, 0), "signbit": (None, 0),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_math(name: str) -> None:
    keep, tol = UNARY[name]
    v = GRID[keep(GRID)] if keep else GRID
    got = getattr(et.tensor(v), name)()
    want = getattr(torch.tensor(v), name)()
    same(got, want, tol)


@pytest.mark.parametrize("name", ["atan", "asinh", "tanh", "sigmoid", "erf", "silu", "gelu"])
def test_unary_math_in_bf16(name: str) -> None:
    """bf16 inputs, each function's own value (some are computed in f32 and rounded once, as
    PyTorch's kernels do: a shared helper once sent asinh and atan to tanh)."""
    v = np.array([-7.5, -2.5, -0.999, -0.25, 0.0, 0.25, 0.999, 2.5, 7.5], np.float32)
    got = getattr(et.tensor(v).cast("bfloat16"), name)().float().numpy()
    want = (getattr(torch, name, None) or getattr(torch.nn.functional, name))(torch.tensor(v).bfloat16()).float().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("name", ["atan", "asinh", "sinh", "tanh", "log1p", "expm1", "erf", "floor", "round"])
def test_unary_gradients(name: str) -> None:
    v = np.array([-2.5, -0.7, -0.1, 0.0, 1e-4, 0.3, 0.9, 2.0, -200.0, 300.0], np.float32)
    if name == "log1p":
        v = v[v > -1]
    if name in ("sinh",):
        v = v[np.abs(v) < 80]
    g, w = grads(lambda x: getattr(x, name)(), v)
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


BINARY = ["atan2", "fmod", "remainder", "copysign", "logaddexp", "maximum", "minimum"]


@pytest.mark.parametrize("name", BINARY)
def test_binary_math(name: str) -> None:
    a = np.repeat(GRID[:16], 16)
    b = np.tile(GRID[:16], 16)
    same(getattr(et.tensor(a), name)(et.tensor(b)), getattr(torch.tensor(a), name)(torch.tensor(b)), 1e-6)


def test_division_modes_and_operators() -> None:
    a = np.array([0., -0., 3., -3., 5.5, -5.5, np.inf, 1.0, 6.0, 7.25, -7.25], np.float32)
    b = np.array([-1., 1., 3., -3., 2., 2., 2., np.inf, -3.0, -0.5, 0.75], np.float32)
    for mode in ("floor", "trunc", None):
        same(et.tensor(a).div(et.tensor(b), rounding_mode=mode), torch.tensor(a).div(torch.tensor(b), rounding_mode=mode))
    same(et.tensor(a) % 2, torch.tensor(a) % 2)
    same(et.tensor(a) // 2, torch.tensor(a) // 2)
    ia, ib = np.array([7, -7, 7, -7, 0]), np.array([2, 2, -2, -2, 3])
    same(et.tensor(ia) // et.tensor(ib), torch.tensor(ia) // torch.tensor(ib))
    same(et.tensor(ia) % et.tensor(ib), torch.tensor(ia) % torch.tensor(ib))
    same(7 % et.tensor(ib), 7 % torch.tensor(ib))


def test_isclose_lerp_clamp_with_tensors() -> None:
    a = np.array([1.0, np.inf, np.nan, 1.0, 0.0], np.float32)
    b = np.array([1.0 + 1e-6, np.inf, np.nan, np.inf, 1e-9], np.float32)
    for equal_nan in (False, True):
        same(et.tensor(a).isclose(et.tensor(b), equal_nan=equal_nan), torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=equal_nan))
    s, e, w = np.float32([0, 1, -2]), np.float32([10, -1, 2]), np.float32([0.25, 0.75, 1.0])
    same(et.tensor(s).lerp(et.tensor(e), et.tensor(w)), torch.lerp(torch.tensor(s), torch.tensor(e), torch.tensor(w)))
    lo, hi = np.float32([-1, 0, 5]), np.float32([1, 0.5, 6])
    same(et.tensor(SPECIAL[:3]).clamp(et.tensor(lo), et.tensor(hi)), torch.tensor(SPECIAL[:3]).clamp(torch.tensor(lo), torch.tensor(hi)))


def test_reductions_any_all_prod_aminmax_dtypes() -> None:
    v = np.array([[1.5, -2.0, 0.0], [3.0, 0.5, -1.0]], np.float32)
    i = np.array([[1, 2, 3], [4, 5, -6]], np.int32)
    for dim in (None, 0, 1):
        kw = {} if dim is None else {"dim": dim}
        same(et.tensor(v).prod(**kw), torch.tensor(v).prod(**kw))
        same(et.tensor(i).prod(**kw), torch.tensor(i).prod(**kw))
        same(et.tensor(i).sum(**kw), torch.tensor(i).sum(**kw))
        same(et.tensor(v).any(**kw), torch.tensor(v).any(**kw))
        same(et.tensor(v).all(**kw), torch.tensor(v).all(**kw))
    mn, mx = et.tensor(v).aminmax(dim=1)
    tm = torch.aminmax(torch.tensor(v), dim=1)
    same(mn, tm.min)
    same(mx, tm.max)
    same(et.tensor(i).sum(dtype="float64"), torch.tensor(i).sum(dtype=torch.float64))
    s, m = et.tensor(v).std_mean((0, 1))
    ts, tm2 = torch.std_mean(torch.tensor(v), (0, 1))
    same(s, ts)
    same(m, tm2)
    g, w = grads(lambda x: x.prod(1), v)
    np.testing.assert_allclose(g, w, rtol=1e-5)


def test_scans() -> None:
    v = np.array([[1.0, -2.0, 3.0, 0.5, 2.0, -1.0, 4.0], [0.5, 0.5, 2.0, -3.0, 1.0, 1.0, -0.25]], np.float32)
    for dim in (0, 1, -1):
        same(et.tensor(v).cumsum(dim), torch.tensor(v).cumsum(dim))
        same(et.tensor(v).cumprod(dim), torch.tensor(v).cumprod(dim))
        same(et.tensor(v).logcumsumexp(dim), torch.tensor(v).logcumsumexp(dim))
        for name in ("cummax", "cummin"):
            a, b = getattr(et.tensor(v), name)(dim)
            ta, tb = getattr(torch.tensor(v), name)(dim)
            same(a, ta)
            same(b, tb)
    same(et.tensor(np.array([1, 2, 3], np.int8)).cumsum(0), torch.tensor([1, 2, 3], dtype=torch.int8).cumsum(0))
    g, w = grads(lambda x: x.cumsum(1) * x.cumsum(1), v)
    np.testing.assert_allclose(g, w, rtol=1e-5)


def test_sort_argsort_topk_kthvalue_median() -> None:
    v = np.array([[3.0, np.nan, 1.0, 3.0, -0.5, 2.0, -0.0], [1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 2.0]], np.float32)
    for desc in (False, True):
        a, b = et.tensor(v).sort(1, descending=desc)
        ta, tb = torch.sort(torch.tensor(v), dim=1, descending=desc, stable=True)
        same(a, ta)
        same(b, tb)
        same(et.tensor(v).argsort(0, descending=desc), torch.argsort(torch.tensor(v), dim=0, descending=desc, stable=True))
    w = np.array([[5.0, 1.0, 4.0, 2.0, 3.0], [0.5, -1.0, 7.0, 2.5, 9.0]], np.float32)
    for largest in (True, False):
        a, b = et.tensor(w).topk(3, largest=largest)
        ta, tb = torch.topk(torch.tensor(w), 3, largest=largest)
        same(a, ta)
        same(b, tb)
    a, b = et.tensor(w).kthvalue(2, 1, keepdim=True)
    ta, tb = torch.kthvalue(torch.tensor(w), 2, 1, keepdim=True)
    same(a, ta)
    same(b, tb)
    same(et.tensor(w).median(), torch.tensor(w).median())
    a, b = et.tensor(w).median(1)
    ta, tb = torch.tensor(w).median(1)
    same(a, ta)
    same(b, tb)
    g, gw = grads(lambda x: x.sort(1)[0] * torch_or_et_range(x), w)
    np.testing.assert_allclose(g, gw, rtol=1e-6)


def torch_or_et_range(x):  # type: ignore[no-untyped-def]
    r = np.arange(5, dtype=np.float32)
    return torch.tensor(r) if isinstance(x, torch.Tensor) else et.tensor(r)


def test_creation() -> None:
    np.testing.assert_allclose(et.linspace(-1, 2, 7).numpy(), torch.linspace(-1, 2, 7).numpy(), rtol=1e-6)
    np.testing.assert_allclose(et.logspace(0, 2, 5).numpy(), torch.logspace(0, 2, 5).numpy(), rtol=1e-6)
    same(et.eye(3, 4), torch.eye(3, 4))
    x = et.tensor(np.ones((2, 3), np.float32))
    for name in ("zeros_like", "ones_like"):
        same(getattr(et, name)(x), getattr(torch, name)(torch.ones(2, 3)))
    same(et.empty_like(x), torch.zeros(2, 3))  # Ember's empty is zeros; PyTorch's is uninitialized
    same(et.full_like(x, 7), torch.full_like(torch.ones(2, 3), 7))
    for indexing in ("ij", "xy"):
        for a, b in zip(et.meshgrid(et.arange(3), et.arange(2), indexing=indexing),
                        torch.meshgrid(torch.arange(3), torch.arange(2), indexing=indexing)):
            same(a, b)
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    for k in (-1, 0, 2):
        same(et.tensor(v).tril(k), torch.tensor(v).tril(k))
        same(et.tensor(v).triu(k), torch.tensor(v).triu(k))


def test_shape_ops() -> None:
    v = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ev, tv = et.tensor(v), torch.tensor(v)
    same(ev.unflatten(2, (2, 2)), tv.unflatten(2, (2, 2)))
    same(ev.roll(1, 2), tv.roll(1, 2))
    same(ev.roll((1, -1), (0, 1)), tv.roll((1, -1), (0, 1)))
    same(ev.roll(5), tv.roll(5))
    for k in (-1, 0, 1):
        same(ev.diagonal(k, 1, 2), tv.diagonal(k, 1, 2))
    d = np.array([1.0, 2.0, 3.0], np.float32)
    for k in (-1, 0, 2):
        same(et.tensor(d).diag(k), torch.tensor(d).diag(k))
    same(ev.repeat_interleave(2, 1), tv.repeat_interleave(2, 1))
    same(ev.repeat_interleave(2), tv.repeat_interleave(2))
    for sections in (3, [1, 3]):
        for a, b in zip(ev.tensor_split(sections, 2), tv.tensor_split(sections, 2)):
            same(a, b)
    same(ev.clone(), tv.clone())
    same(ev.movedim(0, 2), tv.movedim(0, 2))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_modes(mode: str) -> None:
    from ember import functional as F
    v = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for pads in ([1, 2], [2, 1, 1, 2], [0, 2, 2, 0]):
        same(F.pad(et.tensor(v), pads, mode=mode), torch.nn.functional.pad(torch.tensor(v), pads, mode=mode))
    if mode == "constant":
        same(F.pad(et.tensor(v), [-1, 2, 1, -1], value=7.0), torch.nn.functional.pad(torch.tensor(v), [-1, 2, 1, -1], value=7.0))


def test_indexing_forms() -> None:
    v = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    ev, tv = et.tensor(v), torch.tensor(v)
    cases = [(None, 1), (slice(None), None, 2), (..., None), (0, slice(None, None, 2)), (slice(None, None, 2), slice(1, None, 3)),
             ([2, 0],), (slice(None), [3, 1, 1]), (1, [0, 2], slice(None)), (slice(None), slice(None), [[0, 1], [4, 4]]),
             (None, ..., None, 0)]
    for c in cases:
        same(ev[c], tv[tuple(torch.tensor(x) if isinstance(x, list) else x for x in c)])
    with pytest.raises(IndexError):
        ev[0, 0, 0, 0]


def test_gather_scatter_select_fill_einsum() -> None:
    v = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    ev, tv = et.tensor(v), torch.tensor(v)
    i = np.array([[0, 3], [2, 1], [1, 1]])
    same(ev.gather(1, et.tensor(i)), tv.gather(1, torch.tensor(i)))
    same(ev.index_select(1, et.tensor(np.array([3, 0]))), tv.index_select(1, torch.tensor([3, 0])))
    src = np.full((3, 2), 1.5, np.float32)
    same(ev.scatter_add(1, et.tensor(i), et.tensor(src)), tv.scatter_add(1, torch.tensor(i), torch.tensor(src)))
    m = v % 3 == 1
    same(ev.masked_fill(et.tensor(m), -1.0), tv.masked_fill(torch.tensor(m), -1.0))
    same(ev.masked_select(et.tensor(m)), tv.masked_select(torch.tensor(m)))
    same(ev.nonzero(), tv.nonzero())
    a, b = rng_arr((3, 4)), rng_arr((4, 5))
    for eq, ops in (("ij,jk->ik", (a, b)), ("ij->ji", (a,)), ("ij->", (a,)), ("ii->i", (a[:, :3],)), ("ij,ij->i", (a, a)),
                    ("bij,bjk->bik", (np.stack([a, a]), np.stack([b, b]))), ("i,j->ij", (a[0], b[0]))):
        same(et.einsum(eq, *map(et.tensor, ops)), torch.einsum(eq, *map(torch.tensor, ops)), 1e-5)


def rng_arr(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_and_scatter(reduce: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    i = np.array([[0, 3], [2, 2], [1, 1]])
    src = rng_arr((3, 2))
    for include_self in (True, False):
        same(et.tensor(x).scatter_reduce(1, et.tensor(i), et.tensor(src), reduce, include_self=include_self),
             torch.tensor(x).scatter_reduce(1, torch.tensor(i), torch.tensor(src), reduce, include_self=include_self), 1e-6)
    distinct = np.array([[0, 3], [2, 0], [1, 3]])
    same(et.tensor(x).scatter(1, et.tensor(distinct), et.tensor(src)), torch.tensor(x).scatter(1, torch.tensor(distinct), torch.tensor(src)))
    same(et.tensor(x).scatter(1, et.tensor(distinct), value=-1.0), torch.tensor(x).scatter(1, torch.tensor(distinct), value=-1.0))


def test_setitem_is_functional() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for idx, value in (((1, slice(1, 3)), 100.0), ((slice(None), 0), np.array([7.0, 8.0, 9.0], np.float32)),
                       ((Ellipsis, -1), -2.0)):
        e, t = et.tensor(x), torch.tensor(x)
        e[idx] = et.tensor(value) if isinstance(value, np.ndarray) else value
        t[idx] = torch.tensor(value) if isinstance(value, np.ndarray) else value
        same(e, t)
    e, t = et.tensor(x), torch.tensor(x)
    e[et.tensor(x > 5)] = 0.0
    t[torch.tensor(x > 5)] = 0.0
    same(e, t)


def test_max_pool_indices_and_unpool() -> None:
    from ember import functional as F
    im = rng_arr((1, 2, 4, 6))
    v, ix = F.max_pool2d_with_indices(et.tensor(im), 2)
    tv, tix = torch.nn.functional.max_pool2d(torch.tensor(im), 2, return_indices=True)
    same(v, tv)
    same(ix, tix)
    same(F.max_unpool2d(v, ix, 2), torch.nn.functional.max_unpool2d(tv, tix, 2))


def test_function_forms_and_aliases() -> None:
    v = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    ev, tv = et.tensor(v), torch.tensor(v)
    for name in ("exp", "log1p", "sigmoid", "cumsum", "argmax", "flatten", "t", "square"):
        args = (1,) if name == "cumsum" else ()
        same(getattr(et, name)(ev, *args), getattr(torch, name)(tv, *args), 1e-6)
    same(et.maximum(ev, et.tensor(v.T.copy())), torch.maximum(tv, tv.T))
    same(ev.add(ev, alpha=2), tv.add(tv, alpha=2))
    same(ev.reshape(-1).dot(ev.reshape(-1)), tv.reshape(-1).dot(tv.reshape(-1)))
    same(ev[0].outer(ev[1]), tv[0].outer(tv[1]))
    same(ev.mm(ev), tv.mm(tv))
    same(ev.logical_and(ev > 0), tv.logical_and(tv > 0))
    w = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    same(et.tensor(w).nan_to_num(), torch.tensor(w).nan_to_num())
    same(et.tensor(w).nan_to_num(1.0, 2.0, -2.0), torch.tensor(w).nan_to_num(1.0, 2.0, -2.0))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_shape = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None)
@given(a=_shape, b=_shape, op=st.sampled_from(["add", "sub", "mul", "maximum", "atan2", "remainder", "lt"]),
       seed=st.integers(0, 2**16))
def test_broadcasting_binary_ops_random_shapes(a: tuple, b: tuple, op: str, seed: int) -> None:
    """Shapes drawn at random; where PyTorch refuses to broadcast, Ember must refuse too."""
    r = np.random.default_rng(seed)
    x, y = r.standard_normal(a).astype(np.float32), r.standard_normal(b).astype(np.float32) + 0.5
    try:
        want = getattr(torch, op)(torch.tensor(x), torch.tensor(y))
    except RuntimeError:
        with pytest.raises(ValueError):
            getattr(et.tensor(x), op)(et.tensor(y))
        return
    same(getattr(et.tensor(x), op)(et.tensor(y)), want, 1e-5)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), data=st.data())
def test_reductions_random_shapes_and_dims(shape: tuple, data: st.DataObject) -> None:
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape), unique_by=lambda d: d % len(shape)))
    keepdim = data.draw(st.booleans())
    v = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    for name in ("sum", "mean", "amax", "amin", "var", "std"):
        same(getattr(et.tensor(v), name)(tuple(dims), keepdim=keepdim), getattr(torch.tensor(v), name)(tuple(dims), keepdim=keepdim), 1e-5)


def test_found_by_a_sweep_of_every_shared_method() -> None:
    """Differences a sweep of every method Ember and PyTorch share found (forward and gradient
    on random, positive, integer and bool inputs): each is PyTorch's behaviour now."""
    b = np.array([[True, False, True], [False, False, True]])
    for name in ("amax", "amin", "sign", "sgn", "square"):
        same(getattr(et.tensor(b), name)(), getattr(torch.tensor(b), name)())
    same(et.tensor(b).max(1).values, torch.tensor(b).max(1).values)
    same(et.tensor(b).sort(1).values, torch.tensor(b).sort(1).values)
    same(et.tensor(b).argsort(1), torch.tensor(b).argsort(1))
    i, j = np.array([0, 2, 3], np.int64), np.array([5, 1, 2], np.int64)
    same(et.tensor(i).xlogy(et.tensor(j)), torch.tensor(i).xlogy(torch.tensor(j)))
    same(et.tensor(j).topk(0).values, torch.tensor(j).topk(0).values)
    x = np.array([0.5, 1.5, 3.0], np.float32)
    g, tg = grads(lambda t: t.acosh(), x)  # finite above 1: it was NaN everywhere
    np.testing.assert_allclose(g, tg, rtol=1e-5)
    from ember import functional as F
    inp, tgt = np.log(np.array([0.2, 0.5, 0.3], np.float32)), np.array([0.5, -0.1, 0.0], np.float32)
    same(F.kl_div(et.tensor(inp), et.tensor(tgt), reduction="none"),
         torch.nn.functional.kl_div(torch.tensor(inp), torch.tensor(tgt), reduction="none"))
