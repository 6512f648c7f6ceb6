"""benchmarks/order_replay.py: a stored run's points measured again in their order, the first after each."""
from __future__ import annotations

import pytest

from benchmark_scripts import load_benchmark
from dsocr_core.measure.sweep import run_sweep, sweep_workloads
from dsocr_core.results.store import RunStore
from dsocr_core.runtime.session import Session


def test_a_tiny_run_replayed_with_its_first_point_after_each(tmp_path, capsys):
    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore(tmp_path / "runs.sqlite")
    workloads = sweep_workloads(["tiny"], [(1, 1)], [10, 20, 30], [1], [2], dtype="float32")
    run_sweep(session, store, workloads, repeats=1, order_check=False)
    replay = load_benchmark("order_replay")
    out = replay.main(["--store", str(tmp_path / "runs.sqlite"), "--synthetic", "tiny", "--device", "cpu",
                       "--dtype", "float32", "--repeats", "1", "--first-after-each", "--no-flops",
                       "--out", str(tmp_path / "replay.json")])
    assert [m["point"] for m in out["measurements"]] == [0, 1, 0, 2, 0]
    assert [m["workload"]["text_tokens"] for m in out["measurements"]] == [10, 20, 10, 30, 10]
    first = out["measurements"][0]
    assert set(first["measured_s"]) >= {"sam", "prefill", "decode_step"} and first["gpu_state"] is None
    assert first["stored_s"]["prefill"] > 0 and (tmp_path / "replay.json").is_file()
    printed = capsys.readouterr().out
    assert "point 2 (tiny b1 t30): sam" in printed and "GPU state unknown" in printed


def test_a_run_of_one_point_has_nothing_to_replay(tmp_path):
    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore(tmp_path / "runs.sqlite")
    run_sweep(session, store, sweep_workloads(["tiny"], [(1, 1)], [10], [1], [2], dtype="float32"), repeats=1)
    with pytest.raises(SystemExit, match="1 finished point"):
        load_benchmark("order_replay").main(["--store", str(tmp_path / "runs.sqlite"), "--device", "cpu"])
    with pytest.raises(SystemExit, match="no sweep run"):
        load_benchmark("order_replay").main(["--store", str(tmp_path / "empty.sqlite"), "--device", "cpu"])


def test_a_point_that_fails_is_reported_and_the_replay_goes_on(tmp_path, capsys):
    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore(tmp_path / "runs.sqlite")
    run_sweep(session, store, sweep_workloads(["tiny"], [(1, 1)], [10, 20], [1], [2], dtype="float32"),
              repeats=1, order_check=False)
    replay = load_benchmark("order_replay")
    real = replay.measure_with_attn

    def out_of_memory_at_20(s, w, *a, **k):
        if w.text_tokens == 20:
            raise RuntimeError("CUDA out of memory. Tried to allocate 49.44 GiB")
        return real(s, w, *a, **k)
    replay.measure_with_attn = out_of_memory_at_20
    out = replay.main(["--store", str(tmp_path / "runs.sqlite"), "--synthetic", "tiny", "--device", "cpu",
                       "--repeats", "1", "--first-after-each", "--no-flops"])
    assert [m["status"] for m in out["measurements"]] == ["done", "oom", "done"]
    assert "point 1 (tiny b1 t20): oom" in capsys.readouterr().out
