"""The SM clock each stage ran at (runtime/gpu_clocks.py), recorded with every measured point, and a measured point
predicted at its own clocks (analytic.predict.at_clocks): the cycles of its kernels (a compute-bound kernel's time,
a bandwidth-bound kernel's beyond its bytes' floor, the launches) scale with the calibration's clock over the
point's. On a CPU nothing is sampled or recorded."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.kernels import Kernel
from dsocr_core.analytic.predict import CLOCK_EXPONENT, CLOCKS_AS_CALIBRATED, Predictor, at_clocks, with_profile
from dsocr_core.calibration.profile import profile_from_dict, uniform_profile
from dsocr_core.hardware import get_hardware
from dsocr_core.results.analytic_join import compare_run
from dsocr_core.runtime.gpu_clocks import Anchor, ClockSampler, NvmlClock, clocks_by_stage
from dsocr_core.spec import ModelSpec, Workload

H200 = get_hardware("h200")
PTS = Points.build(mode="base", text_tokens=10, batch=8, decode_steps=4, logits="last")
STAGES = ("sam", "clip", "projector", "prefill", "decode")


def _profile(clock_mhz: float | None = 2000.0):
    d = uniform_profile(H200.peak_flops, H200.bandwidth, 0.5, 1e-6, kind="cuda").to_dict()
    if clock_mhz is not None:
        d["environment"] = {"sm_clock_max_mhz": clock_mhz}
    return profile_from_dict(d)


def _predicted(hw) -> dict[str, float]:
    out = evaluate(ModelSpec(), PTS, hw)
    return {s: float(out[s]["predicted_s"][0]) for s in STAGES}


def test_readings_go_to_the_stage_running_in_the_order_the_stages_ran():
    spans = [("sam", 0.0, 1.0), ("clip", 1.0, 1.2), ("projector", 1.2, 1.201), ("prefill", 1.21, 1.5),
             ("sam", 2.0, 3.0)]  # a second repeat
    samples = [(0.5, 1980.0), (0.9, 1900.0), (1.1, 1800.0), (1.3, 1700.0), (2.5, 1960.0), (9.0, 345.0)]
    out = clocks_by_stage(spans, samples)
    assert list(out) == ["sam", "clip", "projector", "prefill"]  # the order they first ran
    assert out["sam"] == {"mhz": 1960.0, "samples": 3}
    assert out["clip"] == {"mhz": 1800.0, "samples": 1}
    assert out["projector"] == {"mhz": None, "samples": 0}  # no reading landed in it: not seen, not guessed
    nested = clocks_by_stage([("vision", 0.0, 2.0), ("sam", 0.0, 1.0)], [(0.5, 1.0), (1.5, 2.0)])
    assert nested == {"vision": {"mhz": 2.0, "samples": 1}, "sam": {"mhz": 1.0, "samples": 1}}


def test_an_anchor_places_the_timers_events_on_the_host_clock():
    class Event:
        def __init__(self, ms):
            self.ms = ms

        def elapsed_time(self, other):
            return other.ms - self.ms

    class Mark:
        def __init__(self, name, a, b):
            self.name, self.start, self.end = name, Event(a), Event(b)

    anchor = Anchor(100.0, Event(0.0))
    assert anchor.spans([Mark("sam", 0.5, 30.5), Mark("clip", 30.6, 35.6)]) == [
        ("sam", pytest.approx(100.0005), pytest.approx(100.0305)), ("clip", pytest.approx(100.0306),
                                                                      pytest.approx(100.0356))]


def test_nothing_is_sampled_on_a_cpu():
    assert NvmlClock.open("cpu") is None and ClockSampler.start("cpu") is None


def test_a_kernels_cycles_take_the_clock_ratio_longer_its_bytes_floor_does_not():
    pred = Predictor(with_profile(H200, _profile(), "fast").prediction)
    gemm = Kernel("gemm", dict(m=8192.0, n=8192.0, k=8192.0), 2.0 * 8192 ** 3, 3 * 8192 * 8192 * 2.0, 1.0)
    thin = Kernel("gemm", dict(m=1.0, n=8192.0, k=8192.0), 2.0 * 8192 ** 2, 8192 * 8192 * 2.0, 1.0)  # a GEMV
    copy = Kernel("memory.copy", dict(bytes=1e9), 1e12, 1e9, 1.0)  # a memory table's kernel is bandwidth-bound
    kernels = {"gemm": gemm, "thin": thin, "copy": copy}
    share = {n: max(k.flops / pred.P, k.nbytes / pred.W) for n, k in kernels.items()}
    floor = {"gemm": 0.0, "thin": thin.nbytes / pred.W, "copy": copy.nbytes / pred.W}
    base = {n: float(pred._excess(k, "bfloat16")) + share[n] for n, k in kernels.items()}
    assert all(base[n] > floor[n] > 0 or n == "gemm" for n in kernels)  # every kernel has cycles to scale
    pred._clock = 1.25
    for n, k in kernels.items():
        t = float(pred._excess(k, "bfloat16")) + share[n]
        assert t == pytest.approx(floor[n] + (base[n] - floor[n]) * 1.25, rel=1e-12), n


def test_the_launches_take_the_clock_ratio_longer():
    """A profile whose kernels run at their roofline (efficiency 1: no time beyond the bytes' floor) and cost 1 us
    a launch: at a lower clock only the launches' share of a stage grows."""
    d = uniform_profile(H200.peak_flops, H200.bandwidth, 1.0, 1e-6, kind="cuda").to_dict()
    d["environment"] = {"sm_clock_max_mhz": 2000.0}
    hw = with_profile(H200, profile_from_dict(d), "fast")
    slow = at_clocks(hw, {"decode": {"mhz": 1000.0, "samples": 3}})
    full, at = evaluate(ModelSpec(), PTS, hw)["decode"], evaluate(ModelSpec(), PTS, slow)["decode"]
    ratio = 2.0 ** CLOCK_EXPONENT
    assert float(at["predicted_launch_s"][0]) == pytest.approx(float(full["predicted_launch_s"][0]) * ratio)
    assert float(full["predicted_launch_s"][0]) > 0
    grown = float(at["predicted_s"][0] - full["predicted_s"][0])
    assert grown == pytest.approx(float(full["predicted_launch_s"][0]) * (ratio - 1) + float(
        at["predicted_kernel_s"][0] - full["predicted_kernel_s"][0]), rel=1e-9)


def test_a_point_is_predicted_at_the_clocks_its_stages_ran_at():
    hw = with_profile(H200, _profile(2000.0), "fast")
    assert hw.prediction.clock_label() == CLOCKS_AS_CALIBRATED + " (2,000 MHz)"
    full = _predicted(hw)
    # the projector had no reading: it takes CLIP's; decode was not recorded at all: it stays at full clock
    recorded = {"clip": {"mhz": 1601.0, "samples": 2}, "prefill": {"mhz": 1000.0, "samples": 3},
                "projector": {"mhz": None, "samples": 0}, "sam": {"mhz": 2000.0, "samples": 9}}  # as stored: by name
    slow = at_clocks(hw, recorded)
    assert slow.prediction.clocks == (("sam", 2000.0), ("clip", 1600.0), ("projector", 1600.0),
                                      ("prefill", 1000.0))  # rounded to 5 MHz: a run's points share predictions
    assert slow.prediction.clock_label() == ("measured with the point: SM sam 2,000, clip 1,600, projector 1,600, "
                                             "prefill 1,000 MHz against the calibration's 2,000 MHz")
    at = _predicted(slow)
    assert at["sam"] == pytest.approx(full["sam"], rel=1e-12) and at["decode"] == pytest.approx(full["decode"],
                                                                                               rel=1e-12)
    assert full["clip"] < at["clip"] <= 1.25 * full["clip"] * (1 + 1e-12)
    assert full["prefill"] < at["prefill"] <= 2.0 * full["prefill"] * (1 + 1e-12)
    assert at_clocks(hw, None) is hw and at_clocks(hw, {"sam": {"mhz": None, "samples": 0}}) is hw
    assert at_clocks(slow, recorded) is slow


def test_the_clock_ratio_takes_the_measured_exponent_and_never_speeds_a_kernel_up():
    hw = at_clocks(with_profile(H200, _profile(2000.0), "fast"), {"sam": {"mhz": 1000.0, "samples": 3},
                                                                    "clip": {"mhz": 2100.0, "samples": 3}})
    ratio = Predictor(hw.prediction).clock_ratio
    assert 0.5 < CLOCK_EXPONENT <= 1.0
    assert ratio == {"sam": pytest.approx(2.0 ** CLOCK_EXPONENT), "clip": 1.0}  # above the tables' clock: as timed
    # the clock the tables ran at is the GPU's maximum, never the clock read at capture (an idle GPU's is low)
    d = _profile(None).to_dict()
    d["environment"] = {"sm_clock_mhz": 345.0}
    assert profile_from_dict(d).clock_mhz is None


def test_a_profile_without_its_calibration_clock_leaves_the_clocks_out_and_says_so():
    hw = at_clocks(with_profile(H200, _profile(None), "fast"), {"clip": {"mhz": 1000.0, "samples": 2}})
    plain = _predicted(with_profile(H200, _profile(None), "fast"))
    assert _predicted(hw) == pytest.approx(plain, rel=1e-12)
    assert any("no calibration clock" in n for n in hw.prediction.notes)
    assert hw.prediction.clock_label() == CLOCKS_AS_CALIBRATED


def test_a_stored_points_clocks_set_its_prediction(tmp_path):
    from dsocr_core.results.store import RunStore

    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.create_run("sweep", "clocks", {"device": "NVIDIA H200", "kind": "cuda"}, {"source": "synthetic"},
                              dtype="bfloat16", attn="sdpa", session_mode="fast")
    stage = {"median_s": 0.01, "p10_s": 0.01, "p90_s": 0.01, "min_s": 0.01, "max_s": 0.01, "n": 3}
    for i, mhz in enumerate((2000.0, 1000.0, None)):
        w = Workload(mode="base", text_tokens=10 + i, batch=8, decode_steps=4, logits="last")
        extra = {"engine_state": {}}
        if mhz is not None:
            extra["stage_clocks"] = {"sam": {"mhz": mhz, "samples": 4}}
        store.put_point(run_id, w, "done", "", {"sam": dict(stage), "prefill": dict(stage)}, 0, {"sequence": 100},
                        extra)
    df = compare_run(store, run_id, prediction=with_profile(H200, _profile(2000.0), "fast"))
    sam = {t: g[g.stage == "sam"].iloc[0] for t, g in df.groupby("text_tokens")}
    assert "SM sam 2,000 MHz" in sam[10].predicted_clocks and "SM sam 1,000 MHz" in sam[11].predicted_clocks
    assert sam[12].predicted_clocks == CLOCKS_AS_CALIBRATED + " (2,000 MHz)"
    assert sam[11].predicted_s > 1.2 * sam[10].predicted_s  # SAM at batch 8 is mostly compute-bound GEMMs
    assert sam[12].predicted_s == pytest.approx(sam[10].predicted_s, rel=1e-12)
    assert np.isfinite(df.time_err_predicted).all()


@pytest.mark.gpu
def test_the_sampler_reads_the_sm_clock_while_a_measured_point_runs():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dsocr_core.measure.sweep import measure_point, point_extra
    from dsocr_core.runtime.session import Session

    clock = NvmlClock.open("cuda")
    assert clock is not None and 100 <= clock.read() <= 5000  # MHz on any GPU NVML knows
    session = Session.load(synthetic="tiny", device="cuda", dtype="float32").with_mode("fast")
    w = Workload(mode="base", text_tokens=10, batch=8, decode_steps=64, logits="last", dtype="float32")
    result = measure_point(session, w, repeats=3, warmup=1, count_flops=False)
    clocks = point_extra(result)["stage_clocks"]
    assert list(clocks)[:2] == ["sam", "clip"] and "decode" in clocks
    seen = [c["mhz"] for c in clocks.values() if c["mhz"] is not None]
    assert seen and all(100 <= mhz <= 5000 for mhz in seen)


def test_the_measured_point_table_shows_each_stages_clock(tmp_path):
    from dsocr_core.results.store import RunStore
    from dsocr_core.runtime.gpu_clocks import stage_clocks_text
    from ui.measured import point_table

    recorded = {"prefill": {"mhz": 1777.5, "samples": 4}, "projector": {"mhz": None, "samples": 0},
                "sam": {"mhz": 1935.0, "samples": 19}}  # as a store keeps it: by name
    assert stage_clocks_text(recorded) == "sam 1,935, projector -, prefill 1,778 MHz"
    assert stage_clocks_text(None) is None and stage_clocks_text({}) is None
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.create_run("sweep", "clocks", {"device": "NVIDIA H200", "kind": "cuda"}, {"source": "synthetic"},
                              dtype="bfloat16", attn="sdpa", session_mode="fast")
    stage = {"median_s": 0.01, "p10_s": 0.01, "p90_s": 0.01, "min_s": 0.01, "max_s": 0.01, "n": 3}
    for i, extra in enumerate(({"stage_clocks": recorded}, {})):
        store.put_point(run_id, Workload(mode="base", text_tokens=10 + i, batch=8, decode_steps=4, logits="last"),
                        "done", "", {"sam": dict(stage)}, 0, {"sequence": 100}, {"engine_state": {}, **extra})
    table = point_table(store.points(run_id)).sort_values("text_tokens")
    first, second = table["SM clock by stage"].tolist()
    assert first == "sam 1,935, projector -, prefill 1,778 MHz" and (second is None or second != second)  # None/NaN


def test_the_sampler_reads_until_stopped_and_not_while_paused():
    import time

    class Counter:
        def __init__(self):
            self.calls = 0

        def read(self):
            self.calls += 1
            return None if self.calls == 1 else 1500.0  # a failed reading is skipped, not stored

    reader = Counter()
    sampler = ClockSampler(reader, period_s=0.001).run()
    deadline = time.time() + 5
    while reader.calls < 3 and time.time() < deadline:
        time.sleep(0.002)
    with sampler.paused():
        time.sleep(0.01)  # a read already under way may finish just after the pause starts
        before = reader.calls
        time.sleep(0.05)
        assert reader.calls == before
    sampler.stop()
    after = reader.calls
    time.sleep(0.02)
    assert reader.calls == after and after >= 3
    assert len(sampler.samples) == after - 1 and all(v == 1500.0 for _, v in sampler.samples)


def test_stage_clocks_on_a_cpu_hand_out_plain_timers_and_record_nothing():
    from dsocr_core.runtime.gpu_clocks import StageClocks
    from dsocr_core.runtime.timing import StageTimer

    with StageClocks("cpu") as clocks:
        with clocks.paused():
            pass
        timer = clocks.timer()
    assert isinstance(timer, StageTimer) and clocks.result() is None


def test_a_clock_that_cannot_be_read_never_costs_the_measurement(monkeypatch):
    from dsocr_core.runtime import gpu_clocks

    def broken(*a, **k):
        raise RuntimeError("NVML in a state nobody planned for")

    monkeypatch.setattr(gpu_clocks.ClockSampler, "start", classmethod(lambda cls, *a, **k: broken()))
    with gpu_clocks.StageClocks("cpu") as clocks:
        timer = clocks.timer()
    assert timer is not None and clocks.result() is None

    class Sampler:  # a running sampler whose anchor and events fail
        samples = [(1.0, 1500.0)]

        def stop(self):
            pass

    monkeypatch.setattr(gpu_clocks.ClockSampler, "start", classmethod(lambda cls, *a, **k: Sampler()))
    monkeypatch.setattr(gpu_clocks.Anchor, "now", classmethod(lambda cls, *a, **k: broken()))
    with gpu_clocks.StageClocks("cpu") as clocks:
        clocks.timer()
    assert clocks.result() is None


def test_a_what_if_clock_prices_every_stage_at_it_and_says_so():
    from dsocr_core.analytic.predict import at_sm_clock
    from dsocr_core.spec import SpecError

    hw = with_profile(H200, _profile(2000.0), "fast")
    full = _predicted(hw)
    slow = at_sm_clock(hw, 1502.0)
    assert slow.prediction.clock_label() == ("what-if: SM 1,500 MHz in every stage against the calibration's "
                                             "2,000 MHz")  # rounded to 5 MHz
    at = _predicted(slow)
    ratio = (2000 / 1500) ** CLOCK_EXPONENT
    assert all(full[s] < at[s] <= full[s] * ratio * (1 + 1e-12) for s in STAGES), (full, at)
    assert at_sm_clock(slow, None).prediction.clock_label() == CLOCKS_AS_CALIBRATED + " (2,000 MHz)"
    assert _predicted(at_sm_clock(hw, 2500.0)) == pytest.approx(full, rel=1e-12)  # above the full clock: as timed
    # a measured point's prediction takes its own clocks (or none): the what-if clock never leaks into it
    measured = at_clocks(slow, {"sam": {"mhz": 1800.0, "samples": 4}})
    assert measured.prediction.clock_label().startswith("measured with the point: SM sam 1,800")
    assert not at_clocks(slow, None).prediction.clocks
    for bad in (0, -1.0, 99.0, 5001, float("nan"), float("inf"), "1500", True):
        with pytest.raises(SpecError, match="a number of MHz from 100 to 5,000"):
            at_sm_clock(hw, bad)
    assert at_sm_clock(hw, np.int64(1500)).prediction.clocks[0][1] == 1500.0
    # a profile that records no calibration clock cannot move its tables: said in the notes, priced as timed
    bare = at_sm_clock(with_profile(H200, _profile(None), "fast"), 1500.0)
    assert _predicted(bare) == pytest.approx(_predicted(with_profile(H200, _profile(None), "fast")), rel=1e-12)
    assert any("records no calibration clock" in n for n in bare.prediction.notes)


def test_the_cli_takes_a_what_if_clock(tmp_path, capsys):
    from dsocr_core.cli import main

    path = tmp_path / "h200.json"
    _profile(2000.0).save(path)
    args = ["analytic", "--spec", "tiny", "--batch", "4", "--decode-steps", "2", "--profile", str(path),
            "--session-mode", "fast"]
    assert main(args + ["--sm-clock", "1500"]) == 0
    assert "what-if: SM 1,500 MHz in every stage against the calibration's 2,000 MHz" in capsys.readouterr().out
    assert main(args + ["--sm-clock", "fast"]) == 2
    assert "--sm-clock: a number of MHz" in capsys.readouterr().err
    assert main(["analytic", "--spec", "tiny", "--sm-clock", "1500"]) == 2
    assert "--sm-clock needs --profile" in capsys.readouterr().err
    bare = tmp_path / "bare.json"
    _profile(None).save(bare)
    assert main(["analytic", "--spec", "tiny", "--profile", str(bare), "--sm-clock", "1500"]) == 2
    assert "records no calibration clock" in capsys.readouterr().err


def test_a_derived_profiles_points_are_scaled_against_their_gpus_full_clock():
    """A derived profile's tables stand for the target GPU at its full clock: a measured run's points are predicted
    at their clocks against that GPU's full clock (the run's environment), and without it not at all."""
    from dsocr_core.calibration.derive import derive_profile

    prof = derive_profile(_profile(2000.0), "h200", source_hardware="h100-sxm")
    assert prof.derived and prof.clock_mhz is None
    recorded = {"prefill": {"mhz": 1000.0, "samples": 3}}
    bare = at_clocks(with_profile(H200, prof, "fast"), recorded)
    assert _predicted(bare) == pytest.approx(_predicted(with_profile(H200, prof, "fast")), rel=1e-12)
    assert any("records no calibration clock" in n for n in bare.prediction.notes)
    run = at_clocks(with_profile(H200, prof, "fast", gpu_clock_mhz=2000.0), recorded)
    assert run.prediction.clock_label() == "measured with the point: SM prefill 1,000 MHz against the run's GPU's " \
                                           "full 2,000 MHz"
    full, at = _predicted(with_profile(H200, prof, "fast", gpu_clock_mhz=2000.0)), _predicted(run)
    assert full["prefill"] < at["prefill"] and at["sam"] == pytest.approx(full["sam"], rel=1e-12)
    # a measured profile keeps its own calibration clock whatever the run's GPU says
    measured = with_profile(H200, _profile(2000.0), "fast", gpu_clock_mhz=1000.0).prediction
    assert measured.calibration_clock() == 2000.0


def test_a_shipped_runs_gpu_clock_reaches_a_derived_profiles_prediction():
    """accuracy_errors takes the full SM clock of the GPU a result's points ran on from its measured environment:
    with a derived profile, seed 82's points whose prefill ran below the full clock are predicted slower than without
    it, and a clock no GPU has is taken as unknown."""
    import copy
    import json
    from pathlib import Path

    from dsocr_core.calibration.derive import derive_profile
    from dsocr_core.calibration.profile import load_profile
    from dsocr_core.results.prediction_check import accuracy_errors

    root = Path(__file__).resolve().parents[1]
    result = json.loads((root / "docs" / "results" / "h200_prediction_accuracy_random82_fast_2026-11-28.json"
                         ).read_text())
    assert result["modes"]["fast"]["measured_environment"]["sm_clock_max_mhz"] == 1980.0
    prof = derive_profile(load_profile(root / "data" / "profiles" / "h100.json"), "h200")
    with_clock = accuracy_errors(result, prof, "fast")
    bare = copy.deepcopy(result)
    bare["modes"]["fast"]["measured_environment"]["sm_clock_max_mhz"] = 19_800_000  # a unit mix-up: unknown
    without = accuracy_errors(bare, prof, "fast")
    pairs = [(a["predicted_s"]["prefill"], b["predicted_s"]["prefill"]) for a, b in zip(with_clock, without)]
    assert all(a >= b for a, b in pairs) and sum(a > b * 1.02 for a, b in pairs) >= 4  # the points at low clocks
