"""SQLite run store: measured runs, their points and per-stage results; JSON/CSV export and JSON import.

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

Concurrency: every operation opens its own connection (WAL journal, busy timeout), writes take the write lock up
front (BEGIN IMMEDIATE), so a Streamlit reader and a sweep writer in other threads or processes can share a file.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import sqlite3
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
FORMAT = "dsocr-run"
FORMAT_VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "runs.sqlite"
ENV_VAR = "DSOCR_STORE"

KINDS = ("sweep", "dataset", "parity", "reference")
STATUSES = ("done", "oom", "error")
FINISHED = ("done", "oom")  # a resumed sweep skips these; an error point is retried
WEIGHT_SOURCES = ("checkpoint", "synthetic", "none")
STAGES = ("sam", "clip", "projector", "vision", "prefill", "decode", "decode_step")  # known, in display order
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
    fallback tokenizer when they apply, e.g. 'bf16 sweep · NVIDIA H200 · 2026-01-02 10:00 UTC · synthetic weights'."""
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
    return " · ".join(parts)


def default_path() -> Path:
    """$DSOCR_STORE when set, else data/runs.sqlite in the repository."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_PATH


class RunStore:
    """A run store in one SQLite file. `RunStore()` opens $DSOCR_STORE or data/runs.sqlite, creating it."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        if str(self.path) == ":memory:":
            raise ValueError("RunStore needs a file (each operation opens its own connection); use a temp file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._init_schema()

    # ---------------------------------------------------------------- connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            conn.execute("BEGIN")  # one snapshot for all statements of the operation
            yield conn
        finally:
            conn.rollback()
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
            conn.close()

    def _init_schema(self) -> None:
        # WAL lets readers run while a writer writes; it persists in the file. On a filesystem that cannot do
        # WAL SQLite keeps its rollback journal: still correct, readers just wait for writers.
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
        with self._write() as conn:
            for statement in filter(str.strip, _DDL.split(";")):
                conn.execute(statement)
            version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
            if version is None:
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} has schema version {version}; this code reads up to "
                                 f"{SCHEMA_VERSION}: update dsocr_core")
            # migrations from older versions go here (version < SCHEMA_VERSION)

    # ---------------------------------------------------------------- runs
    def create_run(
        self,
        kind: Literal["sweep", "dataset", "parity", "reference"],
        name: str,
        environment: Mapping[str, Any],
        weights: Mapping[str, Any],
        dtype: str | None = None,
        attn: str | None = None,
        session_mode: str | None = None,
        meta: Mapping[str, Any] | None = None,
        notes: str = "",
    ) -> str:
        """Record a new run and return its uuid (hex)."""
        run_id = uuid.uuid4().hex
        row = _run_row(run_id, kind, name, _now(), notes, environment, weights, dtype, attn, session_mode,
                       meta or {}, extra_flags={})
        with self._write() as conn:
            _insert_run(conn, row)
        return run_id

    def update_run(self, run_id: str, *, name: str | None = None, notes: str | None = None,
                   meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Rename, re-note, or merge keys into meta (e.g. calibration ceilings measured later in the run).
        Flags can be raised by the new meta, never cleared. Returns the updated run."""
        with self._write() as conn:
            run = _fetch_run(conn, run_id)
            new_meta = {**run["meta"], **_plain(dict(meta or {}), "meta")}
            flags = compute_flags(run["environment"], run["weights"], new_meta)
            flags = {f: flags[f] or run["flags"][f] for f in FLAGS}
            conn.execute(
                "UPDATE runs SET name = ?, notes = ?, meta = ?, synthetic_weights = ?, cpu = ?, "
                "fallback_tokenizer = ? WHERE id = ?",
                (run["name"] if name is None else str(name), run["notes"] if notes is None else str(notes),
                 _dumps(new_meta, "meta"), *(int(flags[f]) for f in FLAGS), run_id),
            )
        return self.get_run(run_id)

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The run as a dict (JSON columns decoded, `flags` dict, point counts). Raises RunNotFound."""
        with self._read() as conn:
            return _fetch_run(conn, run_id)

    def list_runs(self, kind: str | None = None) -> list[dict[str, Any]]:
        """All runs, newest first, each as get_run returns it (with n_points, n_done, n_oom, n_error)."""
        with self._read() as conn:
            sql = "SELECT id FROM runs" + (" WHERE kind = ?" if kind else "") + " ORDER BY created_at DESC, id"
            ids = [r[0] for r in conn.execute(sql, (kind,) if kind else ())]
            return [_fetch_run(conn, i) for i in ids]

    def delete_run(self, run_id: str) -> bool:
        """Delete a run with its points and stage results. False if there was no such run."""
        with self._write() as conn:
            return conn.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount > 0

    # ---------------------------------------------------------------- points
    def put_point(
        self,
        run_id: str,
        workload_key: Mapping[str, Any] | BaseModel,
        status: Literal["done", "oom", "error"] = "done",
        message: str = "",
        stages: Mapping[str, Mapping[str, Any]] | None = None,
        kv_bytes: int | None = None,
        resolved: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> int:
        """Insert or replace (upsert on run and point key) one point with its stage results; returns the point id.

        stages: {stage: {median_s, min_s, max_s, p10_s, p90_s, std_s, repeats, flops, tensor_flops,
        peak_memory_bytes, ...}}; any other key of a stage dict goes to that stage's JSON extra (e.g. `times_s`).
        resolved: values known once the point ran, overriding those read from the key: image_slots, sequence,
        batch, decode_steps (e.g. tokens really generated), text_tokens, grid / image_size as (w, h), mode, ...
        A replaced point loses its old stage results, so an error point can be retried cleanly."""
        key = point_key(workload_key)
        row = _point_row(json.loads(key), status, message, kv_bytes, resolved, extra)
        stage_rows = _stage_rows(stages)
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            return _upsert_point(conn, run_id, key, row, _now(), stage_rows)

    def has_point(self, run_id: str, workload_key: Mapping[str, Any] | BaseModel | str,
                  statuses: Iterable[str] | None = FINISHED) -> bool:
        """Whether the point is recorded with one of `statuses` (default: finished, i.e. done or oom;
        None: any status). workload_key may be a dict, a Workload, or a key from point_key()."""
        key = workload_key if isinstance(workload_key, str) else point_key(workload_key)
        with self._read() as conn:
            row = conn.execute("SELECT status FROM points WHERE run_id = ? AND key = ?", (run_id, key)).fetchone()
        return row is not None and (statuses is None or row[0] in tuple(statuses))

    def finished_keys(self, run_id: str, statuses: Iterable[str] = FINISHED) -> set[str]:
        """Point keys (point_key strings) recorded with one of `statuses`; a resumed sweep skips these."""
        statuses = tuple(statuses)
        marks = ",".join("?" * len(statuses)) or "NULL"
        with self._read() as conn:
            rows = conn.execute(f"SELECT key FROM points WHERE run_id = ? AND status IN ({marks})",
                                (run_id, *statuses)).fetchall()
        return {r[0] for r in rows}

    def points(self, run_id: str) -> pd.DataFrame:
        """Tidy table, one row per point and stage (a point without stage results, e.g. an OOM, has one row with
        stage None). Columns: POINT_FRAME_COLUMNS; `extra` and `stage_extra` hold dicts. Raises RunNotFound."""
        with self._read() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            rows = conn.execute(
                "SELECT p.run_id, p.id AS point_id, p.key, " + ", ".join(f"p.{c}" for c in POINT_COLUMNS)
                + ", p.kv_bytes, p.status, p.message, p.updated_at, s.stage, "
                + ", ".join(f"s.{c}" for c in STAGE_NUMBERS)
                + ", p.extra AS extra, s.extra AS stage_extra "
                "FROM points p LEFT JOIN stage_results s ON s.point_id = p.id WHERE p.run_id = ? ORDER BY p.id",
                (run_id,),
            ).fetchall()
        records = [dict(r) for r in rows]
        records.sort(key=lambda r: (r["point_id"], _stage_order(r["stage"])))
        decoded: dict[str, Any] = {}
        for r in records:
            if r["extra"] not in decoded:
                decoded[r["extra"]] = json.loads(r["extra"])
            r["extra"] = decoded[r["extra"]]  # one dict shared by a point's rows (and equal extras), not copied
            r["stage_extra"] = json.loads(r["stage_extra"]) if r["stage_extra"] is not None else None
        frame = pd.DataFrame.from_records(records, columns=list(POINT_FRAME_COLUMNS))
        for col in (*[c for c in POINT_COLUMNS if c not in _POINT_TEXT], "kv_bytes", *_STAGE_INTS, "point_id"):
            frame[col] = frame[col].astype("Int64")
        for col in STAGE_NUMBERS:
            if col not in _STAGE_INTS:
                frame[col] = frame[col].astype("float64")
        return frame

    # ---------------------------------------------------------------- export / import
    def export_dict(self, run_id: str) -> dict[str, Any]:
        """The full, self-describing JSON document of a run (what export_run writes to .json)."""
        with self._read() as conn:
            run = _fetch_run(conn, run_id)
            pts = conn.execute("SELECT * FROM points WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
            stages: dict[int, dict] = {}
            for s in conn.execute(
                "SELECT s.* FROM stage_results s JOIN points p ON p.id = s.point_id WHERE p.run_id = ?", (run_id,)
            ):
                entry = {c: s[c] for c in STAGE_NUMBERS}
                entry["extra"] = json.loads(s["extra"])
                stages.setdefault(s["point_id"], {})[s["stage"]] = entry
        points = []
        for p in pts:
            points.append({
                "workload": json.loads(p["key"]),
                "status": p["status"],
                "message": p["message"],
                "resolved": {c: p[c] for c in POINT_COLUMNS},
                "kv_bytes": p["kv_bytes"],
                "extra": json.loads(p["extra"]),
                "updated_at": p["updated_at"],
                "stages": dict(sorted(stages.get(p["id"], {}).items(), key=lambda kv: _stage_order(kv[0]))),
            })
        from .. import __version__

        run_doc = {k: run[k] for k in ("id", "kind", "name", "created_at", "notes", "environment", "weights", "dtype",
                                       "attn", "session_mode", "meta", "flags")}
        run_doc["label"] = labels(run)
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "exported_at": _now(),
                "exported_by": f"dsocr_core {__version__}", "run": run_doc, "points": points}

    def export_json(self, run_id: str) -> str:
        """export_dict as text: the header indented, one point per line (readable, diffable, not bloated)."""
        doc = self.export_dict(run_id)
        points = doc.pop("points")
        head = json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)
        lines = [json.dumps(p, ensure_ascii=False, allow_nan=False, separators=(",", ":")) for p in points]
        body = ("[\n  " + ",\n  ".join(lines) + "\n ]") if lines else "[]"
        return head[:-2] + ',\n "points": ' + body + "\n}\n"

    def export_csv(self, run_id: str) -> str:
        """Flat tidy CSV (CSV_COLUMNS): one line per point and stage, run columns and flags repeated on each."""
        run = self.get_run(run_id)
        frame = self.points(run_id)
        env = run["environment"]
        run_values = {
            "run_name": run["name"], "run_kind": run["kind"], "run_created_at": run["created_at"],
            "gpu_name": env.get("gpu_name"), "device": env.get("device"), "weights_source": run["weights"].get("source"),
            "run_dtype": run["dtype"], "run_attn": run["attn"], "session_mode": run["session_mode"], **run["flags"],
        }
        for col, value in run_values.items():
            frame[col] = value
        for col in ("extra", "stage_extra"):
            frame[col] = [None if v is None else json.dumps(v, sort_keys=True) for v in frame[col]]
        buf = io.StringIO()
        frame[list(CSV_COLUMNS)].to_csv(buf, index=False, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        return buf.getvalue()

    def export_run(self, run_id: str, path: str | Path) -> Path:
        """Write the run to `path`: .json (full document, importable) or .csv (flat table). Returns the path."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".json":
            text = self.export_json(run_id)
        elif suffix == ".csv":
            text = self.export_csv(run_id)
        else:
            raise ValueError(f"export path must end in .json or .csv, got {path.name!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        return path

    def import_run(self, path: str | Path) -> str:
        """Import a run exported as JSON; returns its uuid (the original one). Importing it again updates the
        same run (points upserted, none duplicated); an unchanged file is skipped. Raises RunImportError."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RunImportError(f"{path}: cannot read: {exc.strerror or exc}") from None
        return self.import_bytes(data, source=str(path))

    def import_bytes(self, data: bytes | str, source: str = "upload") -> str:
        """import_run for file contents already in memory (e.g. a Streamlit upload)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        sha = hashlib.sha256(raw).hexdigest()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise RunImportError(f"{source}: not UTF-8 text; expected a JSON run export") from None
        except json.JSONDecodeError as exc:
            raise RunImportError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                                 "expected a run exported as .json") from None
        export = _validate_export(doc, source)
        run = export.run
        row = _run_row(run.id, run.kind, run.name, run.created_at, run.notes, run.environment, run.weights,
                       run.dtype, run.attn, run.session_mode, run.meta, extra_flags=run.flags, source=source)
        point_rows = []
        for i, p in enumerate(export.points):
            where = f"{source}: points[{i}]"
            try:
                key = point_key(p.workload)
                resolved = {k: v for k, v in p.resolved.items() if v is not None}
                prow = _point_row(p.workload, p.status, p.message, p.kv_bytes, resolved, p.extra)
                srows = _stage_rows({name: {**s.model_dump(exclude={"extra"}), **s.extra}
                                     for name, s in p.stages.items()})
            except (ValueError, TypeError) as exc:
                raise RunImportError(f"{where}: {exc}") from None
            point_rows.append((key, prow, p.updated_at, srows))
        with self._write() as conn:
            old = conn.execute("SELECT import_sha256 FROM runs WHERE id = ?", (run.id,)).fetchone()
            if old is not None and old[0] == sha:
                return run.id
            if old is None:
                _insert_run(conn, row)
            else:
                current = _fetch_run(conn, run.id)
                flags = {f: row[f] or current["flags"][f] for f in FLAGS}  # never drop a warning
                conn.execute(
                    "UPDATE runs SET kind=?, name=?, created_at=?, notes=?, environment=?, weights=?, dtype=?, attn=?, "
                    "session_mode=?, meta=?, synthetic_weights=?, cpu=?, fallback_tokenizer=?, imported_from=? "
                    "WHERE id=?",
                    (row["kind"], row["name"], row["created_at"], row["notes"], row["environment"], row["weights"],
                     row["dtype"], row["attn"], row["session_mode"], row["meta"], *(int(flags[f]) for f in FLAGS),
                     row["imported_from"], run.id),
                )
            for key, prow, updated_at, srows in point_rows:
                _upsert_point(conn, run.id, key, prow, updated_at, srows)
            conn.execute("UPDATE runs SET import_sha256 = ? WHERE id = ?", (sha, run.id))
        return run.id

    def import_dir(self, folder: str | Path) -> list[str]:
        """Import every *.json in `folder` (e.g. data/reference/), sorted by name; returns the run ids. Good files
        are imported even when some are bad; then one RunImportError lists every bad file."""
        folder = Path(folder)
        if not folder.is_dir():
            return []
        ids, errors = [], []
        for path in sorted(folder.glob("*.json")):
            try:
                ids.append(self.import_run(path))
            except RunImportError as exc:
                errors.append(str(exc))
        if errors:
            raise RunImportError(f"{len(errors)} of {len(errors) + len(ids)} files in {folder} not imported:\n"
                                 + "\n".join(errors))
        return ids


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


def _as_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return None
        if not float(value).is_integer():
            raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def _point_row(workload: Mapping[str, Any], status: str, message: str | None, kv_bytes, resolved, extra
               ) -> dict[str, Any]:
    if status not in STATUSES:
        raise ValueError(f"point status must be one of {', '.join(STATUSES)}; got {status!r}")
    message = "" if message is None else str(message)
    if status != "done" and not message.strip():
        message = f"{status} (no message recorded)"
    values: dict[str, Any] = dict.fromkeys(POINT_COLUMNS)
    for source_name, source in (("workload key", workload), ("resolved", resolved or {})):
        for name, value in source.items():
            if name in _PAIRS:
                if value is None:
                    continue
                if not isinstance(value, (list, tuple)) or len(value) != 2:
                    raise ValueError(f"{source_name} {name} must be a (width, height) pair, got {value!r}")
                for col, v in zip(_PAIRS[name], value):
                    values[col] = _as_int(v, f"{source_name} {name}")
            elif name in POINT_COLUMNS:
                if name in _POINT_TEXT:
                    values[name] = None if value is None else str(value)
                else:
                    values[name] = _as_int(value, f"{source_name} {name}")
            elif source is resolved:
                raise ValueError(f"resolved has unknown key {name!r}; allowed: {', '.join(POINT_COLUMNS)}, "
                                 "grid, crops, image_size (put anything else in extra)")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"extra must be a dict, got {type(extra).__name__}")
    return {**values, "kv_bytes": _as_int(kv_bytes, "kv_bytes"), "status": status, "message": message,
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
                row[col] = _as_int(value, f"stage {stage} {col}")
            elif value is None:
                row[col] = None
            elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"stage {stage} {col} must be a number of seconds, got {value!r}")
            else:
                row[col] = float(value) if math.isfinite(float(value)) else None
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


# -------------------------------------------------------------------- import validation
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ExportStage(_Strict):
    median_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    std_s: float | None = None
    repeats: int | None = None
    flops: int | None = None
    tensor_flops: int | None = None
    peak_memory_bytes: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class _ExportPoint(_Strict):
    workload: dict[str, Any] = Field(min_length=1)
    status: Literal["done", "oom", "error"]
    message: str = ""
    resolved: dict[str, Any] = Field(default_factory=dict)
    kv_bytes: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    updated_at: str
    stages: dict[str, _ExportStage] = Field(default_factory=dict)


class _ExportRun(_Strict):
    id: str = Field(pattern=r"^[0-9a-fA-F-]{8,64}$")
    kind: Literal["sweep", "dataset", "parity", "reference"]
    name: str = ""
    created_at: str
    notes: str = ""
    environment: dict[str, Any]
    weights: dict[str, Any]
    dtype: str | None = None
    attn: str | None = None
    session_mode: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    flags: dict[str, bool] = Field(default_factory=dict)
    label: str | None = None  # informative only; recomputed on read


class _Export(_Strict):
    format: Literal["dsocr-run"]
    format_version: int
    exported_at: str | None = None
    exported_by: str | None = None
    run: _ExportRun
    points: list[_ExportPoint]


def _validate_export(doc: Any, source: str) -> _Export:
    if not isinstance(doc, dict):
        raise RunImportError(f"{source}: expected a JSON object (a run export), got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise RunImportError(f"{source}: not a run export (format is {doc.get('format')!r}, expected {FORMAT!r})")
    version = doc.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise RunImportError(f"{source}: format_version {version} is newer than this code reads ({FORMAT_VERSION}); "
                             "update dsocr_core")
    try:
        export = _Export.model_validate(doc)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()[:5]]
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise RunImportError(f"{source}: malformed run export: " + "; ".join(problems) + more) from None
    if "device" not in export.run.environment:
        raise RunImportError(f"{source}: malformed run export: run.environment has no 'device'")
    if export.run.weights.get("source") not in WEIGHT_SOURCES:
        raise RunImportError(f"{source}: malformed run export: run.weights.source must be one of "
                             f"{', '.join(WEIGHT_SOURCES)}")
    return export
