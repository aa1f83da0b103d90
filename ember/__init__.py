"""Ember: a tensor compiler from the Ember IR (.eir) and a Tensor API to C and CUDA."""
__version__ = "0.1.0"
