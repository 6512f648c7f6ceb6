"""benchmarks/stage_clocks.py: points measured as a sweep measures them (measure_point, without the FLOP count),
each stage's time beside the clock it ran at and, with a profile, its prediction at the full clock and at its own
clocks. On a CPU no clock is read: the two predictions are the same."""
import json

import pytest

from benchmark_scripts import load_benchmark


def test_cpu_run_times_and_predicts_every_stage(tmp_path):
    from dsocr_core.calibration.profile import uniform_profile

    sc = load_benchmark("stage_clocks")
    prof = tmp_path / "cpu.json"
    uniform_profile(1e12, 1e11, 0.5, 1e-6, kind="cpu").save(prof)
    out = tmp_path / "sc.json"
    assert sc.main(["--device", "cpu", "--quick", "--points", "small:1x1:b2", "--repeats", "2", "--decode-steps",
                    "2", "--profile", str(prof), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (point,) = result["points"]
    assert result["benchmark"] == "stage_clocks" and point["stage_clocks"] is None  # no clock on a CPU
    assert set(point["stages_s"]) == {"sam", "clip", "projector", "prefill", "decode_step"}
    assert all(t > 0 for t in point["stages_s"].values())
    full, at = point["predicted_s"]["full_clock"], point["predicted_s"]["at_clocks"]
    assert full == pytest.approx(at) and full["sam"] > 0


def test_bad_settings_are_usage_errors(tmp_path):
    sc = load_benchmark("stage_clocks")
    for bad in (["--repeats", "0"], ["--points", "nonsense"]):
        with pytest.raises(SystemExit) as exc:
            sc.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "x.json"), *bad])
        assert exc.value.code == 2
