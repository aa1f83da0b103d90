"""Ember: a tensor compiler from the Ember IR (.eir) and a Tensor API to C and CUDA."""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import tensor

__version__ = "0.1.0"


def set_default_device(device: str) -> None:
    """Where programs run: "cpu", "cuda" or "ref" (ember.tensor.set_default_device)."""
    from .tensor import set_default_device as set_device
    set_device(device)


def autocast(dtype: str = "bfloat16", enabled: bool = True) -> "tensor.autocast":
    """Mixed precision for matmuls (ember.tensor.autocast)."""
    from .tensor import autocast as cast_context
    return cast_context(dtype, enabled)


def jit(fn):  # type: ignore[no-untyped-def]
    """A step replayed without its Python after two calls (ember.capture)."""
    from .capture import jit as tracing_jit
    return tracing_jit(fn)
