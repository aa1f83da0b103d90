#!/usr/bin/env bash
# One device call on a machine of 2 GPUs (kind nvidia-h200-x2) for data parallelism: the
# 2-GPU test against one GPU, the scaling benchmark beside PyTorch DDP, `ember train --gpus 2`,
# then (SINGLE=1) the single-GPU runtime tests.
#   (on the device machine, from the repository root) [SINGLE=1] [DDP_ARGS="--steps 10"] bash bench/ddp_device.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=index,name --format=csv,noheader
echo "== 2 GPUs against 1 on the same global batch"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/frontend/test_distributed.py 2>&1 | tail -15
echo "== scaling beside PyTorch DDP"
timeout 300 python3 bench/ddp_gpu.py ${DDP_ARGS:-} 2>&1 | tee "$OUT/ddp_bench.txt"
echo "== ember train --gpus 2"
rm -rf /tmp/ddp_run && timeout 90 python3 -m ember train --gpus 2 --steps 40 --eval-every 20 --out /tmp/ddp_run 2>&1 | tail -12
ls /tmp/ddp_run
[ -n "${SINGLE:-}" ] || exit 0
echo "== single-GPU runtime tests"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/frontend/test_device_values.py tests/frontend/test_jit.py \
  tests/frontend/test_autocast.py tests/compiler/test_gpu_plans.py tests/test_corpus.py -k "cuda or gpu or device or jit or autocast" 2>&1 | tail -3
