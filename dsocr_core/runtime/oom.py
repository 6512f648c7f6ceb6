"""One answer to "did this run out of GPU memory?", for the engines (an out-of-memory error fails the call, it is
not a reason to fall back for good) and the sweeps (such a point is recorded as `oom`, not `error`)."""
from __future__ import annotations

import torch


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from (compilers and graph capture wrap what they hit), is a
    CUDA out-of-memory error: torch's OutOfMemoryError, or a CUDA error that says so."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
