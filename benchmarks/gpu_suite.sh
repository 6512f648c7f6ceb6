#!/usr/bin/env bash
# On a GPU machine: the whole GPU test suite, then the session-speed benchmark (parity, prefill, decode at batch
# 1 and 8). Every output goes under $OUT (default out/); a short table is printed last.
#   bash benchmarks/gpu_suite.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -m pytest -m gpu -q -p no:cacheprovider -s > "$OUT/gpu_suite.txt" 2>&1
suite=$?
python3 benchmarks/session_speed.py --sections parity,prefill,decode --batches 1,8 --no-reference-batched \
  --no-ablation --out "$OUT/session_speed.json" > "$OUT/session_speed.log" 2>&1
speed=$?
echo "== GPU: $(cat "$OUT/gpu.txt")"
echo "== GPU suite (exit $suite)"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/gpu_suite.txt" | tail -8
echo "== session speed (exit $speed)"
grep -E "parity b|^\[.*\] (figure|prefill 2x2|decode b)" "$OUT/session_speed.log" | tail -14
