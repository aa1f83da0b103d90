#!/usr/bin/env bash
# One device call for the grading issue: --bench through CUDA events, the GPU test subset,
# the suite's reference times, and `ember bench` over the suite with Ember as a submission.
#   (on the device machine, from the repository root) bash bench/grade_device.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/grade_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== GPU tests (corpus on cuda, grading)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_corpus.py tests/test_grade.py -k "cuda or grade or bench" 2>&1 | tail -3
echo "== ember run --bench 10 --backend cuda, each suite program (median of CUDA-event times)"
for f in bench/suite/*.eir; do
  t0=$(date +%s%N)
  line=$(timeout 120 python3 -m ember run "$f" --backend cuda --bench 10 2>&1 | tail -1)
  printf '%-28s %s  (whole process %d ms)\n' "$(basename $f)" "$line" $(( ($(date +%s%N) - t0) / 1000000 ))
done
echo "== ember bench: the suite, Ember on cuda as a student submission beside the reference"
subs=$(mktemp -d); mkdir -p "$subs/ember_cuda"
printf '#!/bin/sh\nexec python3 -m ember run --backend cuda "$@"\n' > "$subs/ember_cuda/compiler"; chmod +x "$subs/ember_cuda/compiler"
timeout 330 python3 -m ember bench --submissions "$subs" --out "$OUT/bench" --runs 3 --timeout 120 2>&1 | grep -v "it/s\]\|s/it\]" | tail -3
cat "$OUT/bench/summary.md"
