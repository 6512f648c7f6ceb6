#!/usr/bin/env bash
# On a GPU machine: what the reference mode's prediction misses, row by row. Calibrates this GPU (the kernel
# tables and the host cost per kind of eager op, launch.host_op_s_by_kind), then traces the reference engine
# against its plan (benchmarks/plan_vs_trace.py) on a Gundam 1x1 page at batch 1 (host-bound) and on Base pages
# at batch 16 (device-bound: what is left of SAM's miss is device time, docs/accuracy.md). Every output goes under
# $OUT (default out/); a short table is printed last.
#   bash benchmarks/gpu_plan_check.sh            # about 3 min on an H100
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -m dsocr_core calibrate --out "$OUT/profile.json" --no-progress > "$OUT/calibrate.log" 2>&1
cal=$?
profile="$OUT/profile.json"
[ -f "$profile" ] || profile=data/profiles/h100.json  # the trace still runs against the shipped profile
python3 benchmarks/plan_vs_trace.py --device cuda --preset full --profile "$profile" --mode gundam --grid 1x1 \
  --batch 1 --decode-steps 2 --out "$OUT/plan_vs_trace_gundam_b1.json" > "$OUT/plan_vs_trace_gundam_b1.txt" 2>&1
b1=$?
python3 benchmarks/plan_vs_trace.py --device cuda --preset full --profile "$profile" --mode base --batch 16 \
  --decode-steps 1 --out "$OUT/plan_vs_trace_base_b16.json" > "$OUT/plan_vs_trace_base_b16.txt" 2>&1
b16=$?
echo "== GPU: $(cat "$OUT/gpu.txt")"
echo "== calibrate (exit $cal), profile used: $profile"
python3 - "$profile" <<'PY'
import json, sys
launch = json.load(open(sys.argv[1]))["launch"]
by_kind = {k: round(v * 1e6, 2) for k, v in (launch.get("host_op_s_by_kind") or {}).items()}
print("host cost per eager op (us):", by_kind, "mix mean", round(launch["host_op_s"] * 1e6, 2))
from dsocr_core.calibration.profile import load_profile
p = load_profile(sys.argv[1])
for name in ("bias.broadcast", "bias.strided"):  # SAM's dense bias (windows 14, 640 and 1024 px globals 40, 64)
    t = p.table(name)
    if t is not None:
        print(name, "efficiency at bh 192:", {s: round(float(t.lookup(bh=192, side=s)), 3) for s in (14, 40, 64)})
PY
for run in gundam_b1:$b1 base_b16:$b16; do
  name=${run%%:*}
  echo "== plan_vs_trace $name (exit ${run##*:}): stage totals, SAM attention rows, unlinked device time"
  grep -E "^== |sam\.(attn|block)|no op" "$OUT/plan_vs_trace_$name.txt" | head -14
done
