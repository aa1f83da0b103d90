#!/usr/bin/env bash
# One device call for `ember bench`'s checks on the GPU (issue 28): two suite programs, two
# rounds, the reference beside a twin (Ember as a student submission), a liar (reports a tenth of
# its median) and a skipper (one timed run, reported as N).
#   (on the device machine, from the repository root) bash bench/bench_device.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bench_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
suite=$(mktemp -d); subs=$(mktemp -d)
cp bench/suite/{chain8_f32,matmul_bf16_4096}.eir "$suite"
mk() { mkdir -p "$subs/$1"; printf '#!/bin/sh\n%s\n' "$2" > "$subs/$1/compiler"; chmod +x "$subs/$1/compiler"; }
mk twin 'exec python3 -m ember run "$@"'
mk liar 'python3 -m ember run "$@" | awk '"'"'/^# bench/ {split($4, a, "="); print "# bench " $3 " median_ms=" a[2] / 10; next} {print}'"'"
mk skip 'python3 -m ember run "$1" --bench 1 | sed "s/runs=1 /runs=$3 /"'
start=$(date +%s)
timeout 230 python3 -m ember bench --suite "$suite" --submissions "$subs" --out "$OUT" --timeout 60 --allow-ember --rounds 2 2>&1 \
  | grep -v "it/s\]\|s/it\]" | tail -3
echo "ember bench took $(( $(date +%s) - start )) s"
cat "$OUT/summary.md"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p, row in r["programs"].items():
    for n, e in row.items():
        print(p, n, e["status"], e["median_ms"], e["rounds_ms"], e["note"])
print("dropped", r["dropped"], "load", r["load"], "bands", r["bands"])
PY
