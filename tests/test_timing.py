"""StageTimer on the CPU: entries per stage, and the span of a loop's entries with the gaps between them."""
import time

import torch

from dsocr_core.timing import StageTimer


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
