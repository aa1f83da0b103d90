#!/usr/bin/env bash
# One device call for the loss gap (issue 31: Ember's GPT-2 curve 4-10% above PyTorch's after
# its plateau at step ~600, docs/performance.md): each parameter's gradient against PyTorch's
# f32 one, at the initial weights (q, k sharpened too) and past the plateau (a checkpoint of
# STEPS steps), with and without sm_90a's warp-specialized flash kernels. About 5 minutes.
#   (on the device machine, from the repository root) bash bench/loss_gap_device.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== initial weights, then q and k x 8"
timeout 300 python3 bench/grad_parity.py 2>&1 | tail -45
timeout 300 python3 bench/grad_parity.py --sharpen 8 2>&1 | tail -8
echo "== past the plateau: ${STEPS:-800} steps of ember train as bench/loss_curve.py runs it"
timeout 300 python3 -m ember train --model gpt2 --device cuda --steps "${STEPS:-800}" --batch 16 --lr 6e-4 \
  --warmup 50 --cosine --seed 0 --eval-every "${STEPS:-800}" --max-bytes 4000000 --out "$OUT/gap" --fresh \
  --autocast bf16 2>&1 | tail -3
timeout 300 python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" 2>&1 | tail -45
echo "== the same without the warp-specialized flash kernels"
EMBER_FLASH_WS=0 timeout 300 python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" 2>&1 | tail -8
