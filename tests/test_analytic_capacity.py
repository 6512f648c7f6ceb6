"""Capacity planning (TTFT, TPOT, pages/day, memory) and its inverse (the GPU a latency target needs)."""
import numpy as np
import pytest

from dsocr_core.analytic import Points, capacity, capacity_summary, required_hardware, stage_totals
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import Hardware, ModelSpec, SpecError, Workload

SPEC = ModelSpec()
HW = get_hardware("h200")


def test_capacity_definitions():
    w = Workload(crops=(2, 2), batch=4, decode_steps=800)
    cap = capacity_summary(SPEC, w, HW)
    t = stage_totals(SPEC, w, HW)
    assert cap["ttft_s"] == pytest.approx(t["vision"]["time_s"] + t["prefill"]["time_s"])
    assert cap["tpot_s"] == pytest.approx(t["decode"]["time_s"] / 800)
    assert cap["request_s"] == pytest.approx(cap["ttft_s"] + 800 * cap["tpot_s"])
    assert cap["pages_per_s"] == pytest.approx(4 / cap["request_s"])
    assert cap["pages_per_day"] == pytest.approx(cap["pages_per_s"] * 86_400)
    assert cap["memory_bytes"] == t["total"]["weight_memory"] + t["total"]["kv_cache_memory"] + \
        t["total"]["peak_activation_memory"]
    assert cap["fits"]
    # decode at batch 1 on an H200 is bound by ~1.15 GB of weights per token: about 0.24-0.27 ms
    one = capacity_summary(SPEC, Workload(crops=(2, 2), decode_steps=1), HW)
    assert 0.23e-3 < one["tpot_s"] < 0.3e-3


def test_batching_raises_throughput_and_memory():
    pts = Points.grid(crops=[(2, 2)], batch=[1, 8, 64], decode_steps=[1000])
    cap = capacity(SPEC, pts, HW)
    assert np.all(np.diff(cap["pages_per_s"]) > 0)
    assert np.all(np.diff(cap["memory_bytes"]) > 0)
    small = Hardware(name="tiny GPU", peak_tflops=100, bandwidth_tbs=1, memory_gb=8)
    assert not capacity(SPEC, Points.grid(crops=[(2, 2)], batch=[64], decode_steps=[8000]), small)["fits"][0]


def test_tpot_without_decode_steps_is_one_step_at_the_prompt():
    cap = capacity_summary(SPEC, Workload(crops=(2, 2)), HW)
    with_one = capacity_summary(SPEC, Workload(crops=(2, 2), decode_steps=1), HW)
    assert cap["tpot_s"] == pytest.approx(with_one["tpot_s"]) and cap["request_s"] == cap["ttft_s"]


def test_required_hardware_meets_target_exactly():
    pts = Points.from_workload(Workload(crops=(3, 2), batch=2, decode_steps=500))
    req = required_hardware(SPEC, pts, ttft_s=0.01, tpot_s=1e-4, reference=HW)
    for name, target in (("ttft", 0.01), ("tpot", 1e-4)):
        r = {k: np.asarray(v)[0] for k, v in req[name].items()}
        scaled = Hardware(name="scaled", peak_tflops=r["scaled_tflops"], bandwidth_tbs=r["scaled_tbs"], memory_gb=1)
        cap = capacity(SPEC, pts, scaled)
        got = cap["ttft_s"][0] if name == "ttft" else cap["tpot_s"][0]
        assert got == pytest.approx(target, rel=1e-9)
        assert r["min_tflops"] <= r["scaled_tflops"] * (1 + 1e-9) and r["min_tbs"] <= r["scaled_tbs"] * (1 + 1e-9)
        assert r["min_tflops"] == pytest.approx(r["flops"] / target / 1e12)
    # the decode step at batch 2 is memory bound: its bandwidth floor is what matters
    assert req["tpot"]["min_tbs"][0] > HW.bandwidth_tbs


def test_required_hardware_rejects_bad_targets():
    pts = Points.from_workload(Workload())
    with pytest.raises(SpecError):
        required_hardware(SPEC, pts)
    with pytest.raises(SpecError, match="positive"):
        required_hardware(SPEC, pts, ttft_s=0)
