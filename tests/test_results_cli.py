"""Issue 19, items 3, 4, 5, 9 and 10 on the command line: bounded analytic sweeps written through a temporary
file, resumes that refuse other settings, run ids printed and listed (unique prefixes accepted), checkpoint
errors that name the tensor or the missing key, and text tables whose columns never run together."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

import dsocr_core.commands.measure as measure_cmd
import dsocr_core.measure.sweep as sweep_mod
from dsocr_core.analytic import Points, sweep_table, write_sweep
from dsocr_core.cli import main
from dsocr_core.hardware import get_hardware
from dsocr_core.results import sweep_file
from dsocr_core.results.store import AmbiguousRunId, RunNotFound, RunStore
from dsocr_core.results.tables import format_table
from dsocr_core.spec import PRESETS

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _no_model(*_a, **_k):
    raise AssertionError("the model was loaded although the command should have stopped before")


# ------------------------------------------------------------------------------------------------ item 3
GRID = dict(mode="gundam", crops=[(1, 1), (2, 2), (3, 2)], text_tokens=[10, 100, 1000, 5000],
            batch=[1, 8], decode_steps=[0, 64])


@pytest.mark.parametrize("ext", ["csv", "json"])
def test_chunked_sweep_file_equals_the_whole_table(tmp_path, ext):
    spec, hw = PRESETS["full"](), get_hardware("h200")
    whole = write_sweep(sweep_table(spec, Points.grid(**GRID), hw, with_capacity=True), tmp_path / f"whole.{ext}")
    n, path = sweep_file.write_sweep_file(spec, hw, tmp_path / f"chunked.{ext}", chunk_points=7, **GRID)
    assert n == 48 and path.read_bytes() == whole.read_bytes()


def test_cli_sweep_memory_is_bounded_by_the_chunk(tmp_path, capsys, monkeypatch):
    seen = []
    real = sweep_file.sweep_columns
    monkeypatch.setattr(sweep_file, "CHUNK_POINTS", 500)
    monkeypatch.setattr(sweep_file, "sweep_columns", lambda spec, pts, *a: seen.append(pts.size) or real(spec, pts, *a))
    out_csv = tmp_path / "grid.csv"
    code, out, _ = run(capsys, "analytic", "--crops", "1x1,2x2", "--text-tokens", ",".join(map(str, range(1, 101))),
                       "--batch", ",".join(map(str, range(1, 21))), "--sweep", out_csv)
    assert code == 0 and "4000 points" in out
    assert max(seen) == 500 and sum(seen) == 4000  # never more than one chunk of columns in memory
    df = pd.read_csv(out_csv)
    assert len(df) == 4000 and df["text_tokens"].iloc[-1] == 100 and df["batch"].iloc[-1] == 20


def test_a_failed_sweep_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    target = tmp_path / "out.csv"
    target.write_text("the previous sweep\n")
    calls = []
    real = sweep_file.sweep_columns

    def failing(spec, pts, *a):
        calls.append(pts.size)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the sweep, two chunks written
        return real(spec, pts, *a)

    monkeypatch.setattr(sweep_file, "CHUNK_POINTS", 100)
    monkeypatch.setattr(sweep_file, "sweep_columns", failing)
    code = main(["analytic", "--text-tokens", ",".join(map(str, range(1, 501))), "--sweep", str(target)])
    assert code == 130 and len(calls) == 3  # the CLI reports the interrupt
    assert target.read_text() == "the previous sweep\n"  # untouched: the new file was never renamed onto it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]  # and the temporary file is gone


def test_sigterm_cleans_up_a_sweep_as_ctrl_c_does(tmp_path):
    """What `timeout` and `kill` send. Before: the process died at once, leaving the hidden .part file (224 MB for
    a large grid) beside the target; now SIGTERM unwinds like Ctrl-C and the exit status says it was SIGTERM."""
    target = tmp_path / "out.csv"
    cmd = [sys.executable, "-m", "dsocr_core", "analytic", "--text-tokens", ",".join(map(str, range(1, 2001))),
           "--batch", ",".join(map(str, range(1, 501))), "--sweep", str(target)]  # 10^6 points: minutes
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.csv.*.part")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(tmp_path.glob(".out.csv.*.part")), "the sweep never started writing"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "terminated" in err, (proc.returncode, err)
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_that_would_not_fit_on_the_disk_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep_file.shutil, "disk_usage", lambda _p: types.SimpleNamespace(free=10_000))
    code, out, err = run(capsys, "analytic", "--text-tokens", "10,20,30,40,50,60,70,80", "--sweep",
                         tmp_path / "big.json")
    assert code == 2 and not out and "needs about" in err and "GB free" in err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_value_anywhere_fails_before_anything_is_written(tmp_path, capsys):
    code, _, err = run(capsys, "analytic", "--text-tokens", "10,20", "--batch", "1,70000", "--sweep",
                       tmp_path / "x.csv")
    assert code == 2 and "batch" in err and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ items 4, 5
def _sweep_run(store, **changes):
    """A run recorded as measure records one (tiny synthetic weights, fp32, sdpa, CPU, repeats 1, no warm-up)."""
    meta = {"repeats": 1, "warmup": 0, "seed": 0, "logits": "all", **changes.pop("meta", {})}
    return store.create_run("sweep", "tiny sweep", {"device": "cpu"},
                            {"source": "synthetic", "synthetic": True, "detail": "preset tiny, seed 0 (random weights)"},
                            dtype=changes.get("dtype", "float32"), attn="sdpa", session_mode="reference", meta=meta)


MEASURE = ["measure", "--synthetic", "tiny", "--device", "cpu", "--dtype", "float32", "--modes", "tiny",
           "--text-tokens", "10", "--decode-steps", "1", "--repeats", "1", "--warmup", "0"]


@pytest.mark.parametrize("extra,needle", [
    (["--dtype", "bfloat16", "--attn", "eager", "--seed", "3"], "dtype float32 -> bfloat16; attention sdpa -> eager; seed 0 -> 3"),
    (["--repeats", "3"], "repeats 1 -> 3"),
    (["--logits", "last"], "logits all -> last"),
    (["--session-mode", "fast"], "session mode reference -> fast"),
    (["--name", "another name"], "name 'tiny sweep' -> 'another name'"),  # before: ignored without a word
    (["--kind", "reference"], "kind sweep -> reference"),
])
def test_resume_with_other_settings_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, needle):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = _sweep_run(store)
    monkeypatch.setattr(measure_cmd, "session_from_args", _no_model)
    code, out, err = run(capsys, *MEASURE, *extra, "--resume", run_id[:6], "--store", store.path)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert needle in err and "start a new run" in err
    assert store.get_run(run_id)["n_points"] == 0


def test_resume_with_the_runs_own_name_and_kind_goes_on(tmp_path, capsys, monkeypatch):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = _sweep_run(store)
    monkeypatch.setattr(measure_cmd, "session_from_args", _no_model)
    with pytest.raises(AssertionError, match="the model was loaded"):  # past every check: the model would load
        main([*MEASURE, "--name", "tiny sweep", "--kind", "sweep", "--resume", run_id[:6], "--store",
              str(store.path)])


def test_profile_resume_resolves_ids_as_the_store_does_and_refuses_another_name(tmp_path, capsys, monkeypatch):
    """Before: profile matched ids by exact-case prefix (an id in upper case was "no dataset run"), only after
    loading the model, and ignored --name."""
    import dsocr_core.commands.profile as profile_cmd
    from dsocr_core.grounding.samples import sample_pages

    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.create_run("dataset", "my pages", {"device": "cpu"}, {"source": "synthetic"}, dtype="float32",
                              attn="sdpa", session_mode="reference")
    monkeypatch.setattr(profile_cmd, "session_from_args", _no_model)
    base = ["profile", "--pages", str(sample_pages()[-1]), "--synthetic", "tiny", "--device", "cpu",
            "--store", str(store.path), "--resume"]
    code, out, err = run(capsys, *base, run_id[:8], "--name", "renamed")
    assert code == 2 and "name 'my pages' -> 'renamed'" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run(capsys, *base, "0" * 12)
    assert code == 2 and "no run" in err
    with pytest.raises(AssertionError, match="the model was loaded"):  # the id in upper case reaches the run
        main([*base, run_id.upper(), "--name", "my pages"])


def test_resume_of_other_weights_or_device_is_refused_before_any_point(tmp_path, capsys, monkeypatch):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = _sweep_run(store)
    fake = types.SimpleNamespace(weights={"source": "synthetic", "detail": "preset tiny, seed 0 (random weights)"},
                                 device=torch.device("cpu"))
    monkeypatch.setattr(measure_cmd, "session_from_args", lambda args: fake)
    monkeypatch.setattr(sweep_mod, "run_sweep", _no_model)
    fake.weights = {"source": "synthetic", "detail": "preset tiny, seed 1 (random weights)"}
    code, _, err = run(capsys, *MEASURE, "--resume", run_id, "--store", store.path)
    assert code == 2 and "weights preset tiny, seed 0 (random weights) -> preset tiny, seed 1" in err


def test_unknown_and_ambiguous_ids_end_in_one_line_before_the_model(tmp_path, capsys, monkeypatch):
    store = RunStore(tmp_path / "runs.sqlite")
    a, b = _sweep_run(store), _sweep_run(store)
    monkeypatch.setattr(measure_cmd, "session_from_args", _no_model)
    absent = next(p for p in ("0123abcd", "fedcba98") if not a.startswith(p) and not b.startswith(p))
    for bad, needle in ((absent, "no run"), ("not-an-id!", "not a run id")):
        code, out, err = run(capsys, *MEASURE, "--resume", bad, "--store", store.path)
        assert code == 2 and not out and len(err.strip().splitlines()) == 1 and needle in err, err
    # ambiguity: two ids that share a prefix (made so by hand)
    with store._write() as conn:
        conn.execute("UPDATE runs SET id = 'abcd' || substr(id, 5) WHERE id IN (?, ?)", (a, b))
    with pytest.raises(AmbiguousRunId, match="matches 2 runs"):
        store.resolve_id("abcd")
    with pytest.raises(RunNotFound, match="is a sweep run, not dataset"):
        store.resolve_id("abcd" + a[4:], kinds=("dataset",))
    assert store.resolve_id("ABCD" + a[4:10]) == "abcd" + a[4:]


def test_measure_prints_the_id_first_and_on_interrupt(tmp_path, capsys, monkeypatch):
    store_path = tmp_path / "runs.sqlite"
    fake = types.SimpleNamespace(weights={"source": "synthetic", "detail": "x"}, device=torch.device("cpu"))
    monkeypatch.setattr(measure_cmd, "session_from_args", lambda args: fake)

    def interrupted(session, store, workloads, run_id=None, **kw):
        if not workloads:  # the run is recorded first (run_sweep does it), so its id is known up front
            return store.create_run("sweep", kw["name"], {"device": "cpu"}, session.weights, dtype="float32",
                                    attn="sdpa", session_mode="reference", meta={**kw["meta"], "seed": 0})
        print("measuring ...")
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_mod, "run_sweep", interrupted)
    code, out, err = run(capsys, *MEASURE, "--store", store_path)
    assert code == 130 and "measuring" in out
    (run_id,) = [r["id"] for r in RunStore(store_path).list_runs()]
    lines = err.splitlines()
    assert lines[0].startswith(f"run {run_id}") and f"--resume {run_id[:12]}" in lines[0]
    assert any(line.startswith("interrupted;") and run_id in line and f"--resume {run_id[:12]}" in line
               for line in lines)


def test_measure_then_resume_by_prefix_and_list_runs(tmp_path, capsys):
    """One real tiny CPU sweep point; the resume (by an 8-character prefix) measures nothing twice."""
    store_path = tmp_path / "runs.sqlite"
    code, _, err = run(capsys, *MEASURE, "--store", store_path)
    assert code == 0
    (run_id,) = [r["id"] for r in RunStore(store_path).list_runs()]
    assert err.splitlines()[0].startswith(f"run {run_id}  (new")
    code, out, err = run(capsys, *MEASURE, "--resume", run_id[:8], "--store", store_path)
    assert code == 0 and err.splitlines()[0].startswith(f"run {run_id}  (resumed")
    assert f"run {run_id}: 1 done, 0 oom, 0 error" in out
    code, out, _ = run(capsys, "runs", "--store", store_path)
    header, row = out.splitlines()[:2]
    assert header.split() == ["id", "kind", "name", "created", "(UTC)", "done", "oom", "error"]
    assert row.startswith(run_id) and row.split()[-3:] == ["1", "0", "0"]
    code, out, _ = run(capsys, "runs", run_id[:5], "--store", store_path)
    assert code == 0 and f"run {run_id}" in out and "dtype float32" in out and f"--resume {run_id[:12]}" in out
    code, out, _ = run(capsys, "runs", run_id[:5], "--export", tmp_path / "r.json", "--store", store_path)
    assert code == 0 and json.loads((tmp_path / "r.json").read_text())["run"]["id"] == run_id
    code, out, _ = run(capsys, "runs", "--json", "--store", store_path)
    assert json.loads(out)[0]["n_done"] == 1
    code, _, err = run(capsys, "runs", "--store", tmp_path / "absent.sqlite")
    assert code == 2 and "no run store" in err and not (tmp_path / "absent.sqlite").exists()


def test_runs_table_keeps_hostile_names_on_one_line(tmp_path, capsys):
    store = RunStore(tmp_path / "runs.sqlite")
    store.create_run("sweep", "evil\nname\x1b[31m red " + "x" * 200, {"device": "cpu"}, {"source": "none"})
    code, out, _ = run(capsys, "runs", "--store", store.path)
    table = out.split("\n\n")[0].splitlines()
    assert code == 0 and len(table) == 2 and "\x1b" not in out and "…" in table[1]


# ------------------------------------------------------------------------------------------------ item 9
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from dsocr_core.model import save_checkpoint, synthetic_state_dict
    from dsocr_core.spec import tiny_spec

    spec = tiny_spec()
    folder = tmp_path_factory.mktemp("ck") / "tiny"
    save_checkpoint(synthetic_state_dict(spec, seed=1, dtype="float32"), spec, folder, dtype="float32")
    return folder


def _copy(checkpoint, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(checkpoint, folder)
    return folder


def test_cli_names_the_mis_shaped_tensor_and_its_shapes(checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = _copy(checkpoint, tmp_path)
    state = load_file(folder / "model.safetensors")
    state["model.sam_model.blocks.1.attn.rel_pos_h"] = torch.zeros(27, 16)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    code, out, err = run(capsys, "generate", "--checkpoint", folder, "--device", "cpu", "--max-new-tokens", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "1 mis-shaped" in err and "model.sam_model.blocks.1.attn.rel_pos_h [27, 16] (expected [127, 16])" in err


def test_a_missing_size_key_is_named_instead_of_its_consequence(checkpoint, tmp_path, capsys):
    folder = _copy(checkpoint, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.pop("hidden_size")
    config["language_config"].pop("hidden_size")
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run(capsys, "generate", "--checkpoint", folder, "--device", "cpu", "--max-new-tokens", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1
    first_problem = err.split("has no ", 1)[1]
    assert first_problem.startswith("hidden_size") and "default hidden_size=1280 was assumed" in err


# ------------------------------------------------------------------------------------------------ item 10
def test_large_values_never_run_columns_together(capsys):
    code, out, _ = run(capsys, "analytic", "--crops", "3x3", "--text-tokens", "8000", "--batch", "500",
                       "--decode-steps", "8000")
    assert code == 0
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("stage"))
    rows = [line.split() for line in lines[head + 1:head + 8]]
    assert [r[0] for r in rows] == ["sam", "clip", "projector", "vision", "prefill", "decode", "total"]
    for r in rows:  # 12 cells each, every number a well-formed 1,234.5 (none glued to the next)
        assert len(r) == 12, r
        assert all(re.fullmatch(r"-?\d{1,3}(,\d{3})*\.\d+", c) for c in r[1:11]), r
    assert float(rows[-1][1].replace(",", "")) > 1e7  # GFLOP: values past the old fixed width of 12


def test_format_table_sizes_columns_to_their_values():
    text = format_table(["a", "b"], [["x", 6_155_817_687.6], ["y", 1.0]], align="lr")
    lines = text.splitlines()
    assert lines[1].split() == ["x", "6155817687.6"] and len({len(line) for line in lines}) == 1
    with pytest.raises(ValueError):
        format_table(["a"], [["x", "y"]])
