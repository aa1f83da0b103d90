#!/usr/bin/env bash
# One device call for everything GPU: the GPU tests, a differential fuzz batch, then the
# benchmarks beside PyTorch (memory-bound kernels, matmuls, attention, convolutions, training, GPT-2 124M,
# loss parity), each printing its table. About 8 minutes with FUZZ=300 STEPS=12.
#   (on the device machine, from the repository root) bash bench/device.sh [--quick]
# FUZZ=N programs (default 400), STEPS=N training steps (default 8).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
quick=${1:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider tests/test_corpus.py tests/compiler/test_differential.py \
  tests/compiler/test_gpu_plans.py tests/compiler/test_contractions.py tests/compiler/test_attention.py \
  tests/frontend/test_device_values.py tests/compiler/test_cuda_runtime.py tests/frontend/test_train.py \
  tests/frontend/test_autocast.py tests/compiler/test_toolchain_bugs.py tests/compiler/test_cuda_source.py \
  -k "cuda or gpu or tensor_core or device or autocast or toolchain or split" 2>&1 | tail -5
echo "== differential fuzz, cuda vs ref"
python3 tests/tools/fuzz_backends.py --backend cuda --count "${FUZZ:-400}" --start 100000 --out "$OUT/fuzz" 2>&1 | grep -v "^fuzz cuda" | tail -8
echo "== memory-bound kernels"
python3 bench/gpu.py $quick 2>&1 | tee "$OUT/gpu_bench.txt"
echo "== matmuls"
python3 bench/matmul.py $quick 2>&1 | tee "$OUT/matmul_bench.txt"
echo "== attention (flash kernels beside SDPA)"
python3 bench/attention_gpu.py $quick 2>&1 | tee "$OUT/attention_bench.txt"
echo "== f32 attention's memory (issue 9: linear in S)"
python3 bench/attention_gpu.py --f32-memory 2>&1 | tee -a "$OUT/attention_bench.txt"
echo "== convolutions"
python3 bench/cnn_gpu.py --steps "${STEPS:-8}" 2>&1 | tee "$OUT/cnn_bench.txt"
echo "== training"
python3 bench/train_gpu.py --steps "${STEPS:-8}" 2>&1 | tee "$OUT/train_bench.txt"
echo "== GPT-2 124M (bf16, batch 16, vocab 50304)"
python3 bench/train_gpu.py --layers 12 --batch 16 --vocab 50304 --bf16-only --steps "${STEPS:-8}" 2>&1 | tee "$OUT/gpt2_bench.txt"
echo "== loss parity with PyTorch (200 steps, f32 then bf16)"
python3 bench/loss_parity.py 2>&1 | tail -1
python3 bench/loss_parity.py --bf16 2>&1 | tail -1
echo "== the course's GPU (sm_86 plans) as a proxy on this GPU"
python3 bench/course_gpu.py $quick 2>&1 | tee "$OUT/course_bench.txt"
