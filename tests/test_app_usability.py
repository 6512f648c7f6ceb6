"""The dashboard as a newcomer finds it (issue 17): each test would have caught one of the problems found by
trying the README's commands on a 2-core machine without a GPU: contradictory summaries, blank filters, unit-less
timings, sweeps without an estimate, noisy defaults, slow page loads, unreadable charts and tables, inconsistent
texts. The browser-only ones (page icon from a CDN, page-switch time) are in tests/e2e/."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pandas as pd
import pyarrow as pa
import pytest

from dsocr_core.results.store import RunStore
from test_app import (LABEL, bomb_png, chart_rows, charts, fake_gpu_run, goto, make_app, no_reference,  # noqa: F401
                      open_tab, texts, with_reference)  # (the two fixtures are used by name)

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ helpers
def chart_frames(chart) -> list[pd.DataFrame]:
    proto = chart.proto
    frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in proto.datasets]
    if proto.data.data:
        frames.append(pa.ipc.open_stream(proto.data.data).read_all().to_pandas())
    return frames


def spec_of(chart) -> dict:
    return json.loads(chart.proto.spec)


def summary_table(at) -> pd.DataFrame:
    """The MFU page's 'Analytic vs measured' table (shown one column per stage), one row per stage again."""
    assert any(t.startswith("Analytic vs measured") for t in texts(at, "subheader"))
    shown = [f.value for f in at.dataframe if "figure" in f.value.columns][0]
    return shown.set_index("figure").T.rename_axis("stage").reset_index()


def cpu_run(store: RunStore, name: str = "cpu run", modes=("tiny", "small"), spread: bool = True) -> str:
    """A finished CPU sweep run of the tiny model's dimensions (made-up times with a p10-p90 spread)."""
    from dsocr_core.measure.environment import capture_environment
    from dsocr_core.spec import tiny_spec

    run_id = store.create_run("sweep", name, capture_environment("cpu"),
                              {"source": "synthetic", "synthetic": True, "detail": "test data"},
                              dtype="float32", attn="sdpa", session_mode="reference",
                              meta={"model_label": LABEL, "spec": tiny_spec().model_dump(), "repeats": 3,
                                    "warmup": 1})
    for i, mode in enumerate(modes):
        w = {"mode": mode, "text_tokens": 10, "batch": 1, "decode_steps": 2, "dtype": "float32", "attn": "sdpa",
             "logits": "all", "crops": None, "image_size": None, "min_crops": 2, "max_crops": 9}
        stages = {s: {"median_s": t * (1 + i), "p10_s": t * 0.8 * (1 + i) if spread else None,
                      "p90_s": t * 1.5 * (1 + i) if spread else None, "repeats": 3}
                  for s, t in (("sam", 0.01), ("clip", 0.004), ("projector", 0.001), ("vision", 0.015),
                               ("prefill", 0.05), ("decode", 0.02), ("decode_step", 0.01))}
        store.put_point(run_id, w, "done", stages=stages)
    return run_id


def widths(node, width: float = 1.0):
    """(element, share of the page width it is drawn in) for every element under `node`."""
    from streamlit.testing.v1.element_tree import Block, Column

    if isinstance(node, Column):
        width *= node.weight
    if isinstance(node, Block):
        for child in node.children.values():
            yield from widths(child, width)
    else:
        yield node, width


# ------------------------------------------------------------------------------------------------ 1 MFU summary
def test_mfu_summary_agrees_with_the_chart_for_a_cpu_run_on_the_sidebar_ceilings(no_reference):
    """A CPU run against the sidebar's H200: the summary shows the datasheet figures the chart draws, counts its
    flags on them (every point is >10% off), and never says n/a where the chart has values."""
    cpu_run(RunStore())
    at = goto(make_app(), "mfu")
    assert at.toggle(key="mfu_sidebar").value is True
    table = summary_table(at)
    assert "median MFU (datasheet)" in table.columns and "median MFU (calibrated)" not in table.columns
    assert not (table.drop(columns="max FLOP diff") == "n/a").any().any(), table  # (no FLOPs counted here)
    bars = pd.concat(chart_frames(charts(at)[0]))  # stage, metric, peak, value (in %)
    from dsocr_core.results.analytic_join import pct

    for _, b in bars.iterrows():
        row = table[table["stage"] == b["stage"]].iloc[0]  # the chart's stage names are the table's
        assert row[f"median {b['metric']} ({b['peak']})"] == pct(b["value"] / 100), (b, row)
    for _, row in table.iterrows():
        median_err = float(row["time error, median / max (datasheet)"].split("%")[0])
        if median_err > 10:
            assert row["flagged > 10% (datasheet)"] == row["points"], row  # flags counted on the error shown


def test_mfu_summary_of_a_gpu_run_shows_both_ceilings(with_reference):
    at = goto(make_app(), "mfu")
    table = summary_table(at)
    for peak in ("datasheet", "calibrated"):
        assert f"median MBU ({peak})" in table.columns and f"flagged > 10% ({peak})" in table.columns
    assert not (table.drop(columns="max FLOP diff") == "n/a").any().any()


# ------------------------------------------------------------------------------------------------ 2 runs filters
def test_runs_filters_follow_the_chosen_runs(with_reference):
    store = RunStore()
    cpu_id = cpu_run(store)
    at = goto(make_app(), "measured")
    assert at.multiselect(key="ms_runs").value == [with_reference]
    assert at.multiselect(key="ms_f_modes").value == ["gundam"]
    at.multiselect(key="ms_runs").set_value([cpu_id]).run()  # only the CPU run (tiny and small points)
    assert at.multiselect(key="ms_f_modes").value == ["small", "tiny"]
    assert not any("No finished point" in i for i in texts(at, "info"))
    assert chart_rows(charts(at)[0]) > 0
    at.multiselect(key="ms_runs").set_value([with_reference, cpu_id]).run()
    assert set(at.multiselect(key="ms_f_modes").value) == {"gundam", "small", "tiny"}
    runs = {r for f in chart_frames(charts(at)[0]) if "run" in f for r in f["run"]}
    assert runs == {"test H200 run", "cpu run"}  # both chosen runs have points on the chart
    at.multiselect(key="ms_f_batch").set_value([]).run()  # the user's own empty choice stays and is explained
    assert any("No finished point" in i for i in texts(at, "info"))
    goto(at, "overview")
    goto(at, "measured")  # the choice of runs survives a page switch
    assert at.multiselect(key="ms_runs").value == [with_reference, cpu_id]


def test_a_sweep_started_here_joins_the_chosen_runs(with_reference):
    from test_app import wait_for_sweep

    at = open_tab(goto(make_app(), "measured"), "ms_tab", "New sweep")
    at.multiselect(key="ms_modes").set_value(["tiny"])
    at.text_input(key="ms_steps").set_value("1")
    at.number_input(key="ms_repeats_cpu").set_value(1)
    at.number_input(key="ms_warmup_cpu").set_value(0)
    at.button(key="ms_start").click().run()
    job = wait_for_sweep()
    assert job.error is None and job.run_id
    open_tab(at, "ms_tab", "Runs")
    assert at.multiselect(key="ms_runs").value == [with_reference, job.run_id]
    at.multiselect(key="ms_runs").set_value([with_reference]).run()  # added once: the user can take it out
    at.run()
    assert at.multiselect(key="ms_runs").value == [with_reference]


# ------------------------------------------------------------------------------------------------ 3 parity timings
def test_parity_timings_are_named_in_ms_and_unmeasured_stages_say_so(no_reference):
    at = goto(make_app(), "parity")
    at.number_input(key="pa_tokens").set_value(4)
    at.button(key="pa_run").click().run()
    assert any("Parity passed" in s for s in texts(at, "success"))
    tm = [f.value for f in at.dataframe if "one-shot (ms)" in f.value.columns][0]
    names = list(tm[""])
    assert not any(n.endswith("_s") for n in names), names
    assert {"time to first token", "time per output token (median)", "total", "SAM"} <= set(names)
    sam = tm[tm[""] == "SAM"].iloc[0]
    assert sam["one-shot (ms)"] == "— (in prefill)" and float(sam["separated (ms)"].replace(",", "")) > 0
    assert any("not timed apart" in c for c in texts(at, "caption"))
    assert all("Timings (ms)" not in m for m in texts(at, "markdown"))
    # 7: the tables are wide enough for their columns (they used to share a row three ways)
    for element, share in widths(at.main):
        if getattr(element, "type", None) == "arrow_data_frame":
            cols = set(element.value.columns)
            if {"F1"} & cols:
                assert share == 1.0
            if {"characters"} & cols:
                assert share >= 0.4 and list(element.value.columns)[:3] == ["output", "blocks", "characters"]


# ------------------------------------------------------------------------------------------------ 4 sweep estimate
def test_new_sweep_shows_its_size_and_an_estimate_before_it_starts(no_reference):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "New sweep")
    caption = [c for c in texts(at, "caption") if "passes each" in c][0]
    assert "2 points" in caption and "5 passes each (1 warm-up, 3 timed, 1 FLOP count)" in caption
    assert "ETA follows the first point" in caption  # nothing measured on this machine yet
    at.text_input(key="ms_text").set_value("10, 100").run()  # the estimate follows the widgets as they change
    assert any("4 points" in c for c in texts(at, "caption"))
    cpu_run(RunStore(), "earlier cpu run")  # an earlier run of this model here: an estimate in time
    at.text_input(key="ms_text").set_value("10").run()
    caption = [c for c in texts(at, "caption") if "passes each" in c][0]
    assert re.search(r"estimated \*\*\d+ (s|min)", caption) and "1 earlier run" in caption, caption


def test_sweep_eta_scales_the_time_taken_by_the_analytic_cost_left():
    from ui.sweeps import SweepJob, duration

    job = SweepJob("s", "label", total=4, weights=[1.0, 1.0, 2.0, 4.0])
    assert job.eta_s() is None  # before the first point
    job.started = time.time() - 10
    job.done_one("done")
    job.last_done = time.time()  # the first point (weight 1) took 10 s: 7 weight units left, about 70 s
    assert 65 <= job.eta_s() <= 71
    assert "left" in job.summary() and duration(3725) == "1 h 2 min"
    unweighted = SweepJob("s", "label", total=3)
    unweighted.started = time.time() - 6
    unweighted.done_one("done")
    assert 11 <= unweighted.eta_s() <= 12.5


# ------------------------------------------------------------------------------------------------ 5 defaults, spread
def test_sweep_defaults_give_stable_medians_per_device(no_reference):
    from ui.live import MEASURE_DEFAULTS

    at = open_tab(goto(make_app(), "measured"), "ms_tab", "New sweep")
    assert at.number_input(key="ms_warmup_cpu").value >= 1 and at.number_input(key="ms_repeats_cpu").value >= 3
    assert MEASURE_DEFAULTS["cuda"] == {"warmup": 2, "repeats": 5}


def test_measured_page_shows_the_spread_of_the_repeats(no_reference):
    cpu_run(RunStore())
    at = goto(make_app(), "measured")
    layers = spec_of(charts(at)[0])["layer"]
    rules = [layer["encoding"] for layer in layers if "y2" in layer["encoding"]]  # the p10-p90 bars
    assert rules and rules[0]["y"]["field"] == "low" and rules[0]["y2"]["field"] == "high"
    table = [f.value for f in at.dataframe if "status" in f.value.columns][0]
    assert "prefill p10-p90 ms" in table.columns and table["prefill p10-p90 ms"].notna().all()
    assert list(table["repeats"]) == [3, 3]
    assert any("p10-p90" in c for c in texts(at, "caption"))


# ------------------------------------------------------------------------------------------------ 6 page loads
def test_pages_without_a_model_never_import_torch():
    """The sidebar and the analytic, measured and MFU pages' modules import no torch (2-3 s on a small machine);
    only the model pages do, and app.py warms it up in the background."""
    code = ("import sys; import ui.sidebar, ui.analytic_view, ui.forms, ui.runs_tab, ui.live, ui.measured, "
            "ui.dataset_view, ui.dataset_results, ui.dataset_charts, ui.uploads_view, ui.charts, ui.inputs, "
            "dsocr_core.results.analytic_join, dsocr_core.results.page_costs, dsocr_core.measure.uploads; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_session_modes_match_the_core():
    from dsocr_core.engines import ENGINES
    from dsocr_core.runtime.engine import SESSION_MODES
    from ui import sidebar

    assert sidebar.SESSION_MODES == SESSION_MODES == tuple(ENGINES)


def test_comparison_evaluates_the_analytic_model_once_per_group(with_reference, monkeypatch):
    """The measured page's first visit used to evaluate the analytic model once per point and stage (4-6 s for
    the bundled runs); now once per group of points, with the same numbers."""
    from dsocr_core import analytic
    from dsocr_core.results import analytic_join

    calls = []
    real = analytic_join.evaluate
    monkeypatch.setattr(analytic_join, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    from dsocr_core.spec import ModelSpec

    store = RunStore()
    run_id = fake_gpu_run(store)
    df = analytic_join.compare_run(store, run_id)
    assert len(calls) == 2  # datasheet and calibrated ceilings, one group (gundam)
    ds, _ = analytic_join.run_ceilings(store.get_run(run_id))
    points = store.points(run_id).drop_duplicates("key").set_index("key")
    for _, row in df[df["stage"] != "decode_step"].iterrows():
        one = analytic.stage_totals(ModelSpec(), analytic_join.point_workload(points.loc[row["point"]]), ds)
        assert row["analytic_flops"] == one[row["stage"]]["flops"]
        assert row["predicted_datasheet_s"] == pytest.approx(one[row["stage"]]["time_s"], rel=1e-12)


def test_analytic_page_draws_only_the_open_tab(no_reference):
    at = goto(make_app(), "analytic")
    assert len(charts(at)) == 1 and not at.dataframe  # FLOPs: one chart, no per-module table computed


# ------------------------------------------------------------------------------------------------ 7 charts, tables
def test_whole_number_axes_get_whole_number_ticks(no_reference):
    at = goto(make_app(), "analytic")
    x = spec_of(charts(at)[0])["encoding"]["x"]
    assert x["field"] == "crop_count" and x["axis"]["format"] == "d" and x["axis"]["tickMinStep"] == 1
    at.slider(key="an_crops_range").set_value((10, 10)).run()  # one point: a domain around it, not 10.000000
    x = spec_of(charts(at)[0])["encoding"]["x"]
    assert x["scale"]["domain"] == [9, 11]


def test_legends_are_never_cut_and_the_time_chart_is_log(with_reference):
    at = goto(make_app(), "mfu")
    cs = charts(at)
    assert len(cs) == 3
    for c in cs:
        assert spec_of(c)["config"]["legend"]["labelLimit"] == 0
    time_chart = spec_of(cs[2])
    assert time_chart["encoding"]["y"]["scale"]["type"] == "log"
    goto(at, "measured")
    chart = spec_of(charts(at)[0])
    dash = [layer["encoding"]["strokeDash"] for layer in chart["layer"] if "strokeDash" in layer["encoding"]][0]
    assert all(d for d in dash["scale"]["range"])  # no solid line among the 'dashed' analytic lines
    assert any("long dashes" in c and "short dashes" in c for c in texts(at, "caption"))


def test_tables_use_engineering_units(no_reference):
    at = goto(make_app(), "analytic")
    for tab in ("Roofline", "Per module"):
        frame = open_tab(at, "an_tab", tab).dataframe[0].value
        numeric = frame.select_dtypes("number")
        assert (numeric.abs().max() < 1e6).all(), (tab, numeric.abs().max())
        assert any("GFLOP" in c for c in frame.columns) and any("(ms)" in c for c in frame.columns), frame.columns
    at.selectbox(key="an_b_attn").set_value("sdpa").run()
    at.selectbox(key="an_b_hw").set_value("h100-sxm").run()
    cap = open_tab(at, "an_tab", "Capacity").dataframe[0].value
    assert [c for c in cap.columns if "time" in c] == ["time (ms)"] and cap["time (ms)"].notna().all()
    assert set(cap["hardware"]) == {"NVIDIA H200 SXM", "NVIDIA H100 SXM"}


# ------------------------------------------------------------------------------------------------ 8 texts
def test_overview_counts_its_views(no_reference):
    at = make_app()
    intro = [m for m in texts(at, "markdown") if "What does one DeepSeek-OCR page cost" in m][0]
    words = {"Two": 2, "Three": 3, "Four": 4, "Five": 5}
    said = [n for w, n in words.items() if f"{w} views" in intro]
    assert said == [intro.count("\n* **")], intro


@pytest.mark.parametrize("size", [(8500, 8500), (10_000, 10_000), (40_000, 40_000)])
def test_one_pixel_limit_one_message(no_reference, size):
    """72 MP (our limit), 100 MP (Pillow's warning) and 1,600 MP (Pillow's error) read the same way."""
    at = goto(make_app(), "parity")
    at.radio(key="pa_source").set_value("upload").run()
    at.file_uploader(key="pa_upload").set_value([("big.png", bomb_png(*size), "image/png")]).run()
    (error,) = texts(at, "error")
    assert re.fullmatch(r"big\.png: (\d[\d,]* x \d[\d,]* = )?[\d,]+ megapixels is over the 64-megapixel limit "
                        r"for a page image \(refused before decoding, as a possible decompression bomb\); "
                        r"downscale the page", error), error
    assert "89,478,485" not in error and "DOS attack" not in error
