"""Passes from the tensor graph to kernels: rewrite engine, simplification, scheduling, lowering."""
