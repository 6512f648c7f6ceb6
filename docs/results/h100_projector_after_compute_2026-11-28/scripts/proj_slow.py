"""Hunting the projector's slow captures: the sequence that showed them (prefill loops and sweep-style generations
of large pages, in turn), and after each phase the projector graph probed in the state it left: the timer's stage
time, the graph replayed alone (events), and its kernels (profiler)."""
import json, sys, os, statistics
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "scratch")
import torch
from dsocr_core.runtime.session import Session
from dsocr_core.runtime.inputs import synthetic_for_workload
from dsocr_core.measure.stage_stats import timed_generation
from dsocr_core.spec import Workload
from vision_kernels import stage_medians
from proj_cycles_lib import projector_graph, replay_time, replay_kernels, covered

s = Session.load(synthetic="full", device="cuda", dtype="bfloat16").with_mode("fast")
eng = s.engine
out = []
for spec in os.environ["PTS"].split(","):
    mode, b, t, how = spec.split(":")
    b, t = int(b), int(t)
    w = Workload(mode=mode, crops=None, batch=b, text_tokens=t, decode_steps=32, logits="last", dtype="bfloat16")
    eng.release(); torch.cuda.empty_cache()
    inp = synthetic_for_workload(w, seed=0).to(s.device, s.torch_dtype)
    if how == "loop":
        for _ in range(2):
            s.prefill(inp)
        stage = stage_medians(s, inp, 10, ("projector",))["projector"] * 1e6
    else:
        run = dict(no_repeat_ngram_size=0, logits="last", stop_at_eos=False, memory="none")
        timed_generation(s, inp, 3, **run)
        rs = [timed_generation(s, inp, 33, **run).totals["projector"] for _ in range(3)]
        stage = statistics.median(rs) * 1e6
    g = projector_graph(eng, b)
    stage2 = stage_medians(s, inp, 10, ("projector",))["projector"] * 1e6
    alone = replay_time(g)
    ks = replay_kernels(g)
    cov = {c: covered(g, c) for c in (200_000, 1_000_000)}
    out.append({"point": spec, "stage_us": stage, "stage_again_us": stage2, "alone_us": alone, "kernels_us": ks, "covered": cov})
    print(f"{spec:22s} stage {stage:6.1f} again {stage2:6.1f} alone {alone:6.1f} | kernels sum {sum(ks.values()):6.1f} | " + " | ".join(
        f"cover {c}: stage {v[0]:.1f} host {v[1]:.0f} (max {v[2]:.0f})" for c, v in cov.items()), flush=True)
    json.dump(out, open(os.environ["OUT"] + "/slow.json", "w"), indent=1)
