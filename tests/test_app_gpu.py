"""The dashboard on a CUDA GPU, through streamlit.testing.v1.AppTest: the sidebar's fast session mode drives a
measured sweep and a parity run on the device. Skipped without CUDA (tests/conftest.py).

The model is the synthetic tiny one (random weights, bf16); DSOCR_GPU_APP_PRESET=full runs the full-size one.
Run with `-s` to see the stored point and the parity outcome printed."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dsocr_core.results.store import RunStore

pytestmark = pytest.mark.gpu

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PRESET = os.environ.get("DSOCR_GPU_APP_PRESET", "tiny")
TIMEOUT = 600


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    (tmp_path / "reference").mkdir()
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(tmp_path / "reference"))
    return tmp_path


def texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def fast_app() -> AppTest:
    """The app on the GPU with the synthetic model in the fast session mode (the overview checks the mode)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="sb_device").value == "cuda"  # the default where there is a GPU
    if PRESET == "full":
        at.sidebar.radio(key="sb_source").set_value("synthetic-full").run()
    at.sidebar.radio(key="sb_session_mode").set_value("fast").run()
    assert not at.exception, at.exception
    refusals = [w for w in texts(at, "warning") if "Fast mode" in w]
    assert not refusals, refusals  # neither refused (CPU) nor failed to build (engine)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Session mode"] == "fast" and metrics["Device"].startswith("cuda"), metrics
    return at


def open_tab(at: AppTest, key: str, label: str) -> AppTest:
    """Select a tab of an st.tabs(key=..., on_change="rerun") group (only the open tab's content runs)."""
    at.session_state[key] = label
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_fast_mode_measured_sweep_on_cuda(store_env):
    from ui import sweeps
    from ui.measured import point_table

    at = open_tab(goto(fast_app(), "measured"), "ms_tab", "New sweep")
    assert any("fast session mode" in m for m in texts(at, "markdown"))  # the sweep form names the mode
    at.multiselect(key="ms_modes").set_value(["tiny", "gundam"])
    at.text_input(key="ms_grids").set_value("1x1")
    at.text_input(key="ms_text").set_value("10")
    at.text_input(key="ms_batch").set_value("1")
    at.text_input(key="ms_steps").set_value("8")
    at.number_input(key="ms_repeats_cuda").set_value(2)  # per-device defaults: the keys name the device
    at.number_input(key="ms_warmup_cuda").set_value(1)
    at.button(key="ms_start").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    runner = sweeps.runner()
    runner.join(TIMEOUT)
    job = runner.job
    assert job is not None and not job.running and job.kind == "sweep"
    assert job.error is None, job.error
    assert job.session_mode == "fast" and job.total == 2
    run = RunStore().get_run(job.run_id)
    assert run["session_mode"] == "fast"
    assert run["n_points"] == run["n_done"] == 2, run
    assert not run["flags"]["cpu"] and run["environment"].get("gpu_name")
    assert run["meta"]["session"]["session_mode"] == "fast"
    table = point_table(RunStore().points(job.run_id))
    print(f"\nstored run {run['id'][:8]} '{run['name']}': session_mode={run['session_mode']}, "
          f"{run['n_done']}/{run['n_points']} done on {run['environment'].get('gpu_name')}")
    print(table.drop(columns=["message", "updated"]).to_string(index=False))
    at = open_tab(at, "ms_tab", "Runs")
    assert any(o.endswith("fast session mode") for o in at.multiselect(key="ms_runs").options)


def test_fast_mode_parity_on_cuda(store_env):
    at = goto(fast_app(), "parity")
    at.selectbox(key="pa_mode").set_value("tiny")
    at.number_input(key="pa_tokens").set_value(32)
    at.button(key="pa_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    headers = [t for t in texts(at, "success") + texts(at, "error") if t.startswith("Parity ")]
    assert len(headers) == 1 and "fast session mode" in headers[0], texts(at, "error")
    captions = [c for img in at.image for c in img.captions]
    assert any(c.startswith("one-shot:") for c in captions) and any(c.startswith("separated:") for c in captions)
    result = at.session_state["pa_results"][0]
    assert result.error is None
    exported = json.loads(result.export())
    assert exported["session_mode"] == "fast" and exported["session"]["session_mode"] == "fast"
    assert exported["session"]["device"].startswith("cuda")
    ver = exported["verification"] or {}
    print(f"\n{headers[0]}")
    print(f"passed={exported['passed']} token_equal={exported['token_equal']} tokens one-shot "
          f"{len(exported['one_shot']['generated_ids'])} separated {len(exported['separated']['generated_ids'])}; "
          f"first divergence {ver.get('first_divergence')}")
    print("timings (s):", json.dumps(exported["timings"]))
