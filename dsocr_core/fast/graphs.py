"""CUDA-graph capture of a fixed piece of work whose inputs live in static buffers.

`Captured(fn)` runs `fn` eagerly on its first call (on a side stream: this warms up cuBLAS/cuDNN handles and
triggers any torch.compile compilation, outside the capture), captures it into a `torch.cuda.CUDAGraph`, and
replays the graph once to fill the captured outputs; every later call is one replay. `fn` must be idempotent
given its static inputs (re-running it writes the same values), read its inputs only from tensors whose
addresses do not change, and never synchronise with the host. The outputs returned are the tensors captured
the first time: the same objects on every call, overwritten by each replay.

`Captured(fn, ..., advances=True)` is for work that moves its own state forward (the fused decode steps that
choose the next token and advance the position on the device): running it twice on the first call would take
two steps where the caller counts one. Its first call runs `fn` exactly once (the warm-up, whose results are
the call's) and captures without replaying; `fn` must then write its results into static tensors.

On a CPU (or with graphs disabled) `Captured` just calls `fn`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..runtime.oom import out_of_memory


class Captured:
    def __init__(self, fn: Callable[[], Any], enabled: bool, pool=None, warmup: int = 1, advances: bool = False):
        if advances and warmup != 1:
            raise ValueError("work that advances its own state runs exactly one warm-up")
        self.fn = fn
        self.enabled = enabled
        self.pool = pool
        self.warmup = warmup
        self.advances = advances
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.error: str | None = None  # why capture was given up (then fn runs eagerly)

    def __call__(self) -> Any:
        if not self.enabled:
            return self.fn()
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        return self._capture()

    def _capture(self) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                out = self.fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn()
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: run eagerly from now on
            torch.cuda.synchronize()
            if out_of_memory(exc):  # not the op but this size: fail the call (a warm-up that advanced its own
                raise  # state is lost with it, as the point fails) and capture again next time
            self.enabled = False
            self.error = f"{type(exc).__name__}: {exc}"[:500]
            return out
        self.graph, self.outputs = graph, outputs
        if self.advances:  # the warm-up was this call's run; a replay would be a second step
            return out
        graph.replay()
        return outputs
