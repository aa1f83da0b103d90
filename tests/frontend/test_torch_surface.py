"""The PyTorch surface a training script reaches for without thinking (issue 32, item 6): each
against PyTorch itself, through `import ember as torch`-style names."""
from __future__ import annotations

import math

import ember.nn.functional as EF
import ember.nn.init as einit
import numpy as np
import pytest

import ember
import ember.nn as enn
from ember import optim, runners

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
RNG = np.random.default_rng(0)


def arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def close(got: ember.Tensor, want: "torch.Tensor", tol: float = 1e-5) -> None:
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol)


def test_no_grad_and_inference_mode_record_no_gradient() -> None:
    w, tw = ember.tensor(arr(3), requires_grad=True), None
    tw = torch.tensor(w.numpy(), requires_grad=True)
    for mode in (ember.no_grad, ember.inference_mode):
        with mode():
            y = w * 2
        assert y.requires_grad is False and ember.is_grad_enabled()
    with torch.no_grad():
        ty = tw * 2
    assert (w * 2).requires_grad and ty.requires_grad is False
    # a result computed without gradients is a constant of later graphs: the gradient skips it
    with ember.no_grad():
        target = w * 3
    (w * target).sum().backward()
    with torch.no_grad():
        ttarget = tw * 3
    (tw * ttarget).sum().backward()
    close(w.grad, tw.grad)

    @ember.no_grad()
    def f(x: ember.Tensor) -> ember.Tensor:
        return x * 2

    @ember.no_grad
    def g(x: ember.Tensor) -> ember.Tensor:
        return x * 2
    assert not f(w).requires_grad and not g(w).requires_grad and ember.is_grad_enabled()
    with ember.no_grad():
        with ember.enable_grad():
            assert (w * 2).requires_grad
    ember.set_grad_enabled(False)
    assert not (w * 2).requires_grad
    ember.set_grad_enabled(True)
    with ember.set_grad_enabled(False):
        assert not ember.is_grad_enabled()
    assert ember.is_grad_enabled()
    with pytest.raises(RuntimeError, match="does not require grad"):
        (w.detach() * 2).sum().backward()


def test_python_numbers_format_and_requires_grad_() -> None:
    t, tt = ember.tensor(2.5), torch.tensor(2.5)
    assert float(t) == float(tt) and int(t) == int(tt) and bool(t) == bool(tt)
    assert f"{t:.3f}" == f"{tt:.3f}" and f"{ember.tensor([1.5]).sum():5.1f}" == "  1.5"
    with pytest.raises(ValueError):
        float(ember.tensor([1.0, 2.0]))
    x = (ember.randn(3) * 2).requires_grad_()
    assert x.is_leaf and x.requires_grad
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError):
        (x * 2).requires_grad_(False)
    got = ember.tensor([ember.tensor(1.0), ember.tensor(2.0)])
    assert got.dtype == ember.float32 and got.tolist() == torch.tensor([torch.tensor(1.0), torch.tensor(2.0)]).tolist()
    assert ember.long is ember.int64 and ember.float is ember.float32 and ember.int is ember.int32
    assert ember.double is ember.float64 and ember.half is ember.float16 and ember.bool is ember.bool_
    assert ember.tensor([1, 2], dtype=ember.long).dtype == ember.int64


def test_in_place_forms() -> None:
    a = arr(4)
    x, tx = ember.tensor(a), torch.tensor(a)
    y, ty = x * 2, tx * 2         # computed before the in-place ops: keeps the old value, as PyTorch
    for name, args in (("add_", (1.5,)), ("mul_", (2.0,)), ("sub_", (0.5,)), ("clamp_", (-1.0, 1.0)),
                       ("div_", (4.0,))):
        getattr(x, name)(*args)
        getattr(tx, name)(*args)
    x.add_(ember.tensor(a), alpha=2)
    tx.add_(torch.tensor(a), alpha=2)
    close(x, tx)
    close(y, ty)
    x.copy_(ember.tensor(a[::-1].copy()))
    close(x, torch.tensor(a[::-1].copy()))
    close(x.fill_(3.0), torch.full((4,), 3.0))
    close(x.zero_(), torch.zeros(4))
    w = ember.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        w.add_(1.0)
    with ember.no_grad():     # a hand-written SGD step
        w.sub_(ember.ones(4) * 0.5)
    assert w.is_leaf and w.requires_grad
    np.testing.assert_allclose(w.numpy(), a - 0.5)
    e, th = ember.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    h, tz = e * 1, th * 1    # on a result, the gradient flows through
    h.mul_(e)
    tz.mul_(th)
    h.sum().backward()
    tz.sum().backward()
    close(e.grad, th.grad)


def test_devices() -> None:
    x = ember.zeros(2)
    assert x.device == "cpu" and x.device.type == "cpu" and x.cpu() is x
    assert x.to("cpu", ember.float64).dtype == ember.float64 and x.to(dtype=ember.int32).dtype == ember.int32
    if not ember.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            x.cuda()
        with pytest.raises(RuntimeError, match="cuda"):
            enn.Linear(2, 2).to("cuda")
    ember.set_default_device("cpu")


def test_module_surface() -> None:
    class Net(enn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = enn.Sequential(enn.Linear(3, 4), enn.ReLU(), enn.Linear(4, 2))
            self.scale = enn.Parameter(ember.ones(2))
            self.register_buffer("offset", ember.zeros(2))

        def forward(self, x: ember.Tensor) -> ember.Tensor:
            return self.body(x) * self.scale + self.offset

    class TNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
            self.scale = torch.nn.Parameter(torch.ones(2))
            self.register_buffer("offset", torch.zeros(2))

    m, tm = Net(), TNet()
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert list(m.state_dict()) == list(tm.state_dict())
    assert isinstance(m.scale, enn.Parameter) and isinstance(m.scale, ember.Tensor)
    assert m.eval() is m and not m.body[0].training and m.train().body[1].training
    m(ember.randn(5, 3)).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    m.to(ember.float64)
    assert m.body[0].weight.dtype == ember.float64 and m.body[0].weight.is_leaf and m.offset.dtype == ember.float64
    assert m.to("cpu") is m and len(list(m.modules())) == len(list(tm.modules()))
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    assert seen[-1] == "Net" and seen.count("Linear") == 2


def test_init_in_place_on_parameters() -> None:
    lin, tlin = enn.Linear(200, 300), torch.nn.Linear(200, 300)
    w = lin.weight
    for name, kwargs in (("xavier_uniform_", {}), ("kaiming_uniform_", {"a": math.sqrt(5)}),
                         ("kaiming_uniform_", {"nonlinearity": "relu", "mode": "fan_out"}), ("uniform_", {"a": -2, "b": 3})):
        getattr(einit, name)(w, **kwargs)
        getattr(torch.nn.init, name)(tlin.weight, **kwargs)
        lo, hi = float(tlin.weight.detach().min()), float(tlin.weight.detach().max())
        assert w is lin.weight and w.is_leaf and w.requires_grad
        got = w.numpy()
        assert lo - 0.02 * abs(lo) <= got.min() and got.max() <= hi + 0.02 * abs(hi)
        assert abs(got.std() - float(tlin.weight.detach().std())) < 0.02 * float(tlin.weight.detach().std())
    for name, kwargs in (("normal_", {"std": 0.02}), ("xavier_normal_", {}), ("kaiming_normal_", {}),
                         ("trunc_normal_", {"std": 0.5, "a": -1.0, "b": 1.0})):
        getattr(einit, name)(w, **kwargs)
        getattr(torch.nn.init, name)(tlin.weight, **kwargs)
        assert abs(w.numpy().std() - float(tlin.weight.detach().std())) < 0.03 * float(tlin.weight.detach().std())
    assert np.abs(w.numpy()).max() <= 1.0
    for name in ("zeros_", "ones_"):
        getattr(einit, name)(lin.bias)
        close(lin.bias, getattr(torch.nn.init, name)(tlin.bias))
    close(einit.constant_(lin.bias, 0.25), torch.nn.init.constant_(tlin.bias, 0.25))
    assert einit.calculate_gain("leaky_relu", 0.2) == torch.nn.init.calculate_gain("leaky_relu", 0.2)


def test_clip_grad_norm_() -> None:
    a, b = arr(3, 4), arr(5)
    ps, tps = [ember.tensor(a, requires_grad=True), ember.tensor(b, requires_grad=True)], \
        [torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)]
    for norm_type in (2.0, 1.0, math.inf):
        for p, tp in zip(ps, tps):
            p.grad, tp.grad = None, None
        ((ps[0] * 3).sum() + (ps[1] ** 2).sum()).backward()
        ((tps[0] * 3).sum() + (tps[1] ** 2).sum()).backward()
        close(enn.utils.clip_grad_norm_(ps, 1.5, norm_type), torch.nn.utils.clip_grad_norm_(tps, 1.5, norm_type))
        for p, tp in zip(ps, tps):
            close(p.grad, tp.grad)


@pytest.mark.parametrize("name,kwargs,target", [
    ("MSELoss", {}, "float"), ("L1Loss", {"reduction": "sum"}, "float"), ("CrossEntropyLoss", {}, "class"),
    ("CrossEntropyLoss", {"label_smoothing": 0.1, "ignore_index": 1}, "class"), ("NLLLoss", {}, "class"),
    ("BCEWithLogitsLoss", {"pos_weight": "w"}, "prob"), ("SmoothL1Loss", {"beta": 0.5}, "float"),
    ("HuberLoss", {"reduction": "none"}, "float")])
def test_loss_modules(name: str, kwargs: dict, target: str) -> None:
    x = arr(6, 4)
    t = {"float": arr(6, 4), "class": RNG.integers(0, 4, 6), "prob": RNG.random((6, 4)).astype(np.float32)}[target]
    ek = {k: ember.tensor(np.ones(4, np.float32) * 2) if v == "w" else v for k, v in kwargs.items()}
    tk = {k: torch.full((4,), 2.0) if v == "w" else v for k, v in kwargs.items()}
    xe, xt = ember.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    got, want = getattr(enn, name)(**ek)(xe, ember.tensor(t)), getattr(torch.nn, name)(**tk)(xt, torch.tensor(t))
    close(got, want)
    got.sum().backward()
    want.sum().backward()
    close(xe.grad, xt.grad)


def test_functional_linear_layer_norm_embedding_gelu() -> None:
    x, w, b = arr(2, 3, 4), arr(5, 4), arr(5)
    close(EF.linear(ember.tensor(x), ember.tensor(w), ember.tensor(b)),
          torch.nn.functional.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b)))
    lw, lb = arr(3, 4), arr(3, 4)
    close(EF.layer_norm(ember.tensor(x), (3, 4), ember.tensor(lw), ember.tensor(lb)),
          torch.nn.functional.layer_norm(torch.tensor(x), (3, 4), torch.tensor(lw), torch.tensor(lb)), 1e-4)
    close(enn.LayerNorm(4, elementwise_affine=False)(ember.tensor(x)),
          torch.nn.LayerNorm(4, elementwise_affine=False)(torch.tensor(x)), 1e-4)
    idx, table = RNG.integers(0, 6, (2, 3)), arr(6, 4)
    te, tt = ember.tensor(table, requires_grad=True), torch.tensor(table, requires_grad=True)
    got, want = EF.embedding(ember.tensor(idx), te, padding_idx=2), torch.nn.functional.embedding(
        torch.tensor(idx), tt, padding_idx=2)
    close(got, want)
    (got * ember.tensor(arr(2, 3, 4))).sum().backward()
    RNG2 = np.random.default_rng(0)
    (want * torch.tensor(RNG2.standard_normal((2, 3, 4)).astype(np.float32))).sum().backward()
    assert (te.grad.numpy()[2] == 0).all() and (tt.grad.numpy()[2] == 0).all()
    assert (enn.Embedding(5, 3, padding_idx=0).weight.numpy()[0] == 0).all()
    for approximate in ("none", "tanh"):
        close(EF.gelu(ember.tensor(x), approximate=approximate),
              torch.nn.functional.gelu(torch.tensor(x), approximate=approximate))


def _pair(opt_name: str, groups: bool, **kw: object) -> tuple:
    a, b = arr(3, 2), arr(2)
    ep = [ember.tensor(a, requires_grad=True), ember.tensor(b, requires_grad=True)]
    tp = [torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)]
    mk = (lambda ps: [{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.05}]) if groups else (lambda ps: ps)
    return ep, tp, getattr(optim, opt_name)(mk(ep), **kw), getattr(torch.optim, opt_name)(mk(tp), **kw)


def _steps(ep: list, tp: list, eo: object, to: object, n: int, sched: tuple = ()) -> None:
    x = arr(4, 3)
    for _ in range(n):
        for ps, o, xx in ((ep, eo, ember.tensor(x)), (tp, to, torch.tensor(x))):
            o.zero_grad()
            (((xx @ ps[0]) + ps[1]) ** 2).sum().backward()
            o.step()
        for s in sched:
            s.step()


@pytest.mark.parametrize("opt_name,kw", [("Adam", {"lr": 0.01}), ("Adam", {"lr": 0.01, "weight_decay": 0.1}),
                                         ("AdamW", {"lr": 0.01}), ("SGD", {"lr": 0.01, "momentum": 0.9}),
                                         ("SGD", {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
                                         ("SGD", {"lr": 0.01, "momentum": 0.5, "dampening": 0.3})])
def test_optimizers_with_param_groups(opt_name: str, kw: dict) -> None:
    ep, tp, eo, to = _pair(opt_name, True, **kw)
    assert [g["lr"] for g in eo.param_groups] == [g["lr"] for g in to.param_groups]
    _steps(ep, tp, eo, to, 3)
    for p, q in zip(ep, tp):
        close(p, q, 1e-5)
    eo.param_groups[1]["lr"] = to.param_groups[1]["lr"] = 0.2
    _steps(ep, tp, eo, to, 2)
    for p, q in zip(ep, tp):
        close(p, q, 1e-5)
    state = eo.state_dict()
    ep2 = [ember.tensor(p.numpy(), requires_grad=True) for p in ep]
    eo2 = getattr(optim, opt_name)([{"params": [ep2[0]]}, {"params": [ep2[1]]}], **kw)
    eo2.load_state_dict(state)
    assert eo2.param_groups[1]["lr"] == 0.2
    _steps(ep2, tp, eo2, to, 1)
    for p, q in zip(ep2, tp):
        close(p, q, 1e-5)
    extra = ember.tensor(arr(2), requires_grad=True)
    eo.add_param_group({"params": [extra], "lr": 0.5})
    assert eo.param_groups[-1]["lr"] == 0.5 and len(eo.param_groups) == 3
    with pytest.raises(ValueError):
        eo.add_param_group({"params": [extra]})


@pytest.mark.parametrize("make", [
    lambda lr, o: lr.LambdaLR(o, lambda e: 0.9 ** e), lambda lr, o: lr.StepLR(o, 2, 0.5),
    lambda lr, o: lr.CosineAnnealingLR(o, 6, 0.001), lambda lr, o: lr.LinearLR(o, 0.1, total_iters=3),
    lambda lr, o: lr.MultiStepLR(o, [1, 3], 0.3), lambda lr, o: lr.ExponentialLR(o, 0.8),
    lambda lr, o: lr.SequentialLR(o, [lr.LinearLR(o, 0.25, total_iters=2), lr.CosineAnnealingLR(o, 4)], [2])])
def test_lr_schedulers(make: object) -> None:
    ep, tp, eo, to = _pair("SGD", True, lr=0.1)
    es, ts = make(optim.lr_scheduler, eo), make(torch.optim.lr_scheduler, to)
    for _ in range(6):
        np.testing.assert_allclose(es.get_last_lr(), ts.get_last_lr(), rtol=1e-6)
        _steps(ep, tp, eo, to, 1, (es, ts))
    for p, q in zip(ep, tp):
        close(p, q, 1e-5)


def test_save_and_load(tmp_path: object) -> None:
    m = enn.Sequential(enn.Linear(3, 2), enn.BatchNorm1d(2))
    o = optim.AdamW(m.parameters(), lr=0.1)
    m(ember.randn(4, 3)).sum().backward()
    o.step()
    path = f"{tmp_path}/ckpt.safetensors"
    ember.save({"model": m.state_dict(), "opt": o.state_dict(), "step": 7, "name": "run"}, path)
    back = ember.load(path)
    assert back["step"] == 7 and back["name"] == "run" and set(back["model"]) == set(m.state_dict())
    m2 = enn.Sequential(enn.Linear(3, 2), enn.BatchNorm1d(2))
    m2.load_state_dict(back["model"])
    x = ember.randn(4, 3)
    np.testing.assert_array_equal(m2.eval()(x).numpy(), m.eval()(x).numpy())
    o2 = optim.AdamW(m2.parameters(), lr=0.1)
    o2.load_state_dict(back["opt"])
    assert o2.steps == 1
    from safetensors.numpy import load_file
    assert set(load_file(path)) == {f"model.{k}" for k in m.state_dict()} | {f"opt.{k}" for k in o.state_dict()}
    with pytest.raises(TypeError):
        ember.save({"f": object()}, path)


def test_matmul_of_two_vectors() -> None:
    a, b = arr(5), arr(5)
    close(ember.tensor(a) @ ember.tensor(b), torch.tensor(a) @ torch.tensor(b))
    with pytest.raises(ValueError):
        ember.tensor(a) @ ember.tensor(arr(4))


def test_a_hand_written_training_loop_and_top_level_names() -> None:
    ember.manual_seed(0)
    a = arr(16, 3)
    w, b = ember.zeros(3, 1, requires_grad=True), ember.zeros(1, requires_grad=True)
    tw, tb = torch.zeros(3, 1, requires_grad=True), torch.zeros(1, requires_grad=True)
    true = np.array([[1.0], [2.0], [3.0]], np.float32)
    for _ in range(5):
        for m, (ww, bb), x in ((ember, (w, b), ember.tensor(a)), (torch, (tw, tb), torch.tensor(a))):
            loss = ((x @ ww + bb - x @ m.tensor(true)) ** 2).mean()
            loss.backward()
            with m.no_grad():
                ww -= 0.1 * ww.grad
                bb.sub_(0.1 * bb.grad)
                ww.grad.zero_()
                bb.grad.zero_()
    close(w, tw)
    close(b, tb)
    x = ember.tensor(a)
    close(ember.max(x, 1)[0], torch.max(torch.tensor(a), 1)[0])
    close(ember.softmax(x, dim=1), torch.softmax(torch.tensor(a), dim=1))
    assert ember.sum(x).shape == () and x.new_zeros(2, 3).shape == (2, 3) and ember.pi == math.pi
    assert isinstance(x, ember.Tensor) and x.size(0) == 16 and ember.Size is tuple
    with ember.autocast("cpu", dtype=ember.bfloat16, enabled=False):
        pass
    loader = ember.utils.data.DataLoader(ember.utils.data.TensorDataset(x, ember.arange(16)), batch_size=5,
                                         shuffle=True)
    batches = list(loader)
    assert len(loader) == 4 and [len(bx) for bx, _ in batches] == [5, 5, 5, 1]
    seen = np.concatenate([by.numpy() for _, by in batches])
    assert sorted(seen) == list(range(16)) and all(bx.is_leaf for bx, _ in batches)
    np.testing.assert_array_equal(np.concatenate([bx.numpy() for bx, _ in batches]), a[seen])
