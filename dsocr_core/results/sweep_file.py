"""Analytic sweeps written to a file in chunks: memory bounded by the chunk, not by the grid.

A grid is evaluated CHUNK_POINTS points at a time (the same order as analytic.Points.grid: crop grids vary
slowest, decode steps fastest) and appended to a temporary file in the target's folder, renamed onto the target
only when every chunk is written. An error, Ctrl-C, SIGTERM (the CLI raises it as Ctrl-C) or a full disk leaves no
partial file at the target path (a kill -9 can leave the hidden `.NAME.*.part` file behind, never a truncated
target). After the first chunk the output size is estimated and a grid whose file would not fit on the disk is
refused before more is written.
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from ..analytic import Points, sweep_columns
from ..analytic.points import MAX_POINTS
from ..spec import Hardware, ModelSpec, SpecError

CHUNK_POINTS = 20_000  # 157 columns x 8 bytes = 25 MB of arrays per chunk, ~100 MB of JSON text
DISK_MARGIN = 1.1  # the size estimate from the first chunk, plus 10%


def grid_chunks(*, mode: str = "gundam", crops: Sequence | None = None, images: Sequence | None = None,
                text_tokens: Sequence[int] = (10,), batch: Sequence[int] = (1,), decode_steps: Sequence[int] = (0,),
                chunk_points: int | None = None, **settings) -> tuple[int, Iterator[Points]]:
    """(number of points, iterator of Points of at most `chunk_points` (default CHUNK_POINTS) each) for the
    cartesian grid that Points.grid builds at once. Every axis is validated before the first chunk is made."""
    chunk_points = CHUNK_POINTS if chunk_points is None else chunk_points
    if chunk_points < 1:
        raise ValueError("chunk_points must be at least 1")
    pairs = crops if crops is not None else images
    axes = [np.asarray(text_tokens), np.asarray(batch), np.asarray(decode_steps)]
    n_pairs = 1 if pairs is None else len(pairs)
    if any(a.ndim != 1 or a.size == 0 for a in axes) or n_pairs == 0:
        raise SpecError("every sweep axis needs at least one value")
    shape = (n_pairs, *(a.size for a in axes))
    total = int(np.prod(shape, dtype=np.int64))
    if total > MAX_POINTS:
        raise SpecError(f"a grid of {total} points is past the limit of {MAX_POINTS}")
    pair_key = "crops" if crops is not None else "image"
    pair_arr = None if pairs is None else np.asarray(pairs)
    if pair_arr is not None and (pair_arr.ndim != 2 or pair_arr.shape[1] != 2):
        raise SpecError("crop grids and image sizes must be (width, height) pairs")
    # each axis alone through the same checks as the full grid (cheap), so a bad value fails before writing
    if pair_arr is not None:
        Points.build(mode=mode, **{pair_key: pair_arr}, **settings)
    for name, values in zip(("text_tokens", "batch", "decode_steps"), axes):
        Points.build(mode=mode, **{name: values}, **settings)

    def chunks() -> Iterator[Points]:
        for start in range(0, total, chunk_points):
            i0, i1, i2, i3 = np.unravel_index(np.arange(start, min(start + chunk_points, total)), shape)
            kw = dict(text_tokens=axes[0][i1], batch=axes[1][i2], decode_steps=axes[2][i3])
            if pair_arr is not None:
                kw[pair_key] = pair_arr[i0]
            yield Points.build(mode=mode, **kw, **settings)

    return total, chunks()


def write_sweep_file(spec: ModelSpec, hardware: Hardware | None, path: str | Path, *, with_capacity: bool = True,
                     chunk_points: int | None = None, **grid) -> tuple[int, Path]:
    """Evaluate the grid (keywords of grid_chunks) chunk by chunk into `path` (.csv, or .json as a list of
    records: the same text analytic.write_sweep gives for the whole table). Returns (points, path)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json"):
        raise SpecError(f"sweep output must end in .csv or .json, got {path.name!r}")
    total, chunks = grid_chunks(chunk_points=chunk_points, **grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")  # same folder: rename is atomic
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as out:  # the umask's permissions, like a plain write
            for i, pts in enumerate(chunks):
                frame = pd.DataFrame(sweep_columns(spec, pts, hardware, with_capacity))
                if suffix == ".csv":
                    text = frame.to_csv(index=False, header=i == 0, lineterminator="\n")
                else:
                    text = ("[" if i == 0 else ",") + frame.to_json(orient="records")[1:-1]
                del frame
                if i == 0:
                    _check_room(len(text) * total / pts.size, path, total)  # ASCII: characters = bytes
                out.write(text)
            if suffix == ".json":
                out.write("]")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return total, path


def _check_room(estimate: float, path: Path, total: int) -> None:
    free = shutil.disk_usage(path.parent).free
    if estimate * DISK_MARGIN > free:
        raise SpecError(f"a sweep of {total:,} points needs about {estimate / 1e9:,.2f} GB in {path.parent}, which "
                        f"has {free / 1e9:,.2f} GB free; narrow the grid or write elsewhere")
