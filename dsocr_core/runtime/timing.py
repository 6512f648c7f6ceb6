"""Stage timing: NVTX ranges plus CUDA events on a GPU, perf_counter with synchronisation on the CPU.

Events are recorded without synchronising inside the timed region, so timing does not serialise the GPU
pipeline; all elapsed times are read once, after a single synchronisation at the end (`finish()`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

try:  # nvtx marks ranges for `nsys profile`; absent on some machines, so timing must not depend on it
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - exercised only where nvtx is missing
    _nvtx = None


@contextmanager
def nvtx_range(name: str):
    if _nvtx is None:
        yield
    else:
        with _nvtx.annotate(name, domain="dsocr"):
            yield


LAUNCH_COVER_CYCLES = 200_000  # about 100 us of GPU clock cycles: longer than a stage's first launch
COVER_KERNEL = "spin_kernel"  # the wait's kernel (torch.cuda._sleep): not the model's, left out of kernel counts


@dataclass
class _Mark:
    name: str
    start: object
    end: object = None
    count: int = 1  # items (e.g. decode steps) the entry holds


@dataclass
class StageTimer:
    """Times named stages on one device. Several entries with the same name are kept in order."""

    device: torch.device
    marks: list[_Mark] = field(default_factory=list)
    peak_memory: dict[str, int] = field(default_factory=dict)
    current: str | None = None  # the stage being timed (innermost), for hooks that attribute work to a stage

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        """Time one entry of `name`; `count`: how many items (decode steps) it holds, for per_item(). Yields the
        entry, whose `count` may be set inside the block (when the items are known only after the work)."""
        if self.cuda and track_memory:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            # The synchronisation left the GPU idle: the start event would fire at once and the stage would be
            # charged the host's launch of its first kernel (10-30 us of jitter, as large as a graph-replayed
            # projector). A short GPU wait queued first lets the host enqueue the stage behind the start event, so
            # a stage timed after a synchronisation starts at its first kernel: host time before that launch (up
            # to the wait's length, one eager op's worth) is not charged; every later host gap still is.
            with torch.cuda.device(self.device):
                torch.cuda._sleep(LAUNCH_COVER_CYCLES)
        with nvtx_range(name):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                start = time.perf_counter()
            mark = _Mark(name, start, count=count)
            outer, self.current = self.current, name
            try:
                yield mark
            finally:
                self.current = outer
                if self.cuda:
                    mark.end = torch.cuda.Event(enable_timing=True)
                    mark.end.record()
                else:
                    mark.end = time.perf_counter()
                self.marks.append(mark)
        if self.cuda and track_memory:
            torch.cuda.synchronize(self.device)
            self.peak_memory[name] = max(self.peak_memory.get(name, 0), torch.cuda.max_memory_allocated(self.device))

    def finish(self) -> list[tuple[str, float]]:
        """(stage, seconds) for every recorded stage, in order."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [(m.name, m.start.elapsed_time(m.end) / 1e3) for m in self.marks]
        return [(m.name, m.end - m.start) for m in self.marks]

    def per_item(self, name: str) -> list[float]:
        """Seconds per item of every `name` entry, in order: an entry of `count` items gives `count` equal
        shares (a graph launch holding several decode steps gives one time per step)."""
        out: list[float] = []
        for (n, seconds), m in zip(self.finish(), self.marks):
            if n == name:
                out += [seconds / m.count] * m.count
        return out

    def span(self, name: str) -> float:
        """Seconds from the start of the first `name` entry to the end of the last, gaps between entries
        included (a loop's throughput, where summing entries would leave out the time between them)."""
        ms = [m for m in self.marks if m.name == name]
        if not ms:
            return 0.0
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return ms[0].start.elapsed_time(ms[-1].end) / 1e3
        return ms[-1].end - ms[0].start

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, seconds in self.finish():
            out[name] = out.get(name, 0.0) + seconds
        return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
