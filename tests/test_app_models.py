"""The dashboard with a model picker: DeepSeek-OCR 2 chosen in the sidebar drives the analytic page (its one mode,
its encoder stage), the measured sweeps and dataset runs started from the pages (its mode and crop range, its
stages stored), the fast session mode says it is DeepSeek-OCR only, the overview loads the tiny v2 model, and the
analytic page's "Models compared" tab overlays both models' stages for the same pages."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsocr_core.analytic.models import models_on_pages
from dsocr_core.grounding.samples import sample_pages
from dsocr_core.hardware import get_hardware
from dsocr_core.results import dataset_stats
from dsocr_core.results.runs import run_model
from dsocr_core.results.store import RunStore
from test_app import (chart_rows, charts, goto, make_app, no_reference, open_tab, texts,  # noqa: F401
                      wait_for_sweep)


@pytest.fixture
def v2_app(no_reference):
    at = make_app()
    at.sidebar.selectbox(key="sb_model").set_value("deepseek-ocr2").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_model_picker_lists_both_families_and_defaults_to_v1(no_reference):
    at = make_app()
    picker = at.sidebar.selectbox(key="sb_model")
    assert picker.value == "deepseek-ocr" and set(picker.options) == {"DeepSeek-OCR", "DeepSeek-OCR 2"}


def test_v2_analytic_page_has_its_mode_and_encoder_stage(v2_app):
    at = goto(v2_app, "analytic")
    assert at.selectbox(key="an_a_mode_deepseek-ocr2").options == ["dynamic"]
    assert "official DeepSeek-OCR 2" in at.selectbox(key="an_spec").options[0]
    assert chart_rows(charts(at)[0]) == 2 * 16 * 5  # two configurations x crop counts 1..16 x five stages
    modules = open_tab(at, "an_tab", "Per module").dataframe[0].value
    assert set(modules["stage"]) >= {"sam", "encoder", "projector"} and "clip" not in set(modules["stage"])


def test_fast_mode_says_it_runs_v1_only(v2_app):
    assert any("DeepSeek-OCR 2 runs in the reference mode" in c for c in texts(v2_app.sidebar, "caption"))
    v2_app.sidebar.radio(key="sb_session_mode").set_value("fast").run()
    assert any("Fast mode runs DeepSeek-OCR only" in w for w in texts(v2_app.sidebar, "warning"))


def test_overview_loads_the_tiny_v2_model(v2_app):
    at = goto(v2_app, "overview")
    assert any("DeepSeek-OCR 2" in s for s in texts(at.main, "warning"))  # the labelled synthetic model
    assert any("synthetic tiny DeepSeek-OCR 2 dimensions" in c for c in texts(at.main, "caption"))


def test_models_compared_tab_overlays_both_models(no_reference):
    at = goto(make_app(), "analytic")
    open_tab(at, "an_tab", "Models compared")
    chart = charts(at)[0]
    expected = models_on_pages([(1920, 1080)], get_hardware("h200"))  # the first page of the default list
    assert any("DeepSeek-OCR 2**: grid 2x1, 545 image slots" in c for c in texts(at.main, "caption"))
    assert chart_rows(chart) == len(expected)  # the first page: both models' stages, none dropped
    table = at.dataframe[0].value
    row = table[(table["page"] == "1920x1080") & (table["model_label"] == "DeepSeek-OCR 2")].iloc[0]
    assert row["image_slots"] == 545 and row["grid"] == "2x1"
    assert set(table["model_label"]) == {"DeepSeek-OCR", "DeepSeek-OCR 2"}
    at.radio(key="an_models_metric").set_value("flops").run()
    assert not at.exception and chart_rows(charts(at)[0]) == len(expected)
    at.text_input(key="an_models_pages").set_value("1920 by 1080").run()
    assert any("not WIDTHxHEIGHT" in e for e in texts(at.main, "error"))


def test_v2_measured_sweep_from_the_page_stores_the_encoder(v2_app):
    at = open_tab(goto(v2_app, "measured"), "ms_tab", "New sweep")
    assert at.multiselect(key="ms_modes_deepseek-ocr2").value == ["dynamic"]
    at.text_input(key="ms_grids").set_value("1x1")
    at.text_input(key="ms_steps").set_value("1")
    at.number_input(key="ms_repeats_cpu").set_value(1)
    at.number_input(key="ms_warmup_cpu").set_value(0)
    at.button(key="ms_start").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    job = wait_for_sweep()
    assert job.error is None and job.handled == 1
    store = RunStore()
    run = store.get_run(job.run_id)
    assert run_model(run) == "deepseek-ocr2" and "DeepSeek-OCR 2" in run["meta"]["model_label"]
    assert {"sam", "encoder", "projector"} <= set(store.points(job.run_id)["stage"].dropna())
    at = goto(at, "mfu")  # the run's own model spec joins its points: MFU per stage, the encoder among them
    assert at.selectbox(key="mfu_run").value == job.run_id and len(charts(at)) == 3
    table = at.dataframe[-1].value
    assert "encoder" in set(table["stage"]) and "clip" not in set(table["stage"])


def test_v2_dataset_run_from_the_page(v2_app, tmp_path):
    import shutil

    pages = tmp_path / "pages"
    pages.mkdir()
    shutil.copy(sample_pages()[-1], pages / "card.png")
    at = open_tab(goto(v2_app, "measured"), "ms_tab", "Dataset runs")
    at.radio(key="ds_source_kind").set_value("path").run()
    assert at.selectbox(key="ds_mode_deepseek-ocr2").value == "dynamic"
    assert at.number_input(key="ds_max_crops_deepseek-ocr2").value == 6
    at.text_input(key="ds_source").set_value(str(pages))
    at.number_input(key="ds_pages_path").set_value(1)
    at.number_input(key="ds_tokens").set_value(2)
    [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0].click().run()
    assert not at.exception and not at.error, texts(at, "error")
    job = wait_for_sweep()
    assert job.kind == "dataset" and job.error is None and job.handled == 1
    table = dataset_stats.page_table(RunStore(), job.run_id, analytic=False)
    assert table["encoder_s"].iloc[0] > 0 and table["mode"].iloc[0] == "dynamic"
    # the same page under DeepSeek-OCR, then the two runs side by side on the dataset page
    at.sidebar.selectbox(key="sb_model").set_value("deepseek-ocr").run()
    at.radio(key="ds_source_kind").set_value("path").run()
    at.text_input(key="ds_source").set_value(str(pages))
    at.number_input(key="ds_pages_path").set_value(1)
    at.number_input(key="ds_tokens").set_value(2)
    [b for b in at.get("form_submit_button") if "dataset" in b.proto.label.lower()][0].click().run()
    v1_job = wait_for_sweep()
    assert v1_job.error is None and v1_job.handled == 1
    at.run()
    open_tab(at, "ds_view", "Compare runs")
    assert at.selectbox(key="ds_compare").value == job.run_id
    assert any("A runs DeepSeek-OCR, B DeepSeek-OCR 2" in c for c in texts(at, "caption"))
    stages = at.dataframe[-1].value
    assert {"CLIP", "encoder", "SAM", "TTFT"} <= set(stages["stage"]) and len(charts(at)) == 2


def test_v2_parity_page_passes_with_boxes(v2_app):
    at = goto(v2_app, "parity")
    assert at.selectbox(key="pa_mode_deepseek-ocr2").options == ["dynamic"]
    at.number_input(key="pa_tokens").set_value(6)
    at.button(key="pa_run").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    assert any("Parity passed" in s and "DeepSeek-OCR 2" in s for s in texts(at, "success"))
    rows = [str(r) for df in at.dataframe for r in df.value.iloc[:, 0]]
    assert "encoder" in rows and "CLIP" not in rows  # the timing table: the model's own stages
    exported = json.loads(at.session_state["pa_results"][0].export())
    assert exported["passed"] and exported["session"]["model"] == "deepseek-ocr2"


def test_models_compared_re_predicts_the_shipped_gpu_runs_without_a_gpu(tmp_path):
    """benchmarks/models_compared.py --from-stores: the H100 runs shipped in docs/results, re-predicted with the
    shipped H100 profile, give the table the README quotes (measured ms and the prediction's error per stage)."""
    import shutil
    import sys

    root = Path(__file__).resolve().parents[1]
    shipped = root / "docs" / "results" / "h100_models_compared"
    for name in ("deepseek-ocr.sqlite", "deepseek-ocr2.sqlite"):
        shutil.copy(shipped / name, tmp_path / name)
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import models_compared
    finally:
        sys.path.remove(str(root / "benchmarks"))
    assert models_compared.main(["--out", str(tmp_path), "--profile", str(root / "data/profiles/h100.json"),
                                 "--from-stores"]) == 0
    table = (tmp_path / "models_compared.md").read_text().splitlines()
    assert "NVIDIA H100" in table[0] and "re-predicted" in table[0]
    assert table[2:] == (shipped / "models_compared.md").read_text().splitlines()[2:]
    readme = (root / "README.md").read_text()
    assert "| 1920x1080 | DeepSeek-OCR 2 | 2x1 | 23.01 (+25%) | 29.39 (+26%) |" in readme
    assert "| 1920x1080 | DeepSeek-OCR 2 | 2x1 | 555 | sam | 23.006 | 4.646 | 28.737 | +25% |" in table
