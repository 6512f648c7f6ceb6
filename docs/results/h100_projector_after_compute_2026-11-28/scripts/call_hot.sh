#!/usr/bin/env bash
# the projector's tables measured after a burst of compute, then the projector of new points measured in the engine
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); echo "$gpu" | tee $OUT/gpu.txt
case "$gpu" in *H200*) tag=h200;; *) tag=h100;; esac
mkdir -p $OUT/r; t0=$SECONDS
timeout 150 python3 -m dsocr_core calibrate --tables linear.bfloat16,memory.projector_cat --add-to data/profiles/$tag.json \
  --out $OUT/r/${tag}_after_burst.json --no-progress > $OUT/r/calibrate.log 2>&1; echo "calibrate exit $? $((SECONDS-t0)) s"
grep -E "linear|projector_cat|calibration:" $OUT/r/calibrate.log | tail -3
timeout $(( ${TOTAL:-400} - (SECONDS - t0) )) python3 benchmarks/vision_kernels.py --stages projector --repeats 10 --top 5 \
  --points ${POINTS} --profile $OUT/r/${tag}_after_burst.json --out $OUT/r/vk.json > $OUT/r/vk.txt 2>&1
echo "vk exit $? $((SECONDS-t0)) s"
sed -n '/^point /,$p' $OUT/r/vk.txt
tar czf $OUT/results.tgz -C $OUT r && rm -rf $OUT/r; ls $OUT
