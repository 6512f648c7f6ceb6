"""SQLite run store: measured runs, their points and per-stage results (the tables are in schema.py, JSON/CSV
export and JSON import in transfer.py; every public name of both is importable from here too).

Concurrency: every operation opens its own connection (WAL journal, busy timeout), writes take the write lock up
front (BEGIN IMMEDIATE), so a Streamlit reader and a sweep writer in other threads or processes can share a file.

Integrity: opening a store runs SQLite's `PRAGMA quick_check` on the file before anything writes to it; a damaged
file, one that is not SQLite, or an SQLite file of another application raises StoreCorrupt naming the file, and is
left untouched. Corruption met later (SQLite "malformed" errors) raises StoreCorrupt too, and from then on this
RunStore refuses every write.
"""
from __future__ import annotations

import json
import re
import sqlite3
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping

import pandas as pd
from pydantic import BaseModel

from . import transfer
from .schema import (
    CSV_COLUMNS, CSV_RUN_COLUMNS, DEFAULT_PATH, ENV_VAR, FINISHED, FLAG_LABELS, FLAGS, FORMAT, FORMAT_VERSION, KINDS,
    POINT_COLUMNS, POINT_FRAME_COLUMNS, SCHEMA_VERSION, STAGE_NUMBERS, STAGES, STATUSES, WEIGHT_SOURCES,
    AmbiguousRunId, RunImportError, RunNotFound, StoreCorrupt, StoreError, _DDL, _POINT_TEXT, _STAGE_INTS, _dumps,
    _fetch_run, _insert_run, _now, _plain, _point_row, _run_row, _stage_order, _stage_rows, _upsert_point,
    compute_flags, default_path, labels, point_key, stage_stats,
)

# callers import all of these from here (schema.py and transfer.py are this module's parts)
__all__ = [
    "CSV_COLUMNS", "CSV_RUN_COLUMNS", "DEFAULT_PATH", "ENV_VAR", "FINISHED", "FLAG_LABELS", "FLAGS", "FORMAT",
    "FORMAT_VERSION", "KINDS", "POINT_COLUMNS", "POINT_FRAME_COLUMNS", "SCHEMA_VERSION", "STAGE_NUMBERS", "STAGES",
    "STATUSES", "WEIGHT_SOURCES", "AmbiguousRunId", "RunImportError", "RunNotFound", "RunStore", "StoreCorrupt",
    "StoreError", "compute_flags", "default_path", "labels", "point_key", "stage_stats",
]


class RunStore:
    """A run store in one SQLite file. `RunStore()` opens $DSOCR_STORE or data/runs.sqlite, creating it."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        if str(self.path) == ":memory:":
            raise ValueError("RunStore needs a file (each operation opens its own connection); use a temp file")
        self._broken: StoreCorrupt | None = None
        if self.path.is_dir():
            raise StoreCorrupt(f"{self.path} is a folder; a run store is one SQLite file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.check()  # before anything (even the journal-mode switch) writes to the file
        self._init_schema()

    # ---------------------------------------------------------------- connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    def _corrupt(self, problem: str) -> StoreCorrupt:
        # one line: SQLite's reports span lines, and a command line prints an error's first line only, which
        # would cut off the advice below
        problem = " ".join(problem.split())
        return StoreCorrupt(f"run store {self.path} is unusable: {problem}. It was left untouched; move it aside "
                            "(or give another --store / DSOCR_STORE) and re-import exported runs")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn SQLite's corruption errors into StoreCorrupt (and refuse writes from then on)."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            # the plain class is corruption ("malformed", "not a database"); subclasses are other failures
            # (locked, constraint, programming errors) and pass through unchanged
            if type(exc) is not sqlite3.DatabaseError:
                raise
            self._broken = self._corrupt(str(exc))
            raise self._broken from None

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._guard():
            conn = self._connect()
            try:
                conn.execute("BEGIN")  # one snapshot for all statements of the operation
                yield conn
            finally:
                conn.rollback()
                conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self._broken is not None:
            raise StoreCorrupt(str(self._broken))
        with self._guard():
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

    def check(self) -> None:
        """Raise StoreCorrupt unless the file is absent, empty, or a healthy run store: SQLite's quick integrity
        check (`PRAGMA quick_check`: every page and index readable and well formed; it reads the whole file) and
        the tables are ours. Nothing is written."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        try:
            conn = sqlite3.connect(self.path, timeout=30.0)  # reading only; opening writes nothing
            try:
                problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            finally:
                conn.close()
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise
            raise self._corrupt(f"cannot read it ({exc})") from None
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(f"{exc} (not an SQLite file, or a damaged one)") from None
        if problems != ["ok"]:
            raise self._corrupt("SQLite integrity check failed: " + "; ".join(problems[:3])
                                + (" ..." if len(problems) > 3 else ""))
        if tables and not {"runs", "schema_version"} <= tables:
            raise self._corrupt(f"an SQLite database of something else (tables {', '.join(sorted(tables)[:5])}), "
                                "not a run store")

    def _init_schema(self) -> None:
        # WAL lets readers run while a writer writes; it persists in the file. On a filesystem that cannot do
        # WAL SQLite keeps its rollback journal: still correct, readers just wait for writers.
        with self._guard():
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

    def resolve_id(self, text: str, kinds: Iterable[str] | None = None) -> str:
        """The full id of the run whose id is `text` or starts with it (a unique prefix, any case). Raises
        RunNotFound (no such run, or not of one of `kinds`) or AmbiguousRunId (several runs match)."""
        prefix = str(text).strip().lower()
        listing = f"list the runs with: python -m dsocr_core runs --store {self.path}"
        if not re.fullmatch(r"[0-9a-f-]{1,64}", prefix):
            raise RunNotFound(f"{str(text)[:80]!r} is not a run id (hex digits); {listing}")
        with self._read() as conn:
            rows = conn.execute("SELECT id, kind FROM runs WHERE lower(id) LIKE ? ORDER BY created_at DESC, id",
                                (prefix + "%",)).fetchall()
        exact = [r for r in rows if r["id"].lower() == prefix]
        # a store written before imports compared ids in any case may hold one id in two cases: the id as
        # typed reaches its own run
        rows = [r for r in exact if r["id"] == str(text).strip()] or exact or rows
        if not rows:
            raise RunNotFound(f"no run {prefix!r} in {self.path}; {listing}")
        if len(rows) > 1:
            ids = ", ".join(r["id"][:12] for r in rows[:5]) + (" ..." if len(rows) > 5 else "")
            raise AmbiguousRunId(f"{prefix!r} matches {len(rows)} runs in {self.path} ({ids}); give more of the id")
        run_id, kind = rows[0]["id"], rows[0]["kind"]
        kinds = tuple(kinds or ())
        if kinds and kind not in kinds:
            raise RunNotFound(f"run {run_id} in {self.path} is a {kind} run, not {' or '.join(kinds)}")
        return run_id

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

    # ---------------------------------------------------------------- export / import (transfer.py)
    def export_dict(self, run_id: str) -> dict[str, Any]:
        """The full, self-describing JSON document of a run (what export_run writes to .json)."""
        return transfer.export_dict(self, run_id)

    def export_json(self, run_id: str) -> str:
        """export_dict as text: the header indented, one point per line."""
        return transfer.export_json(self, run_id)

    def export_csv(self, run_id: str) -> str:
        """Flat tidy CSV (CSV_COLUMNS): one line per point and stage, run columns and flags repeated on each."""
        return transfer.export_csv(self, run_id)

    def export_run(self, run_id: str, path: str | Path) -> Path:
        """Write the run to `path`: .json (full document, importable) or .csv (flat table). Returns the path."""
        return transfer.export_run(self, run_id, path)

    def import_run(self, path: str | Path) -> str:
        """Import a run exported as JSON; returns its id. See transfer.import_bytes."""
        return transfer.import_run(self, path)

    def import_bytes(self, data: bytes | str, source: str = "upload") -> str:
        """import_run for file contents already in memory (e.g. a Streamlit upload)."""
        return transfer.import_bytes(self, data, source)

    def import_dir(self, folder: str | Path) -> list[str]:
        """Import every *.json in `folder` (e.g. data/reference/); one RunImportError lists every bad file."""
        return transfer.import_dir(self, folder)
