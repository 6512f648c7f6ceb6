"""Every dashboard page through streamlit.testing.v1.AppTest: widgets, charts that carry data, clear errors for
bad input. The model is the synthetic tiny one on the CPU (the embedded default); the run store is a temporary
file and the 'bundled' reference runs come from a temporary folder the tests fill."""
from __future__ import annotations

import io
import json
import os
import re
import struct
import threading
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from dsocr_core.grounding.samples import sample_pages
from dsocr_core.results.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
os.environ["DSOCR_VALIDATE_CHARTS"] = "1"  # every chart drawn in these tests is checked against the Vega-Lite schema
LABEL = "synthetic tiny model on CPU (random weights)"


# ------------------------------------------------------------------------------------------------ helpers
def make_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_tab(at: AppTest, key: str, label: str) -> AppTest:
    """Select a tab of an st.tabs(key=..., on_change="rerun") group (only the open tab's content runs)."""
    at.session_state[key] = label
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list:
    return list(at.get("vega_lite_chart"))


def chart_rows(chart) -> int:
    """Rows of data a vega-lite chart carries (its named datasets, or its inline data)."""
    proto = chart.proto
    rows = sum(pa.ipc.open_stream(d.data.data).read_all().num_rows for d in proto.datasets)
    if proto.data.data:
        rows += pa.ipc.open_stream(proto.data.data).read_all().num_rows
    return rows


def texts(at: AppTest, kind: str) -> list[str]:
    return [e.value for e in getattr(at, kind)]


def page_text(at: AppTest) -> str:
    parts = []
    for kind in ("markdown", "caption", "info", "warning", "success", "error", "title", "subheader"):
        parts += [str(e.value) for e in getattr(at, kind)]
    return "\n".join(parts)


def png_bytes(size=(320, 240)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, "white").save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width=40_000, height=40_000) -> bytes:
    """A PNG whose header claims 1.6 gigapixels (a decompression bomb) with almost no data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")


def fake_gpu_run(store: RunStore, name: str = "test H200 run", session_mode: str | None = None) -> str:
    """A reference-kind run with an H200 environment and calibration: test data for the measured and MFU pages
    (the numbers are made up; nothing here claims to be a measurement)."""
    env = {"device": "cuda", "gpu_name": "NVIDIA H200"}
    weights = {"source": "synthetic", "synthetic": True, "detail": "test data"}
    cal = {"name": "NVIDIA H200", "peak_tflops": 780.0, "bandwidth_tbs": 4.2, "memory_gb": 141.0,
           "source": "test calibration", "calibrated": True}
    run_id = store.create_run("reference", name, env, weights, dtype="bfloat16", attn="sdpa",
                              session_mode=session_mode, meta={"calibration": cal})
    for i, grid in enumerate([(1, 1), (2, 1), (2, 2), (3, 2)]):
        w = {"mode": "gundam", "crops": list(grid), "text_tokens": 10, "batch": 1, "decode_steps": 32,
             "dtype": "bfloat16", "attn": "sdpa", "logits": "all", "image_size": None, "min_crops": 2,
             "max_crops": 9}
        stages = {s: {"median_s": t * (1 + i / 3), "p10_s": t, "p90_s": t * 1.1, "repeats": 3}
                  for s, t in (("sam", 0.01), ("clip", 0.004), ("projector", 0.0002), ("vision", 0.0142),
                               ("prefill", 0.02), ("decode", 0.3), ("decode_step", 0.01))}
        store.put_point(run_id, w, "done", stages=stages)
    oom = {"mode": "gundam", "crops": [9, 9], "text_tokens": 10, "batch": 64, "decode_steps": 32, "dtype": "bfloat16",
           "attn": "sdpa", "logits": "all", "image_size": None, "min_crops": 2, "max_crops": 9}
    store.put_point(run_id, oom, "oom", "OutOfMemoryError: CUDA out of memory (test)")
    return run_id


@pytest.fixture
def no_reference(tmp_path, monkeypatch):
    """A fresh store and an empty 'bundled' reference folder."""
    (tmp_path / "reference").mkdir()
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(tmp_path / "reference"))
    return tmp_path


@pytest.fixture
def with_reference(tmp_path, monkeypatch):
    """A fresh store and a reference folder holding one exported GPU run."""
    scratch = RunStore(tmp_path / "scratch.sqlite")
    run_id = fake_gpu_run(scratch)
    ref = tmp_path / "reference"
    ref.mkdir()
    scratch.export_run(run_id, ref / "h200_test.json")
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(ref))
    return run_id


def wait_for_sweep(timeout=120.0):
    from ui import sweeps

    runner = sweeps.runner()
    runner.join(timeout)
    assert runner.job is not None and not runner.job.running
    return runner.job


# ------------------------------------------------------------------------------------------------ navigation
def test_every_page_opens_with_the_shared_sidebar(no_reference):
    at = make_app()
    for page in ("overview", "analytic", "measured", "parity", "mfu"):
        goto(at, page)
        assert at.sidebar.radio(key="sb_source").value == "synthetic-tiny"
        assert at.sidebar.selectbox(key="sb_hardware").value == "h200"
        assert not at.error, (page, texts(at, "error"))


# ------------------------------------------------------------------------------------------------ overview
def test_overview_shows_device_ceilings_and_the_labelled_model(no_reference):
    at = make_app()
    text = page_text(at)
    assert "No CUDA GPU detected" in text or "Detected GPU" in text
    assert LABEL in text
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Peak BF16 (dense)"] == "989 TFLOP/s"
    assert metrics["Dtype"] == "float32" and metrics["Device"] == "cpu"
    assert float(metrics["Parameters"].split()[0]) > 1
    (chart,) = charts(at)
    assert chart_rows(chart) == 12  # parameter groups


def test_sidebar_custom_ceilings_reach_the_pages(no_reference):
    at = make_app()
    at.sidebar.selectbox(key="sb_hardware").set_value("custom").run()
    at.sidebar.number_input(key="sb_peak").set_value(100.0).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Peak BF16 (dense)"] == "100 TFLOP/s"
    goto(at, "analytic")
    assert "sidebar: custom" in at.selectbox(key="an_a_hw").options


def test_sidebar_calibration_on_the_cpu_is_labelled(no_reference):
    at = make_app()
    at.sidebar.selectbox(key="sb_hardware").set_value("calibrated").run()
    assert any("not calibrated yet" in t for t in texts(at.sidebar, "info"))
    at.sidebar.button(key="sb_calibrate").click().run()
    assert not at.exception
    captions = " ".join(str(c.value) for c in at.sidebar.caption)
    assert "Calibrated on this CPU in float32" in captions
    # measured in the runs' dtype (float32 on the CPU), named so, and never shown as "0.0 TFLOP/s"
    assert "0.0 TFLOP/s" not in captions and re.search(r"\b0\.\d*[1-9]\d* TFLOP/s", captions), captions
    status = [e for e in at.sidebar.get("status") if "Measur" in e.proto.label]
    assert status and status[0].proto.label.startswith("Measured: "), [e.proto.label for e in status]
    from ui import resources

    assert "float32" in resources.calibrations()[("cpu", "float32")].name
    assert "Peak matmul (measured)" in {m.label for m in at.metric}


def test_missing_checkpoint_folder_is_a_clear_message_everywhere(no_reference, tmp_path):
    at = make_app()
    at.sidebar.radio(key="sb_source").set_value("checkpoint").run()
    at.sidebar.text_input(key="sb_checkpoint").set_value(str(tmp_path / "nowhere")).run()
    assert any("does not exist" in e for e in texts(at.sidebar, "error"))
    assert any("does not exist" in e for e in texts(at.main, "error"))  # overview: the model panel
    goto(at, "parity")
    assert any("does not exist" in e for e in texts(at.main, "error"))
    goto(at, "analytic")  # the analytic pages do not need the model
    assert not at.main.error and len(charts(at)) >= 1


# ------------------------------------------------------------------------------------------------ analytic
def test_analytic_charts_carry_data_and_follow_the_controls(no_reference):
    at = goto(make_app(), "analytic")
    assert len(charts(at)) == 1  # only the open tab (FLOPs) is drawn
    for tab, n in (("Bytes", 2), ("Memory", 1), ("Time", 1), ("Roofline", 1)):
        cs = charts(open_tab(at, "an_tab", tab))
        assert len(cs) == n and all(chart_rows(c) > 0 for c in cs), tab
    open_tab(at, "an_tab", "FLOPs")
    cs = charts(at)
    flops_rows = chart_rows(cs[0])
    assert flops_rows == 2 * 16 * 5  # two configurations x crop counts 1..16 x five stages
    at.slider(key="an_crops_range").set_value((1, 4)).run()
    assert chart_rows(charts(at)[0]) == 2 * 4 * 5
    at.toggle(key="an_compare").set_value(False).run()
    assert chart_rows(charts(at)[0]) == 4 * 5
    spec = json.loads(charts(at)[0].proto.spec)
    assert spec["encoding"]["x"]["title"].startswith("crop count")


def test_analytic_every_axis_and_side_by_side(no_reference):
    at = goto(make_app(), "analytic")
    for axis in ("text", "image", "batch", "decode", "crops"):
        at.radio(key="an_axis").set_value(axis).run()
        assert not at.exception and not at.error, (axis, texts(at, "error"))
        assert chart_rows(charts(at)[0]) > 0
    at.radio(key="an_layout").set_value("side by side").run()
    spec = json.loads(charts(at)[0].proto.spec)
    assert "facet" in spec  # one column per configuration


def test_analytic_compares_two_hardware_presets(no_reference):
    at = goto(make_app(), "analytic")
    at.selectbox(key="an_b_attn").set_value("sdpa").run()
    at.selectbox(key="an_b_hw").set_value("h100-sxm").run()
    open_tab(at, "an_tab", "Per module")
    configs = {c for c in at.selectbox(key="an_mod_config").options}
    assert configs == {"A: NVIDIA H200 SXM", "B: NVIDIA H100 SXM"}


def test_analytic_tables_capacity_and_downloads(no_reference):
    at = goto(make_app(), "analytic")
    modules = open_tab(at, "an_tab", "Per module").dataframe[0].value
    assert modules["module"].str.startswith("model.").any()
    downloads = len(at.get("download_button"))
    shapes = open_tab(at, "an_tab", "Image shapes").dataframe[0].value
    assert list(shapes["crops"][:3]) == [1, 2, 3]
    open_tab(at, "an_tab", "Capacity")
    labels = {m.label for m in at.metric}
    assert {"TTFT", "TPOT", "Pages / day"} <= labels
    # the memory is the model's as written, not the fast engine's: the page says so
    assert any("Memory and fits: the weights" in c.value and "fast engine's footprint differs" in c.value
               for c in at.caption)
    assert len(at.dataframe) == 1  # what a GPU needs for the targets
    downloads += len(open_tab(at, "an_tab", "Download").get("download_button"))
    assert downloads >= 3


@pytest.mark.parametrize("axis, key, value, message", [
    ("text", "an_values_text", "10, abc", "not a whole number"),
    ("text", "an_values_text", "", "at least one"),
    ("image", "an_values_image", "0x100", "out of range"),
    ("image", "an_values_image", "640 by 480", "not WIDTHxHEIGHT"),
    ("batch", "an_values_batch", "0, 4", "out of range"),
])
def test_analytic_impossible_settings_show_an_error(no_reference, axis, key, value, message):
    at = goto(make_app(), "analytic")
    at.radio(key="an_axis").set_value(axis).run()
    at.text_input(key=key).set_value(value).run()
    assert not at.exception
    assert any(message in e for e in texts(at, "error")), texts(at, "error")


def test_analytic_bad_crop_grid_and_recovery(no_reference):
    at = goto(make_app(), "analytic")
    at.radio(key="an_axis").set_value("text").run()
    at.selectbox(key="an_b_attn").set_value("flash").run()
    at.text_input(key="an_a_grid").set_value("40x40").run()  # 1600 tiles: past the model's limit
    assert any("1000" in e for e in texts(at, "error"))
    assert at.selectbox(key="an_b_attn").value == "flash"  # the other widgets stay drawn and keep their state
    at.text_input(key="an_values_text").set_value("10, x").run()
    errors = " ".join(texts(at, "error"))
    assert "not a whole number" in errors
    at.text_input(key="an_a_grid").set_value("3x2").run()
    at.text_input(key="an_values_text").set_value("10, 100").run()
    assert not at.error and charts(at)
    assert at.selectbox(key="an_b_attn").value == "flash"


# ------------------------------------------------------------------------------------------------ measured
def test_measured_without_reference_runs_says_so(no_reference):
    at = goto(make_app(), "measured")
    assert any("No bundled reference runs yet" in t for t in texts(at, "info"))
    goto(at, "mfu")
    assert any("No measured run" in t for t in texts(at, "info"))


def test_measured_overlays_reference_runs_on_the_analytic_model(with_reference):
    at = goto(make_app(), "measured")
    assert with_reference in at.multiselect(key="ms_runs").value
    (chart, *_) = charts(at)
    spec = json.loads(chart.proto.spec)
    assert len(spec["layer"]) >= 2  # analytic lines + measured points
    assert chart_rows(chart) > 0
    table = [f.value for f in at.dataframe if "status" in f.value.columns][0]
    assert sorted(table["status"]) == ["done", "done", "done", "done", "oom"]
    assert "CUDA out of memory" in " ".join(table["message"])
    at.selectbox(key="ms_f_x").set_value("crop_count").run()
    assert json.loads(charts(at)[0].proto.spec)["layer"][0]["encoding"]["x"]["field"] == "crop_count"


def test_measured_import_rejects_a_bad_file_and_accepts_an_export(with_reference, tmp_path):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Import / export")
    at.file_uploader(key="ms_import").set_value(("junk.json", b"{not json", "application/json")).run()
    assert any("not valid JSON" in e for e in texts(at, "error"))
    scratch = RunStore(tmp_path / "other.sqlite")
    run_id = fake_gpu_run(scratch, "imported run")
    at.file_uploader(key="ms_import").set_value(("run.json", scratch.export_json(run_id).encode(),
                                                 "application/json")).run()
    assert any("Imported imported run" in s for s in texts(at, "success"))
    assert len(at.get("download_button")) == 2


def test_measured_sweep_runs_in_the_background_and_can_be_stopped(no_reference):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "New sweep")
    at.multiselect(key="ms_modes").set_value(["tiny", "small"])
    at.text_input(key="ms_steps").set_value("1")
    at.number_input(key="ms_repeats_cpu").set_value(1)
    at.number_input(key="ms_warmup_cpu").set_value(0)
    at.button(key="ms_start").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    from ui import sweeps

    runner = sweeps.runner()
    job = runner.job
    assert job.total == 2 and (runner.busy or job.handled)
    deadline = time.time() + 120
    while job.handled < 1 and job.running and time.time() < deadline:  # points appear as they finish
        time.sleep(0.2)
    runner.stop()  # stop after the point being measured
    job = wait_for_sweep()
    assert job.error is None and 1 <= job.handled <= 2
    store = RunStore()  # $DSOCR_STORE: every point measured before the stop is stored
    run = store.get_run(job.run_id)
    assert run["flags"]["synthetic_weights"] and run["flags"]["cpu"]
    assert run["meta"]["model_label"] == LABEL
    assert run["n_points"] == run["n_done"] == job.handled
    at.run()
    progress = at.get("progress")[0]
    assert "points" in progress.proto.text
    open_tab(at, "ms_tab", "Runs")
    assert job.run_id in at.multiselect(key="ms_runs").value  # the sweep this tab started is shown
    assert any(o.startswith("dashboard sweep (" + LABEL) for o in at.multiselect(key="ms_runs").options)


def test_measured_sweep_form_rejects_bad_lists(no_reference):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "New sweep")
    at.text_input(key="ms_batch").set_value("one")
    at.button(key="ms_start").click().run()
    assert any("not a whole number" in e for e in texts(at, "error"))
    from ui import sweeps

    assert not sweeps.runner().busy


def test_dataset_runs_section_reads_a_profiled_run(no_reference):
    from dsocr_core.measure import dataset_run, datasets
    from dsocr_core.runtime.session import Session

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore()
    data = datasets.discover(sample_pages()[-1])  # the card page
    settings = dataset_run.ProfileSettings(mode="tiny", max_new_tokens=3)
    run_id = dataset_run.create_dataset_run(store, session, data, settings, {"n": 1})
    dataset_run.run_dataset(session, store, run_id, datasets.sample(data.pages, 1), settings)
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    assert at.selectbox(key="ds_run").value == run_id
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Samples"] == "1"
    assert any("stage" in f.value.columns for f in at.dataframe)


# ------------------------------------------------------------------------------------------------ parity
def test_parity_on_a_sample_page_shows_both_renderings(no_reference):
    at = goto(make_app(), "parity")
    assert at.selectbox(key="pa_mode").value == "tiny"  # cheap default on the CPU
    assert at.number_input(key="pa_tokens").value == 64
    at.number_input(key="pa_tokens").set_value(16)
    at.button(key="pa_run").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    assert any("Parity passed" in s and LABEL in s for s in texts(at, "success"))
    images = at.image
    captions = [c for img in images for c in img.captions]
    assert any(c.startswith("one-shot:") for c in captions) and any(c.startswith("separated:") for c in captions)
    assert any(c.startswith("sample layout (drawn):") for c in captions)
    assert any("First divergence" in m and "none" in m for m in texts(at, "markdown"))
    exported = json.loads(at.session_state["pa_results"][0].export())  # what the JSON download holds
    assert exported["model_label"] == LABEL and exported["passed"] and exported["token_equal"]


def test_parity_uploads_bad_images_and_a_vendor_text(no_reference):
    at = goto(make_app(), "parity")
    at.radio(key="pa_source").set_value("upload").run()
    at.file_uploader(key="pa_upload").set_value([
        ("empty.png", b"", "image/png"),
        ("corrupt.png", png_bytes()[:60], "image/png"),
        ("notes.png", b"hello, I am not an image", "image/png"),
        ("bomb.png", bomb_png(), "image/png"),
        ("page.png", png_bytes(), "image/png"),
    ]).run()
    errors = " | ".join(texts(at, "error"))
    assert "empty.png" in errors and "corrupt.png" in errors and "notes.png" in errors
    assert "bomb.png" in errors and "decompression bomb" in errors
    assert "page.png" not in errors
    at.file_uploader(key="pa_vendor").set_value([("page.mmd", "<|ref|>title<|/ref|><|det|>[[10, 10, 500, 80]]"
                                                  "<|/det|>\n# Title\n".encode("utf-8"), "text/plain"),
                                                 ("latin.txt", "caf\xe9".encode("latin-1"), "text/plain")]).run()
    assert any("not UTF-8" in e for e in texts(at, "error"))
    at.number_input(key="pa_tokens").set_value(8)
    at.button(key="pa_run").click().run()
    assert any("Parity passed" in s for s in texts(at, "success"))
    captions = [c for img in at.image for c in img.captions]
    assert any(c.startswith("vendor output: 1 blocks") for c in captions)


def test_parity_out_of_memory_is_reported_and_the_app_keeps_running(no_reference, monkeypatch):
    import torch

    from dsocr_core.measure import parity_run as parity

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(parity, "run_parity", oom)
    at = goto(make_app(), "parity")
    at.button(key="pa_run").click().run()
    assert not at.exception
    assert any("out of memory" in e for e in texts(at, "error"))
    goto(at, "overview")  # still running


def test_parity_waits_for_the_device_lock(no_reference):
    from ui import resources

    at = goto(make_app(), "parity")
    lock = resources.gpu_lock()
    assert lock.acquire(timeout=60)
    try:
        at.button(key="pa_run").click().run()
    finally:
        lock.release()
    assert any("busy" in w for w in texts(at, "warning"))


def test_parity_prompt_without_image_is_an_error(no_reference):
    at = goto(make_app(), "parity")
    at.selectbox(key="pa_prompt").set_value("custom").run()
    at.text_area(key="pa_custom").set_value("Free OCR without the image tag").run()
    at.button(key="pa_run").click().run()
    assert not at.exception
    assert any("image" in e.lower() for e in texts(at, "error"))


# ------------------------------------------------------------------------------------------------ MFU
def test_mfu_bars_roofline_and_limits_of_a_gpu_run(with_reference):
    at = goto(make_app(), "mfu")
    assert at.selectbox(key="mfu_run").value == with_reference
    assert at.toggle(key="mfu_sidebar").value is False  # the run has its own ceilings
    cs = charts(at)
    assert len(cs) == 3 and all(chart_rows(c) > 0 for c in cs)
    bars = json.loads(cs[0].proto.spec)
    assert "facet" in bars  # datasheet | calibrated
    text = page_text(at)
    assert "calibrated: NVIDIA H200, 780.0 TFLOP/s" in text
    assert any("median MFU (calibrated)" in set(f.value.get("figure", [])) for f in at.dataframe)  # the summary
    options = at.selectbox(key="mfu_point").options
    at.selectbox(key="mfu_point").set_value(options[1]).run()
    assert not at.exception and len(charts(at)) == 3


def test_mfu_of_a_cpu_run_needs_the_sidebar_ceilings(no_reference):
    from dsocr_core.measure.environment import capture_environment

    store = RunStore()
    run_id = store.create_run("sweep", "cpu run", capture_environment("cpu"),
                              {"source": "synthetic", "synthetic": True}, meta={})
    w = {"mode": "tiny", "text_tokens": 10, "batch": 1, "decode_steps": 2, "dtype": "float32", "attn": "sdpa",
         "logits": "all", "crops": None, "image_size": None, "min_crops": 2, "max_crops": 9}
    store.put_point(run_id, w, "done", stages={"prefill": {"median_s": 0.05}, "sam": {"median_s": 0.01}})
    at = goto(make_app(), "mfu")
    assert at.toggle(key="mfu_sidebar").value is True
    assert any("CPU" in w for w in texts(at, "warning"))
    assert len(charts(at)) == 3
    at.toggle(key="mfu_sidebar").set_value(False).run()
    assert any("no GPU ceilings" in w for w in texts(at, "warning"))
    assert not at.exception


# ------------------------------------------------------------------------------------------------ session mode
def test_fast_mode_is_refused_on_the_cpu_and_the_reference_mode_keeps_working(no_reference):
    at = make_app()
    assert at.sidebar.radio(key="sb_session_mode").value == "reference"  # the default
    if at.sidebar.selectbox(key="sb_device").value != "cpu":  # a GPU machine: choose the CPU to be refused
        at.sidebar.selectbox(key="sb_device").set_value("cpu").run()
    at.sidebar.radio(key="sb_session_mode").set_value("fast").run()
    assert not at.exception
    refusal = [w for w in texts(at.sidebar, "warning") if "Fast mode needs" in w]
    assert refusal and "using the reference mode" in refusal[0]
    assert any("Fast mode needs" in w for w in texts(at.main, "warning"))  # repeated where the model is used
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Session mode"] == "reference" and metrics["Device"] == "cpu"
    goto(at, "parity")
    at.number_input(key="pa_tokens").set_value(8)
    at.button(key="pa_run").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    assert any("Parity passed" in s and "reference session mode" in s for s in texts(at, "success"))
    exported = json.loads(at.session_state["pa_results"][0].export())
    assert exported["session_mode"] == "reference" and exported["session"]["session_mode"] == "reference"
    goto(at, "analytic")  # pages that need no model are untouched
    assert not at.main.error and charts(at)


def test_fast_mode_that_cannot_be_built_falls_back_with_the_reason(no_reference, monkeypatch):
    """Where the engine cannot be built (no Triton, say) the page says why and runs the reference session."""
    from dsocr_core.runtime import session as core
    from ui import resources

    build = core.build_engine

    def broken(mode, *args, **kwargs):
        if getattr(mode, "kind", mode) == "fast":  # an engine description (or a bare session mode)
            raise RuntimeError("Triton is not installed")
        return build(mode, *args, **kwargs)

    loaded = resources.LoadedModel(core.Session.load(synthetic="tiny", device="cpu", dtype="float32"))
    monkeypatch.setattr(core, "build_engine", broken)
    session, refusal = loaded.session("fast")
    assert session is loaded.reference and session.session_mode == "reference"
    assert "could not be built" in refusal and "Triton is not installed" in refusal
    assert loaded.session("fast") == (loaded.reference, refusal)  # remembered, not retried on every rerun
    assert loaded.session("reference") == (loaded.reference, None)


def test_stored_runs_show_their_session_mode(no_reference):
    store = RunStore()
    fast_id = fake_gpu_run(store, "fast gpu run", session_mode="fast")
    at = goto(make_app(), "measured")
    titles = [t for t in at.multiselect(key="ms_runs").options if t.startswith("fast gpu run")]
    assert titles and titles[0].endswith("fast session mode")
    assert any("(fast session mode)" in m for m in texts(at, "markdown"))  # the per-run table's heading
    open_tab(at, "ms_tab", "Import / export")
    assert any(o.endswith("fast session mode") for o in at.selectbox(key="ms_export").options)
    assert "fast" in store.export_csv(fast_id)
    assert json.loads(store.export_json(fast_id))["run"]["session_mode"] == "fast"
    goto(at, "mfu")
    assert at.selectbox(key="mfu_run").value == fast_id
    assert any("fast session mode" in c for c in texts(at, "caption"))
    every = [f.value for f in at.dataframe if "session_mode" in f.value.columns][0]  # what the CSV download holds
    assert set(every["session_mode"]) == {"fast"}


def test_dataset_run_started_from_the_page_records_the_session_mode(no_reference, tmp_path):
    import shutil

    pages = tmp_path / "pages"
    pages.mkdir()
    shutil.copy(sample_pages()[-1], pages / "card.png")
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    at.radio(key="ds_source_kind").set_value("path").run()  # uploads are the default (tests/test_app_dataset.py)
    at.text_input(key="ds_source").set_value(str(pages))
    at.number_input(key="ds_pages_path").set_value(1)
    at.number_input(key="ds_tokens").set_value(3)
    submit = [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0]
    submit.click().run()
    assert not at.exception and not at.error, texts(at, "error")
    job = wait_for_sweep()
    assert job.kind == "dataset" and job.error is None and job.handled == 1
    run = RunStore().get_run(job.run_id)
    assert run["kind"] == "dataset" and run["session_mode"] == "reference" and run["n_done"] == 1
    at.run()
    assert at.selectbox(key=f"ds_run_{job.run_id[:8]}").value == job.run_id  # a run started here is shown
    assert any("reference session mode" in c for c in texts(at, "caption"))
    at.text_input(key="ds_source").set_value(str(tmp_path / "nowhere"))
    [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0].click().run()
    assert any("no such folder" in e for e in texts(at, "error"))


def test_the_loaded_model_builds_any_registered_engine_once_and_one_at_a_time(monkeypatch):
    """LoadedModel asks the engine registry nothing by name: a session mode other than the reference's is built
    with with_mode on first use, kept while chosen, dropped when another mode is chosen."""
    from ui import resources

    built = []

    class FakeSession:
        session_mode = "reference"
        lock = threading.Lock()

        def with_mode(self, mode):
            other = FakeSession()
            other.session_mode, other.engine = mode, object()
            built.append(mode)
            return other

    monkeypatch.setattr(resources, "free_device_memory", lambda: None)
    loaded = resources.LoadedModel(FakeSession())
    assert loaded.needs_build("fast") and not loaded.needs_build("reference")
    fast, refusal = loaded.session("fast")
    assert refusal is None and fast.session_mode == "fast" and not loaded.needs_build("fast")
    assert loaded.session("fast") == (fast, None) and built == ["fast"]  # kept, not rebuilt on a rerun
    assert loaded.session("other")[0].session_mode == "other" and loaded.other[0] == "other"  # one at a time
    assert loaded.session("reference") == (loaded.reference, None) and loaded.other is None
