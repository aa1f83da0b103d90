#!/usr/bin/env bash
# One device call for issue 31's figures in under 10 minutes: the GPU tests that the training
# step's kernels depend on, then GPT-2 124M at B = 16 and 32 and the LLaMA preset beside
# torch.compile, loss parity (FUZZ=1: and a differential fuzz batch). Each part has its own time limit,
# so a slow one cannot take the rest with it; each writes its lines to $OUT.
#   (on the device machine, from the repository root) bash bench/train_device.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== GPU tests"   # two groups, each with its own limit (one limit over all ran out at 83 tests)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/compiler/test_gpu_plans.py tests/compiler/test_contractions.py \
  -k "cuda or gpu or tensor_core or device or plan or odd or split" 2>&1 | tail -2 | tee "$OUT/tests.txt"
timeout 50 python3 -m pytest -q -p no:cacheprovider tests/compiler/test_cuda_source.py tests/frontend/test_train.py \
  tests/frontend/test_autocast.py -k "cuda or gpu or device or jit or split or autocast" 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
for run in "--batch 16" "--batch 32" "--batch 16 --model llama"; do
  echo "== bench/train_gpu.py $run"
  timeout 105 python3 bench/train_gpu.py --layers 12 --vocab 50304 --bf16-only --compile $run 2>&1 |
    grep -E "tok/s|peak device" | tee -a "$OUT/train.txt"
done
echo "== loss parity (bf16)"
timeout 60 python3 bench/loss_parity.py --bf16 2>&1 | tail -1 | tee "$OUT/parity.txt"
if [ -n "${FUZZ:-}" ]; then   # FUZZ=1: 40 s more, past the 10 minutes with the rest
  echo "== differential fuzz, cuda vs ref"
  timeout 40 python3 tests/tools/fuzz_backends.py --backend cuda --count 40 --start 500000 2>&1 | tail -2
fi
