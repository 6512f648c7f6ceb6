"""Run-store schema: tables, constants, error classes, and the helpers that turn runs, points and stage results
into rows and back. Connections live in store.py; export and import in transfer.py.

Schema (normalised, version in `schema_version`):

    runs           one row per run: uuid, kind (sweep | dataset | parity | reference), name, notes, created_at,
                   environment (JSON, see environment.capture_environment), weights (JSON), dtype, attn,
                   session_mode, meta (JSON), and the honesty flags synthetic_weights / cpu / fallback_tokenizer
    points         one row per measured workload: the point key (canonical JSON of the workload keys, unique
                   per run), fixed columns for the common keys (mode, grid, image size, text tokens, batch,
                   decode steps, dtype, attn, logits, image slots, sequence length), kv_bytes, status
                   (done | oom | error) with its message, and a JSON `extra` for anything else
    stage_results  one row per point and stage: median/min/max/p10/p90/std seconds, repeats, flops,
                   tensor_flops, peak_memory_bytes, and a JSON `extra` (e.g. every decode step's time)

Conventions the flags are computed from (so nothing is silently faked; exports carry the flags). They match
Session.weights ({"source", "detail", "synthetic", "tokenizer": <label>, "fallback_tokenizer"}):
    environment["device"]        required; a device starting with "cpu" marks the run CPU
    weights["source"]            required: "checkpoint" | "synthetic" | "none" (no model ran, e.g. analytic);
                                 "synthetic", or weights["synthetic"] true, marks synthetic weights
    weights["fallback_tokenizer"] true (or weights["tokenizer"] == "fallback") marks the fallback tokenizer
    meta["synthetic_weights"], meta["fallback_tokenizer"], meta["cpu_fallback"]   true also set the flags
A flag once set is never cleared (update_run and re-imports can only add warnings).
"""
from __future__ import annotations

import json
import math
import os
import re
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from pydantic import BaseModel

from ..measure.order_check import failed as order_check_failed
from ..registry import stage_names

SCHEMA_VERSION = 1
FORMAT = "dsocr-run"
FORMAT_VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "runs.sqlite"
ENV_VAR = "DSOCR_STORE"

KINDS = ("sweep", "dataset", "parity", "reference")
STATUSES = ("done", "oom", "error")
FINISHED = ("done", "oom")  # a resumed sweep skips these; an error point is retried
WEIGHT_SOURCES = ("checkpoint", "synthetic", "none")
# known stage names, every model family's (registry), in display order
STAGES = (*stage_names(), "decode_step")
STAGE_NUMBERS = ("median_s", "min_s", "max_s", "p10_s", "p90_s", "std_s", "repeats", "flops", "tensor_flops",
                 "peak_memory_bytes")
_STAGE_INTS = {"repeats", "flops", "tensor_flops", "peak_memory_bytes"}
_STAGE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

# Fixed point columns read from the workload key (or given as `resolved` to put_point).
POINT_COLUMNS = ("mode", "grid_w", "grid_h", "image_w", "image_h", "text_tokens", "batch", "decode_steps", "dtype",
                 "attn", "logits", "image_slots", "sequence")
_POINT_TEXT = {"mode", "dtype", "attn", "logits"}
_PAIRS = {"crops": ("grid_w", "grid_h"), "grid": ("grid_w", "grid_h"), "image_size": ("image_w", "image_h")}
FLAGS = ("synthetic_weights", "cpu", "fallback_tokenizer")
FLAG_LABELS = {"synthetic_weights": "synthetic weights", "cpu": "CPU", "fallback_tokenizer": "fallback tokenizer"}

# Columns of points() (and, after the run columns, of the CSV export).
POINT_FRAME_COLUMNS = ("run_id", "point_id", "key", *POINT_COLUMNS, "kv_bytes", "status", "message", "updated_at",
                       "stage", *STAGE_NUMBERS, "extra", "stage_extra")
CSV_RUN_COLUMNS = ("run_name", "run_kind", "run_created_at", "gpu_name", "device", "weights_source", "run_dtype",
                   "run_attn", "session_mode", *FLAGS)
CSV_COLUMNS = ("run_id", *CSV_RUN_COLUMNS, *POINT_FRAME_COLUMNS[1:])


class StoreError(Exception):
    """Base class of run-store errors."""


class RunNotFound(StoreError, LookupError):
    """No run with that id in this store."""


class RunImportError(StoreError, ValueError):
    """A file that is not a valid exported run; the message says which file and what is wrong."""


class StoreCorrupt(StoreError, ValueError):
    """The store file is damaged, unreadable or not a run store. Nothing is written to it; the message names the
    file and the problem (a ValueError, so the CLI prints it as one line and exits 2)."""


class AmbiguousRunId(StoreError, LookupError):
    """A run id prefix that matches several runs."""


# Limits a stored value must respect (an import past them is refused; see transfer.py for the file limits).
MAX_INT = 2**63 - 1  # SQLite INTEGER
MAX_NAME_CHARS = 1_000
MAX_NOTES_CHARS = 100_000
MAX_MESSAGE_CHARS = 10_000


_DDL = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    notes TEXT NOT NULL DEFAULT '',
    environment TEXT NOT NULL,
    weights TEXT NOT NULL,
    dtype TEXT,
    attn TEXT,
    session_mode TEXT,
    meta TEXT NOT NULL DEFAULT '{}',
    synthetic_weights INTEGER NOT NULL,
    cpu INTEGER NOT NULL,
    fallback_tokenizer INTEGER NOT NULL,
    imported_from TEXT,
    import_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    mode TEXT, grid_w INTEGER, grid_h INTEGER, image_w INTEGER, image_h INTEGER, text_tokens INTEGER,
    batch INTEGER, decode_steps INTEGER, dtype TEXT, attn TEXT, logits TEXT, image_slots INTEGER, sequence INTEGER,
    kv_bytes INTEGER,
    status TEXT NOT NULL CHECK (status IN ('done', 'oom', 'error')),
    message TEXT NOT NULL DEFAULT '',
    extra TEXT NOT NULL DEFAULT '{}',
    updated_at TEXT NOT NULL,
    UNIQUE (run_id, key)
);
CREATE TABLE IF NOT EXISTS stage_results (
    point_id INTEGER NOT NULL REFERENCES points(id) ON DELETE CASCADE,
    stage TEXT NOT NULL,
    median_s REAL, min_s REAL, max_s REAL, p10_s REAL, p90_s REAL, std_s REAL,
    repeats INTEGER, flops INTEGER, tensor_flops INTEGER, peak_memory_bytes INTEGER,
    extra TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (point_id, stage)
);
CREATE INDEX IF NOT EXISTS points_by_run ON points(run_id, status);
"""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _plain(value: Any, where: str = "value") -> Any:
    """JSON-safe copy: numpy scalars/arrays to Python, tuples to lists, NaN/inf to None, Paths to str."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(mode="json"), where)
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-serialisable; store plain numbers, text, lists, dicts")


def _dumps(value: Any, where: str) -> str:
    return json.dumps(_plain(value, where), sort_keys=True, separators=(",", ":"), allow_nan=False)


def point_key(workload_key: Mapping[str, Any] | BaseModel) -> str:
    """The stable identity of a point: canonical JSON (sorted keys, no spaces, tuples as lists) of the workload
    keys. A pydantic Workload is dumped with all its fields, so pass the same kind of object every time."""
    if isinstance(workload_key, BaseModel):
        workload_key = workload_key.model_dump(mode="json")
    if not isinstance(workload_key, Mapping) or not workload_key:
        raise ValueError(f"a workload key must be a non-empty dict or a Workload, got {workload_key!r}")
    return _dumps(workload_key, "workload key")


def stage_stats(times_s: Iterable[float]) -> dict[str, float | int]:
    """Median, min, max, p10, p90, std (population) and repeats of repeated timings, in seconds."""
    t = np.asarray([float(x) for x in times_s], dtype=np.float64)
    if t.size == 0:
        raise ValueError("stage_stats needs at least one timing")
    p10, p50, p90 = np.percentile(t, [10, 50, 90])
    return {"median_s": float(p50), "min_s": float(t.min()), "max_s": float(t.max()), "p10_s": float(p10),
            "p90_s": float(p90), "std_s": float(t.std()), "repeats": int(t.size)}


def compute_flags(environment: Mapping, weights: Mapping, meta: Mapping) -> dict[str, bool]:
    """The honesty flags of a run (see the module docstring for the conventions)."""
    return {
        "synthetic_weights": (weights.get("source") == "synthetic" or weights.get("synthetic") is True
                              or bool(meta.get("synthetic_weights"))),
        "cpu": str(environment.get("device") or "").lower().startswith("cpu") or bool(meta.get("cpu_fallback")),
        "fallback_tokenizer": (weights.get("fallback_tokenizer") is True or weights.get("tokenizer") == "fallback"
                               or bool(meta.get("fallback_tokenizer"))),
    }


def labels(run: Mapping[str, Any]) -> str:
    """One-line human label of a run (a get_run / list_runs dict). Always names synthetic weights, CPU and the
    fallback tokenizer when they apply, e.g. 'bf16 sweep · NVIDIA H200 · 2026-01-02 10:00 UTC · synthetic weights',
    and a failed order check (its first point measured again at the end disagreed: measure/order_check.py)."""
    flags = run.get("flags") or compute_flags(run.get("environment") or {}, run.get("weights") or {},
                                              run.get("meta") or {})
    env = run.get("environment") or {}
    name = run.get("name") or f"{run.get('kind', 'run')} {str(run.get('id', ''))[:8]}".strip()
    parts = [name]
    if not flags.get("cpu"):
        parts.append(env.get("gpu_name") or str(env.get("device") or "unknown device"))
    created = str(run.get("created_at") or "")
    if created:
        parts.append(created[:16].replace("T", " ") + " UTC")
    parts += [FLAG_LABELS[f] for f in FLAGS if flags.get(f)]
    if order_check_failed((run.get("meta") or {}).get("order_check")):
        parts.append("ORDER CHECK FAILED")
    return " · ".join(parts)


def default_path() -> Path:
    """$DSOCR_STORE when set, else data/runs.sqlite in the repository."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_PATH



# -------------------------------------------------------------------- row helpers
def _stage_order(stage: str | None) -> tuple[int, str]:
    if stage is None:
        return (-1, "")
    return (STAGES.index(stage), stage) if stage in STAGES else (len(STAGES), stage)


def _run_row(run_id, kind, name, created_at, notes, environment, weights, dtype, attn, session_mode, meta,
             extra_flags: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"run kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if not isinstance(environment, Mapping) or "device" not in environment:
        raise ValueError("environment must be a dict with a 'device' entry (use environment.capture_environment)")
    if not isinstance(weights, Mapping) or weights.get("source") not in WEIGHT_SOURCES:
        raise ValueError(f"weights must be a dict whose 'source' is one of {', '.join(WEIGHT_SOURCES)} "
                         f"(e.g. {{'source': 'checkpoint', 'path': ...}}); got {weights!r}")
    if not isinstance(meta, Mapping):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
    if len(str(name or "")) > MAX_NAME_CHARS:
        raise ValueError(f"run name has {len(str(name))} characters, more than the limit of {MAX_NAME_CHARS}")
    if len(str(notes or "")) > MAX_NOTES_CHARS:
        raise ValueError(f"run notes have {len(str(notes))} characters, more than the limit of {MAX_NOTES_CHARS}")
    flags = compute_flags(environment, weights, meta)
    flags = {f: flags[f] or bool(extra_flags.get(f)) for f in FLAGS}
    return {
        "id": run_id, "kind": kind, "name": str(name or ""), "created_at": created_at, "notes": str(notes or ""),
        "environment": _dumps(environment, "environment"), "weights": _dumps(weights, "weights"),
        "dtype": dtype, "attn": attn, "session_mode": session_mode, "meta": _dumps(meta, "meta"),
        **{f: int(flags[f]) for f in FLAGS}, "imported_from": source,
    }


def _insert_run(conn: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    cols = list(row)
    conn.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                 [row[c] for c in cols])


def _fetch_run(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    r = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    if r is None:
        raise RunNotFound(f"no run {run_id!r} in this store")
    run = {k: r[k] for k in r.keys() if k not in FLAGS and k != "import_sha256"}
    for col in ("environment", "weights", "meta"):
        run[col] = json.loads(run[col])
    run["flags"] = {f: bool(r[f]) for f in FLAGS}
    counts = dict(conn.execute("SELECT status, COUNT(*) FROM points WHERE run_id = ? GROUP BY status", (run_id,))
                  .fetchall())
    run["n_points"] = sum(counts.values())
    for status in STATUSES:
        run[f"n_{status}"] = counts.get(status, 0)
    run["label"] = labels(run)
    return run


def _as_int(value: Any, what: str, low: int = -MAX_INT - 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return None
        if not float(value).is_integer():
            raise ValueError(f"{what} must be a whole number, got {value!r}")
    value = int(value)
    if not low <= value <= MAX_INT:
        raise ValueError(f"{what} must lie in {low}..{MAX_INT}, got {_short(value)}")
    return value


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _point_row(workload: Mapping[str, Any], status: str, message: str | None, kv_bytes, resolved, extra
               ) -> dict[str, Any]:
    if status not in STATUSES:
        raise ValueError(f"point status must be one of {', '.join(STATUSES)}; got {status!r}")
    message = "" if message is None else str(message)
    if status != "done" and not message.strip():
        message = f"{status} (no message recorded)"
    if len(message) > MAX_MESSAGE_CHARS:  # a failure message is kept, shortened (imports refuse longer ones)
        message = message[:MAX_MESSAGE_CHARS - 1] + "…"
    values: dict[str, Any] = dict.fromkeys(POINT_COLUMNS)
    for source_name, source in (("workload key", workload), ("resolved", resolved or {})):
        for name, value in source.items():
            if name in _PAIRS:
                if value is None:
                    continue
                if not isinstance(value, (list, tuple)) or len(value) != 2:
                    raise ValueError(f"{source_name} {name} must be a (width, height) pair, got {value!r}")
                for col, v in zip(_PAIRS[name], value):
                    values[col] = _as_int(v, f"{source_name} {name}", low=0)
            elif name in POINT_COLUMNS:
                if name in _POINT_TEXT:
                    values[name] = None if value is None else str(value)
                else:
                    values[name] = _as_int(value, f"{source_name} {name}", low=0)
            elif source is resolved:
                raise ValueError(f"resolved has unknown key {name!r}; allowed: {', '.join(POINT_COLUMNS)}, "
                                 "grid, crops, image_size (put anything else in extra)")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"extra must be a dict, got {type(extra).__name__}")
    return {**values, "kv_bytes": _as_int(kv_bytes, "kv_bytes", low=0), "status": status, "message": message,
            "extra": _dumps(dict(extra or {}), "extra")}


def _stage_rows(stages: Mapping[str, Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    rows = []
    for stage, result in (stages or {}).items():
        if not isinstance(stage, str) or not _STAGE_NAME.match(stage):
            raise ValueError(f"stage name {stage!r} must be lower-case letters, digits and _ (known: {', '.join(STAGES)})")
        if not isinstance(result, Mapping):
            raise ValueError(f"stage {stage}: expected a dict of results, got {type(result).__name__}")
        row: dict[str, Any] = {"stage": stage}
        for col in STAGE_NUMBERS:
            value = result.get(col)
            if col in _STAGE_INTS:
                row[col] = _as_int(value, f"stage {stage} {col}", low=0)
            elif value is None:
                row[col] = None
            elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"stage {stage} {col} must be a number of seconds, got {_short(value)}")
            elif not math.isfinite(float(value)):  # stored as NULL it would leave a done point with no time
                raise ValueError(f"stage {stage} {col} must be a finite number of seconds, got {value!r}")
            elif float(value) < 0:
                raise ValueError(f"stage {stage} {col} must not be negative, got {value!r}")
            else:
                row[col] = float(value)
        extra = {k: v for k, v in result.items() if k not in STAGE_NUMBERS}
        row["extra"] = _dumps(extra, f"stage {stage}")
        rows.append(row)
    return rows


def _upsert_point(conn: sqlite3.Connection, run_id: str, key: str, row: Mapping[str, Any], updated_at: str,
                  stage_rows: list[dict[str, Any]]) -> int:
    cols = ["run_id", "key", *row, "updated_at"]
    vals = [run_id, key, *row.values(), updated_at]
    updates = ", ".join(f"{c} = excluded.{c}" for c in cols[2:])
    conn.execute(  # upsert needs SQLite 3.24; no RETURNING (3.35) so older system SQLite on GPU boxes works
        f"INSERT INTO points ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
        f"ON CONFLICT (run_id, key) DO UPDATE SET {updates}",
        vals,
    )
    point_id = conn.execute("SELECT id FROM points WHERE run_id = ? AND key = ?", (run_id, key)).fetchone()[0]
    conn.execute("DELETE FROM stage_results WHERE point_id = ?", (point_id,))
    for s in stage_rows:
        scols = ["point_id", *s]
        conn.execute(f"INSERT INTO stage_results ({', '.join(scols)}) VALUES ({', '.join('?' * len(scols))})",
                     [point_id, *s.values()])
    return int(point_id)

