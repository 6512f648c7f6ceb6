import statistics
import torch
from torch.profiler import ProfilerActivity, profile


def projector_graph(eng, b):
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
            ks.setdefault(e.name, []).append(e.device_time_total)
    return {k: statistics.median(v) * len(v) / n for k, v in ks.items()}


def replay_time(run, n=20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        a.record(); run.graph.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def covered(run, cycles, n=15):
    """The timer's sequence by hand (sync, peak reset, a GPU wait of `cycles`, start event, replay, end event):
    median stage us and median host us from queuing the wait to the replay's return."""
    import time
    st, host = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        torch.cuda._sleep(cycles)
        a = torch.cuda.Event(enable_timing=True); a.record()
        run.graph.replay()
        t1 = time.perf_counter()
        b = torch.cuda.Event(enable_timing=True); b.record()
        torch.cuda.synchronize()
        st.append(a.elapsed_time(b) * 1e3); host.append((t1 - t0) * 1e6)
    return statistics.median(st), statistics.median(host), max(host)


def covered_hot(run, burst_ms, cycles=200_000, n=12):
    """covered() right after a burst of large bf16 GEMMs lasting about `burst_ms` (as the projector runs right
    after CLIP): median stage us."""
    a_ = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); torch.mm(a_, a_); e1.record(); torch.cuda.synchronize()
    one_ms = max(e0.elapsed_time(e1), 1e-3)
    k = int(round(burst_ms / one_ms))
    st = []
    for _ in range(n):
        for _ in range(k):
            torch.mm(a_, a_)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda._sleep(cycles)
        a = torch.cuda.Event(enable_timing=True); a.record()
        run.graph.replay()
        b = torch.cuda.Event(enable_timing=True); b.record()
        torch.cuda.synchronize()
        st.append(a.elapsed_time(b) * 1e3)
    return statistics.median(st)
