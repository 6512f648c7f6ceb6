"""One answer to "did this run out of GPU memory?", for the engines (an out-of-memory error fails the call, it is
not a reason to fall back for good) and the sweeps (such a point is recorded as `oom`, not `error`), and the one way
to hand the memory back afterwards."""
from __future__ import annotations

import gc

import torch


def free_memory(device: torch.device) -> None:
    """Garbage collected, the device's work finished and the allocator's cached blocks returned: what a failed or
    finished point held is free for the next one (call it outside the except block, once the traceback has let go
    of the tensors)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


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
