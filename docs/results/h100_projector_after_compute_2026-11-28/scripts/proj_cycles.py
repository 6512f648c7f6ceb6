"""One page's projector stage over several capture cycles (engine released, graphs captured again): the stage's
graphed median (the timer's events) and its graph replayed alone under the profiler, kernel by kernel."""
import json, sys, os, statistics
sys.path.insert(0, "benchmarks")
import torch
from torch.profiler import ProfilerActivity, profile
from dsocr_core.runtime.session import Session
from dsocr_core.runtime.inputs import synthetic_for_workload
from dsocr_core.spec import Workload
from vision_kernels import stage_medians

s = Session.load(synthetic="full", device="cuda", dtype="bfloat16").with_mode("fast")
eng = s.engine
out = []


def projector_graph(b):
    st = eng._states[b]
    (entry,) = st.prefills.values()
    return dict(entry["stages"])["projector"]


def replay_kernels(run, n=5):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run.graph.replay()
        torch.cuda.synchronize()
    ks = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            ks.setdefault(e.name, []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    return {k: statistics.median(v) for k, v in ks.items()}


def replay_time(run, n=20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        a.record(); run.graph.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


for spec in os.environ["PTS"].split(","):
    mode, b, t, cycles = spec.split(":")
    w = Workload(mode=mode, crops=None, batch=int(b), text_tokens=int(t), decode_steps=32, logits="last", dtype="bfloat16")
    inp = synthetic_for_workload(w, seed=0).to(s.device, s.torch_dtype)
    for c in range(int(cycles)):
        eng.release(); torch.cuda.empty_cache()
        for _ in range(2):
            s.prefill(inp)
        med = stage_medians(s, inp, 10, ("projector",))["projector"] * 1e6
        run = projector_graph(int(b))
        alone = replay_time(run)
        ks = replay_kernels(run)
        out.append({"point": spec, "cycle": c, "stage_us": med, "alone_us": alone, "kernels_us": ks})
        print(f"{mode} b{b} c{c}: stage {med:6.1f} alone {alone:6.1f} | " + " | ".join(
            f"{k[:24]} {v:.1f}" for k, v in sorted(ks.items(), key=lambda kv: -kv[1]) if v > 1.5), flush=True)
        json.dump(out, open(os.environ["OUT"] + "/cycles.json", "w"), indent=1)
