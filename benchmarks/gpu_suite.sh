#!/usr/bin/env bash
# On a GPU machine: the whole GPU test suite, then the session-speed benchmark (parity, prefill, decode at batch
# 1 and 8). Every output goes under $OUT (default out/); a short table is printed last.
#   bash benchmarks/gpu_suite.sh
#   PART=1/2 SKIP_SPEED=1 bash benchmarks/gpu_suite.sh   # the first of two shares of the GPU tests, in collection
#       order (on a fresh H100 the whole suite took over 558 s on 2026-11-28, more than one 10-minute device call
#       leaves after the set-up); PART=2/2 on the next call
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
tests=()
if [ -n "${PART:-}" ]; then
  # a share that cannot exist is refused before the collection (which imports every test module: 20 s and more)
  if ! [[ $PART =~ ^([0-9]+)/([0-9]+)$ ]] || (( BASH_REMATCH[1] < 1 || BASH_REMATCH[1] > BASH_REMATCH[2] )); then
    echo "PART=$PART selects no GPU test (PART is K/N with 1 <= K <= N)"; exit 2
  fi
  python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider > "$OUT/gpu_tests_collected.txt" 2>&1 ||
    { echo "collecting the GPU tests failed: $OUT/gpu_tests_collected.txt"; tail -5 "$OUT/gpu_tests_collected.txt"; exit 2; }
  mapfile -t tests < <(grep -E '^tests/[^ ]*::' "$OUT/gpu_tests_collected.txt" |
    python3 -c "
import sys
k, n = (int(x) for x in sys.argv[1].split('/'))
assert 1 <= k <= n, 'PART is K/N with 1 <= K <= N'
ids = [line.strip() for line in sys.stdin if line.strip()]
share = -(-len(ids) // n)
print('\n'.join(ids[(k - 1) * share:k * share]))" "$PART")
  [ ${#tests[@]} -gt 0 ] || { echo "PART=$PART selects no GPU test"; exit 2; }
  printf '%s\n' "${tests[@]}" > "$OUT/gpu_tests_selected.txt"
fi
python3 -m pytest -m gpu -q -p no:cacheprovider -s "${tests[@]}" > "$OUT/gpu_suite.txt" 2>&1
suite=$?
speed=skipped
if [ -z "${SKIP_SPEED:-}" ]; then
  python3 benchmarks/session_speed.py --sections parity,prefill,decode --batches 1,8 --no-reference-batched \
    --no-ablation --out "$OUT/session_speed.json" > "$OUT/session_speed.log" 2>&1
  speed=$?
fi
echo "== GPU: $(cat "$OUT/gpu.txt")"
echo "== GPU suite${PART:+, part $PART (${#tests[@]} tests)} (exit $suite)"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/gpu_suite.txt" | tail -8
echo "== session speed (exit $speed)"
if [ -f "$OUT/session_speed.log" ]; then
  grep -E "parity b|^\[.*\] (figure|prefill 2x2|decode b)" "$OUT/session_speed.log" | tail -14
fi
exit $suite
