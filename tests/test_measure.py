"""Measured sweeps on a tiny synthetic model (CPU): storing, resuming, failures, comparison."""
import pytest
import torch

import dsocr_core.measure.sweep as measure
from dsocr_core.cli import main
from dsocr_core.results.analytic_join import compare_run, summarize, summary_markdown
from dsocr_core.measure.sweep import run_sweep, sweep_workloads, vendor_grids
from dsocr_core.runtime.session import Session
from dsocr_core.results.store import RunStore, point_key
from dsocr_core.tiling import sequence_length


@pytest.fixture(scope="module")
def session():
    return Session.load(synthetic="tiny", device="cpu", dtype="float32")


def small_grid():
    return sweep_workloads(["tiny", "gundam"], [(2, 1)], [10, 30], [1], [3], dtype="float32")


def test_vendor_grids_cover_2_to_9_tiles():
    grids = vendor_grids()
    assert {w * h for w, h in grids} == set(range(2, 10))
    assert (4, 2) in grids and (1, 9) in grids and (3, 3) in grids and (2, 5) not in grids


def test_sweep_stores_every_point_with_stats_and_flops(session, tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    seen = []
    run_id = run_sweep(session, store, small_grid(), repeats=2, progress=lambda *a: seen.append(a[3]))
    run = store.get_run(run_id)
    assert run["n_done"] == 4 and seen == ["done"] * 4 + ["recheck"]  # then the order check's repeat
    assert run["flags"]["synthetic_weights"] and run["flags"]["cpu"]
    df = store.points(run_id)
    assert set(df.stage) >= {"sam", "clip", "projector", "vision", "prefill", "decode", "decode_step"}
    assert (df.median_s > 0).all() and (df.repeats == 2).all() and (df.flops > 0).all()
    assert (df.kv_bytes > 0).all()
    # decode FLOPs: K steps from the prompt, exactly K x the mean step
    dec = df[df.stage == "decode"].set_index("key").flops
    step = df[df.stage == "decode_step"].set_index("key").flops
    assert ((dec - 3 * step).abs() <= 3).all()


def test_resume_skips_finished_points(session, tmp_path, monkeypatch):
    store = RunStore(tmp_path / "runs.sqlite")
    workloads = small_grid()
    calls = []
    stop_after = iter([False, False, True])
    run_id = run_sweep(session, store, workloads, repeats=1, should_stop=lambda: next(stop_after, True))
    assert store.get_run(run_id)["n_done"] == 2  # stopped: what was measured is kept
    real = measure.measure_point
    monkeypatch.setattr(measure, "measure_point", lambda s, w, *a, **k: calls.append(w) or real(s, w, *a, **k))
    run_sweep(session, store, workloads, run_id=run_id, repeats=1)
    assert len(calls) == 3 and store.get_run(run_id)["n_done"] == 4  # two points, then the first one again


def test_oom_and_error_are_recorded_and_the_sweep_goes_on(session, tmp_path, monkeypatch):
    store = RunStore(tmp_path / "runs.sqlite")
    workloads = small_grid()
    real = measure.measure_point

    def flaky(s, w, *a, **k):
        if w is workloads[0]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        if w is workloads[1]:
            raise RuntimeError("kernel exploded")
        if w is workloads[2]:  # exactly the all-position float32 logits (the H200's Gundam 9x1 at batch 63)
            logits = w.batch * sequence_length(w) * s.spec.vocab_size * 4
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {logits / 2**20:.2f} MiB.")
        return real(s, w, *a, **k)

    monkeypatch.setattr(measure, "measure_point", flaky)
    run_id = run_sweep(session, store, workloads, repeats=1)
    run = store.get_run(run_id)
    assert (run["n_oom"], run["n_error"], run["n_done"]) == (2, 1, 1)
    df = store.points(run_id).drop_duplicates("key").set_index("key")
    first, third = (df.loc[point_key(workloads[i])].message for i in (0, 2))
    assert "out of memory" in first and "logits" not in first  # 40 GiB is not this point's logits: no reason named
    assert third.startswith("the all-position float32 logits alone are") and "--logits last" in third
    assert "out of memory" in third  # the error itself stays
    assert "kernel exploded" in df[df.status == "error"].message.iloc[0]


def test_comparison_joins_analytic_and_measured(session, tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = run_sweep(session, store, small_grid()[:2], repeats=1,
                       meta={"calibration": {"name": "test GPU", "peak_tflops": 1.0, "bandwidth_tbs": 0.05,
                                             "memory_gb": 16, "calibrated": True}})
    df = compare_run(store, run_id)
    assert len(df) == 2 * 7
    # our analytic model reproduces the FLOP counter exactly for every stage
    assert df.flop_rel_diff.abs().max() < 1e-3
    assert (df.mfu_calibrated > 0).all() and (df.mbu_calibrated > 0).all()
    assert df.mfu_datasheet.isna().all()  # a CPU run has no datasheet GPU
    s = summarize(df)
    assert s["prefill"]["points"] == 2
    assert "| prefill | 2 |" in summary_markdown(s)


def test_measure_cli(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(["measure", "--synthetic", "tiny", "--device", "cpu", "--dtype", "float32", "--modes", "tiny",
                 "--text-tokens", "10", "--decode-steps", "2", "--repeats", "1", "--store",
                 str(tmp_path / "s.sqlite"), "--export", str(out), "--summary", str(tmp_path / "sum.md")])
    assert code == 0 and out.exists() and (tmp_path / "sum.json").exists()
    assert "1 done" in capsys.readouterr().out
    fresh = RunStore(tmp_path / "other.sqlite")
    run_id = fresh.import_run(out)
    assert fresh.get_run(run_id)["n_done"] == 1


@pytest.mark.parametrize("args", [["--grids", "2y2"], ["--batch", "0"], ["--text-tokens", "x"]])
def test_measure_cli_rejects_bad_grids(args, tmp_path, capsys):
    code = main(["measure", "--synthetic", "tiny", "--device", "cpu", "--store", str(tmp_path / "s.sqlite"), *args])
    assert code == 2 and "error:" in capsys.readouterr().err


def test_fast_mode_sweep_is_labelled_and_counts_reference_flops(tmp_path):
    from dsocr_core.runtime.session import Session

    fast = Session.load(synthetic="tiny", device="cpu", dtype="float32", session_mode="fast")
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = run_sweep(fast, store, sweep_workloads(["tiny"], [(1, 1)], [10], [1], [3], dtype="float32"),
                       repeats=1)
    assert store.get_run(run_id)["session_mode"] == "fast"
    df = compare_run(store, run_id)
    assert df.flop_rel_diff.abs().max() < 1e-3


def test_failure_message_says_where():
    from dsocr_core.measure.sweep import failure

    def boom():
        raise RuntimeError("boom")

    try:
        boom()
    except RuntimeError as exc:
        status, message = failure(exc)
    assert status == "error" and message.startswith("RuntimeError: boom | at test_measure.py:")
    assert message.endswith("in boom")


def test_measure_cli_rejects_unknown_mode(tmp_path, capsys):
    code = main(["measure", "--synthetic", "tiny", "--device", "cpu", "--modes", "foo",
                 "--store", str(tmp_path / "s.sqlite")])
    assert code == 2 and "unknown DeepSeek-OCR mode(s) foo; choose from tiny" in capsys.readouterr().err


def test_objects_alive_before_a_point_are_left_out_of_its_collections():
    """older_objects_frozen keeps what existed before out of the collector's scans (so collecting around each timed
    block is cheap on a long sweep), leaves nothing frozen afterwards, also when the block fails or is nested,
    and a cycle the block creates is still collected by collector_paused."""
    import gc
    import weakref

    from dsocr_core.measure.sweep import collector_paused, older_objects_frozen

    class Node:
        pass

    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        assert gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        with older_objects_frozen():  # nested: the outer block's objects stay frozen until it ends
            pass
        # (not an equality: a frozen object freed meanwhile, by this process or a thread, leaves the count; the
        # clean-clone CI once saw 603,010 become 603,008; an unfreeze would have left none)
        assert frozen * 0.99 <= gc.get_freeze_count() <= frozen
        with collector_paused():
            a, b = Node(), Node()
            a.other, b.other = b, a
            gone = weakref.ref(a)
            del a, b
        assert gone() is None  # the cycle made inside was collected after the timed block
    assert gc.get_freeze_count() == 0
    try:
        with older_objects_frozen():
            raise RuntimeError("a point failed")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0


def test_the_garbage_collector_is_paused_while_a_point_is_timed_and_restored_after():
    """A host-bound run must not be charged a full collection whose moment depends on what the process did
    before; the collector's own setting comes back afterwards, also when the timed block fails."""
    import gc

    from dsocr_core.measure.sweep import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with collector_paused():
            raise RuntimeError("a point failed")
    except RuntimeError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_a_flop_pass_that_runs_out_of_memory_is_counted_over_parts_of_the_batch_with_the_same_result(
        session, monkeypatch):
    # the reference model's dense SAM bias outgrows the GPU at large batches (54 Large pages ask 49.44 GiB at once)
    # where the fast engine ran: the pass is split in halves until each part fits, and adds up to the same counts
    from dsocr_core.measure.stage_stats import counted_flops
    from dsocr_core.runtime.inputs import synthetic_for_workload
    from dsocr_core.spec import Workload

    w = Workload(mode="gundam", crops=(2, 1), text_tokens=12, batch=5, decode_steps=2, dtype="float32")
    inputs = synthetic_for_workload(w, seed=4)
    whole = counted_flops(session, inputs, "last")
    real, seen = session.count_stage_flops, []

    def fits_two_rows(inp, **kw):
        seen.append(inp.batch)
        if inp.batch > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 49.44 GiB.")
        return real(inp, **kw)

    monkeypatch.setattr(session, "count_stage_flops", fits_two_rows)
    parts = counted_flops(session, inputs, "last")
    assert seen == [5, 3, 2, 1, 2]  # 5 -> 3 + 2, 3 -> 2 + 1
    assert {k: v for k, v in parts.items() if k != "routing"} == {k: v for k, v in whole.items() if k != "routing"}
    for phase in ("prefill", "decode"):
        got, want = parts["routing"][phase], whole["routing"][phase]
        assert (got["tokens"], got["distinct"], got["loads"]) == (want["tokens"], want["distinct"], want["loads"])
        assert "in 3 parts of the batch" in got["source"] and "parts" not in want["source"]

    def wrapped(inp, **kw):  # what a compiler or a CUDA error hands on: still an out-of-memory (runtime/oom.py)
        if inp.batch > 2:
            raise RuntimeError("CUDA error: out of memory")
        return real(inp, **kw)

    monkeypatch.setattr(session, "count_stage_flops", wrapped)
    assert counted_flops(session, inputs, "last") == parts

    def other_error(inp, **kw):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(session, "count_stage_flops", other_error)
    with pytest.raises(RuntimeError, match="kernel exploded"):  # any other error is the point's error, unsplit
        counted_flops(session, inputs, "last")

    def never_fits(inp, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(session, "count_stage_flops", never_fits)
    with pytest.raises(torch.OutOfMemoryError):  # one row that does not fit is the point's OOM, as before
        counted_flops(session, inputs.rows(0, 1), "last")
    with pytest.raises(ValueError, match="not within the batch"):
        inputs.rows(3, 7)


def test_a_sweep_point_whose_flop_pass_does_not_fit_is_stored_done_with_its_routing_counted_in_parts(
        session, tmp_path, monkeypatch):
    # end to end: the timed repeats ran, the counting pass runs out of memory over the whole batch; the point is
    # kept (not recorded as oom) with the same FLOPs, and its routing records say they were counted in parts
    store = RunStore(tmp_path / "runs.sqlite")
    w = sweep_workloads(["base"], [(1, 1)], [12], [4], [2], dtype="float32")
    whole = store.points(run_sweep(session, store, w, repeats=1, order_check=False))
    real = session.count_stage_flops

    def fits_one_row(inp, **kw):
        if inp.batch > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 49.44 GiB.")
        return real(inp, **kw)

    monkeypatch.setattr(session, "count_stage_flops", fits_one_row)
    run_id = run_sweep(session, store, w, repeats=1, order_check=False)
    assert store.get_run(run_id)["n_done"] == 1
    parts = store.points(run_id)
    assert parts.set_index("stage").flops.to_dict() == whole.set_index("stage").flops.to_dict()
    routing = parts.set_index("stage").loc["prefill", "stage_extra"]["routing"]
    assert routing["tokens"] == 4 * whole.iloc[0]["sequence"] and "in 4 parts of the batch" in routing["source"]


def test_routing_parts_that_made_different_calls_are_refused():
    from dsocr_core.measure.routing_record import gate_call, merge_parts

    a = [gate_call(3, [2, 0, 1])]
    merged = merge_parts([a, [gate_call(2, [0, 1, 1])]])
    assert merged[0].by_expert == (2, 1, 2) and merged[0].tokens == 5 and merged[0].distinct == 3
    assert merged[0].loads == [2, 2, 1]
    with pytest.raises(ValueError, match="different numbers of gate calls"):
        merge_parts([a, a + a])


def test_an_oom_names_the_all_position_logits_in_either_dtype_and_nothing_else():
    """The lm_head writes the logits in bf16, then .float() copies them: either allocation can fail; a request of
    another size, a message without one, or last-position logits get no reason."""
    from dsocr_core.measure.sweep import oom_hint
    from dsocr_core.spec import Workload

    w = Workload(mode="gundam", crops=(9, 1), text_tokens=2437, batch=63)
    cells = 63 * sequence_length(w) * 129280
    for size in (2, 4):
        msg = f"CUDA out of memory. Tried to allocate {cells * size / 2**30:.2f} GiB."
        assert oom_hint(msg, w, 129280).startswith("the all-position float32 logits alone are 109.8 GiB")
    other = "CUDA out of memory. Tried to allocate 6.09 GiB."
    assert oom_hint(other, w, 129280) == other
    assert oom_hint("CUDA error: out of memory", w, 129280) == "CUDA error: out of memory"
    last = f"CUDA out of memory. Tried to allocate {cells * 4 / 2**30:.2f} GiB."
    assert oom_hint(last, w.model_copy(update={"logits": "last"}), 129280) == last


def test_the_flop_count_runs_after_the_timed_engine_let_go_of_its_state(monkeypatch):
    """The counting pass over the reference model gets the memory the timed fast engine held (its static cache,
    buffers and graphs are released first): a point that fits the engine is not lost to the count."""
    fast = Session.load(synthetic="tiny", device="cpu", dtype="float32").with_mode("fast")
    held = []
    real = measure.counted_flops

    def counting(session, *a, **k):
        held.append(len(session.engine._states))
        return real(session, *a, **k)

    monkeypatch.setattr(measure, "counted_flops", counting)
    w = sweep_workloads(["tiny"], [(1, 1)], [10], [2], [2], dtype="float32")[0]
    result = measure.measure_point(fast, w, repeats=1, warmup=0)
    assert held == [0] and result.stages["prefill"]["flops"] > 0
