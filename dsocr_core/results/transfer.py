"""Moving runs in and out of a store: the JSON document (export, import with validation) and the flat CSV.

Export: `export_dict` is the full self-describing document (format "dsocr-run", FORMAT_VERSION), `export_json` its
text (header indented, one point per line), `export_csv` a tidy table (CSV_COLUMNS). Import: `import_bytes`
validates a whole document (size, nesting, string lengths, no NaN or infinite number anywhere, then the strict
pydantic models below: types, ranges, no negative times or counts; a finished measured point must be a workload
the analytic model evaluates, within its limits) before it writes anything, then writes the run in one transaction.
Run ids are compared in any case, as RunStore.resolve_id compares them; a new run is stored under its id in lower case.

What an import may change: it adds a run under the id in the file; a re-import of a run that was itself imported
(same id, kind and creation time) may rename it, replace its notes and meta, upsert its points and add warning
flags (never clear one). It never replaces a run recorded in this store (a measured sweep, a dataset run) nor a
different run that happens to carry the same id: those imports are refused. Any failure leaves the store unchanged.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .schema import (CSV_COLUMNS, FLAGS, FORMAT, FORMAT_VERSION, MAX_INT, MAX_MESSAGE_CHARS, MAX_NAME_CHARS,
                     MAX_NOTES_CHARS, POINT_COLUMNS, STAGE_NUMBERS, WEIGHT_SOURCES, RunImportError, _fetch_run,
                     _insert_run, _now, _point_row, _run_row, _short, _stage_order, _stage_rows, _upsert_point,
                     labels, point_key)

if TYPE_CHECKING:
    from .store import RunStore

MAX_IMPORT_BYTES = 256 * 2**20  # an export file larger than this is refused before it is parsed
MAX_DEPTH = 32  # JSON nesting (real exports nest 7 levels)
MAX_STRING_CHARS = 1_000_000  # any one string (key or value) in an export


# -------------------------------------------------------------------- export
def export_dict(store: RunStore, run_id: str) -> dict[str, Any]:
    """The full, self-describing JSON document of a run (what export_run writes to .json)."""
    with store._read() as conn:
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


def export_json(store: RunStore, run_id: str) -> str:
    """export_dict as text: the header indented, one point per line (readable, diffable, not bloated)."""
    doc = export_dict(store, run_id)
    points = doc.pop("points")
    head = json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)
    lines = [json.dumps(p, ensure_ascii=False, allow_nan=False, separators=(",", ":")) for p in points]
    body = ("[\n  " + ",\n  ".join(lines) + "\n ]") if lines else "[]"
    return head[:-2] + ',\n "points": ' + body + "\n}\n"


def export_csv(store: RunStore, run_id: str) -> str:
    """Flat tidy CSV (CSV_COLUMNS): one line per point and stage, run columns and flags repeated on each."""
    run = store.get_run(run_id)
    frame = store.points(run_id)
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


def export_run(store: RunStore, run_id: str, path: str | Path) -> Path:
    """Write the run to `path`: .json (full document, importable) or .csv (flat table). Returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = export_json(store, run_id)
    elif suffix == ".csv":
        text = export_csv(store, run_id)
    else:
        raise ValueError(f"export path must end in .json or .csv, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


# -------------------------------------------------------------------- import
def import_run(store: RunStore, path: str | Path) -> str:
    """Import a run exported as JSON; returns its uuid (the original one). Importing it again updates the
    same run (points upserted, none duplicated); an unchanged file is skipped. Raises RunImportError."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_IMPORT_BYTES:
            raise RunImportError(f"{path}: {path.stat().st_size:,} bytes, larger than the import limit of "
                                 f"{MAX_IMPORT_BYTES:,} bytes")
        data = path.read_bytes()
    except OSError as exc:
        raise RunImportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return import_bytes(store, data, source=str(path))


def import_bytes(store: RunStore, data: bytes | str, source: str = "upload") -> str:
    """import_run for file contents already in memory (e.g. a Streamlit upload)."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > MAX_IMPORT_BYTES:
        raise RunImportError(f"{source}: {len(raw):,} bytes, larger than the import limit of {MAX_IMPORT_BYTES:,} bytes")
    sha = hashlib.sha256(raw).hexdigest()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RunImportError(f"{source}: not UTF-8 text; expected a JSON run export") from None
    except json.JSONDecodeError as exc:
        raise RunImportError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                             "expected a run exported as .json") from None
    except RecursionError:
        raise RunImportError(f"{source}: JSON nested too deeply (the limit is {MAX_DEPTH} levels)") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise RunImportError(f"{source}: not a readable JSON run export: {str(exc)[:200]}") from None
    _check_shape(doc, source)
    export = _validate_export(doc, source)
    _check_counts(export, source)
    run = export.run
    try:
        _check_meta(run.meta)
        row = _run_row(run.id, run.kind, run.name, run.created_at, run.notes, run.environment, run.weights,
                       run.dtype, run.attn, run.session_mode, run.meta, extra_flags=run.flags, source=source)
    except (ValueError, TypeError) as exc:
        raise RunImportError(f"{source}: run: {exc}") from None
    point_rows = []
    for i, p in enumerate(export.points):
        where = f"{source}: points[{i}]"
        try:
            key = point_key(p.workload)
            resolved = {k: v for k, v in p.resolved.items() if v is not None}
            prow = _point_row(p.workload, p.status, p.message, p.kv_bytes, resolved, p.extra)
            if run.kind in ("sweep", "reference") and p.status == "done":
                _check_measured_point(prow)
            srows = _stage_rows({name: {**s.model_dump(exclude={"extra"}), **s.extra}
                                 for name, s in p.stages.items()})
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise RunImportError(f"{where}: {exc}") from None
        point_rows.append((key, prow, p.updated_at, srows))
    try:
        with store._write() as conn:
            return _write_import(conn, run, row, point_rows, sha, source)
    except (OverflowError, sqlite3.IntegrityError) as exc:  # rolled back: the store is unchanged
        raise RunImportError(f"{source}: cannot be stored: {exc}") from None


def _write_import(conn, run: "_ExportRun", row: dict, point_rows: list, sha: str, source: str) -> str:
    """The writing half of import_bytes, inside its transaction (see the module docstring for what it may
    replace)."""
    # ids are compared as resolve_id resolves them (in any case), so an import can never add a second run that
    # a full id then fails to reach; a new run is stored under its id in lower case, as local runs are
    old = conn.execute("SELECT id, import_sha256, imported_from, kind, created_at FROM runs WHERE lower(id) = ? "
                       "ORDER BY id = ? DESC", (run.id.lower(), run.id)).fetchone()
    run_id = run.id.lower() if old is None else old["id"]
    row = {**row, "id": run_id}
    if old is not None and old["import_sha256"] == sha:
        return run_id
    if old is not None and old["imported_from"] is None:
        raise RunImportError(f"{source}: run {run_id} is already in this store as a {old['kind']} run recorded "
                             "here; an import never replaces it (import into another store, or delete that "
                             "run first)")
    if old is not None and (old["kind"], old["created_at"]) != (row["kind"], row["created_at"]):
        raise RunImportError(f"{source}: this store already holds another run with id {run_id} (imported "
                             f"{old['kind']} run created {old['created_at']}, the file has a {row['kind']} run "
                             f"created {row['created_at']}); refused")
    if old is None:
        _insert_run(conn, row)
    else:
        current = _fetch_run(conn, run_id)
        flags = {f: row[f] or current["flags"][f] for f in FLAGS}  # never drop a warning
        conn.execute(
            "UPDATE runs SET name=?, notes=?, environment=?, weights=?, dtype=?, attn=?, "
            "session_mode=?, meta=?, synthetic_weights=?, cpu=?, fallback_tokenizer=?, imported_from=? "
            "WHERE id=?",
            (row["name"], row["notes"], row["environment"], row["weights"],
             row["dtype"], row["attn"], row["session_mode"], row["meta"], *(int(flags[f]) for f in FLAGS),
             row["imported_from"], run_id),
        )
    for key, prow, updated_at, srows in point_rows:
        _upsert_point(conn, run_id, key, prow, updated_at, srows)
    conn.execute("UPDATE runs SET import_sha256 = ? WHERE id = ?", (sha, run_id))
    return run_id


def import_dir(store: RunStore, folder: str | Path) -> list[str]:
    """Import every *.json in `folder` (e.g. data/reference/), sorted by name; returns the run ids. Good files
    are imported even when some are bad; then one RunImportError lists every bad file."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    ids, errors = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            ids.append(import_run(store, path))
        except RunImportError as exc:
            errors.append(str(exc))
    if errors:
        raise RunImportError(f"{len(errors)} of {len(errors) + len(ids)} files in {folder} not imported:\n"
                             + "\n".join(errors))
    return ids


# -------------------------------------------------------------------- import validation
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # strict: "7" is not 7, 2.0 is not 2


_Seconds = Annotated[float, Field(ge=0)]
_Count = Annotated[int, Field(ge=0, le=MAX_INT)]
_Time = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}([T ][0-9:.]+)?(Z|[+-]\d{2}:?\d{2})?$")]


class _ExportStage(_Strict):
    median_s: _Seconds | None = None
    min_s: _Seconds | None = None
    max_s: _Seconds | None = None
    p10_s: _Seconds | None = None
    p90_s: _Seconds | None = None
    std_s: _Seconds | None = None
    repeats: Annotated[int, Field(ge=1, le=MAX_INT)] | None = None
    flops: _Count | None = None
    tensor_flops: _Count | None = None
    peak_memory_bytes: _Count | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class _ExportPoint(_Strict):
    workload: dict[str, Any] = Field(min_length=1)
    status: Literal["done", "oom", "error"]
    message: str = Field("", max_length=MAX_MESSAGE_CHARS)
    resolved: dict[str, Any] = Field(default_factory=dict)
    kv_bytes: _Count | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    updated_at: _Time
    stages: dict[str, _ExportStage] = Field(default_factory=dict)


class _ExportRun(_Strict):
    id: str = Field(pattern=r"^[0-9a-fA-F-]{8,64}$")
    kind: Literal["sweep", "dataset", "parity", "reference"]
    name: str = Field("", max_length=MAX_NAME_CHARS)
    created_at: _Time
    notes: str = Field("", max_length=MAX_NOTES_CHARS)
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
    format_version: int = Field(ge=1, le=FORMAT_VERSION)
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
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
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


def _check_shape(doc: Any, source: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH, holding a string longer than MAX_STRING_CHARS or a number
    that is not finite (NaN, Infinity, 1e999: stored as null they would hide a missing value), naming where it
    is; walked without recursion, so no document can exhaust the stack here or in the validation after it."""
    stack = [(doc, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise RunImportError(f"{source}: JSON nested deeper than {MAX_DEPTH} levels (at {where[:80] or 'the top'})")
        if isinstance(value, float) and not math.isfinite(value):
            raise RunImportError(f"{source}: {where or 'the top'} is {value!r}, not a finite number (NaN, Infinity "
                                 "and numbers past the float range are refused)")
        if isinstance(value, str):
            if len(value) > MAX_STRING_CHARS:
                raise RunImportError(f"{source}: {where or 'a value'} is a string of {len(value):,} characters, "
                                     f"more than the limit of {MAX_STRING_CHARS:,}")
        elif isinstance(value, dict):
            for k, v in value.items():
                if len(k) > MAX_STRING_CHARS:
                    raise RunImportError(f"{source}: a key of {len(k):,} characters in {where or 'the top'}")
                stack.append((v, depth + 1, f"{where}.{k[:40]}" if where else k[:40]))
        elif isinstance(value, list):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))


def _check_measured_point(prow: dict) -> None:
    """A finished point of a measured sweep must name a workload the analytic model can evaluate (the pages
    join every such point to it, through Points.build and its limits); raise ValueError otherwise."""
    from ..analytic.points import Points
    from ..registry import all_modes, mode_info
    from ..spec import SpecError, Workload

    needed = ("mode", "text_tokens", "batch", "decode_steps", "dtype", "attn", "logits")
    absent = [k for k in needed if prow.get(k) is None]
    gundam = prow.get("mode") in all_modes() and mode_info(prow["mode"]).crop_mode  # a tiling mode (registry)
    if gundam and (prow.get("grid_w") is None or prow.get("grid_h") is None):
        absent.append("crops")
    if absent:
        raise ValueError(f"a finished measured point needs {', '.join(absent)} in its workload")
    try:
        workload = Workload(mode=prow["mode"], crops=(prow["grid_w"], prow["grid_h"]) if gundam else None,
                            **{k: prow[k] for k in needed[1:]})
    except ValidationError as exc:
        e = exc.errors()[0]
        raise ValueError(f"not a valid workload: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    try:
        Points.from_workload(workload)
    except SpecError as exc:
        raise ValueError(f"outside what the workload model evaluates: {exc}") from None


META_MINIMA = {"repeats": 1, "warmup": 0}  # how a sweep was measured: whole numbers, at least these


def _check_counts(export: "_Export", source: str) -> None:
    """The counts and times the pages read besides the typed fields: the run's meta repeats and warm-ups and each
    stage's `times_s` (every timed run or decode step), whole and non-negative numbers; RunImportError naming the
    field otherwise."""
    for key, low in META_MINIMA.items():
        value = export.run.meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            kind = "negative" if isinstance(value, (int, float)) and value < 0 else "not allowed"
            raise RunImportError(f"{source}: run.meta.{key} is {_short(value)} ({kind}): it must be a whole number "
                                 f">= {low}")
    for i, point in enumerate(export.points):
        for name, stage in point.stages.items():
            times = stage.extra.get("times_s")
            if times is None:
                continue
            where = f"{source}: points[{i}].stages.{name}.extra.times_s"
            if not isinstance(times, list):
                raise RunImportError(f"{where} must be a list of seconds, got {type(times).__name__}")
            for j, t in enumerate(times):
                if isinstance(t, bool) or not isinstance(t, (int, float)):
                    raise RunImportError(f"{where}[{j}] must be a number of seconds, got {_short(t)}")
                if t < 0:
                    raise RunImportError(f"{where}[{j}] is {t!r}: a time cannot be negative")


def _check_meta(meta: dict) -> None:
    """The model spec and calibration a run carries in its meta are read back by the pages: they must be valid."""
    from ..spec import Hardware, ModelSpec

    for key, model in (("spec", ModelSpec), ("calibration", Hardware)):
        if meta.get(key) is None:
            continue
        try:
            model.model_validate(meta[key])
        except ValidationError as exc:
            e = exc.errors()[0]
            raise ValueError(f"meta.{key} is not a valid {model.__name__}: "
                             f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}") from None
