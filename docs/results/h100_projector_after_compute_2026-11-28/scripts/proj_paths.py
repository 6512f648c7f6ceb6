"""The projector stage of one page timed two ways in one process: prefills only (vision_kernels' loop) and the
sweep's measure_point (generate with decode, warm-up 1, 3 repeats)."""
import json, statistics, sys, os
sys.path.insert(0, "benchmarks")
import torch
from dsocr_core.runtime.session import Session
from dsocr_core.runtime.inputs import synthetic_inputs, synthetic_for_workload
from dsocr_core.measure.sweep import measure_point
from dsocr_core.spec import Workload
from vision_kernels import stage_medians

base = Session.load(synthetic="full", device="cuda", dtype="bfloat16")
s = base.with_mode("fast")
pts = [p.split(":") for p in os.environ["PTS"].split(",")]
out = []
for mode, b, t in pts:
    b, t = int(b), int(t)
    w = Workload(mode=mode, crops=None, batch=b, text_tokens=t, decode_steps=32, logits="last", dtype="bfloat16")
    row = {"point": f"{mode} b{b} t{t}"}
    inp = synthetic_for_workload(w, seed=0).to(s.device, s.torch_dtype)
    for _ in range(2):
        s.prefill(inp)
    row["prefill_loop"] = stage_medians(s, inp, 20, ("sam", "clip", "projector"))
    s.engine.release(); torch.cuda.empty_cache()
    r = measure_point(s, w, repeats=3, warmup=1, count_flops=False)
    row["measure_point"] = {k: r.stages[k]["median_s"] for k in ("sam", "clip", "projector")}
    row["measure_point_minmax"] = [r.stages["projector"]["min_s"], r.stages["projector"]["max_s"]]
    inp = synthetic_for_workload(w, seed=0).to(s.device, s.torch_dtype)
    for _ in range(2):
        s.prefill(inp)
    row["prefill_loop_after"] = stage_medians(s, inp, 20, ("sam", "clip", "projector"))
    s.engine.release(); torch.cuda.empty_cache()
    out.append(row)
    print(row["point"], "projector us: loop %.1f  measure_point %.1f (%.1f..%.1f)  loop again %.1f" % (
        row["prefill_loop"]["projector"] * 1e6, row["measure_point"]["projector"] * 1e6,
        *(x * 1e6 for x in row["measure_point_minmax"]), row["prefill_loop_after"]["projector"] * 1e6), flush=True)
    json.dump(out, open(os.environ["OUT"] + "/paths.json", "w"), indent=1)
