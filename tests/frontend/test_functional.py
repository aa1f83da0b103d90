"""ember.functional against torch.nn.functional: activations (values and gradients) and losses
with their options."""
from __future__ import annotations

import numpy as np
import pytest

import ember.tensor as et
from ember import functional as F
from ember import runners

torch = pytest.importorskip("torch")
TF = torch.nn.functional
pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
rng = np.random.default_rng(0)

X = np.array([-100.0, -20.0, -3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, 6.5, 20.0, 100.0], np.float32)
ACTS = ["relu", "relu6", "leaky_relu", "elu", "celu", "selu", "hardtanh", "hardsigmoid", "hardswish", "softplus",
        "softsign", "logsigmoid", "mish", "silu", "gelu", "sigmoid", "tanh"]


def close(a: et.Tensor, b: "torch.Tensor", tol: float = 1e-5) -> None:
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ACTS)
def test_activation_values_and_gradients(name: str) -> None:
    x = et.tensor(X, requires_grad=True)
    tx = torch.tensor(X, requires_grad=True)
    y, ty = getattr(F, name)(x), getattr(TF, name)(tx)
    close(y, ty)
    y.sum().backward()
    ty.sum().backward()
    assert np.isfinite(x.grad.numpy()).all()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_softmin_normalize() -> None:
    v = rng.standard_normal((3, 5)).astype(np.float32)
    close(F.softmin(et.tensor(v), 1), TF.softmin(torch.tensor(v), 1))
    close(F.normalize(et.tensor(v)), TF.normalize(torch.tensor(v)))
    close(F.normalize(et.tensor(v), p=1.0, dim=0), TF.normalize(torch.tensor(v), p=1.0, dim=0))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [{}, {"ignore_index": 2}, {"label_smoothing": 0.1}, {"weight": True},
                                     {"weight": True, "ignore_index": 0, "label_smoothing": 0.2}])
def test_cross_entropy_and_nll(reduction: str, options: dict) -> None:
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    target = np.array([0, 2, 3, 2, 1, 0])
    w = np.array([0.5, 1.0, 2.0, 1.5], np.float32)
    kw = dict(options, reduction=reduction)
    ekw, tkw = dict(kw), dict(kw)
    if options.get("weight"):
        ekw["weight"], tkw["weight"] = et.tensor(w), torch.tensor(w)
    x, tx = et.tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    y, ty = F.cross_entropy(x, et.tensor(target), **ekw), TF.cross_entropy(tx, torch.tensor(target), **tkw)
    close(y, ty)
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    if "label_smoothing" not in options:
        lp = np.log(np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
        close(F.nll_loss(et.tensor(lp), et.tensor(target), **ekw), TF.nll_loss(torch.tensor(lp), torch.tensor(target), **tkw))


def test_cross_entropy_selects_the_target_as_pytorch_gathers_it() -> None:
    """A -inf logit away from the target leaves the loss and the gradient finite, as in PyTorch
    (a one-hot product made -inf * 0 = NaN); the gradient of logsumexp's max is not taken."""
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    logits[0, 3] = logits[2, 1] = -np.inf
    logits[1, :] = 2.0                     # ties at the max: no share of a gradient through it
    target = np.array([1, 4, 0, 2])
    x, tx = et.tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    y, ty = F.cross_entropy(x, et.tensor(target)), TF.cross_entropy(tx, torch.tensor(target))
    close(y, ty)
    y.backward()
    ty.backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_softmax_gradient_does_not_pass_through_its_max() -> None:
    """softmax and logsumexp subtract their max with ir.stop_gradient: once gradients are
    expanded, nothing compares the input with the max (the ties' share of a max's gradient)."""
    from ember import ir
    from ember.compiler import autodiff, simplify
    x = et.tensor(rng.standard_normal((3, 7)).astype(np.float32), requires_grad=True)
    for f in (lambda t: t.softmax(1), lambda t: t.logsumexp(1), lambda t: t.log_softmax(1)):
        y = f(x) * et.tensor(rng.standard_normal((3, 7) if f(x).ndim == 2 else (3,)).astype(np.float32))
        g = ir.grad(y.sum().node, x.node)
        nodes = ir.toposort(simplify.simplify(autodiff.expand_grads([g])))
        assert not any(n.op in (ir.Op.CMPEQ, ir.Op.BITCAST) for n in nodes)


def test_cross_entropy_probabilities_and_spatial() -> None:
    logits = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)
    probs = rng.random((3, 4, 2, 2)).astype(np.float32)
    probs /= probs.sum(1, keepdims=True)
    close(F.cross_entropy(et.tensor(logits), et.tensor(probs), label_smoothing=0.1),
          TF.cross_entropy(torch.tensor(logits), torch.tensor(probs), label_smoothing=0.1))
    idx = rng.integers(0, 4, (3, 2, 2))
    close(F.cross_entropy(et.tensor(logits), et.tensor(idx)), TF.cross_entropy(torch.tensor(logits), torch.tensor(idx)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_and_binary_losses(reduction: str) -> None:
    a, b = rng.standard_normal(7).astype(np.float32) * 2, rng.standard_normal(7).astype(np.float32)
    p, t = rng.random(7).astype(np.float32), (rng.random(7) > 0.5).astype(np.float32)
    for name, args in (("mse_loss", (a, b)), ("l1_loss", (a, b)), ("smooth_l1_loss", (a, b)), ("huber_loss", (a, b)),
                       ("binary_cross_entropy", (p, t)), ("binary_cross_entropy_with_logits", (a * 20, t))):
        close(getattr(F, name)(*map(et.tensor, args), reduction=reduction),
              getattr(TF, name)(*map(torch.tensor, args), reduction=reduction))
    pw = np.float32([2.0])
    close(F.binary_cross_entropy_with_logits(et.tensor(a), et.tensor(t), pos_weight=et.tensor(pw)),
          TF.binary_cross_entropy_with_logits(torch.tensor(a), torch.tensor(t), pos_weight=torch.tensor(pw)))


@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(log_target: bool) -> None:
    inp = np.log(rng.random((4, 3)).astype(np.float32))
    tgt = rng.random((4, 3)).astype(np.float32)
    tgt[0, 0] = 0.0
    if log_target:
        tgt = np.log(tgt + 1e-3)
    for reduction in ("batchmean", "sum", "none", "mean"):
        close(F.kl_div(et.tensor(inp), et.tensor(tgt), reduction=reduction, log_target=log_target),
              TF.kl_div(torch.tensor(inp), torch.tensor(tgt), reduction=reduction, log_target=log_target))


def test_scaled_dot_product_attention() -> None:
    q, k, v = (rng.standard_normal((2, 5, 4)).astype(np.float32) for _ in range(3))
    for causal in (False, True):
        close(F.scaled_dot_product_attention(et.tensor(q), et.tensor(k), et.tensor(v), is_causal=causal),
              TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), is_causal=causal))
    mask = rng.random((5, 5)) > 0.3
    np.fill_diagonal(mask, True)
    close(F.scaled_dot_product_attention(et.tensor(q), et.tensor(k), et.tensor(v), attn_mask=et.tensor(mask), scale=0.3),
          TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), attn_mask=torch.tensor(mask),
                                          scale=0.3))


def test_modules_sequential_and_activations() -> None:
    from ember import nn
    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3), nn.LeakyReLU(0.2), nn.Softmax(dim=-1), nn.Flatten(0))
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3), torch.nn.LeakyReLU(0.2),
                             torch.nn.Softmax(dim=-1), torch.nn.Flatten(0))
    with torch.no_grad():
        for p, tp in zip(m.parameters(), tm.parameters()):
            tp.copy_(torch.tensor(p.numpy()))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    close(m(et.tensor(x)), tm(torch.tensor(x)))
    assert type(nn.ReLU()).__name__ == "ReLU" and len(m) == 6 and len(nn.ModuleList([nn.Tanh()])) == 1
    with pytest.raises(TypeError):
        nn.LeakyReLU(slope=1)


@pytest.mark.parametrize("options", [{}, {"stride": 2}, {"padding": 1}, {"dilation": 2, "padding": 2}, {"padding": "same"},
                                     {"stride": (2, 1), "padding": (1, 0)}])
def test_conv2d_with_groups_and_gradients(options: dict) -> None:
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    ex, ew = et.tensor(x, requires_grad=True), et.tensor(w, requires_grad=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = F.conv2d(ex, ew, et.tensor(b), groups=2, **options)
    ty = TF.conv2d(tx, tw, torch.tensor(b), groups=2, **options)
    close(y, ty, 1e-4)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_conv1d_conv3d() -> None:
    x1, w1 = rng.standard_normal((2, 3, 10)).astype(np.float32), rng.standard_normal((4, 3, 3)).astype(np.float32)
    close(F.conv1d(et.tensor(x1), et.tensor(w1), stride=2, padding=1), TF.conv1d(torch.tensor(x1), torch.tensor(w1), stride=2, padding=1), 1e-4)
    x3, w3 = rng.standard_normal((1, 2, 4, 5, 4)).astype(np.float32), rng.standard_normal((3, 2, 2, 3, 2)).astype(np.float32)
    close(F.conv3d(et.tensor(x3), et.tensor(w3), padding=1), TF.conv3d(torch.tensor(x3), torch.tensor(w3), padding=1), 1e-4)


@pytest.mark.parametrize("options", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
                                     {"kernel_size": 3, "stride": 2, "ceil_mode": True},
                                     {"kernel_size": 3, "stride": 2, "ceil_mode": True, "padding": 1}])
def test_pools(options: dict) -> None:
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    close(F.max_pool2d(et.tensor(x), **options), TF.max_pool2d(torch.tensor(x), **options))
    close(F.avg_pool2d(et.tensor(x), **options), TF.avg_pool2d(torch.tensor(x), **options), 1e-6)
    close(F.avg_pool2d(et.tensor(x), count_include_pad=False, **options),
          TF.avg_pool2d(torch.tensor(x), count_include_pad=False, **options), 1e-6)
    x1 = x[:, :, 0]
    k = options["kernel_size"]
    close(F.max_pool1d(et.tensor(x1), k), TF.max_pool1d(torch.tensor(x1), k))
    close(F.avg_pool1d(et.tensor(x1), k), TF.avg_pool1d(torch.tensor(x1), k), 1e-6)


def test_conv_modules_batchnorm_groupnorm() -> None:
    from ember import nn
    x = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    bn, tbn = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    for _ in range(2):
        close(bn(et.tensor(x)), tbn(torch.tensor(x)), 1e-5)
    close(bn.running_mean, tbn.running_mean, 1e-6)
    close(bn.running_var, tbn.running_var, 1e-5)
    bn.eval()
    tbn.eval()
    close(bn(et.tensor(x)), tbn(torch.tensor(x)), 1e-5)
    gn, tgn = nn.GroupNorm(3, 3), torch.nn.GroupNorm(3, 3)
    close(gn(et.tensor(x)), tgn(torch.tensor(x)), 1e-5)
    assert nn.ConvTranspose1d(3, 2, 3, stride=2)(et.tensor(x[:, :, 0])).shape == (4, 2, 13)
    assert nn.Upsample(scale_factor=2)(et.tensor(x)).shape == (4, 3, 12, 12)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    assert conv(et.tensor(x)).shape == (4, 4, 6, 6) and len(conv.parameters()) == 2
    assert nn.MaxPool2d(2)(et.tensor(x)).shape == (4, 3, 3, 3) and nn.AvgPool2d(3, 1, 1)(et.tensor(x)).shape == (4, 3, 6, 6)


@pytest.mark.parametrize("options", [{}, {"stride": 2}, {"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2},
                                     {"dilation": 2, "padding": 1}])
def test_conv_transpose(options: dict) -> None:
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    close(F.conv_transpose2d(et.tensor(x), et.tensor(w), **options), TF.conv_transpose2d(torch.tensor(x), torch.tensor(w), **options), 1e-4)
    x1, w1 = x[:, :, 0], w[:, :, 0]
    close(F.conv_transpose1d(et.tensor(x1), et.tensor(w1), **options), TF.conv_transpose1d(torch.tensor(x1), torch.tensor(w1), **options), 1e-4)


def test_adaptive_pools_and_interpolate() -> None:
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    for size in ((2, 3), (3, 4), 1, (5, 7)):
        for kind in ("avg", "max"):
            close(getattr(F, f"adaptive_{kind}_pool2d")(et.tensor(x), size), getattr(TF, f"adaptive_{kind}_pool2d")(torch.tensor(x), size), 1e-6)
    close(F.adaptive_avg_pool1d(et.tensor(x[:, :, 0]), 3), TF.adaptive_avg_pool1d(torch.tensor(x[:, :, 0]), 3), 1e-6)
    for kw in ({"size": (7, 9), "mode": "nearest"}, {"scale_factor": 2, "mode": "nearest"},
               {"size": (7, 9), "mode": "bilinear", "align_corners": False}, {"size": (4, 9), "mode": "bilinear", "align_corners": True},
               {"scale_factor": 0.5, "mode": "bilinear", "align_corners": False}):
        close(F.interpolate(et.tensor(x), **kw), TF.interpolate(torch.tensor(x), **kw), 1e-5)
    close(F.interpolate(et.tensor(x[:, :, 0]), size=11, mode="linear"), TF.interpolate(torch.tensor(x[:, :, 0]), size=11, mode="linear"), 1e-5)


@pytest.mark.parametrize("max_norm", [0.1, 100.0])
def test_clip_grad_norm_matches_torch(max_norm: float) -> None:
    from ember import nn
    rng = np.random.default_rng(0)
    w, b, x = rng.standard_normal((5, 3), np.float32), rng.standard_normal(3, np.float32), rng.standard_normal((4, 5), np.float32)
    ew, eb = et.Tensor(w, requires_grad=True), et.Tensor(b, requires_grad=True)
    ((et.Tensor(x) @ ew + eb) ** 2).sum().backward()
    norm = nn.clip_grad_norm_([ew, eb], max_norm)
    tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    ((torch.tensor(x) @ tw + tb) ** 2).sum().backward()
    tnorm = torch.nn.utils.clip_grad_norm_([tw, tb], max_norm)
    np.testing.assert_allclose(norm.item(), float(tnorm), rtol=1e-6)
    np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(eb.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-6)
