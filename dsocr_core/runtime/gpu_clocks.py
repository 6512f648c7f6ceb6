"""The SM clock each timed stage ran at: NVML read every few milliseconds from a thread while a point's repeats run.

Why: a compute-bound kernel's time is a number of cycles, and the SM clock moves under load. An H200 at its 700 W
cap ran 8192^3 GEMMs at full speed for their first 20 ms and 17% slower at about 1,500 MHz from 50 ms on, while
copies kept 1,980 MHz (benchmarks/sustained_load.py); in the fast engine's generations of large batches CLIP and
the LM prefill ran as low as 1,600 MHz, SAM before them at 1,750-1,960 (benchmarks/stage_clocks.py;
docs/accuracy.md, "The clocks a stage ran at"). The time model's tables are timed in short replays at the full
clock, so a measured point is predicted at the clocks it recorded (analytic/predict.py, Prediction.clocks), as it
is at its own host speed.

NVML is the driver's own library (libnvidia-ml.so.1), called through ctypes: no package is needed, and a reading
takes microseconds (nvidia-smi takes 20-50 ms, too coarse for a 10 ms stage). Where the library or the GPU cannot be
read (a CPU, a container without it) there is no sampler and nothing is recorded: None, never a made-up clock.

How a reading finds its stage: just before each timed generation the host synchronises and records an anchor event
(the GPU is idle, so it fires at once); each stage's start and end events, measured from the anchor, place the stage
on the host clock, where the sampler stamped its readings.
"""
from __future__ import annotations

import ctypes
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterable

PERIOD_S = 0.005  # between readings: several per 10 ms stage, and the GIL is taken about 200 times a second
NVML_CLOCK_SM = 1


_NVML: list = []  # the library, loaded and initialised once per process (NVML counts inits; none is left undone)


def _nvml():
    """libnvidia-ml with the entry points used here typed, initialised once; None where it cannot be."""
    if not _NVML:
        lib = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            lib.nvmlInit_v2.restype = ctypes.c_int
            lib.nvmlDeviceGetHandleByPciBusId_v2.argtypes = (ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p))
            lib.nvmlDeviceGetHandleByPciBusId_v2.restype = ctypes.c_int
            lib.nvmlDeviceGetClockInfo.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint))
            lib.nvmlDeviceGetClockInfo.restype = ctypes.c_int
            if lib.nvmlInit_v2() != 0:
                lib = None
        except (OSError, AttributeError):  # no library, or one without these entry points
            lib = None
        _NVML.append(lib)
    return _NVML[0]


class NvmlClock:
    """The SM clock (MHz) of one GPU through NVML; `open` gives None where it cannot be read."""

    def __init__(self, lib, handle):
        self._lib, self._handle = lib, handle

    @classmethod
    def open(cls, device) -> "NvmlClock | None":
        import torch

        from .gpu_state import _smi_target

        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        lib = _nvml()
        if lib is None:
            return None
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByPciBusId_v2(_smi_target(device).encode(), ctypes.byref(handle)) != 0:
            return None
        reader = cls(lib, handle)
        return reader if reader.read() is not None else None

    def read(self) -> float | None:
        mhz = ctypes.c_uint()
        if self._lib.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(mhz)) != 0:
            return None
        return float(mhz.value)


class ClockSampler:
    """Calls `reader.read()` every `period_s` in a daemon thread from run() until stop(), keeping the readings that
    are not None: samples [(host s, reading)]. start(device) samples the SM clock (MHz) through NVML."""

    def __init__(self, reader, period_s: float = PERIOD_S):
        self.reader, self.period_s = reader, period_s
        self.samples: list[tuple[float, Any]] = []
        self._stop, self._paused = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-clock-sampler", daemon=True)

    @classmethod
    def start(cls, device, period_s: float = PERIOD_S) -> "ClockSampler | None":
        """A running sampler of `device`'s SM clock, or None where NVML cannot read it."""
        clock = NvmlClock.open(device)
        return None if clock is None else cls(clock, period_s).run()

    def run(self) -> "ClockSampler":
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.period_s):
            if self._paused.is_set():
                continue
            value = self.reader.read()
            if value is not None:
                self.samples.append((time.perf_counter(), value))

    @contextmanager
    def paused(self):
        """No readings inside the block (a host-speed probe: it times eager ops, which a reading would delay)."""
        self._paused.set()
        try:
            yield
        finally:
            self._paused.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@dataclass
class Anchor:
    """A host time and a CUDA event recorded together on an idle GPU: event times measured from it are host times."""

    host_s: float
    event: Any

    @classmethod
    def now(cls, device) -> "Anchor":
        import torch

        torch.cuda.synchronize(device)
        event = torch.cuda.Event(enable_timing=True)
        host = time.perf_counter()
        event.record(torch.cuda.current_stream(device))  # the stream the stage timer records on, on `device`
        return cls(host, event)

    def spans(self, marks: Iterable) -> list[tuple[str, float, float]]:
        """(stage, host start, host end) of a finished timer's marks (runtime/timing.StageTimer.marks, CUDA events;
        the events must have completed: the timer's finish() synchronises)."""
        return [(m.name, self.host_s + self.event.elapsed_time(m.start) / 1e3,
                 self.host_s + self.event.elapsed_time(m.end) / 1e3) for m in marks]


class StageClocks:
    """The SM clock of each stage of the generations timed inside the block, the one way a sweep's points and a
    dataset run's pages record it:

        with StageClocks(device) as clocks:
            with clocks.paused():
                probe the host's speed
            timed_generation(..., timer=clocks.timer())
        clocks.result()  # {stage: {mhz, samples}}, or None where no clock can be read (a CPU)
    """

    def __init__(self, device):
        self.device = device
        self.sampler: ClockSampler | None = None
        self._timed: list[tuple[Any, Anchor]] = []

    def __enter__(self) -> "StageClocks":
        try:  # the clocks are evidence beside a measurement: failing to read them must never cost the measurement
            self.sampler = ClockSampler.start(self.device)
        except Exception:  # noqa: BLE001 - NVML or the driver in a state nobody planned for: no clocks, said so
            self.sampler = None
        return self

    def __exit__(self, *exc) -> None:
        if self.sampler:
            self.sampler.stop()

    def paused(self):
        return self.sampler.paused() if self.sampler else nullcontext()

    def timer(self):
        """A stage timer for the next timed generation, anchored to the host clock where the clock is sampled."""
        from .timing import StageTimer

        timer = StageTimer(self.device)
        if self.sampler:
            try:
                self._timed.append((timer, Anchor.now(self.device)))
            except Exception:  # noqa: BLE001 - as in __enter__: this generation's clocks are left out
                pass
        return timer

    def result(self) -> dict[str, dict] | None:
        """clocks_by_stage over every timer handed out (their generations have finished: their totals synchronised)."""
        if not self.sampler:
            return None
        try:
            spans = [span for timer, anchor in self._timed for span in anchor.spans(timer.marks)]
        except Exception:  # noqa: BLE001 - an event that cannot be read (as in __enter__): no clocks
            return None
        return clocks_by_stage(spans, self.sampler.samples) or None


def clocks_by_stage(spans: Iterable[tuple[str, float, float]], samples: Iterable[tuple[float, float]],
                    ) -> dict[str, dict]:
    """{stage: {"mhz": median clock or None, "samples": readings}} of the readings taken while each stage ran, every
    stage of `spans` in the order it first ran (a reading inside nested entries counts for the innermost, the
    shortest holding it). A stage no reading fell in (a short one: the projector) has mhz None: what it ran at was
    not seen (analytic.predict.at_clocks then takes the stage's before it)."""
    spans = list(spans)
    by: dict[str, list[float]] = {name: [] for name, _, _ in spans}
    for t, mhz in samples:
        holding = [(end - start, name) for name, start, end in spans if start <= t <= end]
        if holding:
            by[min(holding)[1]].append(mhz)
    return {name: {"mhz": statistics.median(v) if v else None, "samples": len(v)} for name, v in by.items()}


def stage_clocks_text(recorded: dict | None) -> str | None:
    """One line of a point's recorded stage clocks for tables, in running order: 'sam 1,935, clip 1,755,
    projector -, prefill 1,778, decode 1,808 MHz' ('-': no reading fell in the stage). None where nothing was
    recorded (a CPU, or a point measured before the clocks were)."""
    from ..registry import stage_rank

    if not recorded:
        return None
    cells = [f"{stage} {rec['mhz']:,.0f}" if isinstance(rec, dict) and rec.get("mhz") else f"{stage} -"
             for stage, rec in sorted(recorded.items(), key=lambda kv: (stage_rank(kv[0]), kv[0]))]
    return ", ".join(cells) + " MHz"
