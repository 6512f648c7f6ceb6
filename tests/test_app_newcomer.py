"""The dashboard as a newcomer on a CPU machine finds it (AppTest): the bound of a CPU run lies below its
measurements, predictions that miss say so, a running job is never shown as 'no runs', tables and charts show
their data in the units of their neighbours, and labels do not contradict each other."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from dsocr_core.results import dataset_stats, page_costs
from dsocr_core.results.store import RunStore
from page_files import page_png
from test_app import goto, make_app, no_reference, open_tab, texts, wait_for_sweep  # noqa: F401
from test_app_prediction import CPU, cpu_quick, data, pick, plain  # noqa: F401


def shown(at, kind: str) -> str:
    return " ".join(texts(at, kind)).replace("\\", "")


def four_digits(text: str) -> bool:
    """A number as a reader compares it: no exponent, at most 4 significant digits (a whole number keeps all)."""
    whole, _, frac = text.replace(",", "").partition(".")
    return "e" not in text and (not frac or len((whole.lstrip("0") + frac).lstrip("0")) <= 4)


def upload_and_start(at, tokens: int = 2, trace: bool = False):
    at.file_uploader(key="up_files").set_value([
        ("wide.png", page_png(1800, 600, seed=1), "image/png"),
        ("square.png", page_png(800, 800, seed=2), "image/png"),
    ]).run()
    at.number_input(key="ds_tokens").set_value(tokens)
    if trace:
        at.checkbox(key="ds_trace").check()
        at.number_input(key="ds_trace_tokens").set_value(2)
    [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0].click().run()
    assert not at.exception and not at.error, texts(at, "error")


def test_a_cpu_dataset_run_is_bounded_by_its_own_cpu_measured_in_its_dtype(no_reference):
    """The sidebar's CPU ceilings are measured in the runs' dtype (float32), a CPU run stores its CPU's ceilings,
    its bound comes from them, and no measured point of any stage lies below its bound."""
    at = make_app()
    at.sidebar.selectbox(key="sb_hardware").set_value("calibrated").run()
    at.sidebar.button(key="sb_calibrate").click().run()
    at = open_tab(goto(at, "measured"), "ms_tab", "Dataset runs")
    assert at.selectbox(key="ds_mode").value == "gundam"  # the main chart is against crop tiles
    upload_and_start(at)
    job = wait_for_sweep()
    assert job.error is None and job.statuses["done"] == 2, (job.error, job.statuses)
    at.run()
    run = RunStore().get_run(job.run_id)
    stored = run["meta"]["calibration"]
    assert stored["name"].startswith("CPU (float32") and stored["calibrated"]
    caption = shown(at, "caption")
    assert f"the roofline of {stored['name']} (measured with the run)" in caption, caption
    assert at.radio(key="ds_x").value == "crop_count"  # the two pages have different crop grids
    per_page = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    x_titles = {layer["encoding"]["x"]["title"] for layer in per_page["spec"]["layer"]}
    assert x_titles == {"crop tiles (number)"}  # not 'grid width x height' over tile-count ticks
    assert "bound lies above measured points" not in shown(at, "error")
    # every stage of every page: measured >= its bound
    from dsocr_core.spec import Hardware

    pages = dataset_stats.page_table(RunStore(), job.run_id, Hardware(**stored))
    long = page_costs.page_stage_long(pages)
    assert long["analytic_s"].notna().all() and len(long) == 2 * len(page_costs.run_metrics(pages))
    below = long[long["measured_s"] < long["analytic_s"]]
    assert below.empty, below[["stage", "measured_s", "analytic_s"]]


def test_a_bound_above_a_measured_point_is_flagged_as_a_defect_of_the_bound():
    long = pd.DataFrame({"stage": ["SAM", "SAM", "LM prefill", "TPOT"], "measured_s": [1.0, 3.0, 2.0, 0.5],
                         "analytic_s": [2.0, 1.0, 1.0, float("nan")]})
    long["beats_bound"] = long["measured_s"] < long["analytic_s"]
    defects = page_costs.bound_defects(long)
    assert defects.to_dict("records") == [{"stage": "SAM", "n": 1, "of": 2, "lowest": 0.5}]
    assert page_costs.bound_defects(long.iloc[2:]).empty


def test_a_running_dataset_run_is_never_shown_as_no_runs_and_the_live_table_says_what_it_holds(no_reference):
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    assert "No dataset runs in the store yet" in shown(at, "info")
    upload_and_start(at, tokens=4, trace=True)
    assert "No dataset runs in the store yet" not in shown(at, "info")  # the run started by this very click
    job = wait_for_sweep()
    at.run()
    assert f"measured last, of {job.handled} handled so far (the run has {job.total})" in shown(at, "caption")
    live = [t.value for t in at.dataframe if "page wall (ms)" in t.value.columns][0]
    assert all(four_digits(v) for v in live["TTFT (ms)"].tolist() + live["page wall (ms)"].tolist() if v), live

    # the per-stage table: ms and GFLOP like the charts, 4 significant digits, no 'None'
    table = [t.value for t in at.dataframe if "measured / analytic" in t.value.columns][0]
    assert set(table["unit"]) == {"ms", "GFLOP", "tokens"} and "metric" not in table
    assert not any(v in ("None", "nan") for v in table.astype(str).to_numpy().ravel())
    assert all(four_digits(v) for v in table["mean"] if v), list(table["mean"])

    # TTFT and TPOT each binned over their own range, in ms, named so
    open_tab(at, "ds_view", "Distribution")
    hist = [c for c in at.get("vega_lite_chart") if '"hconcat"' in c.proto.spec][0]
    spec = json.loads(hist.proto.spec)
    titles = [panel["encoding"]["x"]["title"] for panel in spec["hconcat"]]
    assert titles == ["TTFT (ms)", "TPOT (ms)"]

    # the operators' stage table: a heading, ms and a percentage
    open_tab(at, "ds_view", "Operators")
    assert "Time per stage in the traced pages" in shown(at, "markdown")
    stages = [t.value for t in at.dataframe if "operators' self time (ms)" in t.value.columns][0]
    assert not [c for c in stages.columns if c.endswith("_us")]
    assert all(v.endswith("%") for v in stages["share of the device's self time"])


@pytest.fixture
def bundled(tmp_path, monkeypatch):
    """A fresh store beside the repository's bundled H200 runs and measured profiles (what a fresh clone has)."""
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.delenv("DSOCR_REFERENCE_DIR", raising=False)
    monkeypatch.delenv("DSOCR_PROFILES_DIR", raising=False)
    return tmp_path


def test_the_quick_cpu_profile_is_not_offered_as_a_predictor(data, cpu_quick, capsys):
    """The quick grids stop at 128-wide shapes and missed CPU runs 10-40x: the picker never offers a quick profile
    (it says which files it left out and why), an uploaded one is refused with the reason, and the CLI predicts
    with one only under a warning that it is no predictor."""
    from dsocr_core.cli import main

    at = goto(make_app(), "analytic")
    options = at.sidebar.selectbox(key="sb_profile").options
    assert not any("cpu_quick" in o for o in options) and "cpu.json (data/profiles)" in options
    side = plain(" ".join(texts(at.sidebar, "caption")))
    assert "Not offered as predictors (quick grids" in side and "cpu_quick.json" in side

    at.sidebar.selectbox(key="sb_profile").set_value("upload").run()
    at.sidebar.file_uploader(key="sb_profile_upload").set_value(
        ("mine.json", cpu_quick.read_bytes(), "application/json")).run()
    (error,) = map(plain, texts(at.sidebar, "error"))
    assert "mine.json is a quick profile" in error and "not a predictor" in error and "10x or more" in error
    assert not list((data / "uploaded_profiles").glob("*.json"))  # refused before it is kept
    assert not any("Predicted with" in t for t in texts(at, "caption"))

    assert main(["analytic", "--mode", "tiny", "--hardware", "h200", "--profile", str(cpu_quick), "--json"]) == 0
    err = capsys.readouterr().err
    assert "is a quick profile, not a predictor" in err and "miss by 10x or more" in err


def test_a_prediction_outside_the_documented_accuracy_says_so_beside_it(bundled):
    """The shipped H200 profile on the bundled H200 reference-mode run: the measured and MFU pages warn that the
    reference mode misses (SAM, CLIP and vision 22-37% over there), and the chart's legend draws 'datasheet roofline' and
    'predicted' as distinct dashes, long enough to see."""
    at = goto(make_app(), "measured")
    runs = RunStore(bundled / "runs.sqlite").list_runs()
    (ref,) = [r["id"] for r in runs if r["session_mode"] == "reference" and "H200" in r["label"]]
    at.session_state["ms_runs"] = [ref]
    pick(at, "repo:h200.json")
    (warning,) = [w for w in map(plain, texts(at, "warning")) if "This prediction is known to miss" in w]
    assert "reference session mode misses its targets (median 10%, max 25%" in warning and "22-37% over" in warning
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    dash = [layer["encoding"]["strokeDash"] for layer in spec["layer"] if "strokeDash" in layer.get("encoding", {})]
    (enc,) = dash
    assert enc["legend"]["symbolType"] == "stroke" and enc["legend"]["symbolSize"] >= 900
    ranges = dict(zip(enc["scale"]["domain"], map(tuple, enc["scale"]["range"])))
    assert {"datasheet roofline", "predicted"} <= set(ranges)
    assert ranges["datasheet roofline"] != ranges["predicted"]

    goto(at, "mfu")
    assert any("reference session mode misses" in plain(w) for w in texts(at, "warning"))


def test_a_bundled_fast_mode_run_is_not_titled_reference_and_a_refused_start_names_the_running_job(bundled):
    """'[reference, 35 points] · fast session mode' read as a contradiction: the kind is a benchmark sweep, bundled
    with the project; a start refused while a dataset run or a calibration runs names that job."""
    at = goto(make_app(), "mfu")
    titles = [o for o in at.selectbox(key="mfu_run").options if "fast session mode" in o]
    assert titles and all("[benchmark sweep, bundled, " in t and "[reference" not in t for t in titles), titles

    from ui import sweeps

    runner = sweeps.SweepRunner()
    for kind, name in (("dataset", "a dataset run"), ("calibration", "a calibration"), ("sweep", "a measured sweep")):
        runner.job = sweeps.SweepJob(name="x", label="x", total=1, kind=kind)
        assert runner.busy_message().startswith(f"{name} is already running"), kind


def test_parity_against_a_text_without_grounding_tags_says_there_is_nothing_to_compare(no_reference):
    """A vendor text with no grounding tags (and synthetic outputs without any): no 'precision 1, recall 1, F1 1,
    mean IoU None' table, but a message; every empty rendering says why it is empty."""
    at = goto(make_app(), "parity")
    at.radio(key="pa_source").set_value("upload").run()
    at.file_uploader(key="pa_upload").set_value([("page.png", page_png(640, 480, seed=3), "image/png")]).run()
    at.file_uploader(key="pa_vendor").set_value([("page.md", b"# Title\n\nJust text, no boxes.\n",
                                                  "text/plain")]).run()
    at.number_input(key="pa_tokens").set_value(4)
    at.button(key="pa_run").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    report = at.session_state["pa_results"][0].report
    assert not any(p.n_reference or p.n_other for p in report.detections.pairs)  # 4 tokens of random weights
    assert any("Nothing to compare" in i for i in texts(at, "info"))
    assert not [t for t in at.dataframe if "precision" in t.value.columns]
    captions = [c for img in at.image for c in img.captions]
    assert any(c.startswith("vendor output: 0 blocks — no grounding blocks") for c in captions), captions


def test_the_operator_breakdown_in_a_job_thread_prints_no_kineto_error():
    """kineto (torch.profiler's backend) registers its client in the thread that imports torch and prints
    "External init callback must run in same thread as registerClient" when another thread starts the first
    profiler, as the dashboard's dataset job did. The dashboard imports torch in its warm-up thread and
    initialises the profiler there; the parity page's view imports no torch before its session is loaded."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
import sys, threading
import ui.parity_view
assert "torch" not in sys.modules, "the parity page imported torch before its session"
from ui import resources
resources.torch_ready()
import torch
def job():  # a dashboard job thread: the first profiler of the process starts here
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(64) @ torch.ones(64)
    print("profiled", len(prof.key_averages()))
t = threading.Thread(target=job)
t.start()
t.join()
"""  # leaving at once: the exit waits for the rest of the warm-up (an abort here before it did)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "profiled" in out.stdout
    assert "External init callback" not in out.stderr, out.stderr[-2000:]


def test_parity_warms_both_paths_up_twice_before_it_times_them():
    """The one-shot path, timed first after one short warm-up, paid twice its later prefill on a CPU (one-shot
    TTFT 497.81 ms against 234.60 ms separated): both paths run twice untimed before either is timed."""
    from dsocr_core.measure import parity_run
    from dsocr_core.runtime.session import Session

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    calls = []
    for name in ("generate_one_shot", "generate_separated"):
        real = getattr(session, name)

        def spy(inputs, tokens, *a, _real=real, _name=name, **k):
            calls.append((_name, tokens))
            return _real(inputs, tokens, *a, **k)
        setattr(session, name, spy)
    parity_run.run_parity(session, page_png(320, 240, seed=4), mode="tiny", max_new_tokens=6)
    warm = [("generate_one_shot", 2), ("generate_separated", 2)] * 2
    assert calls[:4] == warm and calls[4:6] == [("generate_one_shot", 6), ("generate_separated", 6)], calls


def test_units_agree_between_neighbours(no_reference, tmp_path):
    """The uploader's '116.8KB' and the list's '114 KB' of one file; a PDF listed at 1190 x 1684 px and stored at
    1191 x 1684; 'three_pages.pdf p1' beside pdf_page 0; a TTFT target in s beside a TPOT target in ms."""
    from dsocr_core.measure.datasets import render_pdf_page
    from page_files import page_pdf
    from ui.dataset_results import page_numbers

    a4 = page_pdf(pages=1, width=2480, height=3508, resolution=300.0)  # 595.2 x 841.92 pt: 1190.4 px at 144 dpi
    png = page_png(900, 700, seed=5)
    at = open_tab(goto(make_app(), "measured"), "ms_tab", "Dataset runs")
    at.file_uploader(key="up_files").set_value([("a4.pdf", a4, "application/pdf"),
                                                ("page.png", png, "image/png")]).run()
    captions = shown(at, "caption")
    assert f"{len(png) / 1e3:,.1f} KB" in captions and f"{len(a4) / 1e3:,.1f} KB" in captions, captions
    (pdf_file,) = list(tmp_path.glob("**/uploads/**/*.pdf"))  # the stored upload
    assert render_pdf_page(pdf_file, 0).size == (1191, 1684)
    assert "1191x1684 px (p1, 144 dpi)" in captions.replace(" x ", "x"), captions

    pages = pd.DataFrame({"label": ["three_pages.pdf p1", "page.png"], "pdf_page": [0, None]})
    assert page_numbers(pages)["PDF page"].tolist()[0] == 1 and pd.isna(page_numbers(pages)["PDF page"][1])

    open_tab(goto(at, "analytic"), "an_tab", "Capacity")
    labels = [n.label for n in at.number_input if n.key in ("an_ttft", "an_tpot")]
    assert labels == ["TTFT target (ms)", "TPOT target (ms)"]


def test_no_text_is_cut_and_overlapping_configurations_stay_visible(bundled):
    """'gun…' in the Modes chip and 'sequence length (' in the x-axis selector (each had a sixth of the row);
    the MFU summary's fifteen columns cut at the right; the time tab's y title longer than its chart; '1e+4'
    beside '1,000' on an axis; configuration B's line drawn over an identical A with nothing to tell them apart."""
    from test_app_usability import widths

    at = goto(make_app(), "measured")
    share = {getattr(e, "key", None): w for e, w in widths(at.main)}
    assert share["ms_f_modes"] >= 0.35 and share["ms_f_x"] >= 0.35, share
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert "~g" not in json.dumps(spec)  # no exponent notation on any axis or tooltip

    goto(at, "mfu")
    assert {getattr(e, "key", None): w for e, w in widths(at.main)}["mfu_run"] == 1.0  # a 150-character title
    summary = [f.value for f in at.dataframe if "figure" in f.value.columns][0]
    assert len(summary.columns) <= 9 and "SAM" in summary.columns

    at = open_tab(goto(at, "analytic"), "an_tab", "Time")
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    enc = spec.get("encoding") or spec["spec"]["encoding"]
    assert enc["y"]["title"] == "time per stage (ms)"
    width = enc["strokeWidth"]["scale"]["range"]
    assert width[0] > width[1]  # A thick under B thin: where they coincide, both show
