import json
import threading

import pandas as pd
import pytest

from dsocr_core.measure.environment import capture_environment
from dsocr_core.spec import Workload
from dsocr_core.results.store import (
    CSV_COLUMNS, FORMAT_VERSION, POINT_FRAME_COLUMNS, RunImportError, RunNotFound, RunStore, labels, point_key,
    stage_stats,
)

GPU_ENV = {"device": "cuda:0", "gpu_name": "NVIDIA H200", "driver": "570.1", "cuda": "12.8", "torch": "2.13.0"}
REAL = {"source": "checkpoint", "path": "/ckpt/DeepSeek-OCR", "tokenizer": "checkpoint"}


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "runs.sqlite")


def _stages(scale=1.0):
    return {
        "sam": {**stage_stats([0.010 * scale, 0.011 * scale, 0.012 * scale]), "flops": 1_000_000, "tensor_flops": 900_000,
                "peak_memory_bytes": 2**30},
        "prefill": {**stage_stats([0.1, 0.2, 0.3]), "flops": 5 * 10**12},
        "decode_step": {"median_s": 0.004, "repeats": 3, "times_s": [0.004, 0.0041, 0.0039]},
    }


def _sweep(store, weights=REAL, env=GPU_ENV, **kw):
    return store.create_run("sweep", "bf16 sweep", env, weights, dtype="bfloat16", attn="sdpa",
                            session_mode="separated", meta=kw.pop("meta", {"ceiling_tflops": 700.0}), **kw)


def test_round_trip_run_and_points(store):
    rid = _sweep(store, notes="first")
    run = store.get_run(rid)
    assert run["kind"] == "sweep" and run["name"] == "bf16 sweep" and run["notes"] == "first"
    assert run["environment"]["gpu_name"] == "NVIDIA H200"
    assert run["weights"] == REAL and run["meta"] == {"ceiling_tflops": 700.0}
    assert run["dtype"] == "bfloat16" and run["attn"] == "sdpa" and run["session_mode"] == "separated"
    assert run["flags"] == {"synthetic_weights": False, "cpu": False, "fallback_tokenizer": False}

    w = Workload(mode="gundam", crops=(3, 2), text_tokens=12, batch=2, decode_steps=8)
    pid = store.put_point(rid, w, stages=_stages(), kv_bytes=123456, resolved={"image_slots": 903, "sequence": 915},
                          extra={"note": "warm"})
    frame = store.points(rid)
    assert list(frame.columns) == list(POINT_FRAME_COLUMNS)
    assert list(frame["stage"]) == ["sam", "prefill", "decode_step"]  # display order, not insertion order
    row = frame.iloc[0]
    assert row["point_id"] == pid and row["key"] == point_key(w)
    assert (row["mode"], row["grid_w"], row["grid_h"], row["text_tokens"], row["batch"], row["decode_steps"]) == (
        "gundam", 3, 2, 12, 2, 8)
    assert (row["image_slots"], row["sequence"], row["kv_bytes"], row["status"]) == (903, 915, 123456, "done")
    assert row["median_s"] == pytest.approx(0.011) and row["min_s"] == pytest.approx(0.010)
    assert row["p90_s"] > row["p10_s"] and row["repeats"] == 3 and row["flops"] == 1_000_000
    assert row["tensor_flops"] == 900_000 and row["peak_memory_bytes"] == 2**30
    assert row["extra"] == {"note": "warm"}
    step = frame[frame["stage"] == "decode_step"].iloc[0]
    assert step["stage_extra"] == {"times_s": [0.004, 0.0041, 0.0039]}
    assert pd.isna(step["flops"])
    assert store.get_run(rid)["n_points"] == 1 and store.get_run(rid)["n_done"] == 1


def test_upsert_replaces_point_and_its_stages(store):
    rid = _sweep(store)
    key = {"mode": "base", "batch": 4}
    first = store.put_point(rid, key, status="error", message="RuntimeError: boom")
    assert store.points(rid)["status"].tolist() == ["error"]
    second = store.put_point(rid, key, stages={"prefill": {"median_s": 0.5}})
    assert first == second
    frame = store.points(rid)
    assert len(frame) == 1 and frame["status"].tolist() == ["done"] and frame["message"].tolist() == [""]
    third = store.put_point(rid, key, stages={"sam": {"median_s": 0.1}, "clip": {"median_s": 0.2}})
    assert third == first
    assert store.points(rid)["stage"].tolist() == ["sam", "clip"]  # old prefill row gone


def test_finished_keys_and_has_point(store):
    rid = _sweep(store)
    done, oom, err = Workload(mode="tiny"), Workload(mode="large", batch=64), Workload(mode="base", batch=8)
    store.put_point(rid, done, stages=_stages())
    store.put_point(rid, oom, status="oom", message="CUDA out of memory. Tried to allocate 20.00 GiB")
    store.put_point(rid, err, status="error", message="RuntimeError: cuDNN error")
    assert store.finished_keys(rid) == {point_key(done), point_key(oom)}
    assert store.finished_keys(rid, statuses=["done"]) == {point_key(done)}
    assert store.has_point(rid, done) and store.has_point(rid, point_key(oom))
    assert not store.has_point(rid, err)  # an error is retried on resume
    assert store.has_point(rid, err, statuses=None)
    assert not store.has_point(rid, Workload(mode="small"), statuses=None)
    # key stability: the same workload built again, or a dict with another key order, gives the same key
    assert point_key(Workload(mode="tiny")) == point_key(done)
    assert point_key({"b": 1, "a": (2, 3)}) == point_key({"a": [2, 3], "b": 1})


def test_oom_and_error_statuses_keep_messages(store):
    rid = _sweep(store)
    store.put_point(rid, {"mode": "large", "batch": 64}, status="oom", message="CUDA out of memory (64 GiB)")
    store.put_point(rid, {"mode": "base", "batch": 2}, status="error", message="ValueError: bad grid")
    store.put_point(rid, {"mode": "base", "batch": 3}, status="error", message="")
    frame = store.points(rid).set_index("batch")
    assert frame.loc[64, "status"] == "oom" and frame.loc[64, "message"] == "CUDA out of memory (64 GiB)"
    assert frame.loc[2, "message"] == "ValueError: bad grid"
    assert frame.loc[3, "message"] == "error (no message recorded)"
    assert frame["stage"].isna().all()  # failed points still show up, one row each
    run = store.get_run(rid)
    assert (run["n_points"], run["n_done"], run["n_oom"], run["n_error"]) == (3, 0, 1, 2)
    with pytest.raises(ValueError, match="status"):
        store.put_point(rid, {"mode": "base"}, status="crashed")


def test_bad_inputs_are_refused(store):
    with pytest.raises(ValueError, match="kind"):
        store.create_run("benchmark", "x", GPU_ENV, REAL)
    with pytest.raises(ValueError, match="source"):
        store.create_run("sweep", "x", GPU_ENV, {"path": "/somewhere"})
    with pytest.raises(ValueError, match="device"):
        store.create_run("sweep", "x", {"gpu_name": "H200"}, REAL)
    rid = _sweep(store)
    with pytest.raises(RunNotFound):
        store.put_point("nope", {"mode": "base"})
    with pytest.raises(ValueError, match="stage name"):
        store.put_point(rid, {"mode": "base"}, stages={"Pre fill": {"median_s": 1.0}})
    with pytest.raises(ValueError, match="seconds"):
        store.put_point(rid, {"mode": "base"}, stages={"prefill": {"median_s": "fast"}})
    with pytest.raises(ValueError, match="resolved"):
        store.put_point(rid, {"mode": "base"}, resolved={"page": "a.png"})
    with pytest.raises(TypeError, match="JSON"):
        store.put_point(rid, {"mode": "base"}, extra={"obj": object()})
    assert store.points(rid).empty
    with pytest.raises(RunNotFound):
        store.get_run("nope")


def test_dataset_run_with_per_page_extra(store):
    rid = store.create_run("dataset", "omnidoc pages", GPU_ENV, REAL, meta={"pages": 2})
    steps = [0.005 + 0.0001 * i for i in range(50)]
    store.put_point(
        rid, {"page": "pages/a.png", "mode": "gundam"},
        stages={"vision": {"median_s": 0.05}, "prefill": {"median_s": 0.08},
                "decode_step": {**stage_stats(steps), "times_s": steps}},
        resolved={"grid": (3, 2), "image_size": (1654, 2339), "text_tokens": 10, "image_slots": 903,
                  "decode_steps": 50},
        extra={"page": "pages/a.png", "output": "# Title\nBody text"},
    )
    row = store.points(rid).iloc[0]
    assert (row["grid_w"], row["grid_h"], row["image_w"], row["image_h"], row["decode_steps"]) == (3, 2, 1654, 2339, 50)
    assert row["extra"]["output"].startswith("# Title")
    assert store.list_runs(kind="dataset")[0]["id"] == rid and store.list_runs(kind="parity") == []


def test_export_json_then_import_into_fresh_store_gives_identical_points(store, tmp_path):
    rid = _sweep(store, weights={"source": "synthetic", "seed": 0}, env=capture_environment("cpu"))
    store.put_point(rid, Workload(mode="gundam", crops=(2, 2)), stages=_stages(), kv_bytes=10,
                    resolved={"image_slots": 500}, extra={"x": [1, 2]})
    store.put_point(rid, Workload(mode="large", batch=32), status="oom", message="CUDA out of memory")
    path = store.export_run(rid, tmp_path / "out" / "run.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "dsocr-run" and doc["format_version"] == FORMAT_VERSION
    assert doc["run"]["flags"] == {"synthetic_weights": True, "cpu": True, "fallback_tokenizer": False}
    assert "synthetic weights" in doc["run"]["label"] and "CPU" in doc["run"]["label"]

    fresh = RunStore(tmp_path / "elsewhere.sqlite")
    assert fresh.import_run(path) == rid  # the original uuid is kept
    a, b = store.get_run(rid), fresh.get_run(rid)
    for field in ("kind", "name", "created_at", "environment", "weights", "meta", "flags", "dtype", "attn",
                  "session_mode", "n_points", "label"):
        assert a[field] == b[field], field
    assert b["imported_from"] == str(path)
    pd.testing.assert_frame_equal(store.points(rid).drop(columns="point_id"),
                                  fresh.points(rid).drop(columns="point_id"))

    # importing again (unchanged, then changed) never duplicates the run or its points
    assert fresh.import_run(path) == rid
    store.put_point(rid, Workload(mode="tiny"), stages={"prefill": {"median_s": 0.01}})
    store.export_run(rid, path)
    assert fresh.import_run(path) == rid
    assert len(fresh.list_runs()) == 1 and fresh.get_run(rid)["n_points"] == 3
    pd.testing.assert_frame_equal(store.points(rid).drop(columns="point_id"),
                                  fresh.points(rid).drop(columns="point_id"))


def test_import_dir_imports_reference_runs(store, tmp_path):
    ref = tmp_path / "reference"
    rid = _sweep(store)
    store.put_point(rid, Workload(mode="base"), stages={"prefill": {"median_s": 0.1}})  # a whole workload: imports
    store.export_run(rid, ref / "h200.json")  # refuse finished sweep points the analytic join cannot evaluate
    (ref / "broken.json").write_text("{not json")
    fresh = RunStore(tmp_path / "fresh.sqlite")
    with pytest.raises(RunImportError, match="broken.json") as info:
        fresh.import_dir(ref)
    assert "1 of 2" in str(info.value)
    assert [r["id"] for r in fresh.list_runs()] == [rid]  # the good file still landed
    assert fresh.import_dir(tmp_path / "absent") == []


def test_csv_export_columns_and_flags(store, tmp_path):
    rid = _sweep(store, weights={"source": "checkpoint", "tokenizer": "fallback"})
    store.put_point(rid, Workload(mode="base"), stages=_stages())
    store.put_point(rid, Workload(mode="large"), status="oom", message="CUDA out of memory")
    path = store.export_run(rid, tmp_path / "run.csv")
    frame = pd.read_csv(path)
    assert tuple(frame.columns) == CSV_COLUMNS
    assert len(frame) == 4  # 3 stage rows + 1 OOM row
    assert frame["fallback_tokenizer"].all() and not frame["synthetic_weights"].any() and not frame["cpu"].any()
    assert set(frame["gpu_name"]) == {"NVIDIA H200"} and set(frame["run_id"]) == {rid}
    assert json.loads(frame.loc[frame["stage"] == "decode_step", "stage_extra"].iloc[0])["times_s"][0] == 0.004
    with pytest.raises(ValueError, match=".json or .csv"):
        store.export_run(rid, tmp_path / "run.parquet")


@pytest.mark.parametrize(
    "content, match",
    [
        ("{oops", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"format": "something-else"}', "not a run export"),
        ('{"format": "dsocr-run", "format_version": 99}', "newer"),
        ('{"format": "dsocr-run", "format_version": 1, "run": {"id": "abcdef0123"}, "points": []}', "run.kind"),
        ("BAD_STATUS", "points.0.status"),
        ("NO_DEVICE", "device"),
    ],
)
def test_malformed_import_gives_clear_error(store, tmp_path, content, match):
    if content in ("BAD_STATUS", "NO_DEVICE"):
        rid = _sweep(store)
        store.put_point(rid, {"mode": "base"}, stages={"prefill": {"median_s": 0.1}})
        doc = store.export_dict(rid)
        if content == "BAD_STATUS":
            doc["points"][0]["status"] = "exploded"
        else:
            del doc["run"]["environment"]["device"]
        content = json.dumps(doc)
    path = tmp_path / "bad.json"
    path.write_text(content)
    fresh = RunStore(tmp_path / "fresh.sqlite")
    with pytest.raises(RunImportError, match=match) as info:
        fresh.import_run(path)
    assert str(path) in str(info.value)
    assert fresh.list_runs() == []  # nothing half-imported
    with pytest.raises(RunImportError, match="cannot read"):
        fresh.import_run(tmp_path / "missing.json")


def test_concurrent_reader_while_writer_writes(tmp_path):
    path = tmp_path / "shared.sqlite"
    writer_store, reader_store = RunStore(path), RunStore(path)
    rid = _sweep(writer_store)
    n = 150
    errors: list[BaseException] = []
    stop = threading.Event()
    seen = []

    def write():
        try:
            for i in range(n):
                writer_store.put_point(rid, {"mode": "base", "batch": i + 1}, stages=_stages(1 + i / n))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    def read():
        try:
            while not stop.is_set():
                frame = reader_store.points(rid)
                assert len(frame) % 3 == 0  # never a point with only part of its stages
                seen.append(len(reader_store.finished_keys(rid)))
                reader_store.list_runs()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert seen and seen == sorted(seen)  # the reader saw the run grow monotonically
    assert len(reader_store.finished_keys(rid)) == n


def test_delete_run_removes_points(store):
    rid = _sweep(store)
    other = _sweep(store)
    store.put_point(rid, {"mode": "base"}, stages=_stages())
    store.put_point(other, {"mode": "base"}, stages=_stages())
    assert store.delete_run(rid) is True and store.delete_run(rid) is False
    assert [r["id"] for r in store.list_runs()] == [other]
    assert len(store.points(other)) == 3
    with pytest.raises(RunNotFound):
        store.points(rid)


def test_update_run_merges_meta_and_never_clears_flags(store):
    rid = _sweep(store, meta={"synthetic_weights": True})
    run = store.update_run(rid, notes="calibrated", meta={"ceilings": {"tflops": 690.0}, "synthetic_weights": False})
    assert run["notes"] == "calibrated" and run["meta"]["ceilings"] == {"tflops": 690.0}
    assert run["flags"]["synthetic_weights"] is True


def test_labels_always_name_the_caveats(store):
    real = store.get_run(_sweep(store))
    assert labels(real) == real["label"]
    assert "NVIDIA H200" in labels(real)
    for word in ("synthetic weights", "CPU", "fallback tokenizer"):
        assert word not in labels(real)
    cpu_synth = store.get_run(_sweep(store, weights={"source": "synthetic"}, env=capture_environment("cpu")))
    assert "synthetic weights" in labels(cpu_synth) and "CPU" in labels(cpu_synth)
    fallback = store.get_run(_sweep(store, weights={"source": "checkpoint"}, meta={"fallback_tokenizer": True}))
    assert labels(fallback).endswith("fallback tokenizer")
    # the weights dict Session.load builds is understood as is
    session_weights = {"source": "checkpoint", "detail": "/ckpt", "synthetic": False,
                       "tokenizer": "fallback byte tokenizer (no tokenizer in checkpoint)", "fallback_tokenizer": True}
    assert labels(store.get_run(_sweep(store, weights=session_weights))).endswith("fallback tokenizer")
    odd = {"source": "checkpoint", "synthetic": True}  # contradictory: the warning wins
    assert "synthetic weights" in labels(store.get_run(_sweep(store, weights=odd)))
    # a bare dict (e.g. read from an export) without stored flags gets them computed
    assert "synthetic weights" in labels({"name": "x", "environment": {"device": "cuda"}, "weights": {"source": "synthetic"}})


def test_default_path_honours_env_var(tmp_path, monkeypatch):
    target = tmp_path / "via_env" / "store.sqlite"
    monkeypatch.setenv("DSOCR_STORE", str(target))
    store = RunStore()
    assert store.path == target and target.exists()
    with pytest.raises(ValueError, match="file"):
        RunStore(":memory:")


def test_newer_schema_is_refused(tmp_path):
    import sqlite3

    path = tmp_path / "future.sqlite"
    RunStore(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 999")
    conn.close()
    with pytest.raises(Exception, match="schema version 999"):
        RunStore(path)
