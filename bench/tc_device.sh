#!/usr/bin/env bash
# One device call for the contraction work (issue 8): the GPU tests of contractions, GPU plans,
# the corpus and random programs on CUDA, then the matmul benchmark beside cuBLAS.
#   (on the device machine, from the repository root) bash bench/tc_device.sh [bench/matmul.py options]
# PLANS="p1 p2": also time the quick shapes under each forced plan (EMBER_TC_PLAN format).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider tests/compiler/test_contractions.py tests/compiler/test_gpu_plans.py \
  tests/test_corpus.py tests/compiler/test_differential.py -k "cuda or gpu or tensor_core" 2>&1 | tail -8
echo "== matmul benchmark"
python3 bench/matmul.py "$@" 2>&1 | tee "$OUT/matmul_bench.txt"
for plan in ${PLANS:-}; do
  echo "== plan $plan"
  python3 bench/matmul.py --quick --plan "$plan" 2>&1 | tail -n +2
done
