#!/usr/bin/env bash
# On a GPU machine: the order-independence benchmark of one session mode within one call's time, resumable.
# The three orders run once (skipped when their file exists; an orders phase cut short starts over next
# call), then each point alone in a fresh process until the time is up (points already measured alone are
# skipped), then the report. Everything is packed into one file,
# $OUT/order_independence_<mode>.tgz, and unpacked from it first when it exists, so a second call carrying the
# archive goes on where the first stopped.
#   MODE=fast LIMIT_S=540 bash benchmarks/gpu_order_check.sh        # about 9 min on an H100 for the 10 points
#   MODE=reference ALONE_RUNS=3 POINTS=tiny-b1,g2x3 bash benchmarks/gpu_order_check.sh
#   ARGS="--quick --device cpu" POINTS=tiny-b1-t10,tiny-b2-t30 bash benchmarks/gpu_order_check.sh   # a CPU smoke test
set -uo pipefail
OUT=${OUT:-out}
PY=${PY:-python3}
MODE=${MODE:-fast}
LIMIT_S=${LIMIT_S:-540}
ALONE_RUNS=${ALONE_RUNS:-1}
ARGS=${ARGS:-}  # passed to every run of the benchmark (e.g. --repeats 5)
DEFAULT_POINTS='import sys; sys.path.insert(0, "benchmarks"); import order_independence as o; print(o.FULL_POINTS)'
POINTS=${POINTS:-$("$PY" -c "$DEFAULT_POINTS")}
if [ "$LIMIT_S" -lt 120 ]; then echo "LIMIT_S must be at least 120 (seconds for the whole call)"; exit 2; fi
WORK=$(mktemp -d)/order_independence
mkdir -p "$OUT" "$WORK"
ARCHIVE="$OUT/order_independence_$MODE.tgz"
SEED=${SEED:-}  # an archive from an earlier call (carried into the repo) to go on from
for a in "$SEED" "$ARCHIVE"; do
  [ -n "$a" ] && [ -f "$a" ] && tar xzf "$a" -C "$(dirname "$WORK")"
done
start=$SECONDS
if [ ! -f "$WORK/orders-$MODE.json" ]; then
  timeout $((LIMIT_S - 30)) "$PY" benchmarks/order_independence.py --phase orders --modes "$MODE" --points "$POINTS" \
    --out "$WORK" $ARGS 2>&1 | grep -E "points in|Error"
fi
for run in $(seq 1 "$ALONE_RUNS"); do
  for p in ${POINTS//,/ }; do
    f="$WORK/one-$MODE-$p.json"; [ "$run" -gt 1 ] && f="$WORK/one-$MODE-$p.run$run.json"
    [ -f "$f" ] && continue
    left=$((LIMIT_S - 20 - SECONDS + start))
    [ "$left" -lt 60 ] && { echo "time is up before $p (run $run): call again with the archive"; break 2; }
    t0=$SECONDS  # one fresh process measuring this point alone (what --phase alone runs per point)
    timeout "$left" "$PY" benchmarks/order_independence.py --phase one --modes "$MODE" --points "$p" \
      --alone-run "$run" --out "$WORK" $ARGS > "$WORK/last_alone.log" 2>&1
    rc=$?
    grep -E "Error" "$WORK/last_alone.log"
    if [ -f "$f" ]; then echo "$MODE alone $p (run $run): $((SECONDS - t0)) s"
    else echo "$MODE alone $p (run $run): no result (exit $rc)"; fi
  done
done
"$PY" benchmarks/order_independence.py --phase report --modes "$MODE" --out "$WORK"  # writes summary.json too
tar czf "$ARCHIVE" -C "$(dirname "$WORK")" order_independence
