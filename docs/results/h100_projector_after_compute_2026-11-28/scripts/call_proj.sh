#!/usr/bin/env bash
# the projector's kernels traced inside their graph at small and large pages, and the linear table measured in two passes
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); echo "$gpu" | tee $OUT/gpu.txt
case "$gpu" in *H200*) tag=h200;; *) tag=h100;; esac
mkdir -p $OUT/r; t0=$SECONDS
timeout 120 python3 -m dsocr_core calibrate --tables linear.bfloat16,memory.projector_cat,memory.gather_rows --passes 2 --add-to data/profiles/$tag.json \
  --out $OUT/r/${tag}_passes.json --no-progress > $OUT/r/calibrate.log 2>&1; echo "calibrate exit $? $((SECONDS-t0)) s"
tail -4 $OUT/r/calibrate.log
timeout 400 python3 benchmarks/vision_kernels.py --stages projector --graphed-kernels --repeats 20 --top 6 \
  --points ${POINTS} --profile data/profiles/$tag.json --out $OUT/r/vk.json > $OUT/r/vk.txt 2>&1
echo "vk exit $? $((SECONDS-t0)) s"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv | tee -a $OUT/gpu.txt
tail -12 $OUT/r/vk.txt
tar czf $OUT/results.tgz -C $OUT r && rm -rf $OUT/r; ls $OUT
