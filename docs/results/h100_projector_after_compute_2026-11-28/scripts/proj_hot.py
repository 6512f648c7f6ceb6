"""Is the projector slower right after a long compute-bound stage? Its graph replayed after GEMM bursts of growing
length, beside the stage timed in the engine's prefill."""
import json, sys, os
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "scratch")
import torch
from dsocr_core.runtime.session import Session
from dsocr_core.runtime.inputs import synthetic_for_workload
from dsocr_core.spec import Workload
from vision_kernels import stage_medians
from proj_cycles_lib import projector_graph, covered_hot

s = Session.load(synthetic="full", device="cuda", dtype="bfloat16").with_mode("fast")
out = []
for spec in os.environ["PTS"].split(","):
    mode, b, t = spec.split(":")
    w = Workload(mode=mode, crops=None, batch=int(b), text_tokens=int(t), decode_steps=32, logits="last", dtype="bfloat16")
    s.engine.release(); torch.cuda.empty_cache()
    inp = synthetic_for_workload(w, seed=0).to(s.device, s.torch_dtype)
    for _ in range(2):
        s.prefill(inp)
    stage = stage_medians(s, inp, 10, ("clip", "projector"))
    g = projector_graph(s.engine, int(b))
    hot = {ms: covered_hot(g, ms) for ms in (0, 1, 4, 16, 60)}
    out.append({"point": spec, "stage_us": stage["projector"] * 1e6, "clip_ms": stage["clip"] * 1e3, "after_burst_us": hot})
    print(f"{spec:16s} in prefill {stage['projector']*1e6:6.1f} (clip {stage['clip']*1e3:.1f} ms) | after burst: " +
          "  ".join(f"{ms} ms {v:6.1f}" for ms, v in hot.items()), flush=True)
    json.dump(out, open(os.environ["OUT"] + "/hot.json", "w"), indent=1)
