"""torch.compile with a reasoned eager fallback, and the cuDNN autotuning switch, for the fast engine."""
from __future__ import annotations

import torch

COMPILE_OPTIONS = {"coordinate_descent_tuning": True}  # tunes the GEMV/attention reductions' block sizes


class Compiled:
    """A torch.compile'd function that falls back to an eager one (`fallback`, default the same function) and
    says why, if compiling fails. dynamic=False: every new shape compiles anew (no symbolic sizes)."""

    def __init__(self, eager, options: dict | None, dynamic: bool | None = None, fallback=None):
        self.eager = fallback or eager
        self.compiled = torch.compile(eager, fullgraph=True, dynamic=dynamic, options=options)
        self.error: str | None = None

    def __call__(self, *args, **kwargs):
        if self.error is None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - fall back, keep the reason for describe()
                self.error = f"{type(exc).__name__}: {exc}"[:800]
        return self.eager(*args, **kwargs)




class cudnn_benchmark:
    """Let cuDNN time its convolution algorithms for each new shape (a warm-up run does it, outside any graph
    capture); restores the global flag afterwards."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.old = torch.backends.cudnn.benchmark
        if self.on:
            torch.backends.cudnn.benchmark = True

    def __exit__(self, *exc):
        torch.backends.cudnn.benchmark = self.old
