#!/usr/bin/env bash
# One device call for the tensor-core work (issue 8): its GPU tests, the GPU plan and corpus
# tests on CUDA, then the matmul benchmark beside cuBLAS.
#   (on the device machine, from the repository root) bash bench/tc_device.sh [bench/matmul.py options]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider -x tests/compiler/test_contractions.py tests/compiler/test_gpu_plans.py 2>&1 | tail -15
echo "== matmul benchmark"
python3 bench/matmul.py "$@" 2>&1 | tee "$OUT/matmul_bench.txt"
if [ -n "${PLANS:-}" ]; then
  for plan in $PLANS; do
    echo "== plan $plan"
    python3 bench/matmul.py --quick --plan "$plan" 2>&1 | tail -n +2
  done
fi
