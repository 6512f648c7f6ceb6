"""Calibration profiles (issue 14): strict loading, table interpolation, the CPU microbenchmark path, derived
profiles and their labels, the calibrate command, and benchmarks/prediction_accuracy.py end to end on a CPU."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmark_scripts import load_benchmark
from dsocr_core.calibration.derive import derive_profile
from dsocr_core.calibration.microbench import _fill, run_microbench
from dsocr_core.calibration.profile import (FORMAT_VERSION, ProfileError, Table, add_tables, entry_work, load_profile,
                                            profile_from_dict, uniform_profile)
from dsocr_core.cli import main
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware



@pytest.fixture(scope="module")
def quick_profile_path(tmp_path_factory) -> Path:
    """`python -m dsocr_core calibrate --device cpu --quick --out FILE`, once for the module."""
    out = tmp_path_factory.mktemp("cal") / "cpu_quick.json"
    assert main(["calibrate", "--device", "cpu", "--quick", "--budget-s", "60", "--no-progress",
                 "--out", str(out)]) == 0
    return out


def _valid() -> dict:
    return uniform_profile(1e12, 1e11).to_dict()


def _write(tmp_path, data, name="p.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


# ------------------------------------------------------------------------------------------ loading
def test_round_trip(tmp_path):
    prof = uniform_profile(2e12, 3e11, 0.5, 1e-6)
    path = prof.save(tmp_path / "u.json")
    back = load_profile(path)
    assert back.peak_flops == 2e12 and back.bandwidth == 3e11 and back.launch["host_op_s"] == 1e-6
    assert set(back.tables) == set(prof.tables)
    assert back.table("gemm.bfloat16").lookup(m=5, n=6, k=7) == pytest.approx(0.5)
    assert back.path == str(path) and not back.derived and "measured" in back.label()


def _mutate(fn):
    d = _valid()
    fn(d)
    return d


BAD = [
    ("format_version 2 is not supported", lambda d: d.update(format_version=FORMAT_VERSION + 1)),
    ("format_version '1' is not supported", lambda d: d.update(format_version="1")),
    ("not a calibration profile", lambda d: d.update(format="something-else")),
    ("missing field 'launch'", lambda d: d.pop("launch")),
    ("missing field 'launch.sync_s'", lambda d: d["launch"].pop("sync_s")),
    ("unknown field 'color'", lambda d: d.update(color="red")),
    ("efficiency has shape [2] but the axes give [1]",
     lambda d: d["tables"]["memory.copy"].update(efficiency=[1.0, 1.0])),
    ("efficiencies must be finite and positive", lambda d: d["tables"]["memory.copy"].update(efficiency=[-1.0])),
    ("strictly increasing", lambda d: d["tables"]["memory.copy"].update(axes={"bytes": [4.0, 2.0]},
                                                                        efficiency=[1.0, 1.0])),
    ("unknown table 'gemm.int8'", lambda d: d["tables"].update({"gemm.int8": d["tables"]["gemm.bfloat16"]})),
    ("axes ['m', 'k', 'n'] but a gemm table has ['m', 'n', 'k']",
     lambda d: d["tables"]["gemm.bfloat16"].update(axes={"m": [1.0], "k": [1.0], "n": [1.0]})),
    ("ceilings.flops_per_s must be a positive number", lambda d: d["ceilings"].update(flops_per_s=0.0)),
    ("launch.host_op_s must be a non-negative number", lambda d: d["launch"].update(host_op_s=-1.0)),
    # numbers no device has: they predicted NaN, 1.4e305 s, or 3.2 billion pages a day
    ("ceilings.bytes_per_s is 1e-300, outside what a real device reaches",
     lambda d: d["ceilings"].update(bytes_per_s=1e-300)),
    ("ceilings.flops_per_s is 1e+300, outside", lambda d: d["ceilings"].update(flops_per_s=1e300)),
    ("launch.host_op_s is 1e+300 s, more than the 1 s", lambda d: d["launch"].update(host_op_s=1e300)),
    ("table gemm.bfloat16: efficiency 1e+300 is more than 1.2",
     lambda d: d["tables"]["gemm.bfloat16"].update(efficiency=[[[1e300]]])),
    ("table memory.copy: efficiency 1.5 is more than 1.2",
     lambda d: d["tables"]["memory.copy"].update(efficiency=[1.5])),
    ("'derived' is True but 'derivation' is absent", lambda d: d.update(derived=True)),
    ("no GEMM table", lambda d: [d["tables"].pop(k) for k in list(d["tables"]) if k.startswith("gemm.")]),
    ("not a rectangular array", lambda d: d["tables"]["memory.copy"].update(efficiency=[[1.0], 2.0])),
    ("measured is not a grid of true/false values",  # a ragged list raised a bare ValueError (the picker crashed)
     lambda d: d["tables"]["gemm.bfloat16"].update(measured=[[[True]], [[True, False]]])),
    ("launch.host_op_s_by_kind.other must be a non-negative number",
     lambda d: d["launch"].update(host_op_s_by_kind={"other": -1e-6})),
]


@pytest.mark.parametrize("needle,change", BAD, ids=[b[0][:40] for b in BAD])
def test_invalid_profiles_name_the_problem(tmp_path, needle, change):
    path = _write(tmp_path, _mutate(change))
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert needle in str(exc.value)
    assert str(path) in str(exc.value)  # which file


def test_unreadable_files(tmp_path):
    text = json.dumps(_valid())
    cases = {"truncated (the JSON ends early)": text[: len(text) // 2], "is empty": "  \n",
             "not valid JSON": "{\"format\": oops}"}
    for needle, content in cases.items():
        with pytest.raises(ProfileError) as exc:
            load_profile(_write(tmp_path, content))
        assert needle in str(exc.value)
    with pytest.raises(ProfileError, match="no calibration profile"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(ProfileError, match="is a folder"):
        load_profile(tmp_path)
    with pytest.raises(ProfileError, match="a profile is a JSON object"):
        load_profile(_write(tmp_path, "[1, 2]"))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="not a text"):
        load_profile(tmp_path / "bin.json")


def _hostile_profiles(tmp_path) -> dict[str, tuple[Path, str]]:
    """Files a hostile or unlucky user can hand over, and what the message must say besides the file's name."""
    text = json.dumps(_valid())
    deep = _write(tmp_path, text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep.json")
    digits = _write(tmp_path, text.replace('"format_version": 1', '"format_version": 1' + "0" * 5000), "digits.json")
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: 20 MB on disk without writing them
        f.truncate(20 * 2**20)
    return {"deep": (deep, "nested 100,001 levels deep"), "digits": (digits, "cannot be read"),
            "big": (big, "larger than the limit of 16,777,216 bytes")}


@pytest.mark.parametrize("case", ["deep", "digits", "big"])
def test_hostile_profile_files_are_refused_naming_the_file(tmp_path, case, capsys):
    """Size and depth are bounded before the file is parsed (no RecursionError, no gigabytes of memory); every
    message names the file, on the CLI as one line with exit code 2."""
    path, needle = _hostile_profiles(tmp_path)[case]
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert str(path) in str(exc.value) and needle in str(exc.value), str(exc.value)
    for argv in (["calibrate", "--show", str(path)], ["analytic", "--profile", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert str(path) in err and needle in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------ tables
def test_log_space_interpolation_and_clamping():
    t = Table("memory.copy", ("bytes",), (np.array([1e3, 1e5]),), np.array([0.1, 0.4]), np.ones(2, bool))
    # geometric midpoint of the axis -> geometric mean of the values; outside the grid the edge value holds
    assert t.lookup(bytes=1e4) == pytest.approx(0.2)
    assert t.lookup(bytes=np.array([10.0, 1e3, 1e5, 1e9])).tolist() == pytest.approx([0.1, 0.1, 0.4, 0.4])
    # a quarter of the way in log space: exp(0.75 ln 0.1 + 0.25 ln 0.4)
    assert t.lookup(bytes=10 ** 3.5) == pytest.approx(math.exp(0.75 * math.log(0.1) + 0.25 * math.log(0.4)))


def test_multilinear_lookup_by_hand():
    eff = np.array([[[0.1, 0.9]], [[0.3, 0.6]]])  # m in {1, 100}, n in {10}, k in {10, 1000}
    t = Table("gemm.bfloat16", ("m", "n", "k"), (np.array([1.0, 100.0]), np.array([10.0]),
                                                 np.array([10.0, 1000.0])), eff, np.ones(eff.shape, bool))
    centre = (0.1 * 0.9 * 0.3 * 0.6) ** 0.25  # the log-space centre of the four corners
    assert t.lookup(m=10, n=123, k=100) == pytest.approx(centre)
    m = np.array([1.0, 10.0, 100.0])
    k = np.array([10.0, 100.0, 1000.0])
    out = t.lookup(m=m, n=10, k=k)  # vectorised: the diagonal of the grid
    assert out.tolist() == pytest.approx([0.1, centre, 0.6])
    assert t.lookup(m=m[:, None], n=10, k=k[None, :]).shape == (3, 3)  # coordinates broadcast


def test_entry_work_conventions():
    f, b = entry_work("gemm.bfloat16", dict(m=2, n=3, k=4))
    assert (f, b) == (2 * 2 * 3 * 4, (8 + 12 + 6) * 2)
    f, b = entry_work("gemm.float32", dict(m=2, n=3, k=4))
    assert b == (8 + 12 + 6) * 4
    f, b = entry_work("attention.sdpa", dict(bh=2, q=3, k=5, d=8))
    assert f == 4 * 30 * 8 + 6 * 30 and b == 2 * 2 * (3 + 5) * 8 * 2
    fe, be = entry_work("attention.eager.causal", dict(bh=2, s=4, d=8))
    assert be == 2 * 2 * 8 * 8 * 2 + 2 * 32 * (4 * 2 + 8)  # + the scores each eager op moves (masked)


def test_fill_takes_the_nearest_measured_entry():
    measured = np.array([[True, True, False], [True, False, False]])
    values = np.array([[1.0, 2.0, np.nan], [3.0, np.nan, np.nan]])
    out = _fill(measured, values)
    assert out[0, 2] == 2.0 and out[1, 1] in (2.0, 3.0) and out[1, 2] == 2.0
    assert np.isfinite(out).all()


# ------------------------------------------------------------------------------------------ microbenchmarks
def test_cpu_microbench_subset():
    prof = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16", "memory.copy"])
    assert set(prof.tables) == {"gemm.bfloat16", "memory.copy"}
    assert prof.device["kind"] == "cpu" and prof.raw["calibration"]["complete"]
    for t in prof.tables.values():
        assert t.measured.all() and np.all(t.efficiency > 0)
    assert prof.launch["eager_kernel_s"] > 0 and prof.raw["versions"]["torch"]


def test_stopped_calibration_fills_from_measured_neighbours():
    calls = []

    def stop() -> bool:  # stop after six shapes, as the budget or the dashboard's stop button would (up to
        calls.append(1)  # 16 x 128 x 16 and 1 x 128 x 128: their best rates clear a profile's floor even when a
        return len(calls) > 6  # call takes 30 ms on a busy machine; three 1-row shapes once did not)

    prof = run_microbench("cpu", quick=True, budget_s=60, should_stop=stop, tables=["gemm.bfloat16"])
    t = prof.table("gemm.bfloat16")
    assert int(t.measured.sum()) == 6 and t.efficiency.size == 12
    assert np.all(np.isfinite(t.efficiency)) and np.all(t.efficiency > 0)
    cal = prof.raw["calibration"]
    assert cal["stopped"] and not cal["complete"] and cal["skipped"]["budget"] == 6


def test_a_calibration_that_saw_no_real_rate_says_why_instead_of_writing_a_profile(monkeypatch):
    """Stopped after a few tiny shapes on a machine busy with other work, a CPU calibration once measured 0.67
    MFLOP/s at best: ceilings below what a profile may claim. It fails naming the stop, the shapes and the rate."""
    from dsocr_core.calibration import microbench

    monkeypatch.setattr(microbench, "measure_entry", lambda name, coords, st: 0.5)  # half a second a shape
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(RuntimeError, match=r"was stopped after 2 shapes.*flops_per_s [\d.e+]+ \(a profile's floor"):
        run_microbench("cpu", quick=True, budget_s=60, should_stop=stop, tables=["gemm.bfloat16"])


def test_tables_added_to_a_profile_keep_its_ceilings_and_say_so(tmp_path):
    base = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16", "memory.copy"])
    added = run_microbench("cpu", quick=True, budget_s=30, tables=["memory.transposed_cat"], add_to=base)
    assert set(added.tables) == {"gemm.bfloat16", "memory.copy", "memory.transposed_cat"}
    assert added.raw["ceilings"] == base.raw["ceilings"] and added.launch == base.launch
    np.testing.assert_array_equal(added.table("gemm.bfloat16").efficiency, base.table("gemm.bfloat16").efficiency)
    t = added.table("memory.transposed_cat")
    assert t.measured.all() and np.all(t.efficiency > 0)
    assert any(n.startswith("memory.transposed_cat added on ") for n in added.raw["calibration"]["notes"])
    assert added.label().startswith(base.label() + " (+ memory.transposed_cat measured quick 20")
    assert load_profile(added.save(tmp_path / "p.json")).table("memory.transposed_cat") is not None
    other = dict(base.device, name="NVIDIA H100 80GB HBM3")
    with pytest.raises(ProfileError, match="cannot go into a profile of a CPU"):
        add_tables(base, {}, other, {}, {}, "2026-11-26T00:00:00+00:00", quick=True)
    with pytest.raises(ProfileError, match="quick profile"):  # full-grid tables into a quick profile
        add_tables(base, {}, base.device, {}, {}, "2026-11-26T00:00:00+00:00", quick=False)


def test_a_profiles_dict_is_a_copy():
    prof = profile_from_dict(_valid())
    d = prof.to_dict()
    d["launch"]["graph_launch_s"] = 1.0
    d["ceilings"]["flops_per_s"] = 1.0
    d["tables"]["gemm.bfloat16"]["efficiency"] = 0.5
    assert prof.launch["graph_launch_s"] == _valid()["launch"]["graph_launch_s"]
    assert prof.peak_flops == 1e12 and prof.to_dict() == _valid()


def test_a_graph_start_cost_is_measured_added_kept_and_checked(tmp_path):
    """launch.graph_start (what a graph replay adds between the stage timer's events) is measured with the launch
    costs, can be added to an older profile like a table (said in its label), stays absent where it was absent, and
    is validated like every launch cost."""
    base = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16"])
    assert base.graph_start_s == 0.0  # a CPU has no graphs
    older = _valid()
    assert "graph_start_s" not in older["launch"] and profile_from_dict(older).graph_start_s is None
    assert "graph_start_s" not in profile_from_dict(older).to_dict()["launch"]  # absent stays absent
    without = profile_from_dict({k: v for k, v in base.to_dict().items()})
    raw = without.to_dict()
    del raw["launch"]["graph_start_s"]
    without = profile_from_dict(raw)
    added = run_microbench("cpu", quick=True, budget_s=30, tables=["launch.graph_start"], add_to=without)
    assert added.graph_start_s == 0.0 and set(added.tables) == set(without.tables)
    assert "launch.graph_start measured quick" in added.label()
    assert load_profile(added.save(tmp_path / "g.json")).graph_start_s == 0.0
    with_cost = add_tables(without, {}, without.device, {}, {}, "2026-11-27T00:00:00+00:00", quick=True,
                           launch={"graph_start_s": 3.5e-6})
    assert with_cost.graph_start_s == pytest.approx(3.5e-6)
    with pytest.raises(ProfileError, match="cannot be added"):
        add_tables(without, {}, without.device, {}, {}, "2026-11-27T00:00:00+00:00", quick=True,
                   launch={"sync_s": 1e-6})
    bad = with_cost.to_dict()
    bad["launch"]["graph_start_s"] = -1e-6
    with pytest.raises(ProfileError, match="graph_start_s must be a non-negative"):
        profile_from_dict(bad)


def test_nothing_measured_is_an_error():
    with pytest.raises(RuntimeError, match="no GEMM shape"):
        run_microbench("cpu", quick=True, budget_s=1e-9, tables=["gemm.bfloat16"])


# ------------------------------------------------------------------------------------------ derived profiles
def _h200_profile(eff_gemm: np.ndarray, eff_copy: float = 0.8) -> dict:
    d = uniform_profile(989e12, 4.8e12, name="NVIDIA H200", kind="cuda").to_dict()
    d["device"]["sm_count"] = 132
    d["ceilings"]["source"] = "datasheet"
    d["tables"]["gemm.bfloat16"] = {"axes": {"m": [1024.0, 65536.0], "n": [1024.0], "k": [4096.0]},
                                    "efficiency": eff_gemm.tolist(), "meta": {"dtype": "bfloat16"}}
    d["tables"]["memory.copy"] = {"axes": {"bytes": [1e9]}, "efficiency": [eff_copy]}
    return d


def test_derived_profile_scales_by_datasheet_ratios_and_sms():
    src = profile_from_dict(_h200_profile(np.array([[[0.2]], [[0.7]]])), "h200.json")
    a100 = get_hardware("a100-sxm-80gb")
    der = derive_profile(src, "a100-sxm-80gb")
    assert der.derived and der.device_name == a100.name
    assert der.peak_flops == a100.peak_flops and der.bandwidth == a100.bandwidth
    r = der.derivation["ratios"]
    assert r["flops"] == pytest.approx(312 / 989) and r["bandwidth"] == pytest.approx(2.039 / 4.8)
    assert r["sm"] == pytest.approx(108 / 132)
    # memory-bound entry: work time x (4.8 / 2.039); efficiency relative to the target's roofline stays
    assert der.table("memory.copy").efficiency[0] == pytest.approx(0.8)
    # a compute-bound GEMM of 8 x 8 = 64 tiles of 128 x 128 fills neither GPU: it runs on 64 SMs of either,
    # so its time moves by the per-SM rate ratio (989/132) / (312/108), not by the peak ratio
    f, b = 2 * 1024 * 1024 * 4096, (1024 * 4096 * 2 + 1024 * 1024) * 2
    assert f / 989e12 > b / 4.8e12 and f / 312e12 > b / 2.039e12  # compute bound on both
    src_t = f / 989e12 / 0.2
    tgt_t = src_t * (989e12 * 64 / 132) / (312e12 * 64 / 108)
    assert der.table("gemm.bfloat16").efficiency[0, 0, 0] == pytest.approx(f / 312e12 / tgt_t)
    # a large GEMM fills both GPUs: the peak ratio, so its efficiency is unchanged
    assert der.table("gemm.bfloat16").efficiency[1, 0, 0] == pytest.approx(0.7)
    # launch costs are kept as measured; the label says derived and names the source
    assert der.launch == src.launch
    assert "DERIVED from NVIDIA H200" in der.label() and "not measured" in der.label()
    with pytest.raises(ProfileError, match="measured profile"):
        derive_profile(der, "h200")


def test_a_derived_memory_entry_moves_with_the_bandwidth_only_where_it_streams():
    """A memory-bound entry that reached at least 0.8 of the source's plain-stream bandwidth moves with the bandwidth
    ratio; one held back below it (latency, bytes in flight, its own arithmetic: a small copy, a LayerNorm) keeps
    the bandwidth it reached, never above the target's streaming bandwidth (derive.py's docstring)."""
    d = _h200_profile(np.array([[[0.2]], [[0.7]]]))
    d["tables"]["memory.elementwise"] = {"axes": {"bytes": [1e9]}, "efficiency": [0.9]}  # streams at 0.9 x 4.8
    small, mid, large = 4096.0, 16e6, 1e9
    t_small, t_mid, t_large = 5e-6, mid / 2.9e12, large / 4.3e12  # 0.8 GB/s, 2.9 TB/s, 4.3 TB/s reached
    d["tables"]["memory.copy"] = {"axes": {"bytes": [small, mid, large]},
                                  "efficiency": [b / 4.8e12 / t for b, t in ((small, t_small), (mid, t_mid),
                                                                             (large, t_large))]}
    d["tables"]["memory.norm"] = {"axes": {"bytes": [large]}, "efficiency": [1.85e12 / 4.8e12]}
    der = derive_profile(profile_from_dict(d, "h200.json"), "h100-sxm")
    took = lambda name, i, b: b / 3.35e12 / der.table(name).efficiency[i]  # noqa: E731 - seconds on the target
    assert took("memory.copy", 0, small) == pytest.approx(t_small)  # latency-bound: the same 5 us
    assert took("memory.copy", 1, mid) == pytest.approx(mid / 2.9e12)  # 2.9 TB/s: below the H100's 3.0 streams
    assert took("memory.copy", 2, large) == pytest.approx(large / (4.3e12 * 3.35 / 4.8))  # streams: the ratio
    assert took("memory.norm", 0, large) == pytest.approx(large / 1.85e12)  # a LayerNorm at 1.85 TB/s on both
    # to a GPU with fewer SMs a held-back entry keeps the bandwidth per SM (fewer bytes in flight)
    a100 = derive_profile(profile_from_dict(d, "h200.json"), "a100-sxm-80gb")
    assert 4096.0 / 2.039e12 / a100.table("memory.copy").efficiency[0] == pytest.approx(t_small * 132 / 108)
    # and a held-back entry never runs faster than the target streams: the 2.9 TB/s copy on a 2.039 TB/s A100
    assert mid / 2.039e12 / a100.table("memory.copy").efficiency[1] == pytest.approx(mid / (0.9 * 2.039e12))
    assert "streams" in der.derivation["method"]


def test_one_table_derived_into_a_measured_profile_keeps_the_derived_time_and_says_so(tmp_path, capsys):
    """calibrate --derive-from H200 --tables memory.projector_cat --add-to H100 (the shipped H100 profile without
    that table): the H100 profile keeps every other table, and that one takes the time derive_profile gives it
    (against the H100 profile's measured ceilings); its label, notes and `calibrate --show` say DERIVED and from which GPU's tables of which day. Refused: a derived
    base, a table the source lacks, a launch cost, no table, and a source table that was itself derived."""
    from dsocr_core.calibration.derive import _measured_on, add_derived_tables
    from dsocr_core.calibration.profile import without_tables

    h200 = load_profile("data/profiles/h200.json")
    name = "memory.projector_cat"
    raw = load_profile("data/profiles/h100.json").to_dict()  # the H100 profile without any derived table (the
    # shipped one carries memory.broadcast and memory.index_put derived from the H200's) nor that one
    gone = [name] + [n for n, t in raw["tables"].items() if (t.get("meta") or {}).get("derived_from")]
    for n in gone:
        raw["tables"].pop(n, None)
    raw["calibration"]["added"] = without_tables(raw["calibration"]["added"], gone)  # nor their additions
    h100 = profile_from_dict(raw)
    assert h100.derived_tables == {} and "DERIVED" not in h100.label()
    both = add_derived_tables(h100, h200, [name])
    der = derive_profile(h200, "h100-sxm")
    nbytes = der.table(name).grid[0]
    took = lambda p: nbytes / p.bandwidth / p.table(name).efficiency  # noqa: E731
    np.testing.assert_allclose(took(both), took(der), rtol=1e-9)
    assert all(np.array_equal(both.table(t).efficiency, h100.table(t).efficiency) for t in h100.tables)
    assert both.derived_tables == {name: h200.device_name} and der.derived_tables == {}  # a derived one: all are
    day = _measured_on(h200, name)[:10]
    assert both.label() == h100.label() + f" (+ {name} DERIVED from {h200.device_name}'s tables of {day}, not measured)"
    assert both.raw["calibration"]["notes"][-1].startswith(f"{name} DERIVED on ")
    assert add_derived_tables(both, h200, [name]).label() == both.label()  # derived again: one entry, not two
    # then measured on the H100 itself: the label and derived_tables no longer say DERIVED
    measured = add_tables(both, {name: h100.to_dict()["tables"]["memory.copy"]}, {"name": h100.device_name}, {}, {},
                          "2026-11-29T00:00:00+00:00")
    assert measured.derived_tables == {} and "DERIVED" not in measured.label()
    assert measured.label() == h100.label() + f" (+ {name} measured 2026-11-29)"
    # and derived again over that measurement: the label names the latest addition only
    again = add_derived_tables(measured, h200, [name])
    assert again.label() == both.label() and again.derived_tables == {name: h200.device_name}
    # two tables derived in one entry, one of them measured later: the other stays DERIVED
    pair = add_derived_tables(h100, h200, [name, "memory.copy"])
    half = add_tables(pair, {name: h100.to_dict()["tables"]["memory.copy"]}, {"name": h100.device_name}, {}, {},
                      "2026-11-29T00:00:00+00:00")
    assert half.derived_tables == {"memory.copy": h200.device_name}
    assert half.label() == h100.label() + f" (+ memory.copy DERIVED from {h200.device_name}'s tables of " \
        f"{max(_measured_on(h200, n) for n in (name, 'memory.copy'))[:10]}, not measured) (+ {name} measured " \
        "2026-11-29)"
    assert not both.derived and load_profile(both.save(tmp_path / "p.json")).label() == both.label()
    assert main(["calibrate", "--show", str(tmp_path / "p.json")]) == 0
    assert f"DERIVED from {h200.device_name}'s, not measured here" in capsys.readouterr().out
    with pytest.raises(ProfileError, match="not to a derived one"):
        add_derived_tables(der, h200, [name])
    with pytest.raises(ProfileError, match="has no memory.transposed_cat"):  # that profile predates the table
        add_derived_tables(h100, load_profile("data/profiles/history/h200_2026-11-23.json"), ["memory.transposed_cat"])
    with pytest.raises(ProfileError, match="unknown table"):
        add_derived_tables(h100, h200, ["launch.graph_start"])
    with pytest.raises(ProfileError, match="name the kernel tables"):
        add_derived_tables(h100, h200, [])
    # both's table is itself derived from the H200's: deriving it again, back onto an H200, would hide that
    h200_raw = h200.to_dict()
    h200_raw["tables"].pop(name)
    with pytest.raises(ProfileError, match="itself derived"):
        add_derived_tables(profile_from_dict(h200_raw), both, [name])
    assert "its table derived from NVIDIA H200" in derive_profile(both, "h200").table(name).meta["derived_from"]
    out = tmp_path / "cli.json"
    args = ["calibrate", "--derive-from", "data/profiles/h200.json", "--add-to", str(tmp_path / "p.json"), "--out"]
    assert main(args + [str(out), "--tables", name]) == 0 and "DERIVED" in load_profile(out).label()
    assert main(args + [str(out), "--tables", name, "--target", "h100-sxm"]) == 2
    assert main(args + [str(out), "--tables", ","]) == 2


def test_derived_label_travels_into_predictions_and_exports(tmp_path):
    from dsocr_core.analytic import Points, analyze, sweep_columns
    from dsocr_core.analytic.predict import with_profile
    from dsocr_core.spec import ModelSpec, Workload

    src = profile_from_dict(_h200_profile(np.array([[[0.5]], [[0.5]]])), "h200.json")
    der = derive_profile(src, "h100-sxm")
    path = der.save(tmp_path / "h100_derived.json")
    back = load_profile(path)
    assert back.derived and back.label() == der.label()
    hw = with_profile(get_hardware("h100-sxm"), back, "fast")
    cols = sweep_columns(ModelSpec(), Points.grid(crops=[(2, 2)], batch=[1, 2]), hw, with_capacity=True)
    assert cols["predicted.derived"].tolist() == [True, True]
    assert all("DERIVED" in s for s in cols["predicted.profile"])
    out = analyze(ModelSpec(), Workload(crops=(2, 2)), hw)
    assert out["prediction"]["derived"] and out["prediction"]["derivation"]["ratios"]["bandwidth"] == \
        pytest.approx(3.35 / 4.8)


# ------------------------------------------------------------------------------------------ the command
def test_calibrate_cli_quick_cpu(quick_profile_path, capsys):
    prof = load_profile(quick_profile_path)
    assert prof.device["kind"] == "cpu" and prof.raw["calibration"]["quick"]
    for name in ("gemm.bfloat16", "gemm.float32", "memory.copy", "memory.norm", "attention.sdpa",
                 "attention.sdpa.causal", "attention.eager", "grouped_gemm.bfloat16"):
        assert name in prof.tables, name
    assert main(["calibrate", "--show", str(quick_profile_path)]) == 0
    out = capsys.readouterr().out
    assert "measured quick" in out and "gemm.bfloat16" in out


def test_calibrate_cli_derive_and_errors(quick_profile_path, tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["calibrate", "--derive-from", str(quick_profile_path), "--target", "h100-sxm",
                 "--source-hardware", "h200", "--out", str(out)]) == 0
    assert load_profile(out).derived
    capsys.readouterr()
    assert main(["calibrate", "--derive-from", str(quick_profile_path), "--target", "h100-sxm",
                 "--out", str(tmp_path / "x.json")]) == 2  # a CPU profile has no datasheet: say which
    assert "no datasheet preset" in capsys.readouterr().err
    assert main(["calibrate", "--device", "cpu", "--quick"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["calibrate", "--derive-from", str(quick_profile_path), "--out", str(tmp_path / "y.json")]) == 2
    assert "--target" in capsys.readouterr().err
    add = ["calibrate", "--device", "cpu", "--quick", "--no-progress", "--out", str(tmp_path / "a.json")]
    assert main(add + ["--tables", "memory.transposed_cat", "--add-to", str(out)]) == 2  # a derived profile
    assert "DERIVED" in capsys.readouterr().err
    assert main(add + ["--tables", "memory.nope", "--add-to", str(quick_profile_path)]) == 2
    assert "no table memory.nope" in capsys.readouterr().err
    assert main(add[:3] + add[4:] + ["--tables", "memory.copy", "--add-to", str(quick_profile_path)]) == 2
    assert "quick profile" in capsys.readouterr().err  # a full-grid table into a quick profile
    assert main(add + ["--add-to", str(quick_profile_path)]) == 2
    assert "needs --tables" in capsys.readouterr().err
    assert main(add + ["--tables", "launch.host_stages", "--add-to", str(quick_profile_path)]) == 2
    assert "needs a CUDA GPU and a full calibration" in capsys.readouterr().err  # no host term on a CPU
    assert main(add + ["--tables", "memory.transposed_cat", "--add-to", str(quick_profile_path)]) == 0
    assert "memory.transposed_cat measured quick" in load_profile(tmp_path / "a.json").label()
    older = json.loads(quick_profile_path.read_text())
    del older["launch"]["graph_start_s"]  # a profile made before the graph start was measured
    older_path = _write(tmp_path, older, "older.json")
    assert load_profile(older_path).graph_start_s is None
    assert main(add + ["--tables", "launch.graph_start", "--add-to", str(older_path)]) == 0
    assert load_profile(tmp_path / "a.json").graph_start_s == 0.0
    capsys.readouterr()
    assert main(["calibrate", "--show", str(tmp_path / "a.json")]) == 0
    assert "graph_start_s 0.00 us" in capsys.readouterr().out
    assert main(add + ["--tables", "launch.graph_start"]) == 2  # every calibration measures it: only with --add-to
    assert "only with --add-to" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(quick_profile_path.read_text()[:100])
    assert main(["calibrate", "--show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------ accuracy benchmark
def test_prediction_accuracy_quick_cpu(quick_profile_path, tmp_path, capsys):
    mod = load_benchmark("prediction_accuracy")
    out = tmp_path / "acc.json"
    res = mod.main(["--quick", "--device", "cpu", "--profile", str(quick_profile_path), "--out", str(out),
                    "--store", str(tmp_path / "runs.sqlite")])
    assert set(res["modes"]) == {"reference", "fast"}
    for mode, entry in res["modes"].items():
        assert entry["not_done"] == 0
        summary = entry["summary"]
        for stage in ("sam", "clip", "projector", "prefill", "decode", "ttft", "tpot"):
            s = summary[stage]
            assert s["n"] == 2 and s["median_abs"] <= s["p90_abs"] <= s["max_abs"]
            assert math.isfinite(s["max_abs"])
        for p in entry["points"]:
            assert p["predicted_s"]["ttft"] > 0 and p["measured_s"]["ttft"] > 0
            assert "gpu_state" in p and p["gpu_state"] is None  # carried with each point; none on a CPU
        assert entry["engine"] == EngineSpec.of(mode).to_dict()  # the engine the points ran on, recorded
        assert entry["order_check"]["stages"]  # the run's first point measured again, carried with the figures
    printed = capsys.readouterr().out
    assert "reference session mode" in printed and "fast session mode" in printed
    assert printed.count("order check ") == 2  # one line per mode, passed or FAILED
    last = json.loads(printed.strip().splitlines()[-1])
    assert set(last["summary"]) == {"reference", "fast"}
    assert json.loads(out.read_text())["profile"]["label"].startswith("CPU")
    # predicting the stored points again (another profile would go here) measures nothing and gives the same
    again = mod.main(["--quick", "--device", "cpu", "--profile", str(quick_profile_path), "--predict-only",
                      "--store", str(tmp_path / "runs.sqlite")])
    for mode in ("reference", "fast"):
        assert again["modes"][mode]["run_id"] == res["modes"][mode]["run_id"]
        assert again["modes"][mode]["summary"] == res["modes"][mode]["summary"]
    # each mode was predicted with the routing its run recorded, and the result carries it: predicting the saved
    # result again (what tests/test_prediction_regression.py does with the shipped ones) reads it back
    from dsocr_core.results.prediction_check import accuracy_errors, summarize

    saved = json.loads(out.read_text())
    assert saved["settings"]["routing"] == "observed"
    for mode, entry in saved["modes"].items():
        assert entry["routing"]["source"].startswith(f"run {entry['run_id'][:8]}")
        again = summarize(accuracy_errors(saved, load_profile(quick_profile_path), mode))
        for stage, s in entry["summary"].items():
            assert again[stage]["median_abs"] == pytest.approx(s["median_abs"], rel=1e-9, abs=1e-12), (mode, stage)


def test_prediction_accuracy_quick_cpu_for_deepseek_ocr2(quick_profile_path, tmp_path, capsys):
    mod = load_benchmark("prediction_accuracy")
    with pytest.raises(SystemExit):  # the fast engine runs DeepSeek-OCR only: refused before anything runs
        mod.main(["--quick", "--device", "cpu", "--model", "deepseek-ocr2", "--profile", str(quick_profile_path)])
    assert "use --modes reference" in capsys.readouterr().err
    res = mod.main(["--quick", "--device", "cpu", "--model", "deepseek-ocr2", "--modes", "reference",
                    "--profile", str(quick_profile_path), "--store", str(tmp_path / "runs.sqlite")])
    summary = res["modes"]["reference"]["summary"]
    assert {"sam", "encoder", "projector", "prefill", "decode", "ttft", "tpot"} <= set(summary)
    assert "clip" not in summary and res["settings"]["model"] == "deepseek-ocr2"
    assert all(math.isfinite(s["max_abs"]) for s in summary.values())


@pytest.mark.parametrize("model", ["deepseek-ocr", "deepseek-ocr2"])
def test_the_random_group_draws_distinct_points_across_the_workload_space(model):
    mod = load_benchmark("prediction_accuracy")
    from dsocr_core.registry import get_family
    from dsocr_core.results.store import point_key

    points = mod.random_workloads(40, 7, 32, "bfloat16", "last", model)
    assert len({point_key(w) for w in points}) == 40
    assert [point_key(w) for w in points] == [point_key(w) for w in mod.random_workloads(40, 7, 32, "bfloat16",
                                                                                           "last", model)]
    assert [point_key(w) for w in points] != [point_key(w) for w in mod.random_workloads(40, 8, 32, "bfloat16",
                                                                                           "last", model)]
    assert all(1 <= w.batch <= 64 and 10 <= w.text_tokens <= 3300 and w.decode_steps == 32 for w in points)
    assert {w.mode for w in points} <= set(get_family(model).modes)
    tiled = [w for w in points if get_family(model).modes[w.mode].crop_mode]
    assert tiled and all(w.crops[0] * w.crops[1] <= get_family(model).modes[w.mode].crop_range[1] for w in tiled)
    chosen = mod.held_out_workloads(False, 32, "bfloat16", "last", ("random",), model, 5, 7)
    assert [point_key(w) for w in chosen] == [point_key(w) for w in points[:5]]
    with pytest.raises(ValueError, match="at least one point"):
        mod.random_workloads(0, 7, 32, "bfloat16", "last", model)
    with pytest.raises(SystemExit):
        mod.main(["--quick", "--device", "cpu", "--groups", "random"])


def test_the_random_group_can_be_narrowed_to_batches_and_text_lengths():
    """--random-batch 1-1 --random-text 1500-3300: a held-out set of long texts at batch 1 (what the fused batch-1
    step's attention sees); the ranges' defaults draw the points the seeds always drew."""
    mod = load_benchmark("prediction_accuracy")
    from dsocr_core.results.store import point_key

    long_b1 = mod.random_workloads(12, 7, 32, "bfloat16", "last", batches=(1, 1), text=(1500, 3300))
    assert len({point_key(w) for w in long_b1}) == 12
    assert all(w.batch == 1 and 1500 <= w.text_tokens <= 3300 for w in long_b1)
    assert ([point_key(w) for w in mod.random_workloads(6, 7, 32, "bfloat16", "last", batches=(1, 64),
                                                         text=(10, 3300))]
            == [point_key(w) for w in mod.random_workloads(6, 7, 32, "bfloat16", "last")])
    assert mod.int_range("1-64") == (1, 64) and mod.int_range("8") == (8, 8)
    for bad in ("64-1", "0-4", "a-b"):
        with pytest.raises(argparse.ArgumentTypeError):
            mod.int_range(bad)


def test_the_projector_input_op_is_the_models_own_cat_with_sams_map_channels_last():
    """memory.projector_cat times DeepseekOCRModel.projector_input on SAM's map as the fast engine's neck leaves it
    (channels-last: the flattened map reads whole rows), over the rows its bytes name; the reference model's map is
    channels-first (its patch embedding is a conv), which memory.transposed_cat times."""
    import torch

    from dsocr_core.calibration.ops import _projector_input_op
    from dsocr_core.model.deepseek_ocr import DeepseekOCRModel

    rnd = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16)  # noqa: E731
    for rows in (100, 256, 3000):
        make, op, set_bytes, _ = _projector_input_op(rows * 8 * 1024, rnd)
        clip, sam = make()
        out = op((clip, sam))
        assert out.shape[-1] == 2048 and abs(out.shape[0] * out.shape[1] - rows) < out.shape[0]
        assert set_bytes == 4 * out.shape[0] * out.shape[1] * 1024
        assert sam.flatten(2).transpose(1, 2).is_contiguous()
        assert clip.shape[0] == 1 or not clip[:, 1:].is_contiguous()  # a row skipped per view
        torch.testing.assert_close(out, DeepseekOCRModel.projector_input(clip, sam.contiguous()), rtol=0, atol=0)


def test_dense_bias_ops_run_what_sam_runs_and_are_calibrated():
    """bias.broadcast and bias.strided time SAM's dense relative-position bias as model/sam.py builds it: the
    broadcast sum of two permuted einsum outputs (not contiguous), then its reshape, which has to copy; the bytes
    the tables count are those the plan gives the two kernels. A quick CPU calibration fills both tables."""
    import torch

    from dsocr_core.calibration.ops import kernel_op
    from dsocr_core.calibration.profile import entry_work

    make, run, set_bytes, _ = kernel_op("bias.broadcast", {"bh": 3, "side": 14}, "cpu", 64)
    x = make()
    assert not x[0].is_contiguous() and not x[1].is_contiguous()  # the einsums' permuted outputs
    summed = run(x)
    assert summed.shape == (3, 14, 14, 14, 14) and not summed.is_contiguous()
    torch.testing.assert_close(summed, x[0].unsqueeze(-1) + x[1].unsqueeze(-2))
    assert float(entry_work("bias.broadcast", {"bh": 3, "side": 14})[1]) == 2 * 3 * 14 ** 4 + 4 * 3 * 14 ** 3
    make, run, set_bytes, _ = kernel_op("bias.strided", {"bh": 3, "side": 14}, "cpu", 64)
    x = make()
    out = run(x)
    assert out.shape == (3, 196, 196) and out.data_ptr() != x[0].data_ptr()  # a copy, not a view
    assert set_bytes == 2 * 3 * 14 ** 4  # the input set holds the sum; the copy reads and writes it:
    assert float(entry_work("bias.strided", {"bh": 3, "side": 14})[1]) == 2 * set_bytes
    # a profile needs a GEMM table: one beside the two
    prof = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16", "bias.broadcast", "bias.strided"])
    assert {"bias.broadcast", "bias.strided"} <= set(prof.tables)
    for t in (prof.table("bias.broadcast"), prof.table("bias.strided")):
        assert t.axes == ("bh", "side") and t.measured.all() and np.all(t.efficiency > 0)


def test_the_time_limit_keeps_room_for_the_order_checks_repeat_of_the_first_point(monkeypatch):
    mod = load_benchmark("prediction_accuracy")
    now = [100.0]
    monkeypatch.setattr(mod.time, "perf_counter", lambda: now[0])
    limit = mod.TimeLimit(60.0, t0=100.0)
    limit.new_sweep()
    now[0] = 120.0
    limit.progress(1, 8, None, "done")  # the first point took 20 s
    now[0] = 139.0
    assert not limit()  # 21 s left: room for the repeat
    now[0] = 141.0
    assert limit()  # 19 s left: no new point, no order check
    limit.new_sweep()  # the next mode's sweep: its own first point
    assert not limit() and limit.first_s == 0.0
    limit.progress(1, 8, None, "skipped")  # a resumed point took no time
    assert limit.first_s == 0.0


def test_calibrate_cli_names_the_tables_it_cannot_measure_before_measuring(tmp_path, capsys):
    """A GPU-only table asked for on a CPU, a table no calibration has, and a profile of its own without a GEMM
    table are refused up front, each saying why (not after the run, as a profile with no GEMM table)."""
    run = ["calibrate", "--device", "cpu", "--quick", "--no-progress", "--budget-s", "5",
           "--out", str(tmp_path / "p.json")]
    assert main(run + ["--tables", "attention.split_kv"]) == 2
    assert "attention.split_kv is timed on a CUDA GPU only" in capsys.readouterr().err
    assert main(run + ["--tables", "memory.nope,gemm.bfloat16"]) == 2
    assert "no table memory.nope on cpu" in capsys.readouterr().err
    assert main(run + ["--tables", "memory.copy"]) == 2
    assert "needs a GEMM table" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()
