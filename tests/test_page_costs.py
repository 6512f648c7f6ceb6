"""Per-page costs of a dataset run over uploaded pages (issue 18), on the synthetic tiny model on the CPU: each
page's stage times beside the analytic bound and the predicted time (a CPU quick calibration profile), the spread
per stage, the slowest pages, two runs joined on the same pages, readable operator names, and the charts built
from them (the predicted series drawn when a prediction is given)."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from dsocr_core.measure import dataset_run, datasets
from dsocr_core.measure.kernel_names import short_name
from dsocr_core.measure.uploads import UploadStore
from dsocr_core.results import dataset_stats as stats
from dsocr_core.results import page_costs as pc
from dsocr_core.results.store import RunStore
from page_files import page_jpeg, page_pdf, page_png

os.environ["DSOCR_VALIDATE_CHARTS"] = "1"  # the charts below are checked against the Vega-Lite schema


@pytest.fixture(scope="module")
def session():
    from dsocr_core.runtime.session import Session

    return Session.load(synthetic="tiny", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def quick_prediction():
    """A prediction Hardware from `calibrate --device cpu --quick` (microbenchmarks only, about 2 s)."""
    from dsocr_core.analytic.predict import profile_hardware, with_profile
    from dsocr_core.calibration.microbench import run_microbench

    profile = run_microbench("cpu", quick=True, budget_s=30)
    return with_profile(profile_hardware(profile), profile, "reference")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, session):
    """Two dataset runs (2 epochs, then 1) over the same uploads: an image, a 2-page PDF and a file that went
    missing after upload (recorded as an error; the run goes on)."""
    tmp = tmp_path_factory.mktemp("costs")
    ups = UploadStore(tmp / "uploads")
    for name, data in (("a.jpg", page_jpeg(900, 500)), ("doc.pdf", page_pdf(2)), ("gone.png", page_png(seed=5))):
        assert ups.add(name, data).added
    gone = [u for u in ups.list() if u.name == "gone.png"][0]
    data = ups.dataset()
    ups.path(gone).unlink()
    store = RunStore(tmp / "runs.sqlite")
    settings = dataset_run.ProfileSettings(mode="tiny", max_new_tokens=2)
    ids = []
    for epochs in (2, 1):
        run_id = dataset_run.create_dataset_run(store, session, data, settings, {"n": None, "epochs": epochs})
        dataset_run.run_dataset(session, store, run_id, datasets.sample(data.pages, None, epochs), settings)
        ids.append(run_id)
    return store, ids


def test_each_page_beside_its_analytic_bound_and_prediction(two_runs, quick_prediction):
    from dsocr_core.hardware import get_hardware

    store, (run_id, _) = two_runs
    pages = stats.page_table(store, run_id, get_hardware("h200"), prediction=quick_prediction)
    assert (pages["status"] == "done").sum() == 6 and (pages["status"] == "error").sum() == 2  # 3 pages x 2 epochs
    done = pages[pages["status"] == "done"]
    for m in ("sam_s", "prefill_s", "ttft_s", "tpot_s", "decode_s"):
        assert done[f"analytic_{m}"].gt(0).all() and done[f"predicted_{m}"].gt(0).all(), m
    np.testing.assert_allclose(done["predicted_ttft_s"], done["predicted_vision_s"] + done["predicted_prefill_s"])
    long = pc.page_stage_long(pages)
    metrics = pc.run_metrics(pages)  # a DeepSeek-OCR run: its own stages (CLIP), not the encoder
    assert "clip_s" in metrics and "encoder_s" not in metrics
    assert set(long["stage"]) == {pc.METRICS[m] for m in metrics} and len(long) == 6 * len(metrics)
    assert long[["measured_s", "analytic_s", "predicted_s"]].notna().all().all()
    assert set(long["crop_count"]) == {1.0} and long["prompt_tokens"].nunique() == 1  # tiny mode: one global view
    assert done["source"].str.endswith((".jpg", ".pdf")).all()
    no_pred = pc.page_stage_long(stats.page_table(store, run_id, get_hardware("h200")))
    assert no_pred["predicted_s"].isna().all() and no_pred["analytic_s"].notna().all()


def test_the_charts_draw_the_bound_and_the_prediction(two_runs, quick_prediction):
    from dsocr_core.hardware import get_hardware
    from ui import dataset_charts

    store, (run_id, _) = two_runs
    view = stats.load_dataset_run(store, run_id, get_hardware("h200"), prediction=quick_prediction)
    long = pc.page_stage_long(view.pages)
    for x in pc.X_AXES:
        spec = dataset_charts.page_stages(long, x).to_dict()  # validated against the Vega-Lite schema
        series = {row["series"] for data in spec["datasets"].values() for row in data}
        assert series == {"measured", "analytic bound", "predicted"}
    spec = dataset_charts.page_stages(pc.page_stage_long(stats.page_table(store, run_id, get_hardware("h200"))))
    assert {r["series"] for d in spec.to_dict()["datasets"].values() for r in d} == {"measured", "analytic bound"}
    dataset_charts.spread(pc.stage_spread(view.pages)).to_dict()


def test_spread_slowest_pages_and_page_means(two_runs):
    store, (run_id, _) = two_runs
    pages = stats.page_table(store, run_id, analytic=False)
    spread = pc.stage_spread(pages)
    assert list(spread["stage"]) == [pc.METRICS[m] for m in pc.run_metrics(pages)]
    assert (spread["n"] == 6).all()
    assert (spread["min"] <= spread["p10"]).all() and (spread["p10"] <= spread["median"]).all()
    assert (spread["median"] <= spread["p90"]).all() and (spread["p90"] <= spread["max"]).all()
    ttft = pages.loc[pages["status"] == "done", "ttft_s"]
    assert spread.set_index("metric").loc["ttft_s", "p90"] == pytest.approx(np.percentile(ttft, 90))
    means = pc.page_means(pages)
    assert len(means) == 3 and (means["epochs"] == 2).all()
    slow = pc.slowest_pages(pages, "wall_s", n=3)
    assert len(slow) == 3 and slow["wall_s"].is_monotonic_decreasing
    assert slow["wall_s"].iloc[0] == pytest.approx(means["wall_s"].max())


def test_two_runs_side_by_side_on_the_same_pages(two_runs):
    store, (a, b) = two_runs
    pa, pb = (stats.page_table(store, r, analytic=False) for r in (a, b))
    cmp = pc.compare_runs(pa, pb)
    assert (cmp.shared, cmp.only_a, cmp.only_b, cmp.joined_on) == (3, 0, 0, "file")
    metrics = pc.run_metrics(pa, pb)
    assert list(cmp.stages["stage"]) == [pc.METRICS[m] for m in metrics] and (cmp.stages["n"] == 3).all()
    row = cmp.stages.set_index("metric").loc["ttft_s"]
    assert row["b_over_a"] == pytest.approx(row["median_b"] / row["median_a"])
    assert len(cmp.pages) == 3 * len(metrics)
    renamed = pb.assign(source=pb["source"].str.replace("/uploads/", "/elsewhere/"))  # another machine's paths
    again = pc.compare_runs(pa, renamed)
    assert again.joined_on == "name" and again.shared == 3


def test_operator_names_are_shortened_and_folded():
    ops = pd.DataFrame([
        {"stage": "decode", "device": "cuda", "operator": "void at::native::vectorized_elementwise_kernel<4, "
         "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
         "at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<float, float, float, "
         "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)", "calls": 10,
         "self_us": 500.0, "share": 0.5, "stage_total_us": 1000.0, "rank": 1},
        {"stage": "decode", "device": "cuda", "operator": "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_"
         "s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_"
         "tn_align8::Params)", "calls": 4, "self_us": 300.0, "share": 0.3, "stage_total_us": 1000.0, "rank": 2},
        *({"stage": "decode", "device": "cuda", "operator": f"aten::op{i}", "calls": 1, "self_us": 20.0,
           "share": 0.02, "stage_total_us": 1000.0, "rank": 3 + i} for i in range(10)),
    ])
    out = pc.operator_breakdown(ops, top=3)
    assert list(out["short"][:2]) == ["vectorized_elementwise_kernel · MulFunctor",
                                      "cutlass_80_wmma_tensorop_bf16_s161616…32_128x2_tn_align8"]
    assert out["operator"].iloc[0].startswith("void at::native::")  # the full name stays beside it
    assert list(out["short"]) [-1] == "(other operators)" and len(out) == 4
    assert out["self_ms"].sum() == pytest.approx(1.0) and out["calls"].sum() == 24
    assert short_name("aten::mm") == "aten::mm" and short_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert short_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                      "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)") == \
        "cunn_SoftMaxForward"
    assert short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert len(short_name("x" * 300)) == 56
    assert json.dumps(out.to_dict(orient="records"))  # plain values, ready for a chart


def test_thumbnails_of_images_and_pdf_pages(tmp_path):
    ups = UploadStore(tmp_path)
    ups.add("a.png", page_png(800, 1000))
    ups.add("doc.pdf", page_pdf(2, 600, 800))
    data = ups.dataset()
    img = datasets.thumbnail(data.pages[0], max_side=200)
    assert max(img.size) == 200 and img.mode == "RGB"
    pdf = datasets.thumbnail(data.pages[2], max_side=200)  # 600 x 800 pt... page 2 rendered at 36 dpi, then cut
    assert max(pdf.size) <= 200
