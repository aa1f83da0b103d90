#!/usr/bin/env bash
# One device call for the loss gap (issue 31: Ember's GPT-2 curve 4-10% above PyTorch's after
# its plateau at step ~600, docs/performance.md): each parameter's gradient against PyTorch's
# f32 one, past the plateau (a checkpoint of STEPS steps): 4 steps of ember train from it, each
# update set against AdamW's formula (the third and fourth replayed); the gradients' bias, summed
# over 8 batches; with VARIANTS=base,f32,nofuse,... a column per way of compiling them. About 5
# minutes; each table whole in $OUT/*.txt, the flagged rows and the summary printed. PARTS picks
# among update, bias, trace and trace-nofuse (each block's values and gradients against PyTorch's, --trace).
#   (on the device machine, from the repository root) OUT=/tmp/x [PARTS="trace"] bash bench/loss_gap_device.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
step() {   # step NAME COMMAND...: runs it (7.5 minutes at most), keeps its output, prints the gist
  local name=$1 t0=$SECONDS; shift
  timeout 450 "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s"
  grep -E "^(GPT|loss:|variant |attention alone|o |dq |dk |dv )|flagged|Error|error:" "$OUT/$name.txt" | tail -14
}
step train python3 -m ember train --model gpt2 --device cuda --steps "${STEPS:-800}" --batch 16 --lr 6e-4 \
  --warmup 50 --cosine --seed 0 --eval-every "${STEPS:-800}" --max-bytes 4000000 --out "$OUT/gap" --fresh \
  --autocast bf16
tail -c 400 "$OUT/train.txt"; rm -f "$OUT/gap/loss.png"
PARTS=" ${PARTS:-update bias} "
[[ $PARTS != *" update "* ]] || { step update python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" \
  --steps-after 4; grep -E "^step " "$OUT/update.txt"; }
[[ $PARTS != *" bias "* ]] || { step bias python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" --batches 8
  grep -E "^(tok|pos|blocks\.(0|11)\.|ln)" "$OUT/bias.txt" | cut -c1-150; }
[[ $PARTS != *" trace "* ]] || { step trace python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" --trace
  grep -E "^(point|[0-9]+\.|final)" "$OUT/trace.txt"; }
[[ $PARTS != *" trace-nofuse "* ]] || { step trace_nofuse python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" \
  --trace --variants nofuse; grep -E "^(point|[0-9]+\.|final)" "$OUT/trace_nofuse.txt"; }
[ -z "${VARIANTS:-}" ] || step variants python3 bench/grad_parity.py --ckpt "$OUT/gap/ckpt.safetensors" --variants "$VARIANTS"
rm -rf "$OUT/gap"   # (the checkpoint is 1.5 GB)
