"""Scale-out over Ray (CPU): one local Ray instance (2 CPUs) for the test session, 2 workers holding the tiny
synthetic model (float32). The distributed sweep stores what the single-process one stores; a killed worker loses
nothing; an interrupted driver resumes; bad worker counts and unreachable addresses are one-line errors; and
nothing imports Ray unless asked to.

The tests share one pool of 2 workers: the kill test leaves one alive, the Ctrl-C test kills it, the CLI test
then starts its own; they run in this order on purpose."""
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsocr_core.cli import main
from dsocr_core.measure.scale_out import ScaleOutError, check_address, check_same_gpus, check_workers
from dsocr_core.measure.sweep import run_sweep, sweep_workloads
from dsocr_core.results.store import RunStore
from dsocr_core.tiling import sequence_length

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'ray>=2.40'); the scale-out "
                                                   "tests need a local Ray instance")
LOAD = dict(synthetic="tiny", device="cpu", dtype="float32", seed=0)
SWEEP = dict(repeats=1, warmup=0, seed=0)


def workloads():
    """Four cheap points (the tiny mode: one 512x512 view; a gundam tile grid costs 3x more on this CPU)."""
    return sweep_workloads(["tiny"], [(1, 1)], [10, 20, 30, 40], [1], [2], dtype="float32")


@pytest.fixture(scope="session")
def ray_instance():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(ray_instance):
    from dsocr_core.measure.scale_out import WorkerPool

    p = WorkerPool.start(LOAD, workers=2)
    yield p
    p.close()


def by_key(store, run_id):
    df = store.points(run_id)
    return {k: g.set_index("stage") for k, g in df.groupby("key")}


def test_commands_do_not_import_ray():
    code = ("import sys, dsocr_core.commands.measure, dsocr_core.commands.profile, dsocr_core.measure.sweep, "
            "dsocr_core.measure.dataset_run, dsocr_core.measure.scale_out; from dsocr_core.cli import build_parser; "
            "build_parser().parse_args(['measure', '--synthetic', 'tiny']); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_argument_checks_without_ray():
    assert check_workers(None) is None and check_workers(3) == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ScaleOutError, match="at least 1"):
            check_workers(bad)
    assert check_address("auto") == "auto"
    with pytest.raises(ScaleOutError, match="HOST:PORT"):
        check_address("no port here")
    with pytest.raises(ScaleOutError, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        check_address("127.0.0.1:1")
    same = [{"gpu_name": "NVIDIA H200"}] * 2
    check_same_gpus(same)
    mixed = same + [{"gpu_name": "NVIDIA A100-SXM4-40GB"}]
    with pytest.raises(ScaleOutError, match="different GPU models .*--allow-mixed-gpus"):
        check_same_gpus(mixed)
    check_same_gpus(mixed, allow_mixed=True)


def test_a_worker_records_oom_and_errors_as_statuses(monkeypatch):
    """The worker's own loop (no Ray needed): a raising measure_point becomes a status, as in one process."""
    import types

    import torch

    import dsocr_core.measure.sweep as sweep_mod
    from dsocr_core.measure.scale_out import WorkItem, Worker

    worker = Worker(0)
    calls = []
    worker.session = types.SimpleNamespace(attn_impl="sdpa", device=torch.device("cpu"),
                                           model=types.SimpleNamespace(set_attn_impl=calls.append),
                                           spec=types.SimpleNamespace(vocab_size=129280))
    w = workloads()[0]
    logits = w.batch * sequence_length(w) * 129280 * 4  # the point's all-position float32 logits
    for exc, status in ((torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "oom"),
                        (torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {logits / 2**20:.2f} MiB"),
                         "oom"),
                        (RuntimeError("bad shape"), "error")):
        monkeypatch.setattr(sweep_mod, "measure_point", lambda *a, _e=exc, **k: (_ for _ in ()).throw(_e))
        out = worker.measure(WorkItem("point", "k", w, SWEEP))
        assert out["status"] == status and out["stages"] is None and out["worker_s"] >= 0
        assert str(exc) in out["message"]
        # as in one process: the reason is named where the request is the logits, and only there
        assert out["message"].startswith("the all-position float32 logits") == (f"{logits / 2**20:.2f}" in str(exc))
    assert calls == ["sdpa", "sdpa", "sdpa"]  # the session's attention is restored after every point


@needs_ray
def test_cli_bad_worker_count_and_unreachable_address(ray_instance, tmp_path, capsys):
    base = ["measure", "--synthetic", "tiny", "--device", "cpu", "--dtype", "float32", "--modes", "tiny",
            "--store", str(tmp_path / "runs.sqlite")]
    for extra, message in ((["--workers", "0"], "--workers must be a whole number of at least 1, got 0"),
                           (["--workers", "two"], "--workers must be a whole number of at least 1, got 'two'"),
                           (["--workers", "64"], "--workers 64 asks for more workers than the Ray instance has CPU(s) (2)"),
                           (["--ray-address", "127.0.0.1:1"], "cannot reach a Ray cluster at 127.0.0.1:1"),
                           (["--ray-address", "http://x"], "--ray-address must be 'auto' or HOST:PORT"),
                           (["--workers", "2", "--calibrate"], "--calibrate measures one device")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
    assert ray_instance.is_initialized()  # a refused request leaves the shared instance alone


@needs_ray
def test_distributed_sweep_stores_the_single_process_points(pool, tmp_path):
    from dsocr_core.measure.scale_out import run_sweep_scaled
    from dsocr_core.runtime.session import Session

    store = RunStore(tmp_path / "runs.sqlite")
    stats = {}
    scaled = run_sweep_scaled(pool, store, workloads(), stats=stats, **SWEEP)
    single = run_sweep(Session.load(**LOAD), store, workloads(), **SWEEP)
    a, b = by_key(store, scaled), by_key(store, single)
    assert set(a) == set(b) and len(a) == 4
    for key in a:
        assert (a[key].status == "done").all() and (b[key].status == "done").all()
        assert a[key].flops.to_dict() == b[key].flops.to_dict()
        assert a[key].kv_bytes.iloc[0] == b[key].kv_bytes.iloc[0]
        where = a[key].extra.iloc[0]
        assert where["node"] and where["node_id"] and where["worker"] in (0, 1) and where["gpu_name"] is None
    assert {a[k].extra.iloc[0]["worker"] for k in a} == {0, 1}  # both workers measured
    run = store.get_run(scaled)
    assert run["meta"]["scale_out"]["workers"] == 2 and run["meta"]["repeats"] == 1
    assert run["environment"]["device"] == "cpu" and run["flags"]["synthetic_weights"]
    assert stats["results"] == 4 and stats["retried"] == 0 and stats["lost"] == 0


@needs_ray
def test_interrupted_driver_resumes_without_repeating_or_losing_points(pool, tmp_path):
    from dsocr_core.measure.scale_out import run_sweep_scaled

    store = RunStore(tmp_path / "runs.sqlite")
    seen = []
    run_id = run_sweep_scaled(pool, store, workloads(), progress=lambda *a: seen.append(a[3]),
                              should_stop=lambda: len(seen) >= 1, **SWEEP)
    first = by_key(store, run_id)
    assert 1 <= len(first) < 4 and all((g.status == "done").all() for g in first.values())
    seen2 = []
    run_sweep_scaled(pool, store, workloads(), run_id=run_id, progress=lambda *a: seen2.append(a[3]), **SWEEP)
    assert seen2.count("skipped") == len(first) and seen2.count("done") == 4 - len(first)
    after = by_key(store, run_id)
    assert len(after) == 4 and store.get_run(run_id)["n_done"] == 4
    for key, g in first.items():  # stored points were not measured again
        assert after[key].updated_at.iloc[0] == g.updated_at.iloc[0]
        assert after[key].median_s.to_dict() == g.median_s.to_dict()


@needs_ray
def test_killed_worker_loses_nothing_and_the_run_completes(ray_instance, pool, tmp_path):
    from dsocr_core.measure.scale_out import run_sweep_scaled

    store = RunStore(tmp_path / "runs.sqlite")
    killed = []

    def progress(i, total, w, status):
        if not killed:  # after the first result: kill the worker that has most queued (an item is lost there)
            victim = max(pool.alive(), key=lambda w: len(w.in_flight))
            killed.append(victim.index)
            ray_instance.kill(victim.actor)

    stats = {}
    run_id = run_sweep_scaled(pool, store, workloads(), progress=progress, stats=stats, **SWEEP)
    rows = pool.progress_rows()
    points = by_key(store, run_id)
    assert len(points) == 4 and all((g.status == "done").all() for g in points.values())
    assert stats["retried"] >= 1 and stats["lost"] == 0
    assert [r["alive"] for r in rows].count(False) == 1 and not rows[killed[0]]["alive"]
    # every item the dead worker held was measured again by the survivor
    assert {g.extra.iloc[0]["worker"] for k, g in points.items()} >= {1 - killed[0]}
    # and the pool said so (before: retried without a word): which worker died, which point was retried
    assert any(e.startswith(f"worker {killed[0]} on ") and " died" in e for e in pool.events), pool.events
    assert any(e.startswith("retrying point tiny T") for e in pool.events), pool.events


@needs_ray
def test_ctrl_c_kills_the_workers_and_keeps_what_is_stored(ray_instance, pool, tmp_path):
    """Ctrl-C in the driver (a KeyboardInterrupt while it waits): queued items are cancelled, the workers killed,
    the stored points stay; the shared Ray instance (not the pool's own) stays up."""
    from dsocr_core.measure.scale_out import run_sweep_scaled

    assert pool.alive(), "runs after the kill test, with its surviving worker"
    store = RunStore(tmp_path / "runs.sqlite")

    def progress(*_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep_scaled(pool, store, workloads(), progress=progress, **SWEEP)
    (run,) = store.list_runs()
    assert run["n_points"] == run["n_done"] == 1  # written before the interrupt, kept
    assert not pool.alive() and ray_instance.is_initialized()


@needs_ray
def test_profile_cli_spreads_pages_over_workers(ray_instance, pool, tmp_path, capsys):
    from dsocr_core.grounding.samples import sample_pages

    pages = tmp_path / "pages"
    pages.mkdir()
    for p in list(sample_pages())[:2]:
        shutil.copy(p, pages / p.name)
    (pages / "zz_junk.jpg").write_bytes(b"\x00junk" * 10)
    store = tmp_path / "runs.sqlite"
    args = ["profile", "--pages", str(pages), "--synthetic", "tiny", "--device", "cpu", "--dtype", "float32",
            "--mode", "tiny", "--max-new-tokens", "2", "--store", str(store), "--workers", "2", "--json"]
    import ray

    for w in pool.alive():  # the CLI starts its own pool: free the shared pool's CPUs first
        ray.kill(w.actor)
        w.alive = False
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["done"] == 2 and doc["summary"]["error"] == 1
    rs = RunStore(store)
    run_id = rs.list_runs("dataset")[0]["id"]
    df = rs.points(run_id).drop_duplicates("key")
    assert set(df.status) == {"done", "error"}
    assert all(e["node"] and e["worker"] in (0, 1) for e in df.extra)
    assert rs.get_run(run_id)["meta"]["scale_out"]["workers"] == 2


@needs_ray
def test_measure_cli_exits_non_zero_when_points_failed_for_lack_of_workers(ray_instance, pool, tmp_path, capsys,
                                                                         monkeypatch):
    """Both workers die during the run (the first after the first result, the second after the first result that
    follows a retry). Before: the run ended with errors but exit status 0, not a word on the deaths or retries."""
    from dsocr_core.measure.scale_out import WorkerPool

    for w in pool.alive():  # the CLI starts its own pool: free the shared pool's CPUs first
        ray_instance.kill(w.actor)
        w.alive = False
    real = WorkerPool.run_items
    kills = []

    def run_items(self, items, record, *a, **k):
        def record_then_kill(item, result):
            record(item, result)
            retried = any(e.startswith("retrying") for e in self.events)
            if self.alive() and (not kills or (len(kills) == 1 and retried)):
                kills.append(max(self.alive(), key=lambda w: len(w.in_flight)))  # the one with most queued
                ray_instance.kill(kills[-1].actor)
        return real(self, items, record_then_kill, *a, **k)

    monkeypatch.setattr(WorkerPool, "run_items", run_items)
    store = tmp_path / "runs.sqlite"
    code = main(["measure", "--synthetic", "tiny", "--device", "cpu", "--dtype", "float32", "--modes", "tiny",
                 "--grids", "1x1", "--text-tokens", "10,20,30,40", "--decode-steps", "2", "--repeats", "1",
                 "--warmup", "0", "--store", str(store), "--workers", "2"])
    out, err = capsys.readouterr()
    run = RunStore(store).list_runs()[0]
    assert run["n_points"] == 4 and run["n_error"] >= 1
    assert code == 1, (code, err)
    assert sorted(re.findall(r"worker (\d) on \S+ died \(", err)) == ["0", "1"], err  # each death said once
    assert "retrying point tiny" in err and "recorded as error" in err, err
    assert f"{run['n_error']} point(s) failed because their Ray workers died" in err
    assert f"--resume {run['id'][:12]}" in err.splitlines()[-1]


@needs_ray
def test_dashboard_sweep_on_ray_workers_reports_progress_per_worker(ray_instance, tmp_path):
    """ui/scale_out.py's background job (the measured-sweep form's 'Local Ray workers' choice), without a page."""
    import types

    from ui import scale_out as ui_scale_out
    from ui import sweeps

    model = types.SimpleNamespace(source="synthetic", preset="tiny", checkpoint=None, device="cpu", dtype="float32",
                                  attn="sdpa", session_mode="reference", model="deepseek-ocr")
    store = RunStore(tmp_path / "runs.sqlite")
    scale = {"workers": 2, "address": None, "allow_mixed_gpus": False}
    start = ui_scale_out.starter(scale, model)
    job = start(None, store, workloads()[:2], name="ui sweep", label="tiny", repeats=1, warmup=0)
    sweeps.runner().join(timeout=240)
    assert not job.running and job.error is None, job.error
    assert job.handled == 2 and job.statuses["done"] == 2
    rows = job.worker_rows
    assert len(rows) == 2 and sum(r["done"] for r in rows) == 2 and all(r["node"] for r in rows)
    assert store.get_run(job.run_id)["n_done"] == 2
    assert store.get_run(job.run_id)["meta"]["started_from"] == "dashboard"


def test_measured_page_forms_offer_ray_workers(tmp_path, monkeypatch):
    """The measured-sweep and dataset-run forms carry the 'where to run' inputs; by default nothing changes."""
    from streamlit.testing.v1 import AppTest

    (tmp_path / "reference").mkdir()
    monkeypatch.setenv("DSOCR_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(tmp_path / "reference"))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("pages/measured.py").run()
    at.session_state["ms_tab"] = "New sweep"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    place = at.radio(key="ms_place")
    assert place.value == "here" and set(place.options) >= {"This process (the sidebar's loaded model)",
                                                            "Local Ray workers (one per GPU)", "A Ray cluster"}
    assert at.number_input(key="ms_workers").value == 2  # on the CPU
    assert at.text_input(key="ms_address").value == "auto"


@needs_ray
def test_calibrate_cli_writes_one_profile_per_worker(ray_instance, pool, tmp_path, capsys):
    """calibrate --workers 2: each worker (no model loaded) calibrates its device; one labelled profile each."""
    from dsocr_core.calibration.profile import load_profile

    for w in pool.alive():  # free the shared pool's CPUs for the calibration workers
        ray_instance.kill(w.actor)
        w.alive = False
    out = tmp_path / "node.json"
    assert main(["calibrate", "--device", "cpu", "--quick", "--workers", "2", "--no-progress", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["failed"] == [] and len(doc["profiles"]) == 2
    paths = sorted(p["profile"] for p in doc["profiles"])
    assert all(Path(p).name.startswith("node.") and Path(p).name.endswith(".json") for p in paths)
    assert len(set(paths)) == 2  # one file per worker, never one overwriting the other
    for p in paths:
        prof = load_profile(p)
        assert prof.device["kind"] == "cpu" and prof.raw["calibration"]["quick"] is True
        assert prof.table("gemm.bfloat16") is not None


def test_the_worker_panel_says_which_worker_died_and_what_was_retried():
    from streamlit.testing.v1 import AppTest

    def page():
        import types

        from ui.scale_out import worker_panel

        row = {"worker": 1, "node": "vm", "gpu": "cpu", "gpu_index": None, "alive": False, "done": 1, "failed": 0,
               "in_flight": 0, "current": "", "death": "ActorDiedError: gone"}
        worker_panel(types.SimpleNamespace(worker_rows=[row], worker_events=[
            "worker 1 on vm died (ActorDiedError: gone); 1 worker(s) left",
            "retrying point tiny T10 B1 K2 (it was on worker 1 on vm) on another worker"]))

    at = AppTest.from_function(page, default_timeout=60).run()
    assert not at.exception, at.exception
    (warning,) = at.warning
    assert "worker 1 on vm died" in warning.value.replace("\\", "") and "retrying point tiny" in warning.value
