"""DeepSeek-OCR 2 through the measuring side on the CPU (tiny random weights): a measured sweep stores its own
stages (encoder, not clip) and joins the analytic model, a dataset run's page table and summary carry them and
compare with a DeepSeek-OCR run on the same page, and the parity run compares the separated and one-shot paths
with boxes."""
import pytest
import torch
from PIL import Image

from dsocr_core.measure.datasets import discover, sample
from dsocr_core.measure.dataset_run import ProfileSettings, check_resume, create_dataset_run, run_dataset
from dsocr_core.measure.parity_run import run_parity
from dsocr_core.measure.sweep import run_sweep, sweep_workloads
from dsocr_core.results import dataset_stats, page_costs
from dsocr_core.results.analytic_join import compare_run
from dsocr_core.results.runs import run_model, run_spec
from dsocr_core.results.store import RunStore
from dsocr_core.runtime.session import Session
from dsocr_core.spec import Workload
from dsocr_core.spec_v2 import OCR2Spec


@pytest.fixture(scope="module")
def session():
    return Session.load(synthetic="tiny", model="deepseek-ocr2", device="cpu", dtype="float32")


def test_measured_v2_sweep_stores_its_stages_and_joins_the_analytic_model(session, tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    workloads = sweep_workloads(["dynamic"], [(1, 1)], [10], [1], [2], dtype="float32")
    page = Workload(mode="dynamic", image_size=(1920, 1080), text_tokens=10, decode_steps=2, dtype="float32")
    run_id = run_sweep(session, store, [*workloads, page], name="v2 tiny", repeats=1, warmup=0)
    run = store.get_run(run_id)
    assert run_model(run) == "deepseek-ocr2" and isinstance(run_spec(run), OCR2Spec)
    stages = set(store.points(run_id)["stage"].dropna())
    assert {"sam", "encoder", "projector", "vision", "prefill", "decode"} <= stages and "clip" not in stages
    joined = compare_run(store, run_id)
    enc = joined[joined["stage"] == "encoder"]
    assert (enc["measured_tensor_flops"] == enc["analytic_tensor_flops"]).all()  # counted on our model = formula
    assert list(enc["grid"]) == ["1x1", "2x1"]  # the page size's grid, chosen by the vendor rule, is stored
    assert list(enc["sequence"]) == [257 + 10, 545 + 10]  # BOS, the image slots, 9 text ids


def _dataset_run(session, store, pages, mode: str) -> str:
    settings = ProfileSettings(mode=mode, max_new_tokens=3, **dict(zip(("min_crops", "max_crops"),
                                                                         session.family.modes[mode].crop_range)))
    dataset = discover(pages)
    samples = sample(dataset.pages, None, 1, 0, "fixed")
    run_id = create_dataset_run(store, session, dataset, settings.validate(), {"samples": len(samples)})
    run_dataset(session, store, run_id, samples, settings)
    return run_id


def test_v2_dataset_run_pages_carry_the_encoder_and_compare_with_a_v1_run(session, tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    Image.new("RGB", (700, 500), (250, 250, 250)).save(pages / "a.png")  # <= 768 px: the global view only
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = _dataset_run(session, store, pages, "dynamic")
    table = dataset_stats.page_table(store, run_id)
    row = table.iloc[0]
    assert row["status"] == "done" and row["image_slots"] == 257
    assert row["encoder_s"] > 0 and torch.isnan(torch.tensor(row["clip_s"]))
    assert row["encoder_flops"] == row["analytic_encoder_tensor_flops"]
    summary = dataset_stats.stage_summary(table)
    assert "encoder" in set(summary["stage"]) and "clip" not in set(summary["stage"])
    # the same page under DeepSeek-OCR: the two runs side by side, each model's own second vision stage kept
    v1 = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="model deepseek-ocr2 -> deepseek-ocr"):  # no run mixes the two models
        check_resume(store, run_id, v1, discover(pages), ProfileSettings(mode="dynamic", min_crops=2, max_crops=6,
                                                                         max_new_tokens=3))
    v1_table = dataset_stats.page_table(store, _dataset_run(v1, store, pages, "tiny"), analytic=False)
    cmp = page_costs.compare_runs(v1_table, table)
    stages = cmp.stages.set_index("metric")
    assert cmp.shared == 1 and stages.loc["sam_s", "n"] == 1 and stages.loc["ttft_s", "b_over_a"] > 0
    assert stages.loc["clip_s", "n"] == 0 and stages.loc["clip_s", "median_a"] > 0
    assert stages.loc["encoder_s", "n"] == 0 and stages.loc["encoder_s", "median_b"] > 0


def test_the_fast_session_mode_is_refused_for_v2(session, capsys):
    from dsocr_core.cli import main

    with pytest.raises(ValueError, match="fast engine runs DeepSeek-OCR only; run DeepSeek-OCR 2 in the reference"):
        session.with_mode("fast")
    assert main(["generate", "--synthetic", "tiny", "--model", "deepseek-ocr2", "--device", "cpu",
                 "--session-mode", "fast"]) == 2
    assert "fast engine runs DeepSeek-OCR only" in capsys.readouterr().err


def test_v2_parity_run_matches_with_boxes(session):
    report = run_parity(session, Image.new("RGB", (640, 480), (255, 255, 255)), max_new_tokens=6, warmup=False)
    assert report.mode == "dynamic" and report.grid == (1, 1)
    assert report.token_equal and report.passed
    timings = report.timings()["separated"]
    assert timings["encoder"] > 0 and "clip" not in timings
    assert report.to_dict()["session"]["model"] == "deepseek-ocr2"


def test_scale_out_workers_load_the_chosen_model(monkeypatch):
    """--model reaches the Ray workers' Session.load, and the lead's facts name the model's stages."""
    import argparse

    from dsocr_core.measure import scale_out

    seen = {}
    monkeypatch.setattr(scale_out.WorkerPool, "start", classmethod(lambda cls, load_args, **kw: seen.update(load_args)))
    args = argparse.Namespace(workers="2", checkpoint=None, synthetic="tiny", weights_seed=0, session_mode="reference",
                              device="cpu", dtype="float32", attn="sdpa", model="deepseek-ocr2", ray_address=None,
                              allow_mixed_gpus=False)
    scale_out.pool_from_args(args)
    assert seen["model"] == "deepseek-ocr2"
    lead = scale_out.RemoteSession({"weights": {}, "dtype": "float32", "attn_impl": "sdpa", "session_mode": "reference",
                                    "device": "cpu", "spec": OCR2Spec(), "describe": {}})
    assert lead.family.name == "deepseek-ocr2" and lead.vision_stages == ("sam", "encoder", "projector")
