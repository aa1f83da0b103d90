"""Every method and function Ember and PyTorch share, called the same way on both and compared,
in the manner of a framework's op test-suite: forward on ordinary inputs (random, positive,
integer, bool, with and without a dim) and on edge inputs (empty, 0-d, odd shapes, infinities,
NaN, -0.0, ties), and gradients of the float ones. Values must agree as floats, with NaN and
infinities where PyTorch has them and the sign of zero results; dtypes and shapes exactly.

    python tests/tools/torch_sweep.py [-v]

prints the counts (run, passed, wrong, raised) and each disagreement (-v: also the calls that
raise where PyTorch raises too, which are not counted). tests/frontend/test_op_sweep.py runs it.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import numpy as np
import torch

import ember.tensor as et

warnings.filterwarnings("ignore")
rng = np.random.default_rng(0)
A = rng.standard_normal((3, 4)).astype(np.float32)
B = rng.standard_normal((3, 4)).astype(np.float32)
P = np.abs(A) + 0.5
INT = rng.integers(-5, 6, (3, 4)).astype(np.int64)
INT2 = rng.integers(1, 4, (3, 4)).astype(np.int64)
BOOL = A > 0
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -2.5, 3.0, 1e-30, 1e30], np.float32)
TIES = np.array([[1.0, 1.0, 2.0], [2.0, 2.0, 2.0], [-np.inf, -np.inf, 0.0], [np.nan, 1.0, np.nan]], np.float32)
EMPTY = np.zeros((2, 0), np.float32)
SCALAR = np.array(0.7, np.float32)
ODD = rng.standard_normal((1, 3, 1)).astype(np.float32)
IEDGE = np.array([0, -1, 1, 7, -8, 2 ** 31 - 1], np.int64)

# calls that are not the same computation in both (random draws, host conversions, identity)
SKIP = {"backward", "numpy", "item", "tolist", "to", "cpu", "cuda", "size", "dim", "numel", "detach", "realize",
        "requires_grad_", "type", "float", "double", "half", "int", "long", "bool", "bfloat16", "contiguous", "clone",
        "assign", "grad", "requires_grad", "data", "shape", "dtype", "ndim", "T", "mT", "is_leaf", "value",
        "tensor", "Tensor", "manual_seed", "set_default_device", "from_numpy", "as_tensor", "autocast", "rand", "randn",
        "randint", "randperm", "empty", "empty_like", "rand_like", "randn_like", "device", "no_grad", "dropout",
        "normal_", "uniform_", "multinomial", "new_empty", "element_size", "nelement", "is_cuda", "is_floating_point"}

FORWARD = (("f", (A,), ()), ("f+f", (A, B), ()), ("pos", (P,), ()), ("i", (INT,), ()), ("i+i", (INT, INT2), ()),
           ("b", (BOOL,), ()), ("dim0", (A,), (0,)), ("dim1", (A,), (1,)), ("special", (SPECIAL,), ()),
           ("special+special", (SPECIAL, SPECIAL[::-1].copy()), ()), ("special,dim0", (SPECIAL,), (0,)),
           ("ties,dim1", (TIES,), (1,)), ("ties", (TIES,), ()), ("empty", (EMPTY,), ()), ("empty,dim1", (EMPTY,), (1,)),
           ("empty,dim0", (EMPTY,), (0,)), ("0-d", (SCALAR,), ()), ("0-d,dim0", (SCALAR,), (0,)),
           ("odd", (ODD,), ()), ("odd,dim2", (ODD,), (2,)), ("iedge", (IEDGE,), ()), ("iedge+i", (IEDGE, IEDGE[::-1].copy()), ()))
GRADIENT = (("f", (A,), ()), ("pos", (P,), ()), ("f+f", (A, B), ()), ("dim1", (A,), (1,)), ("special", (SPECIAL,), ()),
            ("ties,dim1", (TIES,), (1,)), ("ties", (TIES,), ()), ("0-d", (SCALAR,), ()), ("odd,dim2", (ODD,), (2,)),
            ("empty,dim1", (EMPTY,), (1,)))
FUNCTION = (("f", (A,), {}), ("f,dim=1", (A,), {"dim": 1}), ("f,f", (A, B), {}), ("i", (INT,), {}),
            ("f,dim=0,keepdim", (A,), {"dim": 0, "keepdim": True}), ("special", (SPECIAL,), {}),
            ("special,special", (SPECIAL, SPECIAL[::-1].copy()), {}), ("empty", (EMPTY,), {}), ("0-d", (SCALAR,), {}))


def values(got: Any) -> Any:
    """A (values, indices) pair's values; a list's first tensor; anything else as it is."""
    if isinstance(got, tuple) and hasattr(got, "_fields") or isinstance(got, (list, tuple)) and got:
        return got[0]
    return got


def differ(x: np.ndarray, y: np.ndarray, signed: bool = True) -> str | None:
    """Why Ember's x is not PyTorch's y, or None (signed: zeros' signs must agree too)."""
    if x.shape != y.shape or str(x.dtype) != str(y.dtype):
        return f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    if x.dtype.kind != "f":
        return None if np.array_equal(x, y) else f"values {x.ravel()[:4]} vs {y.ravel()[:4]}"
    same = np.isclose(x, y, rtol=1e-4, atol=1e-5) | (np.isnan(x) & np.isnan(y))
    zeros = (x == 0) & (y == 0)
    same &= ~zeros | (np.signbit(x) == np.signbit(y)) | (not signed)
    if same.all():
        return None
    at = np.argwhere(~same)[:3].tolist()
    return f"at {at}: {x[~same][:3]} vs {y[~same][:3]}"


class Tally:
    def __init__(self) -> None:
        self.passed, self.wrong, self.raised, self.both_raise, self.accepted = 0, [], [], [], []

    @property
    def run(self) -> int:
        return self.passed + len(self.wrong) + len(self.raised)

    def line(self, title: str) -> str:
        return (f"{title}: {self.run} run, {self.passed} passed, {len(self.wrong)} wrong, {len(self.raised)} raised "
                f"({len(self.accepted)} calls PyTorch rejects computed)")


def compare(tally: Tally, label: str, want_fn: Callable[[], Any], got_fn: Callable[[], Any], signed: bool = True) -> None:
    """One call on both: PyTorch first (a call it rejects is not a test, unless Ember answers it
    anyway, which is counted wrong), then Ember."""
    try:
        want = want_fn()
    except Exception:
        try:
            got = got_fn()
        except Exception:
            tally.both_raise.append(label)
            return
        if isinstance(got, et.Tensor):
            tally.accepted.append(label)
        return
    if not isinstance(want, (torch.Tensor, list)) or isinstance(want, torch.Tensor) and want.dtype == torch.bfloat16:
        return
    try:
        got = got_fn()
    except Exception as e:
        tally.raised.append((label, f"{type(e).__name__}: {str(e)[:90]}"))
        return
    want, got = (want, got) if isinstance(want, list) else ([want], [got])
    if len(want) != len(got):
        tally.wrong.append((label, f"{len(got)} results vs {len(want)}"))
        return
    for g, w in zip(got, want):
        d = differ(g.numpy() if isinstance(g, et.Tensor) else np.asarray(g), w.detach().numpy(force=True), signed)
        if d:
            tally.wrong.append((label, d))
            return
    tally.passed += 1


def forward(names: list[str], call: Callable, cases: tuple) -> Tally:
    tally = Tally()
    for name in names:
        for label, arrays, extra in cases:
            compare(tally, f"{name} {label}", lambda: values(call(torch, name, [torch.tensor(a) for a in arrays], extra)),
                    lambda: values(call(et, name, [et.Tensor(a) for a in arrays], extra)))
    return tally


def method(lib: Any, name: str, ts: list, extra: tuple) -> Any:
    return getattr(ts[0], name)(*ts[1:], *extra)


def function(lib: Any, name: str, ts: list, extra: dict) -> Any:
    return getattr(lib, name)(*ts, **extra)


def gradients(names: list[str]) -> Tally:
    """The gradients of sum(op(...)) (its values: (values, indices) pairs) for the float inputs."""
    tally = Tally()
    for name in names:
        if name.endswith("_"):   # in-place forms of leaves are rejected by both
            continue
        for label, arrays, extra in GRADIENT:
            def run(lib: Any, tensor: Callable) -> list:
                ts = [tensor(a) for a in arrays]
                out = values(getattr(ts[0], name)(*ts[1:], *extra))
                if lib is torch and (not isinstance(out, torch.Tensor) or not out.requires_grad
                                     or not out.dtype.is_floating_point):
                    raise TypeError("no gradient")
                out.sum().backward()
                return [t.grad if t.grad is not None else lib.zeros_like(t) for t in ts]
            compare(tally, f"{name} {label}", lambda: run(torch, lambda a: torch.tensor(a, requires_grad=True)),
                    lambda: run(et, lambda a: et.Tensor(a, requires_grad=True)), signed=False)
    return tally


def sweep() -> list[tuple[str, Tally]]:
    shared = sorted(m for m in set(dir(et.Tensor)) & set(dir(torch.Tensor)) if not m.startswith("_") and m not in SKIP)
    functions = sorted(n for n in set(dir(et)) & set(dir(torch)) if not n.startswith("_") and n not in SKIP
                       and callable(getattr(et, n)) and callable(getattr(torch, n)) and not isinstance(getattr(et, n), type))
    return [("methods, forward", forward(shared, method, FORWARD)), ("methods, gradients", gradients(shared)),
            ("functions, forward", forward(functions, function, FUNCTION))]


def main() -> None:
    report = sweep()
    for title, tally in report:
        print(tally.line(title))
        for label, why in tally.wrong:
            print("    wrong ", label, why)
        for label, why in tally.raised:
            print("    raised", label, why)
        if "-v" in sys.argv:
            print("    (computed where PyTorch raises:", ", ".join(tally.accepted), ")")
        if "-v" in sys.argv:
            print("    (both raise:", ", ".join(tally.both_raise), ")")
    total = Tally()
    for _, t in report:
        total.passed += t.passed
        total.wrong += t.wrong
        total.raised += t.raised
        total.accepted += t.accepted
    print(total.line("all"))


if __name__ == "__main__":
    main()
