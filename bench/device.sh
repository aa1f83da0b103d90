#!/usr/bin/env bash
# One device call: the GPU tests, a differential fuzz batch on the GPU, then the GPU benchmark.
#   (on the device machine, from the repository root) bash bench/device.sh [--quick]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider tests/test_corpus.py tests/compiler/test_differential.py tests/compiler/test_gpu_plans.py -k "cuda or gpu_plan" 2>&1 | tail -5
echo "== differential fuzz, cuda vs ref"
python3 tests/tools/fuzz_backends.py --backend cuda --count "${FUZZ:-400}" --start 100000 2>&1 | tail -8
echo "== training, cpu vs cuda"
python3 bench/train_compare.py --steps "${STEPS:-40}" 2>&1 | grep -v "^ *[0-9]*/[0-9]* \[" | tail -8
echo "== benchmark"
python3 bench/gpu.py "$@" 2>&1 | tee "$OUT/gpu_bench.txt"
