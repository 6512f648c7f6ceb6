"""Issue 19, items 2, 7 and 8: an import never replaces a run recorded in the store (nor a different run with
the same id); crafted files are a clear RunImportError with the store unchanged; run names are shown as text."""
from __future__ import annotations

import json
import os

import pytest

from dsocr_core.results import transfer
from dsocr_core.results.store import RunImportError, RunStore
from dsocr_core.spec import Workload

ENV = {"device": "cuda:0", "gpu_name": "NVIDIA H200"}
WEIGHTS = {"source": "checkpoint", "detail": "/ckpt", "tokenizer": "checkpoint"}
WORKLOAD = Workload(mode="gundam", crops=(2, 2), decode_steps=8).model_dump(mode="json")


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "runs.sqlite")


def _measured(store, name="my measured sweep"):
    run_id = store.create_run("sweep", name, ENV, WEIGHTS, dtype="bfloat16", attn="sdpa", session_mode="reference")
    store.put_point(run_id, WORKLOAD, stages={"prefill": {"median_s": 1.18, "repeats": 3, "flops": 10**12}})
    return run_id


def _snapshot(store):
    docs = []
    for r in store.list_runs():
        doc = store.export_dict(r["id"])
        doc.pop("exported_at")
        docs.append(doc)
    return docs


def _doc(store, run_id):
    return json.loads(store.export_json(run_id))


# ------------------------------------------------------------------------------------------------ item 2
def test_an_import_never_replaces_a_measured_run(store):
    run_id = _measured(store)
    before = _snapshot(store)
    hostile = _doc(store, run_id)
    hostile["run"].update(kind="reference", name="replaced", created_at="2020-01-01T00:00:00+00:00")
    hostile["points"][0]["stages"]["prefill"]["median_s"] = 1e-9
    with pytest.raises(RunImportError, match="recorded here; an import never replaces it"):
        store.import_bytes(json.dumps(hostile), source="hostile.json")
    # even the run's own export, imported back: refused, not merged
    with pytest.raises(RunImportError, match="never replaces"):
        store.import_bytes(store.export_json(run_id), source="own.json")
    assert _snapshot(store) == before
    run = store.get_run(run_id)
    assert (run["name"], run["kind"]) == ("my measured sweep", "sweep")
    assert store.points(run_id)["median_s"].iloc[0] == pytest.approx(1.18)


def test_a_reimport_updates_only_the_same_imported_run(store, tmp_path):
    source = RunStore(tmp_path / "elsewhere.sqlite")
    run_id = _measured(source, "shared run")
    first = source.export_json(run_id)
    assert store.import_bytes(first, source="shared.json") == run_id
    # the same run, exported again later with a new name and one more point: updated in place
    source.update_run(run_id, name="shared run (more points)")
    source.put_point(run_id, {**WORKLOAD, "batch": 2}, stages={"prefill": {"median_s": 2.0}})
    assert store.import_bytes(source.export_json(run_id), source="shared.json") == run_id
    run = store.get_run(run_id)
    assert run["name"] == "shared run (more points)" and run["n_points"] == 2
    # another run carrying that id (other kind or creation time): refused, the imported one unchanged
    before = _snapshot(store)
    for change in ({"kind": "reference"}, {"created_at": "2021-05-05T05:05:05+00:00"}):
        other = json.loads(first)
        other["run"].update(change)
        with pytest.raises(RunImportError, match="another run with id"):
            store.import_bytes(json.dumps(other), source="other.json")
    assert _snapshot(store) == before


# ------------------------------------------------------------------------------------------------ item 7
def _deep(levels):
    value = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _mutations():
    def stage(field, value):
        return lambda d: d["points"][0]["stages"]["prefill"].__setitem__(field, value)

    return {
        "kv_bytes 10**30": (lambda d: d["points"][0].__setitem__("kv_bytes", 10**30), "kv_bytes"),
        "flops 10**30": (stage("flops", 10**30), "flops"),
        "workload int 10**30": (lambda d: d["points"][0]["workload"].__setitem__("text_tokens", 10**30), "text_tokens"),
        "nested 1,200 levels": (lambda d: d["run"]["meta"].__setitem__("x", _deep(1200)), "nested"),
        "nested 40 levels": (lambda d: d["points"][0]["extra"].__setitem__("x", _deep(40)), "nested deeper than 32"),
        "negative time": (stage("median_s", -0.5), "median_s"),
        "negative flops": (stage("flops", -1), "flops"),
        "negative repeats": (stage("repeats", -3), "repeats"),
        "zero repeats": (stage("repeats", 0), "repeats"),
        "negative kv_bytes": (lambda d: d["points"][0].__setitem__("kv_bytes", -1), "kv_bytes"),
        "negative text tokens": (lambda d: d["points"][0]["workload"].__setitem__("text_tokens", -5), "text_tokens"),
        'format_version "7"': (lambda d: d.__setitem__("format_version", "7"), "format_version"),
        "format_version 2.0": (lambda d: d.__setitem__("format_version", 2.0), "format_version"),
        "format_version -1": (lambda d: d.__setitem__("format_version", -1), "format_version"),
        "format_version 0": (lambda d: d.__setitem__("format_version", 0), "format_version"),
        "format_version true": (lambda d: d.__setitem__("format_version", True), "format_version"),
        "format_version 2": (lambda d: d.__setitem__("format_version", 2), "newer"),
        "time as text": (stage("median_s", "0.1"), "median_s"),
        "50 MB name": (lambda d: d["run"].__setitem__("name", "n" * 50_000_000), "characters"),
        "2,000-character name": (lambda d: d["run"].__setitem__("name", "n" * 2000), "name"),
        "2 MB string in extra": (lambda d: d["points"][0]["extra"].__setitem__("blob", "b" * 2_000_000), "characters"),
        "garbage date": (lambda d: d["run"].__setitem__("created_at", "yesterday"), "created_at"),
        # accepted before, then crashed the measured and MFU pages, which join finished points to the model
        "workload without dtype": (lambda d: (d["points"][0]["workload"].pop("dtype"),
                                              d["points"][0]["resolved"].pop("dtype")), "needs dtype"),
        "resolved batch 0": (lambda d: d["points"][0]["resolved"].__setitem__("batch", 0), "batch"),
        "unknown mode": (lambda d: (d["points"][0]["workload"].__setitem__("mode", "huge"),
                                    d["points"][0]["resolved"].__setitem__("mode", "huge")), "mode"),
        "bad spec in meta": (lambda d: d["run"]["meta"].__setitem__("spec", {"hidden_size": "wide"}), "meta.spec"),
        "bad calibration": (lambda d: d["run"]["meta"].__setitem__("calibration", {"name": "x"}), "meta.calibration"),
    }


@pytest.mark.parametrize("case", list(_mutations()))
def test_crafted_imports_are_refused_and_change_nothing(store, tmp_path, case):
    mutate, needle = _mutations()[case]
    source = RunStore(tmp_path / "elsewhere.sqlite")
    doc = _doc(source, _measured(source, "to import"))
    _measured(store)  # something already in the store that must stay as it is
    before = _snapshot(store)
    mutate(doc)
    text = json.dumps(doc) if case != "nested 1,200 levels" else _nested_text(doc)
    with pytest.raises(RunImportError) as err:
        store.import_bytes(text, source="crafted.json")
    assert needle in str(err.value) and str(err.value).startswith("crafted.json")
    assert len(str(err.value)) < 1000  # a message, not the offending value
    assert _snapshot(store) == before


def _nested_text(doc):
    """json.dumps itself recurses; write the deep value by hand."""
    deep = doc["run"]["meta"].pop("x")
    depth = 0
    while deep:
        deep, depth = deep["a"], depth + 1
    doc["run"]["meta"]["x"] = "@@"
    return json.dumps(doc).replace('"@@"', '{"a":' * depth + "{}" + "}" * depth)


def test_huge_integers_and_huge_files_are_refused(store, tmp_path, monkeypatch):
    with pytest.raises(RunImportError, match="not a readable JSON"):
        store.import_bytes('{"format": "dsocr-run", "format_version": ' + "9" * 5000 + "}", source="digits.json")
    monkeypatch.setattr(transfer, "MAX_IMPORT_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(" " * 2000)
    with pytest.raises(RunImportError, match="larger than the import limit"):
        store.import_run(path)
    assert store.list_runs() == []


def test_the_bundled_reference_runs_still_import(store):
    root = os.path.join(os.path.dirname(__file__), "..", "data", "reference")
    assert len(store.import_dir(root)) == 2


# ------------------------------------------------------------------------------------------------ item 8
HOSTILE = "![pwn](https://evil.example/x.png) **bold** <img src=https://evil.example/y.png> [link](https://e.x)"


def test_markdown_in_names_stays_text():
    from markdown_it import MarkdownIt

    from ui.measured import md

    html = MarkdownIt("commonmark").render(md(HOSTILE))
    assert "<img" not in html and "<a " not in html and "<strong>" not in html
    assert "![pwn](https://evil.example/x.png)" in html.replace("&quot;", '"')  # shown, literally
    assert "\n" not in md("two\nlines\x1b[31m")


def test_dashboard_shows_an_imported_markdown_name_as_text(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    scratch = RunStore(tmp_path / "scratch.sqlite")
    run_id = scratch.create_run("reference", HOSTILE, ENV, {"source": "synthetic", "synthetic": True},
                                dtype="bfloat16", attn="sdpa", session_mode="reference")
    scratch.put_point(run_id, WORKLOAD, stages={s: {"median_s": 0.01} for s in ("sam", "prefill", "decode")})
    (tmp_path / "reference").mkdir()
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(tmp_path / "reference"))
    at = AppTest.from_file(os.path.join(os.path.dirname(__file__), "..", "app.py"), default_timeout=120).run()
    at.switch_page("pages/measured.py").run()
    at.session_state["ms_tab"] = "Import / export"  # the measured page draws only its open tab
    at.run()
    at.file_uploader(key="ms_import").set_value(("run.json", scratch.export_json(run_id).encode(),
                                                 "application/json")).run()
    assert not at.exception and any("Imported" in s for s in (e.value for e in at.success))
    # a deeply nested upload is a message, not a RecursionError traceback
    at.file_uploader(key="ms_import").set_value(("deep.json", b'{"a":' * 5000 + b"{}" + b"}" * 5000,
                                                 "application/json")).run()
    assert not at.exception and any("nested" in e.value for e in at.error)
    at.switch_page("pages/mfu.py").run()
    assert not at.exception
    shown = [str(e.value) for kind in ("markdown", "caption", "success", "info", "warning", "error")
             for e in getattr(at, kind)]
    assert any("pwn" in s for s in shown)
    from markdown_it import MarkdownIt

    rendered = [MarkdownIt("commonmark").render(s) for s in shown]  # what a Markdown renderer makes of them
    assert not any("<img" in h or "href=" in h or "<strong>bold" in h for h in rendered), rendered


# ------------------------------------------------------------------------------------------------ ids, numbers
def test_an_import_cannot_hide_a_run_behind_its_id_in_another_case(store, tmp_path):
    """Ids are compared as resolve_id resolves them (any case): the upper-case copy of a local run's id is the
    same id, so the import is refused and the full id still reaches the run."""
    run_id = _measured(store)
    source = RunStore(tmp_path / "elsewhere.sqlite")
    doc = _doc(source, _measured(source, "look-alike"))
    doc["run"]["id"] = run_id.upper()
    before = _snapshot(store)
    with pytest.raises(RunImportError, match="recorded here"):
        store.import_bytes(json.dumps(doc), source="upper.json")
    assert _snapshot(store) == before
    assert store.resolve_id(run_id) == run_id and store.resolve_id(run_id.upper()) == run_id
    # an imported run re-imported under its id in another case is the same run, updated, not a second one
    other = _doc(source, _measured(source, "shared"))
    store.import_bytes(json.dumps(other), source="shared.json")
    other["run"]["id"] = other["run"]["id"].upper()
    other["run"]["name"] = "shared, renamed"
    assert store.import_bytes(json.dumps(other), source="shared.json") == other["run"]["id"].lower()
    assert [r["name"] for r in store.list_runs()].count("shared, renamed") == 1 and len(store.list_runs()) == 2


def test_a_full_id_reaches_its_run_in_a_store_holding_two_cases(store):
    """A store written before ids were compared in any case may hold both; the exact id still resolves."""
    run_id = _measured(store)
    with store._write() as conn:
        row = dict(conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())
        row["id"] = run_id.upper()
        conn.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    assert store.resolve_id(run_id) == run_id
    assert store.resolve_id(run_id.upper()) == run_id.upper()
    with pytest.raises(Exception, match="matches 2 runs"):
        store.resolve_id(run_id[:12])


def _import_mutated(store, tmp_path, mutate, text=None):
    source = RunStore(tmp_path / "elsewhere.sqlite")
    doc = _doc(source, _measured(source, "to import"))
    mutate(doc)
    _measured(store)
    before = _snapshot(store)
    with pytest.raises(RunImportError) as err:
        store.import_bytes(text(doc) if text else json.dumps(doc), source="crafted.json")
    assert _snapshot(store) == before
    return str(err.value)


@pytest.mark.parametrize("field, value, needle", [
    ("text_tokens", 10**12, "text tokens must lie in 1..10000000"),
    ("decode_steps", 10**9, "decode steps must lie in 0..10000000"),
    ("batch", 10**6, "batch must lie in 1..65536"),
])
def test_an_imported_point_past_the_workload_models_limits_is_refused(store, tmp_path, field, value, needle):
    """The measured and MFU pages evaluate every finished point with the analytic model; a point it refuses
    (SpecError on the page) is refused at import instead, naming the point and the field."""
    message = _import_mutated(store, tmp_path, lambda d: d["points"][0]["resolved"].__setitem__(field, value))
    assert message.startswith("crafted.json: points[0]") and needle in message


def _stage(field, value):
    return lambda d: d["points"][0]["stages"]["prefill"].__setitem__(field, value)


@pytest.mark.parametrize("case, mutate, needle", [
    ("infinite median", _stage("median_s", "@inf@"), "points[0].stages.prefill.median_s"),
    ("1e999 median", _stage("median_s", "@1e999@"), "points[0].stages.prefill.median_s"),
    ("NaN median", _stage("median_s", "@nan@"), "points[0].stages.prefill.median_s"),
    ("NaN in meta", lambda d: d["run"]["meta"].__setitem__("warmup", "@nan@"), "run.meta.warmup"),
    ("inf in environment", lambda d: d["run"]["environment"].__setitem__("gpu_memory_gb", "@inf@"),
     "run.environment.gpu_memory_gb"),
    ("-inf in extra", lambda d: d["points"][0]["extra"].__setitem__("score", "@-inf@"), "points[0].extra.score"),
    ("NaN in a time list", _stage("extra", {"times_s": [0.1, "@nan@"]}), "points[0].stages.prefill.extra.times_s[1]"),
])
def test_non_finite_numbers_are_refused_naming_the_field(store, tmp_path, case, mutate, needle):
    literals = {'"@inf@"': "Infinity", '"@1e999@"': "1e999", '"@nan@"': "NaN", '"@-inf@"': "-Infinity"}

    def text(doc):
        out = json.dumps(doc)
        for k, v in literals.items():
            out = out.replace(k, v)
        return out

    message = _import_mutated(store, tmp_path, mutate, text)
    assert needle in message and "not a finite number" in message, message
    assert "greater than or equal" not in message


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["run"]["meta"].__setitem__("repeats", -3), "run.meta.repeats"),
    (lambda d: d["run"]["meta"].__setitem__("warmup", -1), "run.meta.warmup"),
    (_stage("extra", {"times_s": [0.1, -0.2]}), "points[0].stages.prefill.extra.times_s[1]"),
])
def test_negative_repeats_and_times_are_refused(store, tmp_path, mutate, needle):
    message = _import_mutated(store, tmp_path, mutate)
    assert needle in message and "negative" in message, message


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_measured_point_without_a_finite_time_is_refused(store, value):
    run_id = _measured(store)
    with pytest.raises(ValueError, match="stage prefill median_s must be a finite number"):
        store.put_point(run_id, {**WORKLOAD, "batch": 3}, stages={"prefill": {"median_s": value}})
    assert store.get_run(run_id)["n_points"] == 1
