#!/usr/bin/env bash
# One device call for the toolchain issue: the ptxas probe, the regression programs and GPU
# tests on CUDA, then a CUDA differential fuzz batch.
#   (on the device machine, from the repository root) bash bench/toolchain_device.sh [COUNT] [START]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "from cuda.bindings import nvrtc; print('NVRTC', nvrtc.nvrtcVersion()[1:])"
echo "== ptxas probe (wrong results of 4096; the workaround row must be 0)"
python3 tests/tools/ptxas_probe.py
echo "== GPU tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/compiler/test_toolchain_bugs.py tests/test_corpus.py \
  tests/compiler/test_differential.py tests/compiler/test_gpu_plans.py -k "cuda or gpu_plan or toolchain" 2>&1 | tail -3
echo "== CUDA fuzz"
python3 tests/tools/fuzz_backends.py --backend cuda --count "${1:-5000}" --start "${2:-3000000}" --jobs 12 \
  --out "${OUT:-/tmp}/fuzz_cuda" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -15
