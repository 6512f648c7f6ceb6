"""The projector stage timed by the engine's prefill with the stage timer as it is (a synchronisation and a short
GPU wait at every stage boundary) and with the boundaries left unsynchronised (events only), alternating."""
import json, sys, os, statistics
sys.path.insert(0, "benchmarks")
import torch
from dsocr_core.runtime import timing
from dsocr_core.runtime.session import Session
from dsocr_core.runtime.inputs import synthetic_for_workload
from dsocr_core.spec import Workload

orig = timing.StageTimer.stage
def nosync(self, name, track_memory=False, count=1):
    return orig(self, name, False, count)

s = Session.load(synthetic="full", device="cuda", dtype="bfloat16").with_mode("fast")
out = []
for spec in os.environ["PTS"].split(","):
    mode, grid, b = spec.split(":")
    gw, gh = (int(x) for x in grid.split("x"))
    w = Workload(mode=mode, crops=(gw, gh) if mode.startswith("gundam") else None, batch=int(b), text_tokens=10,
                 decode_steps=32, logits="last", dtype="bfloat16")
    s.engine.release(); torch.cuda.empty_cache()
    inp = synthetic_for_workload(w, seed=0).to(s.device, s.torch_dtype)
    for _ in range(2):
        s.prefill(inp)
    res = {"synced": [], "unsynced": []}
    for i in range(16):
        how = "synced" if i % 2 == 0 else "unsynced"
        timing.StageTimer.stage = orig if how == "synced" else nosync
        t = timing.StageTimer(s.device)
        s.prefill(inp, timer=t)
        res[how].append(dict(t.totals()))
    timing.StageTimer.stage = orig
    row = {"point": spec, **{h: {k: statistics.median(r[k] for r in v) * 1e6 for k in v[0]} for h, v in res.items()}}
    out.append(row)
    print(f"{spec:18s} projector synced {row['synced']['projector']:7.1f} unsynced {row['unsynced']['projector']:7.1f} | "
          f"clip {row['synced']['clip']:9.1f} {row['unsynced']['clip']:9.1f} | prefill {row['synced']['prefill']:9.1f} {row['unsynced']['prefill']:9.1f}", flush=True)
    json.dump(out, open(os.environ["OUT"] + "/nosync.json", "w"), indent=1)
