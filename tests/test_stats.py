"""Dataset-run statistics on a run store filled by hand (known numbers), and the analytic join."""
import numpy as np
import pandas as pd
import pytest

from dsocr_core.analytic import stage_totals
from dsocr_core.hardware import get_hardware
from dsocr_core.measure.operators import OperatorProfile, group_events
from dsocr_core.spec import Workload, tiny_spec
from dsocr_core.results.dataset_stats import (decode_steps, distributions, load_dataset_run, operator_stages,
                              operator_table, page_means, page_table, run_stages, run_summary, stage_summary)
from dsocr_core.results.store import RunStore, stage_stats

SPEC = tiny_spec()
H200 = get_hardware("h200")
# (page, epoch, grid, text tokens, decode step times, sam, prefill, wall)
PAGES = [
    ("a.png", 0, (1, 1), 10, [0.010, 0.012, 0.011], 0.20, 0.30, 0.70),
    ("b.png", 0, (2, 3), 10, [0.020, 0.022], 0.60, 0.90, 1.80),
    ("a.png", 1, (1, 1), 10, [0.009, 0.013, 0.011], 0.22, 0.28, 0.72),
    ("doc.pdf", 0, (2, 2), 12, [], 0.50, 0.70, 1.40),
]
SLOTS = {(1, 1): 273, (2, 3): 273 + 20 * 31, (2, 2): 273 + 20 * 21}


@pytest.fixture()
def run(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.create_run("dataset", "hand-made", {"device": "cpu"}, {"source": "synthetic", "synthetic": True},
                              dtype="bfloat16", attn="sdpa",
                              meta={"spec": SPEC.model_dump(mode="json"), "settings": {"logits": "all"}})
    for i, (page, epoch, grid, text, steps, sam, prefill, wall) in enumerate(PAGES):
        stages = {"sam": {**stage_stats([sam]), "flops": 1000 + i}, "clip": stage_stats([0.05]),
                  "projector": stage_stats([0.01]), "vision": stage_stats([sam + 0.06]),
                  "prefill": {**stage_stats([prefill]), "flops": 5000}}
        if steps:
            stages["decode"] = stage_stats([sum(steps)])
            stages["decode_step"] = stage_stats(steps)
        seq = SLOTS[grid] + text
        store.put_point(run_id, {"page": page, "pdf_page": 0 if page.endswith(".pdf") else None, "epoch": epoch},
                        "done", stages=stages, kv_bytes=1234,
                        resolved={"mode": "gundam", "grid": grid, "image_size": (1000, 1400), "image_slots": SLOTS[grid],
                                  "sequence": seq, "text_tokens": text, "batch": 1, "decode_steps": len(steps)},
                        extra={"label": page, "generated_tokens": len(steps) + 1, "eos": not steps,
                               "text": "<|ref|>title<|/ref|><|det|>[[1, 2, 30, 40]]<|/det|>\nHi",
                               "detections": {"blocks": 1, "labels": {"title": 1}},
                               "decode_steps_s": steps, "ttft_s": sam + 0.06 + prefill,
                               "tpot_s": float(np.median(steps)) if steps else None,
                               "preprocess_s": 0.05, "generation_s": wall - 0.05, "wall_s": wall})
    store.put_point(run_id, {"page": "broken.png", "pdf_page": None, "epoch": 0}, "error", "broken.png: not an image",
                    extra={"label": "broken.png"})
    return store, run_id


def test_page_table_one_row_per_sample(run):
    store, run_id = run
    pages = page_table(store, run_id, analytic=False)
    assert len(pages) == 5 and list(pages["status"]) == ["done"] * 4 + ["error"]
    a0 = pages.iloc[0]
    assert (a0["page"], a0["epoch"], a0["grid"], a0["prompt_tokens"]) == ("a.png", 0, "1x1", 283)
    assert a0["decode_s"] == pytest.approx(0.033) and a0["sam_flops"] == 1000 and a0["blocks"] == 1
    assert a0["labels"] == "title 1" and a0["generated_tokens"] == 4
    pdf = pages.iloc[3]
    assert pdf["pdf_page"] == 0 and pdf["decode_s"] == 0.0 and pdf["decode_flops"] == 0  # no decode step
    bad = pages.iloc[4]
    assert bad["message"] == "broken.png: not an image" and pd.isna(bad["sam_s"]) and pd.isna(bad["grid"])


def test_stage_summary_matches_numpy(run):
    store, run_id = run
    summary = stage_summary(page_table(store, run_id, analytic=False)).set_index("metric")
    sam = np.array([p[5] for p in PAGES])
    row = summary.loc["sam_s"]
    assert row["n"] == 4  # the error sample is left out
    assert row["mean"] == pytest.approx(sam.mean()) and row["median"] == pytest.approx(np.median(sam))
    assert row["p90"] == pytest.approx(np.percentile(sam, 90)) and row["std"] == pytest.approx(sam.std())
    assert (row["min"], row["max"]) == (pytest.approx(sam.min()), pytest.approx(sam.max()))
    tpot = [np.median(p[4]) for p in PAGES if p[4]]
    assert summary.loc["tpot_s", "n"] == 3 and summary.loc["tpot_s", "mean"] == pytest.approx(np.mean(tpot))
    assert summary.loc["generated_tokens", "mean"] == pytest.approx(np.mean([len(p[4]) + 1 for p in PAGES]))
    assert summary.loc["ttft_s", "stage"] == "time to first token"


def test_analytic_prediction_beside_each_page(run):
    store, run_id = run
    pages = page_table(store, run_id, hardware=H200)
    for _, p in pages[pages["status"] == "done"].iterrows():
        w = Workload(mode="gundam", crops=(int(p["grid_w"]), int(p["grid_h"])), text_tokens=int(p["text_tokens"]),
                     decode_steps=int(p["decode_steps"]), dtype="bfloat16", attn="sdpa", logits="all")
        expect = stage_totals(SPEC, w, H200)
        assert run_stages(pages) == ("sam", "clip", "projector", "vision", "prefill", "decode")  # the run's model
        assert np.isnan(p["analytic_encoder_tensor_flops"])  # DeepSeek-OCR 2's stage: no figure for this run
        for s in run_stages(pages):
            assert p[f"analytic_{s}_tensor_flops"] == pytest.approx(expect[s]["tensor_flops"])
            assert p[f"analytic_{s}_s"] == pytest.approx(expect[s]["time_s"])
        assert p["analytic_ttft_s"] == pytest.approx(expect["vision"]["time_s"] + expect["prefill"]["time_s"])
        if p["decode_steps"]:
            assert p["analytic_tpot_s"] == pytest.approx(expect["decode"]["time_s"] / p["decode_steps"])
        else:
            assert np.isnan(p["analytic_tpot_s"])
    assert pages.iloc[4][[c for c in pages if c.startswith("analytic_")]].isna().all()
    summary = stage_summary(pages).set_index("metric")
    assert summary.loc["prefill_s", "analytic_mean"] == pytest.approx(pages["analytic_prefill_s"].mean())
    assert summary.loc["prefill_s", "measured_over_analytic"] == pytest.approx(
        summary.loc["prefill_s", "mean"] / summary.loc["prefill_s", "analytic_mean"])
    # a CPU run without a hardware: FLOPs predicted, no time
    cpu = page_table(store, run_id)
    assert "analytic_prefill_tensor_flops" in cpu and "analytic_prefill_s" not in cpu


def test_distributions_steps_means_and_summary(run):
    store, run_id = run
    pages = page_table(store, run_id, analytic=False)
    lat = distributions(pages)
    assert set(lat["metric"]) == {"ttft_s", "tpot_s"}
    assert (lat["metric"] == "ttft_s").sum() == 4 and (lat["metric"] == "tpot_s").sum() == 3  # no steps: no TPOT
    by_stage = distributions(pages, [f"{s}_s" for s in run_stages(pages)])
    assert len(by_stage) == 4 * 6
    steps = decode_steps(store, run_id, pages)
    assert len(steps) == 8 and list(steps["step"][:3]) == [1, 2, 3]
    assert list(steps["context"][:3]) == [283, 284, 285]
    means = page_means(pages).set_index("page")
    assert means.loc["a.png", "epochs"] == 2 and means.loc["a.png", "sam_s"] == pytest.approx(0.21)
    s = run_summary(store, run_id, pages)
    assert (s["samples"], s["done"], s["error"], s["oom"]) == (5, 4, 1, 0)
    assert s["pages_per_s"] == pytest.approx(4 / sum(p[7] for p in PAGES))
    assert s["tokens_per_page"] == pytest.approx(np.mean([len(p[4]) + 1 for p in PAGES]))
    assert s["errors"] == [{"label": "broken.png", "message": "broken.png: not an image"}]
    assert s["flags"]["synthetic_weights"] and s["flags"]["cpu"]


def test_operator_tables_from_the_run_meta(run):
    from types import SimpleNamespace
    from torch.autograd import DeviceType

    store, run_id = run
    assert operator_table(store, run_id).empty and operator_stages(store, run_id).empty
    rng = SimpleNamespace(name="dsocr::prefill", device_type=DeviceType.CPU, is_async=False, cpu_parent=None,
                          cpu_children=[], kernels=[], cpu_time_total=10.0, self_cpu_time_total=4.0)
    mm = SimpleNamespace(name="aten::mm", device_type=DeviceType.CPU, is_async=False, cpu_parent=rng,
                         cpu_children=[], kernels=[], cpu_time_total=6.0, self_cpu_time_total=6.0)
    ops, stages = group_events([rng, mm])
    store.update_run(run_id, meta={"operators": OperatorProfile(ops, stages, ["a.png"]).to_meta()})
    table = operator_table(store, run_id, stage="prefill", device="cpu")
    assert list(table["operator"]) == ["aten::mm", "(untraced: Python and non-torch work)"]
    assert table["share"].tolist() == pytest.approx([0.6, 0.4])
    assert operator_stages(store, run_id).iloc[0]["total_us"] == 10.0
    view = load_dataset_run(store, run_id, H200)
    assert len(view.pages) == 5 and len(view.operators) == 2 and view.summary["operators"]


def test_empty_run(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.create_run("dataset", "empty", {"device": "cpu"}, {"source": "synthetic"})
    view = load_dataset_run(store, run_id)
    assert view.pages.empty and view.summary["done"] == 0 and view.summary["pages_per_s"] is None
    assert (view.stages["n"] == 0).all() and view.latency.empty and view.steps.empty
