"""Code generators and runtimes: C for the CPU (c.py), CUDA for NVIDIA GPUs (cuda.py)."""
