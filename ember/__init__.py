"""Ember: a tensor compiler from the Ember IR (.eir) and a Tensor API to C and CUDA.

The package also answers PyTorch's top-level names, so that `import ember as torch` runs a
PyTorch script: ember.tensor(...), ember.zeros, ember.no_grad, ember.float32 and ember.long,
ember.nn (with nn.functional, nn.init, nn.utils), ember.optim (with optim.lr_scheduler),
ember.save and ember.load, ember.cuda.is_available()."""
from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import tensor

__version__ = "0.1.0"
_SUBMODULES = ("tensor", "nn", "optim", "functional", "utils", "runners", "data", "ir", "dtype", "models",
               "distributed")


def autocast(*args: Any, dtype: Any = None, enabled: bool = True, **_: Any) -> "tensor.autocast":
    """Mixed precision for matmuls (ember.tensor.autocast): autocast("bfloat16"), or PyTorch's
    autocast("cuda", dtype=ember.bfloat16)."""
    from .tensor import autocast as cast_context
    if args and args[0] in ("cuda", "cpu"):   # PyTorch's first argument is the device type
        args = args[1:]
    return cast_context(args[0] if args else dtype or "bfloat16", args[1] if len(args) > 1 else enabled)


def jit(fn):  # type: ignore[no-untyped-def]
    """A step replayed without its Python after two calls (ember.capture)."""
    from .capture import jit as tracing_jit
    return tracing_jit(fn)


def save(obj: Any, path: Any) -> None:
    """torch.save for state dicts: tensors, arrays and numbers, in dicts (nested ones too), to a
    safetensors file (ember.nn.save)."""
    from .nn import save as save_state
    save_state(obj, path)


def load(path: Any, **_: Any) -> Any:
    """torch.load of what ember.save wrote: the same dicts, tensors as ember Tensors."""
    from .nn import load as load_state
    return load_state(path)


Size = tuple
pi, e, inf, nan = math.pi, math.e, math.inf, math.nan


class cuda:
    """torch.cuda's questions a script asks before choosing a device."""

    @staticmethod
    def is_available() -> bool:
        from . import runners
        return "cuda" in runners.available()

    @staticmethod
    def device_count() -> int:
        return int(cuda.is_available())

    @staticmethod
    def manual_seed(seed: int) -> None:
        from .tensor import manual_seed
        manual_seed(seed)

    @staticmethod
    def synchronize() -> None:
        pass


def __getattr__(name: str) -> Any:
    """ember.<name>: a submodule, else ember.tensor's (torch.<name>), else a dtype's name
    (ember.long, ember.float, ember.int)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    t = importlib.import_module(f"{__name__}.tensor")
    if name in t._NAMES:
        return t._NAMES[name]
    if not name.startswith("_") and hasattr(t, name):
        return getattr(t, name)
    if not name.startswith("_") and callable(getattr(t.Tensor, name, None)):   # torch.sum, torch.max, ...
        return t._function(name)
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
