"""Routing-aware prediction on a GPU: a fast-mode sweep of the FULL synthetic model records the experts each MoE
layer touches, and the run predicted with that observed routing is closer to its measured decode step than with
uniform routing (the synthetic weights send a batch to far fewer experts than uniform routing assumes,
docs/accuracy.md). Run on the device machine: `python -m pytest -m gpu tests/test_routing_gpu.py`.
"""
from pathlib import Path

import pytest
import torch

import dsocr_core.results.analytic_join as join
from dsocr_core.analytic.lm import expected_experts
from dsocr_core.analytic.predict import profile_hardware, with_profile
from dsocr_core.calibration.profile import load_profile
from dsocr_core.measure.sweep import run_sweep, sweep_workloads
from dsocr_core.results.prediction_check import run_errors
from dsocr_core.results.store import RunStore
from dsocr_core.runtime.session import Session

pytestmark = pytest.mark.gpu
PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"


def own_profile():
    """The shipped profile of this GPU (H100 or H200), or a skip naming the GPU."""
    name = torch.cuda.get_device_name()
    for key, file in (("H200", "h200.json"), ("H100", "h100.json")):
        if key in name:
            return load_profile(PROFILES / file)
    pytest.skip(f"no shipped profile for {name} (data/profiles has the H100 and H200)")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    session = Session.load(synthetic="full", device="cuda", dtype="bfloat16", session_mode="fast")
    store = RunStore(tmp_path_factory.mktemp("routing_gpu") / "runs.sqlite")
    workloads = sweep_workloads(["base"], [(1, 1)], [10], [16], [32], dtype="bfloat16", logits="last")
    return store, run_sweep(session, store, workloads, repeats=3, warmup=1)


def test_a_fast_mode_point_records_the_experts_its_layers_touched(measured):
    store, run_id = measured
    pts = store.points(run_id)
    routing = join.observed_routing(store.get_run(run_id), pts)
    assert routing is not None and 16.0 in routing.tokens
    distinct = dict(zip(routing.tokens, routing.observed))[16.0]
    assert 6 <= distinct < expected_experts(64, 6, 16.0)  # fewer than uniform routing's 50.8


def test_the_observed_routing_predicts_the_batched_decode_step_better(measured, monkeypatch):
    store, run_id = measured
    prof = own_profile()
    pred = with_profile(profile_hardware(prof), prof, "fast")
    observed = {r["point"]: r["error"]["decode_step"] for r in run_errors(store, run_id, pred)}
    monkeypatch.setattr(join, "observed_routing", lambda *a, **k: None)  # the same run, assumed uniform routing
    uniform = {r["point"]: r["error"]["decode_step"] for r in run_errors(store, run_id, pred)}
    for point, err in observed.items():
        assert abs(err) < abs(uniform[point]), (point, err, uniform[point])
        assert abs(err) <= 0.25, f"{point}: decode step predicted {err:+.1%} off with the observed routing"
