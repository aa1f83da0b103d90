set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
echo "== host_step"; timeout 120 python3 bench/host_step.py 2>&1 | tail -1
echo "== GPU tests"; date +%s
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_corpus.py tests/compiler/test_differential.py \
  tests/compiler/test_gpu_plans.py tests/compiler/test_contractions.py tests/compiler/test_attention.py \
  tests/frontend/test_device_values.py tests/frontend/test_jit.py tests/frontend/test_train.py tests/frontend/test_distributed.py \
  tests/frontend/test_autocast.py tests/compiler/test_toolchain_bugs.py tests/compiler/test_cuda_source.py \
  tests/compiler/test_cuda_runtime.py tests/compiler/test_store.py \
  -k "cuda or gpu or tensor_core or device or autocast or toolchain or split or jit or store or runtime or donat or place" 2>&1 | tail -4
echo "== GPT-2 cold"; date +%s
timeout 150 python3 bench/train_gpu.py --layers 12 --batch 16 --vocab 50304 --bf16-only --steps 12 2>&1 | tail -2
echo "== GPT-2 cached"; date +%s
timeout 100 python3 bench/train_gpu.py --layers 12 --batch 16 --vocab 50304 --bf16-only --steps 12 2>&1 | tail -2
echo "== loss parity"; date +%s
timeout 100 python3 bench/loss_parity.py 2>&1 | tail -1
timeout 100 python3 bench/loss_parity.py --bf16 2>&1 | tail -1
date +%s
