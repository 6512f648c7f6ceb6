#!/usr/bin/env bash
# On a GPU machine: a complete profile of this GPU, then points it has never seen predicted with it. Calibrates
# every table and launch cost (python -m dsocr_core calibrate), times the fast engine against its floors
# (benchmarks/session_speed.py: decode at batch 1 and 8, the prefill of a 2x2 page), then measures a random set
# of points (benchmarks/prediction_accuracy.py --groups random) predicted with the profile calibrated first, so
# the set is held out from it. Every output goes under $OUT (default out/); a short table is printed last.
#   SEED=40 POINTS=10 MODES=fast LIMIT_S=560 bash benchmarks/gpu_own_profile_check.sh   # about 9 min
#   PROFILE=data/profiles/h200.json SKIP_SPEED=1 ...   # an existing profile: no calibration
#   ADD_TABLES=attention.default,attention.default.causal SKIP_SPEED=1 ...   # the shipped profile of this GPU
#       (data/profiles/h100.json or h200.json, or PROFILE) with these tables measured here and added to it
set -uo pipefail
OUT=${OUT:-out}
SEED=${SEED:-40}
POINTS=${POINTS:-10}
MODES=${MODES:-fast}
LIMIT_S=${LIMIT_S:-560}
SKIP_SPEED=${SKIP_SPEED:-}
mkdir -p "$OUT"
start=$SECONDS
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)
echo "$gpu" > "$OUT/gpu.txt"
tag=$(echo "${gpu%%,*}" | tr 'A-Z ' 'a-z_' | tr -cd 'a-z0-9_')
profile=${PROFILE:-}
ADD_TABLES=${ADD_TABLES:-}
cal=skipped
if [ -n "$ADD_TABLES" ] || [ -z "$profile" ]; then
  if [ -n "$ADD_TABLES" ]; then  # the tables measured here, added to the shipped profile of this GPU (or PROFILE)
    case "$gpu" in *H200*) base=${PROFILE:-data/profiles/h200.json};; *) base=${PROFILE:-data/profiles/h100.json};; esac
    what=(--tables "$ADD_TABLES" --add-to "$base")
  else
    what=(--budget-s 200)  # every table and launch cost
  fi
  profile="$OUT/profile_$tag.json"
  python3 -m dsocr_core calibrate "${what[@]}" --out "$profile" --no-progress > "$OUT/calibrate_$tag.log" 2>&1
  cal=$?
  [ -f "$profile" ] || { echo "calibration failed (exit $cal): $OUT/calibrate_$tag.log"; tail -5 "$OUT/calibrate_$tag.log"; exit 1; }
fi
speed=skipped
if [ -z "$SKIP_SPEED" ]; then
  timeout 150 python3 benchmarks/session_speed.py --sections prefill,decode --batches 1,8 \
    --out "$OUT/session_speed_$tag.json" > "$OUT/session_speed_$tag.log" 2>&1
  speed=$?
fi
left=$((LIMIT_S - (SECONDS - start) - 40))  # room for building the model and writing the result
acc=skipped
if [ "$left" -gt 90 ]; then
  timeout $((left + 30)) python3 benchmarks/prediction_accuracy.py --profile "$profile" --modes "$MODES" \
    --groups random --random-points "$POINTS" --seed "$SEED" --time-limit-s "$left" \
    --store "$OUT/accuracy_random$SEED.sqlite" --out "$OUT/accuracy_random${SEED}_$tag.json" \
    > "$OUT/accuracy_random${SEED}_$tag.log" 2>&1
  acc=$?
fi
echo "== GPU: $gpu; $((SECONDS - start)) s"
echo "== calibrate: exit $cal, profile $profile"
python3 -m dsocr_core calibrate --show "$profile" 2>&1 | head -12
echo "== session_speed (exit $speed)"
# the benchmark's own figure table (its log's last lines before the JSON)
sed -n '/\] figure  /,/^{/p' "$OUT/session_speed_$tag.log" 2>/dev/null | grep -v '^{'
echo "== accuracy, random seed $SEED (exit $acc)"
sed -n '/session mode (target/,$p' "$OUT/accuracy_random${SEED}_$tag.log" 2>/dev/null | head -30
