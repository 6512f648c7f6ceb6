"""StageTimer on the CPU: entries per stage, and the span of a loop's entries with the gaps between them."""
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
