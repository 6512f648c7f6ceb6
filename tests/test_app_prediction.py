"""Predicted time in the dashboard (issue 14): the sidebar's calibration-profile picker, the predicted series and
columns beside the roofline on the analytic, measured, MFU and capacity views, the labels of derived and CPU
profiles, malformed profiles, and "Calibrate this machine" running the quick CPU grids in the background job.

The profiles are test data: a CPU quick profile measured once for the module (the real microbenchmarks, a few
seconds), a uniform 'NVIDIA H200' profile and the profile derived from it for the H100 (the layout data/profiles
will have once GPU profiles are measured)."""
from __future__ import annotations

import pandas as pd
import pytest

from dsocr_core.calibration import load_profile, uniform_profile
from dsocr_core.calibration.derive import add_derived_tables, derive_profile
from dsocr_core.calibration.microbench import run_microbench
from dsocr_core.calibration.profile import profile_from_dict
from dsocr_core.results.store import RunStore
from test_app import fake_gpu_run, goto, make_app, open_tab, page_text, texts
from test_app_usability import chart_frames, cpu_run

CPU = "repo:cpu.json"  # a CPU profile of the full grids (uniform test data); the quick one is never offered
H200, H100_DERIVED, BROKEN = "repo:h200.json", "repo:h100_from_h200.json", "repo:broken.json"
H100_ONE_DERIVED = "repo:h100_one_derived.json"  # a measured H100 profile with one table derived from the H200's


@pytest.fixture(scope="module")
def cpu_quick(tmp_path_factory):
    """`calibrate --device cpu --quick`, once for the module (what the dashboard's CPU calibration runs)."""
    prof = run_microbench("cpu", quick=True, budget_s=60)
    return prof.save(tmp_path_factory.mktemp("prof") / "cpu_quick.json")


@pytest.fixture
def data(tmp_path, monkeypatch, cpu_quick):
    """A temporary data folder (run store, calibrated profiles), a 'bundled' folder holding one GPU run and a
    repository profile folder holding a GPU profile, the H100 profile derived from it and a truncated file."""
    scratch = RunStore(tmp_path / "scratch.sqlite")
    ref = tmp_path / "reference"
    ref.mkdir()
    scratch.export_run(fake_gpu_run(scratch), ref / "h200_test.json")
    repo = tmp_path / "profiles"
    h200 = uniform_profile(989e12, 4.8e12, efficiency=0.5, launch=5e-6, name="NVIDIA H200", kind="cuda")
    h200.save(repo / "h200.json")
    uniform_profile(2e11, 2e10, efficiency=0.5, launch=5e-6, name="Test CPU", kind="cpu").save(repo / "cpu.json")
    derive_profile(load_profile(repo / "h200.json"), "h100-sxm").save(repo / "h100_from_h200.json")
    h100 = uniform_profile(989e12, 3.35e12, efficiency=0.5, launch=5e-6, name="NVIDIA H100 80GB HBM3", kind="cuda")
    add_derived_tables(h100, load_profile(repo / "h200.json"), ["memory.projector_cat"]).save(
        repo / "h100_one_derived.json")
    (repo / "broken.json").write_text((repo / "h200.json").read_text()[:200])
    raw = h200.to_dict()  # a calibration stopped inside its GEMM grid: valid, but it cannot time a memory kernel
    raw["tables"] = {k: v for k, v in raw["tables"].items() if k.startswith("gemm.")}
    profile_from_dict(raw).save(repo / "gemm_only.json")
    (tmp_path / "calibrated_profiles").mkdir()
    (tmp_path / "calibrated_profiles" / "cpu_quick.json").write_bytes(cpu_quick.read_bytes())
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(ref))
    monkeypatch.setenv("DSOCR_PROFILES_DIR", str(repo))
    return tmp_path


def pick(at, key: str):
    at.sidebar.selectbox(key="sb_profile").set_value(key).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def plain(text: str) -> str:
    """Text as read, without the Markdown escapes of file names and labels (ui.measured.md)."""
    return str(text).replace("\\", "")


def sidebar_text(at) -> str:
    return plain("\n".join(str(e.value) for kind in ("caption", "warning", "error", "success")
                            for e in getattr(at.sidebar, kind)))


def export_frame(at) -> pd.DataFrame:
    """The analytic page's Download tab table (what the CSV/JSON buttons write)."""
    return [f.value for f in at.dataframe if "model_dimensions" in f.value.columns][0]


# ------------------------------------------------------------------------------------------------ analytic
def test_analytic_page_without_and_with_a_profile(data):
    at = goto(make_app(), "analytic")
    options = at.sidebar.selectbox(key="sb_profile").options
    assert options[0] == "none (roofline only)" and options[-1].startswith("upload")
    assert {"h200.json (data/profiles)", "h100_from_h200.json (data/profiles)", "cpu.json (data/profiles)"} <= set(
        options) and not any("cpu_quick" in o for o in options)  # a quick profile is no predictor
    assert "Not offered as predictors (quick grids, a smoke test of the calibration" in sidebar_text(at)
    assert "cpu_quick.json" in sidebar_text(at)
    open_tab(at, "an_tab", "Time")
    assert "No prediction: choose a calibration profile" in page_text(at)  # how to get one
    assert set(chart_frames(at.get("vega_lite_chart")[0])[0]["series"]) == {"roofline"}

    pick(at, CPU)
    side = sidebar_text(at)
    assert "Test CPU profile, measured" in side and "CPU profile: its kernels are this CPU's, not a GPU's" in side
    frame = chart_frames(at.get("vega_lite_chart")[0])[0]
    assert set(frame["series"]) == {"roofline", "predicted"}
    both = frame.pivot_table(index=["config", "crop_count", "stage"], columns="series", values="value")
    assert (both["predicted"] > 0).all() and len(both) == 2 * 16 * 5  # two configurations, 16 counts, 5 stages
    assert "Predicted with" in page_text(at) and "reference session mode" in page_text(at)

    roof = open_tab(at, "an_tab", "Roofline").dataframe[0].value
    assert set(roof["series"]) == {"roofline", "predicted"}
    modules = open_tab(at, "an_tab", "Per module").dataframe[0].value
    assert "predicted (ms)" in modules and (modules["predicted (ms)"] > 0).all()

    open_tab(at, "an_tab", "Capacity")
    metrics = {m.label: m.value for m in at.metric}
    assert {"TTFT", "Predicted TTFT", "Predicted TPOT", "Predicted pages / day"} <= set(metrics)
    targets = [f.value for f in at.dataframe if "target" in f.value.columns][0]
    assert {"time (ms)", "predicted (ms)", "meets (predicted)"} <= set(targets.columns)

    export = export_frame(open_tab(at, "an_tab", "Download"))
    for col in ("total.time_s", "total.predicted_s", "decode.predicted_host_s", "capacity.predicted_ttft_s",
                "capacity.predicted_pages_per_day"):
        assert col in export and export[col].notna().all(), col
    assert export["predicted.device_kind"].eq("cpu").all() and (~export["predicted.derived"]).all()
    assert export["predicted.profile"].str.contains("Test CPU profile, measured").all()
    assert export["predicted.session_mode"].eq("reference").all()
    assert any("predicted.device_kind" in t for t in texts(at, "caption"))


def test_derived_profile_is_labelled_in_the_sidebar_and_the_export(data):
    at = pick(goto(make_app(), "analytic"), H100_DERIVED)
    assert "DERIVED" in sidebar_text(at) and any("DERIVED profile" in w for w in texts(at.sidebar, "warning"))
    export = export_frame(open_tab(at, "an_tab", "Download"))
    assert export["predicted.derived"].all() and export["predicted.profile"].str.contains("DERIVED").all()
    assert export["predicted.device_kind"].eq("cuda").all()


def test_a_measured_profile_with_a_derived_table_says_which_in_the_sidebar_and_the_export(data):
    at = pick(goto(make_app(), "analytic"), H100_ONE_DERIVED)
    warning = [w for w in texts(at.sidebar, "warning") if "DERIVED" in w]
    assert warning and "`memory.projector_cat` (from NVIDIA H200)" in warning[0] and "DERIVED profile" not in warning[0]
    export = export_frame(open_tab(at, "an_tab", "Download"))
    assert (~export["predicted.derived"]).all()  # a measured profile, its one derived table named in its label
    assert export["predicted.profile"].str.contains("memory.projector_cat DERIVED from NVIDIA H200").all()


def test_a_malformed_profile_names_the_problem_and_falls_back_to_the_roofline(data):
    at = pick(goto(make_app(), "analytic"), BROKEN)
    (error,) = map(plain, texts(at.sidebar, "error"))
    assert "broken.json" in error and "truncated" in error and "roofline only" in error
    export = export_frame(open_tab(at, "an_tab", "Download"))
    assert "total.time_s" in export and not any(c.startswith("predicted") or ".predicted" in c for c in export)
    # an uploaded one too: the message names the upload, not a temporary file
    pick(at, "upload")
    at.sidebar.file_uploader(key="sb_profile_upload").set_value(("mine.json", b'{"format": "x"}',
                                                                  "application/json")).run()
    (error,) = map(plain, texts(at.sidebar, "error"))
    assert "mine.json" in error and "not a calibration profile" in error and "tmp" not in error
    good = (data / "profiles" / "h200.json").read_bytes()
    at.sidebar.file_uploader(key="sb_profile_upload").set_value(("h200 copy.json", good, "application/json")).run()
    assert not texts(at.sidebar, "error") and "NVIDIA H200 profile" in sidebar_text(at)
    kept = data / "uploaded_profiles" / "h200_copy.json"
    assert kept.exists()  # kept, and listed from now on
    mtime = kept.stat().st_mtime_ns
    at.run()
    assert kept.stat().st_mtime_ns == mtime  # not rewritten on every run (the cache key holds the mtime)
    picker = at.sidebar.selectbox(key="sb_profile")
    assert "h200_copy.json (uploaded)" in picker.options and picker.value == "upload"
    assert "NVIDIA H200 profile" in sidebar_text(at)


def test_hostile_profile_uploads_are_messages_naming_the_upload(data):
    """Nested 100,000 levels deep, a 5,000-digit integer, past the size limit: a message naming the upload, the
    page keeps running on the roofline (before: a RecursionError and a ValueError raised on the page)."""
    from dsocr_core.calibration.profile import MAX_PROFILE_BYTES

    good = (data / "profiles" / "h200.json").read_text()
    uploads = {"deep.json": (good[:-2] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "levels deep"),
               "digits.json": (good.replace('"format_version": 1', '"format_version": 1' + "0" * 5000),
                               "cannot be read"),
               "huge.json": (" " * (MAX_PROFILE_BYTES + 1), "larger than the limit")}
    at = pick(goto(make_app(), "analytic"), "upload")
    for name, (text, needle) in uploads.items():
        at.sidebar.file_uploader(key="sb_profile_upload").set_value((name, text.encode(), "application/json")).run()
        assert not at.exception, [e.value for e in at.exception]
        (error,) = map(plain, texts(at.sidebar, "error"))
        assert f"the uploaded file {name}" in error and needle in error and "roofline only" in error, error
    assert not (data / "uploaded_profiles").exists() or not list((data / "uploaded_profiles").iterdir())


# ------------------------------------------------------------------------------------------------ measured, MFU
def test_measured_and_mfu_pages_draw_the_prediction_in_the_runs_own_mode(data):
    store = RunStore(data / "runs.sqlite")
    cpu_id = cpu_run(store)  # a CPU sweep run, reference session mode
    at = pick(goto(make_app(), "measured"), H200)
    chart = [f for f in chart_frames(at.get("vega_lite_chart")[0]) if "source" in f][0]
    assert "predicted" in set(chart["source"]) and "datasheet roofline" in set(chart["source"])
    text = page_text(at)
    assert "Predicted (solid lines) with" in text and "reference" in text and "the predicted time (solid)" in text

    at.session_state["ms_runs"] = [cpu_id]
    at.run()
    assert "measured on the CPU; the profile is of a GPU" in plain(page_text(at))

    goto(at, "mfu")
    limits = chart_frames(at.get("vega_lite_chart")[2])[0]
    assert {"measured", "predicted", "at the datasheet limit"} <= set(limits["time"])
    summary = [f.value for f in at.dataframe if "figure" in f.value.columns][0]
    assert "predicted time error, median / max" in set(summary["figure"])
    table = [f.value for f in at.dataframe if "predicted_s" in f.value.columns][0]
    assert table["predicted_profile"].str.contains("NVIDIA H200").all() and table["predicted_session_mode"].eq(
        "reference").all() and table["predicted_device_kind"].eq("cuda").all()


# ------------------------------------------------------------------------------------------------ calibration
def test_testing_the_calibration_on_the_cpu_saves_the_quick_profile_and_offers_it_to_nobody(data):
    """On the CPU the sidebar runs the quick grids in the background job: the profile is saved (the calibration
    works) but neither selected nor offered as a predictor (its times would miss the CPU's runs 10-40x)."""
    from ui import sweeps

    (data / "calibrated_profiles" / "cpu_quick.json").unlink()
    at = goto(make_app(), "analytic")
    assert any("saved but not offered as a predictor" in c for c in texts(at.sidebar, "caption"))
    assert at.sidebar.button(key="sb_cal_start").label == "Test the calibration"
    at.sidebar.button(key="sb_cal_start").click().run()
    assert not at.exception, [e.value for e in at.exception]
    runner = sweeps.runner()
    runner.join(120)
    job = runner.job
    assert job.kind == "calibration" and not job.running and job.error is None, job.error
    assert job.total > 50 and job.handled == job.total
    at.run()  # the panel sees the finished job: the app reruns with the new profile chosen
    assert not at.exception, [e.value for e in at.exception]
    saved = list((data / "calibrated_profiles").glob("cpu*.json"))
    assert [f.name for f in saved] == ["cpu_quick.json"] and load_profile(saved[0]).quick  # one smoke test kept
    picker = at.sidebar.selectbox(key="sb_profile")
    assert picker.value == "none" and f"calibrated:{saved[0].name}" not in picker.options
    assert f"Saved {saved[0].name}: the calibration works; a quick profile is not offered as a predictor" in \
        sidebar_text(at)
    assert saved[0].name in sidebar_text(at) and "Not offered as predictors" in sidebar_text(at)
    at.sidebar.button(key="sb_cal_start").click().run()  # a second test replaces the first one's file
    sweeps.runner().join(120)
    at.run()
    assert [f.name for f in (data / "calibrated_profiles").glob("cpu*.json")] == ["cpu_quick.json"]
    frame = chart_frames(at.get("vega_lite_chart")[0])  # FLOPs tab: no roofline there, nothing predicted
    assert frame and "series" not in frame[0]



def test_compare_run_predicts_each_point_as_the_analytic_model_does(tmp_path):
    """The measured pages' predicted time is the time model's, point by point (one evaluation, not a second
    implementation): compare_run(prediction=...) equals stage_totals on the same ProfiledHardware."""
    from dsocr_core import analytic
    from dsocr_core.analytic.predict import with_profile
    from dsocr_core.hardware import PRESETS
    from dsocr_core.results import analytic_join
    from dsocr_core.spec import ModelSpec

    store = RunStore(tmp_path / "runs.sqlite")
    run_id = fake_gpu_run(store, session_mode="fast")
    prof = uniform_profile(989e12, 4.8e12, efficiency=0.5, launch=5e-6, name="NVIDIA H200", kind="cuda")
    hw = with_profile(PRESETS["h200"], prof, "fast")
    df = analytic_join.compare_run(store, run_id, prediction=hw)
    points = store.points(run_id).drop_duplicates("key").set_index("key")
    # the fake run records no engine: it is predicted on the fast engine of the time before engine records
    from dsocr_core.engines import engine_before_records

    hw_run = with_profile(PRESETS["h200"], prof, engine_before_records("fast"))
    for _, row in df[df["stage"] != "decode_step"].iterrows():
        one = analytic.stage_totals(ModelSpec(), analytic_join.point_workload(points.loc[row["point"]]), hw_run)
        assert row["predicted_s"] == pytest.approx(one[row["stage"]]["predicted_s"], rel=1e-9)
        assert row["time_err_predicted"] == pytest.approx((row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    assert df["predicted_session_mode"].eq("fast").all() and (~df["predicted_derived"]).all()
    summary = analytic_join.summarize(df)
    assert all(s["time_err_predicted_median"] is not None for s in summary.values())
    assert "predicted_s" not in analytic_join.compare_run(store, run_id)  # without a profile: as before


def test_the_prediction_interface_keeps_the_sidebar_roofline(data):
    """ui.prediction's interface (other dashboard code is written against it): current_profile(settings) and
    predicted_hardware(settings), the sidebar's ceilings carrying the profile's prediction in the sidebar's mode;
    the cache key rebuilds the same Hardware inside cached functions."""
    from types import SimpleNamespace

    from dsocr_core.hardware import PRESETS
    from ui import prediction

    h200 = PRESETS["h200"]
    settings = SimpleNamespace(profile=prediction.choose(data / "profiles" / "cpu.json", "data/profiles"), hardware=h200,
                               model=SimpleNamespace(session_mode="reference"))
    prof = prediction.current_profile(settings)
    assert prof.device["kind"] == "cpu" and prof is prediction.current_profile(settings)  # loaded once
    hw = prediction.predicted_hardware(settings)
    assert (hw.peak_flops, hw.bandwidth, hw.name) == (h200.peak_flops, h200.bandwidth, h200.name)
    assert hw.prediction.profile is prof and hw.prediction.session_mode == "reference"
    again = prediction.attach(h200, prediction.key(settings))
    assert again.model_dump() == hw.model_dump() and again.prediction.profile is prof
    assert prediction.attach(None, prediction.key(settings, "fast")).prediction.session_mode == "fast"
    none = SimpleNamespace(profile=None, hardware=h200, model=settings.model)
    assert prediction.current_profile(none) is None and prediction.predicted_hardware(none) is None
    assert prediction.key(none) is None and prediction.attach(h200, None) is h200


def test_dataset_run_pages_get_the_predicted_time(data):
    """A dataset run's per-page chart draws the chosen profile's predicted time beside the analytic bound, in the
    run's own session mode (issue 18 over issue 14)."""
    from dsocr_core.cli import main
    from dsocr_core.grounding.samples import sample_pages
    from test_app import charts
    from test_app_dataset import series_of

    page = list(sample_pages())[0]
    assert main(["profile", "--pages", str(page), "--synthetic", "tiny", "--device", "cpu", "--dtype", "float32",
                 "--mode", "tiny", "--max-new-tokens", "2", "--store", str(data / "runs.sqlite")]) == 0
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    (chart,) = charts(at)
    assert "predicted" not in series_of(chart)
    assert "no predicted time (no calibration profile chosen)" in plain(" ".join(texts(at, "caption")))
    pick(at, CPU)
    (chart,) = charts(at)
    assert series_of(chart) >= {"measured", "analytic bound", "predicted"}
    assert "predicted: " in plain(" ".join(texts(at, "caption")))


def test_a_profile_that_cannot_time_every_kernel_is_refused_up_front(data):
    """A calibration stopped before its memory and attention tables: refused in the sidebar with the reason (the
    pages keep the roofline) instead of failing in the middle of a page."""
    at = pick(goto(make_app(), "analytic"), "repo:gemm_only.json")
    (error,) = map(plain, texts(at.sidebar, "error"))
    assert "gemm_only.json cannot predict: no table times" in error and "memory.elementwise" in error
    open_tab(at, "an_tab", "Time")
    assert not at.exception


def test_mfu_page_shows_the_observed_routing_and_saves_it_for_what_if_predictions(data):
    store = RunStore(data / "runs.sqlite")
    run_id = cpu_run(store, modes=("tiny",))
    w = {"mode": "base", "text_tokens": 10, "batch": 2, "decode_steps": 2, "dtype": "float32", "attn": "sdpa",
         "logits": "all", "crops": None, "image_size": None, "min_crops": 2, "max_crops": 9}
    stages = {s: {"median_s": t, "p10_s": t, "p90_s": t, "repeats": 3}
              for s, t in (("sam", 0.01), ("clip", 0.004), ("projector", 0.001), ("vision", 0.015),
                           ("prefill", 0.05), ("decode", 0.02), ("decode_step", 0.01))}
    # the routing records of the FLOP-counting pass (measure/routing_record.py): the tiny model's 2 MoE layers
    stages["prefill"]["routing"] = {"tokens": 546, "distinct": [8, 7]}
    stages["decode_step"]["routing"] = {"tokens": 2, "distinct": [[2, 3], [2, 2]]}
    store.put_point(run_id, w, "done", stages=stages)

    at = pick(goto(make_app(), "mfu"), H200)
    at.selectbox(key="mfu_run").set_value(run_id).run()
    at.toggle(key="mfu_sidebar").set_value(True).run()  # a CPU run: MFU against the sidebar's ceilings
    assert "MoE routing: observed vs assumed" in page_text(at)
    table = [f.value for f in at.dataframe if "observed distinct experts" in f.value.columns][0]
    assert list(table["tokens per call"]) == [2, 546] and list(table["layer-calls"]) == [4, 2]
    assert table["observed distinct experts"].tolist() == pytest.approx([2.25, 7.5])
    assert "engine reference (assumed: the run predates engine descriptions" in plain(page_text(at))
    cmp = [f.value for f in at.dataframe if "predicted_routing" in f.value.columns][0]
    assert cmp["predicted_routing"].str.startswith(f"observed (run {run_id[:8]}").all()

    assert "h200_synthetic_decode.json (data/routing)" in at.sidebar.selectbox(key="sb_routing").options
    at.button(key="mfu_save_routing").click().run()
    assert not at.exception, [e.value for e in at.exception]
    saved = data / "routing_profiles" / f"run_{run_id[:8]}.json"
    assert saved.is_file()
    at.run()  # the saved profile is selected in the sidebar on the next run
    assert at.sidebar.selectbox(key="sb_routing").value == f"saved:{saved.name}"
    assert f"Routing: observed (run {run_id[:8]}" in sidebar_text(at)


def test_what_if_predictions_take_the_sidebars_routing_profile(data, tmp_path, monkeypatch):
    at = pick(goto(make_app(), "analytic"), H200)
    assert at.sidebar.selectbox(key="sb_routing").value == "uniform"
    assert "MoE routing uniform (assumed)" in plain(page_text(open_tab(at, "an_tab", "Time")))
    uniform = export_frame(open_tab(at, "an_tab", "Download"))
    assert uniform["predicted.routing"].eq("uniform (assumed)").all()

    at.sidebar.selectbox(key="sb_routing").set_value("repo:h200_synthetic_decode.json").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "k=6 of E=64" in sidebar_text(at)
    observed = export_frame(at)
    assert observed["predicted.routing"].str.startswith("observed (routing_spread.py").all()
    assert (observed["decode.predicted_s"] <= uniform["decode.predicted_s"] * (1 + 1e-9)).all()
    assert (observed["sam.predicted_s"] == uniform["sam.predicted_s"]).all()

    (tmp_path / "routing").mkdir()  # a malformed routing profile: named, and the prediction stays uniform
    (tmp_path / "routing" / "bad.json").write_text('{"format": "dsocr-routing-profile"}')
    monkeypatch.setenv("DSOCR_ROUTING_DIR", str(tmp_path / "routing"))
    at.run()
    at.sidebar.selectbox(key="sb_routing").set_value("repo:bad.json").run()
    assert "bad.json: format_version must be 1" in sidebar_text(at)
    assert export_frame(at)["predicted.routing"].eq("uniform (assumed)").all()


def test_what_if_predictions_take_the_sidebars_sm_clock(data):
    """A profile that records its calibration clock offers a what-if SM clock: every stage's kernels' and launches'
    cycles are priced at it (never above the clock ratio to the exponent), and the export and caption say so; a
    profile without a calibration clock offers none."""
    from dsocr_core.analytic.predict import CLOCK_EXPONENT

    raw = load_profile(data / "profiles" / "h200.json").to_dict()
    raw["environment"] = {**(raw.get("environment") or {}), "sm_clock_max_mhz": 1980.0}
    profile_from_dict(raw).save(data / "profiles" / "h200_clocked.json")
    at = pick(goto(make_app(), "analytic"), "repo:h200_clocked.json")
    full = export_frame(open_tab(at, "an_tab", "Download"))
    assert full["predicted.clocks"].eq("the calibration's full SM clock (1,980 MHz)").all()

    at.sidebar.number_input(key="sb_sm_clock").set_value(1500).run()
    assert not at.exception, [e.value for e in at.exception]
    slow = export_frame(at)
    assert slow["predicted.clocks"].eq("what-if: SM 1,500 MHz in every stage against the calibration's 1,980 MHz"
                                       ).all()
    ratio = (1980 / 1500) ** CLOCK_EXPONENT
    for stage in ("sam", "prefill", "decode"):
        assert (slow[f"{stage}.predicted_s"] > full[f"{stage}.predicted_s"]).all(), stage
        assert (slow[f"{stage}.predicted_s"] <= full[f"{stage}.predicted_s"] * ratio * (1 + 1e-9)).all(), stage
    assert "what-if SM clock of 1,500 MHz" in plain(page_text(open_tab(at, "an_tab", "Time")))

    pick(at, H200)  # the uniform test profile records no calibration clock
    assert not [n for n in at.sidebar.number_input if n.key == "sb_sm_clock"]
    assert "records no calibration clock" in sidebar_text(at)
    assert export_frame(open_tab(at, "an_tab", "Download"))["predicted.clocks"].eq(
        "the calibration's full SM clock").all()


def test_a_what_if_clock_below_any_gpus_is_refused_in_the_sidebar(data):
    raw = load_profile(data / "profiles" / "h200.json").to_dict()
    raw["environment"] = {**(raw.get("environment") or {}), "sm_clock_max_mhz": 1980.0}
    profile_from_dict(raw).save(data / "profiles" / "h200_clocked.json")
    at = pick(goto(make_app(), "analytic"), "repo:h200_clocked.json")
    at.sidebar.number_input(key="sb_sm_clock").set_value(40).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "below any GPU's" in sidebar_text(at)
    assert export_frame(open_tab(at, "an_tab", "Download"))["predicted.clocks"].eq(
        "the calibration's full SM clock (1,980 MHz)").all()
    at.sidebar.number_input(key="sb_sm_clock").set_value(1503).run()
    assert "what-if SM clock of 1,505 MHz" in plain(page_text(open_tab(at, "an_tab", "Time")))  # as predicted
