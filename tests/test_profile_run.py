"""Dataset runs on a tiny random checkpoint (official format, loaded as a user would) over the project's sample
pages: stored points, corrupt pages, resume, FLOPs, the CLI."""
import json
import shutil

import pytest

from dsocr_core.cli import main
from dsocr_core.measure.datasets import discover, sample
from dsocr_core.model.checkpoint import save_checkpoint, synthetic_model
from dsocr_core.measure.dataset_run import FlopCache, ProfileSettings, check_resume, create_dataset_run, run_dataset
from dsocr_core.measure.stage_stats import timed_generation
from dsocr_core.runtime.flops import decode_flops_total
from dsocr_core.runtime.tokens import trim_at_eos
from dsocr_core.grounding.samples import sample_pages
from dsocr_core.runtime.session import Session
from dsocr_core.spec import tiny_spec
from dsocr_core.results.store import RunStore

SAMPLES = {p.stem: p for p in sample_pages()}
FAST = ProfileSettings(mode="tiny", max_new_tokens=3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    spec = tiny_spec()
    save_checkpoint(synthetic_model(spec, seed=5, dtype="float32"), spec, folder, dtype="float32")
    return folder


@pytest.fixture(scope="module")
def session(checkpoint):
    return Session.load(checkpoint=checkpoint, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def pages_dir(tmp_path_factory):
    """Two good sample pages, a truncated PNG and a file that is not an image at all."""
    d = tmp_path_factory.mktemp("pages")
    shutil.copy(SAMPLES["card"], d / "card.png")
    shutil.copy(SAMPLES["small"], d / "small.png")
    data = SAMPLES["letter"].read_bytes()
    (d / "truncated.png").write_bytes(data[: len(data) // 3])
    (d / "zz_junk.jpg").write_bytes(b"\x00junk" * 10)
    return d


def new_run(store, session, dataset, settings=FAST, sampling=None):
    return create_dataset_run(store, session, dataset, settings, sampling or {"n": None, "epochs": 1})


def test_timed_generation_follows_the_one_shot_tokens(session):
    inputs = session.prepare(SAMPLES["card"], "<image>\nFree OCR.", mode="tiny")
    ref = session.generate_one_shot(inputs, max_new_tokens=6)
    run = timed_generation(session, inputs, 6)
    assert trim_at_eos(run.tokens[0].tolist(), session.spec.eos_token_id) == ref.generated_ids[0]
    assert len(run.steps) == 5  # the first token comes from the prefill
    assert run.kv_length == inputs.seq_len + 5 and run.kv_bytes > 0
    assert all(run.totals[s] > 0 for s in ("sam", "clip", "projector", "prefill", "decode"))


def test_run_stores_every_page_and_records_corrupt_ones(tmp_path, session, pages_dir):
    store = RunStore(tmp_path / "runs.sqlite")
    ds = discover(pages_dir)
    samples = sample(ds.pages, order="fixed")
    run_id = new_run(store, session, ds)
    seen = []
    counts = run_dataset(session, store, run_id, samples, FAST, progress=lambda i, n, s, st: seen.append(st))
    assert counts["done"] == 2 and counts["error"] == 2 and seen == ["done", "done", "error", "error", "recheck"]
    run = store.get_run(run_id)
    assert run["kind"] == "dataset" and run["flags"]["cpu"] and run["meta"]["settings"]["mode"] == "tiny"
    frame = store.points(run_id)
    by_page = {json.loads(k)["page"]: g for k, g in frame.groupby("key")}
    bad = by_page["truncated.png"].iloc[0]
    assert bad["status"] == "error" and "truncated or corrupt" in bad["message"]
    assert by_page["zz_junk.jpg"].iloc[0]["message"].endswith("not a readable image file")
    card = by_page["card.png"].set_index("stage")
    assert set(card.index) == {"sam", "clip", "projector", "vision", "prefill", "decode", "decode_step"}
    row = card.iloc[0]
    assert row["status"] == "done" and row["mode"] == "tiny" and (row["grid_w"], row["grid_h"]) == (1, 1)
    assert (row["image_w"], row["image_h"]) == (620, 440) and row["image_slots"] == 73
    assert row["decode_steps"] == 2 and row["kv_bytes"] > 0
    extra = row["extra"]
    assert extra["generated_tokens"] == 3 and len(extra["decode_steps_s"]) == 2 and isinstance(extra["text"], str)
    assert set(extra["detections"]) >= {"blocks", "labels"} and extra["ttft_s"] > 0
    assert extra["flops_source"] == "counted"
    assert card.loc["decode", "median_s"] == pytest.approx(sum(extra["decode_steps_s"]))
    assert card.loc["vision", "median_s"] == pytest.approx(sum(card.loc[s, "median_s"]
                                                               for s in ("sam", "clip", "projector")))
    assert card.loc["decode_step", "repeats"] == 2
    # the second page has the same input shape (tiny mode: one 512 view): its FLOPs are reused, not recounted
    small = by_page["small.png"].set_index("stage")
    assert small.iloc[0]["extra"]["flops_source"] == "same shape"
    for s in ("sam", "clip", "projector", "prefill", "decode"):
        assert small.loc[s, "flops"] == card.loc[s, "flops"] > 0


def test_resume_skips_finished_pages_and_retries_errors(tmp_path, session, pages_dir):
    store = RunStore(tmp_path / "runs.sqlite")
    ds = discover(pages_dir)
    good = [p for p in ds.pages if p.name in ("card.png", "truncated.png")]
    run_id = new_run(store, session, ds)
    first = sample(good, epochs=1, order="fixed")
    run_dataset(session, store, run_id, first, FAST)
    ids_before = dict(zip(store.points(run_id)["key"], store.points(run_id)["point_id"]))
    check_resume(store, run_id, session, ds, FAST)  # same settings: fine
    seen = []
    counts = run_dataset(session, store, run_id, sample(good, epochs=2, order="fixed"), FAST,
                         progress=lambda i, n, s, st: seen.append((s.page.name, s.epoch, st)))
    assert seen == [("card.png", 0, "skipped"), ("truncated.png", 0, "error"),  # errors are tried again
                    ("card.png", 1, "done"), ("truncated.png", 1, "error"),
                    ("card.png", 0, "recheck")]  # the order check: the first page measured again
    assert counts == {"done": 1, "oom": 0, "error": 2, "skipped": 1, "stopped": 0}
    after = store.points(run_id)
    assert after["point_id"].nunique() == 4
    assert all(dict(zip(after["key"], after["point_id"]))[k] == v for k, v in ids_before.items())


def test_resume_refuses_different_settings(tmp_path, session, pages_dir):
    store = RunStore(tmp_path / "runs.sqlite")
    ds = discover(pages_dir)
    run_id = new_run(store, session, ds)
    with pytest.raises(ValueError, match="max_new_tokens 3 -> 9"):
        check_resume(store, run_id, session, ds, ProfileSettings(mode="tiny", max_new_tokens=9))
    with pytest.raises(ValueError, match="data set"):
        check_resume(store, run_id, session, discover(SAMPLES["card"].parent), FAST)
    sweep = store.create_run("sweep", "s", {"device": "cpu"}, {"source": "synthetic"})
    with pytest.raises(ValueError, match="not a dataset run"):
        check_resume(store, sweep, session, ds, FAST)


def test_should_stop_ends_the_run_between_pages(tmp_path, session, pages_dir):
    store = RunStore(tmp_path / "runs.sqlite")
    ds = discover(pages_dir)
    run_id = new_run(store, session, ds)
    samples = sample(ds.pages, order="fixed")
    calls = []
    counts = run_dataset(session, store, run_id, samples, FAST, should_stop=lambda: calls.append(1) or len(calls) > 1)
    assert counts["done"] == 1 and counts["stopped"] == len(samples) - 1
    assert store.get_run(run_id)["n_points"] == 1


def test_decode_flops_from_two_counted_steps_are_exact(session):
    """FLOPs of K decode steps extrapolated from the first two equal those counted step by step."""
    inputs = session.prepare(SAMPLES["small"], mode="small")
    k = 6
    counted = session.count_stage_flops(inputs, logits="last", decode_steps=k)["decode"]["per_step"]
    cache = FlopCache(session, "shape")
    flops, source = cache.counted(inputs, "last")
    assert source == "counted" and [flops["decode_first"], flops["decode_second"]] == counted[:2]
    for n in range(k + 1):
        assert decode_flops_total(flops["decode_first"], flops["decode_second"], n) == sum(counted[:n])
    assert cache.counted(inputs, "last")[1] == "same shape"
    assert FlopCache(session, "page").counted(inputs, "last")[1] == "counted"
    assert FlopCache(session, "none").counted(inputs, "last") == (None, "not counted")


def test_oom_is_recorded_and_a_failed_flop_pass_keeps_the_timings(tmp_path, session, pages_dir, monkeypatch):
    import torch

    import dsocr_core.measure.dataset_run as pr

    store = RunStore(tmp_path / "runs.sqlite")
    ds = discover(pages_dir)
    good = [p for p in ds.pages if p.name in ("card.png", "small.png")]
    run_id = new_run(store, session, ds)
    real = pr.timed_generation

    def flaky(session_, inputs, max_new_tokens, **kw):
        if inputs.image_size == (640, 832) and max_new_tokens > 2:  # small.png's timed run, not its warm-up
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(session_, inputs, max_new_tokens, **kw)

    def no_flops(*args, **kwargs):
        raise RuntimeError("counter broke")

    monkeypatch.setattr(pr, "timed_generation", flaky)
    monkeypatch.setattr(session, "count_stage_flops", no_flops)
    counts = run_dataset(session, store, run_id, sample(good, order="fixed"), FAST)
    assert counts["done"] == 1 and counts["oom"] == 1
    frame = store.points(run_id)
    oom = frame[frame["status"] == "oom"].iloc[0]
    assert "out of memory" in oom["message"] and json.loads(oom["key"])["page"] == "small.png"
    done = frame[frame["status"] == "done"]
    assert done.iloc[0]["extra"]["flops_source"] == "failed: RuntimeError: counter broke"
    assert done["flops"].isna().all() and (done["median_s"] > 0).all()


def test_settings_are_validated():
    for bad, match in [({"max_new_tokens": 0}, "max_new_tokens"), ({"prompt": "Free OCR."}, "<image>"),
                       ({"mode": "huge"}, "mode"), ({"flops": "all"}, "flops"), ({"dpi": 5}, "dpi")]:
        with pytest.raises(ValueError, match=match):
            ProfileSettings(**bad).validate()


def test_cli_profile_resume_and_trace(tmp_path, checkpoint, pages_dir, capsys):
    listing = tmp_path / "pages.txt"
    listing.write_text(f"{pages_dir / 'card.png'}\n{pages_dir / 'truncated.png'}\n{pages_dir / 'small.png'}\n")
    store = tmp_path / "runs.sqlite"
    common = ["profile", "--pages", str(listing), "--checkpoint", str(checkpoint), "--device", "cpu",
              "--dtype", "float32", "--mode", "tiny", "--max-new-tokens", "2", "--store", str(store), "--json"]
    assert main(common + ["--sample", "2", "--seed", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    s = doc["summary"]
    assert s["samples"] == 2 and s["done"] + s["error"] == 2 and s["sampling"]["seed"] == 4
    stages = {r["metric"]: r for r in doc["stages"]}
    assert stages["ttft_s"]["n"] == s["done"] and stages["generated_tokens"]["mean"] == 2
    assert doc["operators"] == []
    run_id = s["run_id"]
    # resume with every page and a profiler pass; the two pages already in the run are not measured again
    trace_dir = tmp_path / "trace"
    assert main(common + ["--resume", run_id[:10], "--trace", "--trace-pages", "1", "--trace-tokens", "2",
                          "--trace-dir", str(trace_dir)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["run_id"] == run_id and doc["summary"]["samples"] == 3 and doc["summary"]["done"] == 2
    assert {r["stage"] for r in doc["operators"]} >= {"sam", "clip", "projector", "prefill", "decode"}
    assert (trace_dir / "trace.json").stat().st_size > 0 and (trace_dir / "operators.csv").is_file()
    # a resume with other settings is refused with one line
    assert main(common[:-1] + ["--resume", run_id, "--mode", "small"]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert main(["profile", "--pages", str(tmp_path / "missing"), "--synthetic", "tiny", "--device", "cpu"]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_cli_text_report_on_a_single_pdf(tmp_path, checkpoint, capsys):
    from PIL import Image

    pdf = tmp_path / "doc.pdf"
    Image.open(SAMPLES["card"]).convert("RGB").save(pdf, resolution=144.0)
    rc = main(["profile", "--pages", str(pdf), "--checkpoint", str(checkpoint), "--device", "cpu",
               "--dtype", "float32", "--mode", "tiny", "--max-new-tokens", "2", "--store", str(tmp_path / "r.sqlite"),
               "--hardware", "h200", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "samples 1: done 1, error 0, oom 0   [CPU, fallback tokenizer]" in out
    assert "time to first token" in out and "pages/s" in out and "run id" in out
