"""StageTimer on the CPU: entries per stage, and the span of a loop's entries with the gaps between them."""
import contextlib
import time

import torch

from dsocr_core.runtime.timing import StageTimer


def test_span_includes_the_gaps_between_entries():
    timer = StageTimer(torch.device("cpu"))
    for _ in range(3):
        with timer.stage("step"):
            time.sleep(0.01)
        time.sleep(0.02)  # outside every entry
    with timer.stage("other"):
        pass
    entries = [s for name, s in timer.finish() if name == "step"]
    assert len(entries) == 3
    span = timer.span("step")
    assert span >= sum(entries) + 2 * 0.02  # the two gaps between the three entries count
    assert span < sum(entries) + 3 * 0.02 + 0.05  # the gap after the last entry does not
    assert timer.span("missing") == 0.0


def test_per_item_splits_entries_that_hold_several_items():
    timer = StageTimer(torch.device("cpu"))
    with timer.stage("decode", count=2):
        time.sleep(0.02)
    with timer.stage("prefill"):
        pass
    with timer.stage("decode"):
        time.sleep(0.01)
    items = timer.per_item("decode")
    first, second = [s for name, s in timer.finish() if name == "decode"]
    assert len(items) == 3 and items[0] == items[1] and abs(items[0] * 2 - first) < 1e-9
    assert abs(items[2] - second) < 1e-9


def test_a_stage_after_the_memory_synchronisation_starts_behind_a_gpu_wait(monkeypatch):
    """The synchronisation for peak memory leaves the GPU idle; the stage's start event must be queued behind a
    short GPU wait (LAUNCH_COVER_CYCLES), or the stage is charged the host's launch of its first kernel (the
    jitter that made a graph-replayed projector 17 or 50 us in the same run). The CUDA calls are recorded, in
    order, on fakes: the order is the property, not a time."""
    from dsocr_core.runtime import timing

    calls: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            calls.append("event")

        def elapsed_time(self, other):
            return 1.0

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(f"sleep {cycles}"))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())  # no GPU to select
    timer = StageTimer(torch.device("cuda"))
    with timer.stage("projector", track_memory=True):
        calls.append("work")
    assert calls[:5] == ["sync", "reset", f"sleep {timing.LAUNCH_COVER_CYCLES}", "event", "work"]
    calls.clear()
    with timer.stage("decode"):  # no synchronisation before it: the queue is not drained, nothing to cover
        calls.append("work")
    assert calls == ["event", "work", "event"]
