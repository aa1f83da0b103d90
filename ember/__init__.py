"""Ember: a tensor compiler from the Ember IR (.eir) and a Tensor API to C and CUDA."""
__version__ = "0.1.0"


def set_default_device(device: str) -> None:
    """Where programs run: "cpu", "cuda" or "ref" (ember.tensor.set_default_device)."""
    from .tensor import set_default_device as set_device
    set_device(device)
