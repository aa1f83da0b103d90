"""Every method and function Ember and PyTorch share, called the same way on both and compared:
forward on random, positive, integer and bool inputs (with and without a dim), gradients on
floats, top-level functions. Prints the counts and each disagreement; a quick check of the
frontend against PyTorch beyond the written tests (issue 11).

    python tests/tools/torch_sweep.py
"""
from __future__ import annotations

import warnings

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
SKIP = {"backward", "numpy", "item", "tolist", "to", "cpu", "cuda", "size", "dim", "numel", "detach", "realize",
        "requires_grad_", "type", "float", "double", "half", "int", "long", "bool", "bfloat16", "contiguous", "clone",
        "assign", "grad", "requires_grad", "data", "shape", "dtype", "ndim", "T", "mT", "is_leaf", "value",
        "tensor", "Tensor", "manual_seed", "set_default_device", "from_numpy", "as_tensor", "autocast", "rand", "randn",
        "randint", "randperm", "empty", "empty_like", "rand_like", "randn_like", "device", "no_grad", "dropout"}


def values(got: object) -> object:
    """A (values, indices) pair's values; anything else as it is."""
    return got[0] if isinstance(got, tuple) and hasattr(got, "_fields") else got


def differ(a: et.Tensor, b: torch.Tensor) -> str | None:
    x, y = a.numpy(), b.detach().numpy()
    if x.shape != y.shape or str(x.dtype) != str(y.dtype):
        return f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    same = np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True) if x.dtype.kind == "f" else np.array_equal(x, y)
    return None if same else f"values {x.ravel()[:3]} vs {y.ravel()[:3]}"


def sweep(names: list[str], call, cases: tuple) -> tuple[int, list]:  # type: ignore[no-untyped-def]
    ok, bad = 0, []
    for name in names:
        for label, arrays, extra in cases:
            try:
                want = values(call(torch, name, [torch.tensor(a) for a in arrays], extra))
            except Exception:
                continue
            if not isinstance(want, torch.Tensor) or want.dtype == torch.bfloat16:
                continue
            try:
                got = values(call(et, name, [et.Tensor(a) for a in arrays], extra))
                d = differ(got[0] if isinstance(got, (tuple, list)) else got, want)
            except Exception as e:
                d = f"raises {type(e).__name__}: {str(e)[:80]}"
            if d:
                bad.append((name, label, d))
            else:
                ok += 1
    return ok, bad


def method(lib: object, name: str, ts: list, extra: tuple) -> object:
    return getattr(ts[0], name)(*ts[1:], *extra)


def function(lib: object, name: str, ts: list, extra: dict) -> object:
    return getattr(lib, name)(*ts, **extra)


def gradients(names: list[str]) -> tuple[int, list]:
    ok, bad = 0, []
    for name in names:
        for label, arrays, extra in (("f", (A,), ()), ("pos", (P,), ()), ("f+f", (A, B), ()), ("dim1", (A,), (1,))):
            tt = [torch.tensor(a, requires_grad=True) for a in arrays]
            try:
                want = values(getattr(tt[0], name)(*tt[1:], *extra))
                if not isinstance(want, torch.Tensor) or not want.requires_grad or not want.dtype.is_floating_point:
                    continue
                want.sum().backward()
                expected = [t.grad.numpy() if t.grad is not None else np.zeros_like(a) for t, a in zip(tt, arrays)]
            except Exception:
                continue
            ee = [et.Tensor(a, requires_grad=True) for a in arrays]
            try:
                values(getattr(ee[0], name)(*ee[1:], *extra)).sum().backward()
                grads = [e.grad.numpy() if e.grad is not None else np.zeros_like(w) for e, w in zip(ee, expected)]
                if all(np.allclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True) for g, w in zip(grads, expected)):
                    ok += 1
                else:
                    bad.append((name, label, "gradients differ"))
            except Exception as e:
                bad.append((name, label, f"raises {type(e).__name__}: {str(e)[:80]}"))
    return ok, bad


def main() -> None:
    shared = sorted(m for m in set(dir(et.Tensor)) & set(dir(torch.Tensor)) if not m.startswith("_") and m not in SKIP)
    cases = (("f", (A,), ()), ("f+f", (A, B), ()), ("pos", (P,), ()), ("i", (INT,), ()), ("i+i", (INT, INT2), ()),
             ("b", (BOOL,), ()), ("dim0", (A,), (0,)), ("dim1", (A,), (1,)))
    report = [("methods, forward", *sweep(shared, method, cases)), ("methods, gradients", *gradients(shared))]
    functions = sorted(n for n in set(dir(et)) & set(dir(torch)) if not n.startswith("_") and n not in SKIP
                       and callable(getattr(et, n)) and callable(getattr(torch, n)))
    fcases = (("f", (A,), {}), ("f,dim=1", (A,), {"dim": 1}), ("f,f", (A, B), {}), ("i", (INT,), {}),
              ("f,dim=0,keepdim", (A,), {"dim": 0, "keepdim": True}))
    report.append(("functions, forward", *sweep(functions, function, fcases)))
    for title, ok, bad in report:
        print(f"{title}: {ok} agree, {len(bad)} differ")
        for b in bad:
            print("   ", *b)


if __name__ == "__main__":
    main()
