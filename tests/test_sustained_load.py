"""benchmarks/sustained_load.py: ops back to back summarised by the time they ended, clock readings placed in the
same windows, and small probes after bursts of GEMMs. On the CPU the ops run synchronously and no clock is read."""
import json

import pytest

from benchmark_scripts import load_benchmark


def _script():
    return load_benchmark("sustained_load")


def test_windows_group_ops_by_end_time():
    sl = _script()
    ends = [1.0, 1.5, 3.0, 4.0, 30.0]
    durations = [1.0, 0.5, 1.5, 1.0, 2.0]
    rows = sl.windows(ends, durations, work=1e9)
    assert [(r["from_ms"], r["to_ms"], r["ops"]) for r in rows] == [(0, 2, 2), (2, 5, 2), (20, 50, 1)]
    assert rows[0]["median_op_ms"] == pytest.approx(0.75)
    assert rows[2]["throughput"] == pytest.approx(1e9 / 2e-3)


def test_clock_readings_land_in_their_windows():
    sl = _script()
    rows = [{"from_ms": 0, "to_ms": 2}, {"from_ms": 2, "to_ms": 5}, {"from_ms": 5, "to_ms": 10}]
    start = 100.0
    samples = [(99.0, {"sm_clock_mhz": 1980.0, "power_w": 90.0, "throttle": ["idle"]}),  # before the run
               (100.001, {"sm_clock_mhz": 1980.0, "power_w": 300.0, "throttle": []}),
               (100.003, {"sm_clock_mhz": 1800.0, "power_w": 700.0, "throttle": ["software power cap"]}),
               (100.004, {"sm_clock_mhz": 1700.0, "power_w": 690.0, "throttle": ["software power cap"]})]
    sl.clocks_in_windows(samples, start, rows)
    assert [r["clock_samples"] for r in rows] == [1, 2, 0]
    assert rows[0]["sm_clock_mhz"] == 1980.0 and rows[0]["slowdowns"] == []
    assert rows[1]["sm_clock_mhz"] == 1750.0 and rows[1]["power_w"] == 695.0
    assert rows[1]["slowdowns"] == ["software power cap"]
    assert rows[2]["sm_clock_mhz"] is None and rows[2]["power_w"] is None


def test_cpu_smoke_run_writes_every_part(tmp_path):
    sl = _script()
    out = tmp_path / "sl.json"
    assert sl.main(["--device", "cpu", "--quick", "--bursts-ms", "0,1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "sustained_load" and result["environment"]["device"] == "cpu"
    assert [r["kind"] for r in result["sustained"]] == ["gemm", "copy"]
    for run in result["sustained"]:
        assert run["ops"] >= 3 and run["windows"][0]["vs_first"] == 1.0
        assert sum(w["ops"] for w in run["windows"]) <= run["ops"]
        assert all(w["median_op_ms"] > 0 for w in run["windows"])
    bursts = result["after"]["bursts"]
    assert [b["burst_ms"] for b in bursts] == [0.0, 1.0]
    assert all(len(b["probe_ms"]) == result["settings"]["probes"] and b["median_probe_ms"] > 0 for b in bursts)


def test_bad_settings_are_usage_errors(tmp_path):
    sl = _script()
    for bad in (["--kinds", "gemm,fft"], ["--seconds", "0"], ["--bursts-ms", "x"], ["--repeats", "0"]):
        with pytest.raises(SystemExit) as exc:
            sl.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "x.json"), *bad])
        assert exc.value.code == 2


def test_the_clock_exponent_of_the_shipped_h200_run_is_the_time_models():
    """The exponent each window's slowdown implies, from the H200 run shipped in docs/results: the constant the time
    model scales compute-bound kernels by (analytic/predict.CLOCK_EXPONENT) is its median."""
    import statistics
    from pathlib import Path

    from dsocr_core.analytic.predict import CLOCK_EXPONENT

    sl = _script()
    run = json.loads((Path(__file__).resolve().parents[1] / "docs" / "results" / "h200_sustained_load_2026-11-28"
                      / "sl.json").read_text())
    rows = [dict(w) for w in run["sustained"][0]["windows"]]  # the GEMMs
    sl.clock_exponents(rows, 1980.0)
    steady = [r["clock_exponent"] for r in rows if r["from_ms"] >= 100]
    assert all(0.6 < e < 0.72 for e in steady), steady
    assert statistics.median(steady) == pytest.approx(CLOCK_EXPONENT, abs=0.01)
    assert all(r["clock_exponent"] is None for r in rows if r["from_ms"] < 50)
    copies = [dict(w) for w in run["sustained"][1]["windows"]]
    sl.clock_exponents(copies, 1980.0)
    assert all(r["clock_exponent"] is None for r in copies)  # their clock never fell
