"""Vectorised sweeps: a grid of workload points evaluated as numpy arrays, exported as a table."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..spec import Hardware, ModelSpec, SpecError
from .capacity import capacity
from .points import Points
from .stages import evaluate, flat


def sweep_columns(spec: ModelSpec, pts: Points, hardware: Hardware | None = None,
                  with_capacity: bool = False) -> dict[str, np.ndarray]:
    """Inputs, token counts and every stage metric ("prefill.flops", ...) as one array per column."""
    stages = evaluate(spec, pts, hardware)
    cols = pts.columns() | flat(stages)
    if with_capacity and hardware is not None:
        cols |= {f"capacity.{k}": v for k, v in capacity(spec, pts, hardware, stages).items()}
    pred = getattr(hardware, "prediction", None)
    if pred is not None:  # every exported row names the profile, and says when it was derived, not measured
        cols["predicted.profile"] = np.full(pts.size, pred.profile.label())
        cols["predicted.derived"] = np.full(pts.size, pred.profile.derived)
        cols["predicted.session_mode"] = np.full(pts.size, pred.session_mode)
        cols["predicted.engine"] = np.full(pts.size, pred.engine.label())  # kind and any non-default option
        cols["predicted.routing"] = np.full(pts.size, pred.routing_label())  # uniform (assumed) or observed
        cols["predicted.clocks"] = np.full(pts.size, pred.clock_label())  # the calibration's, or a what-if clock
        # a CPU profile predicts CPU runs, not a GPU: the kind travels with every row, not only in the label
        cols["predicted.device_kind"] = np.full(pts.size, pred.profile.device.get("kind"))
    return cols


def sweep_table(spec: ModelSpec, pts: Points, hardware: Hardware | None = None,
                with_capacity: bool = False) -> pd.DataFrame:
    """The sweep as a DataFrame, one row per point."""
    return pd.DataFrame(sweep_columns(spec, pts, hardware, with_capacity))


def write_sweep(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a sweep table to .csv or .json (a list of records)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json"):
        raise SpecError(f"sweep output must end in .csv or .json, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        df.to_json(path, orient="records", indent=None)
    return path
