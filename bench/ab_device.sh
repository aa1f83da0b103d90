#!/usr/bin/env bash
# One device call that measures a change: this tree against a base revision's, each figure taken
# under both in the same call (and twice, alternating), so that nothing but the change differs.
#   here:   rm -rf .ab/base && mkdir -p .ab/base && git archive REV ember bench | tar -x -C .ab/base
#   device: bash bench/ab_device.sh            (run's carry: [".ab"]; BASE=folder to name another)
# What it measures, each under a tree's own ember/ and bench/ (a fresh EMBER_CACHE a tree):
# - GPT-2 124M at B = 16 (B=8 etc. to name another), Ember's bf16 jit step alone: tok/s and the
#   host's Python before the launch;
# - the course's sm_86 flash kernels at S = 4096, D = 64 and 128, beside FlashAttention-2;
# - a bias gradient's column sum (bf16 16384 x 768) beside torch.
# ONLY=step,flash,colsum picks parts.
set -uo pipefail
export PYTHONUNBUFFERED=1
BASE=${BASE:-.ab/base}
ONLY=${ONLY:-step,flash,colsum}
[ -d "$BASE/ember" ] || { echo "ab_device.sh: no base tree at $BASE (see the header)"; exit 2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader

run() {   # run TREE LABEL PYTHON-FILE ARGS...: the file in TREE, with its ember/ and bench/
  local tree=$1 label=$2 file=$3; shift 3
  (cd "$tree" && EMBER_CACHE=/tmp/ab_cache_$label PYTHONPATH=.:bench timeout 150 python3 "$file" "$label" "$@" 2>&1 |
     grep -E "^(base|new) |rror" | tail -4)
}

cat > /tmp/ab_step.py <<'EOF'
import os, statistics, sys
import numpy as np
import train_gpu as TG
from ember.models.gpt import GPTConfig
c = GPTConfig(vocab=50304, block=1024, dim=768, n_layer=12, n_head=12)
b = int(os.environ.get("B", "16"))
tokens = np.random.default_rng(0).integers(0, 50304, (4, b, 1025)).astype(np.int32)
first, rest, loss, host, launch, _ = TG.ember_steps(c, 30, tokens, "cuda", "bfloat16", True, 0)
step = statistics.median(rest)
print(f"{sys.argv[1]} GPT-2 B{b}: {b * 1024 / step / 1e3:.1f}k tok/s, step {step * 1e3:.2f} ms, first {first:.1f} s, "
      f"host {host * 1e3:.2f} ms ({launch * 1e3:.2f} before the launch), loss {loss:.4f}")
EOF
cat > /tmp/ab_flash.py <<'EOF'
import io, sys, contextlib
import course_gpu as CG
peak = CG.mma_sync_peak()
for d in (64, 128):
    for causal in (False, True):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            CG.attention_case(d, 4096, causal, peak)
        for line in buf.getvalue().splitlines():
            print(sys.argv[1], line)
EOF
cat > /tmp/ab_colsum.py <<'EOF'
import sys
import numpy as np
import torch
from ember import data, ir, dtype as dt
from ember.ir import Op
from ember.backend import cuda
from gpu import cuda_time
x = ir.param("x", dt.bf16, (16384, 768))
prog = cuda.CUDAProgram([ir.reduce(Op.SUM, x, (0,))])
v = data.round_float(np.random.default_rng(0).standard_normal(x.shape, dtype=np.float32), dt.bf16)
run, fetch = prog.bind({x: data.to_storage(v, dt.bf16)})
t = torch.from_numpy(v).cuda().to(torch.bfloat16)
mine, theirs = cuda_time(run), cuda_time(lambda: t.sum(0))
err = np.abs(data.from_storage(fetch()[0], dt.bf16) - t.sum(0).float().cpu().numpy()).max()
print(f"{sys.argv[1]} column sum bf16 16384x768: {mine * 1e6:.1f} us ({x.numel * 2 / mine / 1e12:.2f} TB/s), "
      f"torch {theirs * 1e6:.1f} us, ratio {theirs / mine:.2f}, max |diff| {err:.3g}")
EOF
for round in 1 2; do
  for part in step flash colsum; do
    [[ ",$ONLY," == *",$part,"* ]] || continue
    [ "$part" = flash ] && [ "$round" = 2 ] && continue   # (its ratios are to FA2 in the same process)
    echo "== $part, round $round ($SECONDS s)"
    run . new /tmp/ab_$part.py
    run "$BASE" base /tmp/ab_$part.py
  done
done
echo "done at $SECONDS s"
