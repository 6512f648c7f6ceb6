"""torch.compile with a reasoned eager fallback, and the cuDNN autotuning switch, for the fast engine."""
from __future__ import annotations

import types

import torch

from ..runtime.oom import out_of_memory

COMPILE_OPTIONS = {"coordinate_descent_tuning": True}  # tunes the GEMV/attention reductions' block sizes


# Static-shape functions keep at most this many compiled variants per code object: dynamo refuses to compile a
# code object again once its cache reaches torch._dynamo.config.recompile_limit (and, with fullgraph, raises,
# which would send the function to its eager fallback for good: a sweep's later points would then run other
# kernels than a fresh process). At this size a fresh copy of the function starts an empty cache instead.
STATIC_VARIANTS = 48
RECOMPILE_LIMIT = 64  # raised from dynamo's default 8, process-wide, when the first static function is made


class Compiled:
    """A torch.compile'd function that falls back to an eager one (`fallback`, default the same function) and
    says why, if compiling fails.

    dynamic=False: every new shape compiles a static variant (no symbolic sizes), whatever was compiled before,
    so a shape runs the kernels a fresh process would run for it; when STATIC_VARIANTS are held, the next compile
    starts a new generation (a copy of the function with its own, empty cache). dynamic=None is torch's automatic
    dynamic: the second distinct shape compiles a symbolic variant that serves every later shape, so what runs
    depends on the shapes seen before; the engine uses it only where it marks the varying sizes symbolic itself
    before the first compile (decode pieces; LM prefill layers, compiled first on canonical sizes)."""

    def __init__(self, eager, options: dict | None, dynamic: bool | None = None, fallback=None):
        self.fn = eager
        self.eager = fallback or eager
        self.options = options
        self.dynamic = dynamic
        self.generation = 0
        self.error: str | None = None
        if dynamic is False:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._start(eager)

    def _start(self, fn) -> None:
        self._code = fn.__code__
        self.compiled = torch.compile(fn, fullgraph=True, dynamic=self.dynamic, options=self.options)

    def variants(self) -> int:
        """Compiled variants the current generation holds (dynamo's cache entries of its code object)."""
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(self._code))

    def state(self) -> dict:
        """How this function runs: compiled shape policy, variants held, generation, or the fallback's reason."""
        shapes = {False: "static", None: "automatic-dynamic", True: "dynamic"}[self.dynamic]
        return {"shapes": shapes if self.error is None else "eager fallback", "variants": self.variants(),
                "generation": self.generation, "error": self.error}

    def __call__(self, *args, **kwargs):
        if self.error is None:
            if self.dynamic is False and self.variants() >= STATIC_VARIANTS:
                self.generation += 1
                self._start(fresh_copy(self.fn))
            try:
                return self.compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - fall back, keep the reason for describe()
                if out_of_memory(exc):  # this call's size, not the function: the caller fails this point, and
                    raise  # the next point compiles as a fresh process would (no eager fallback for good)
                self.error = f"{type(exc).__name__}: {exc}"[:800]
        return self.eager(*args, **kwargs)


def fresh_copy(fn):
    """The same function on a new code object: dynamo keys its cache by code object, so the copy starts empty."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


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
