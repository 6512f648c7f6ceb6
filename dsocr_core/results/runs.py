"""Runs as the command line shows them: the listing table, one run's details, its model and spec, and the settings
a resumed measured sweep must share with the run it continues (so no run mixes dtypes, attentions, seeds or weights)."""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from ..engines import run_engine
from .tables import format_table

# What a resumed sweep must share with its run, and how each is named in a refusal.
RESUME_SETTINGS = {"dtype": "dtype", "attn": "attention", "session_mode": "session mode", "seed": "seed",
                   "repeats": "repeats", "warmup": "warm-up runs", "logits": "logits", "weights_source": "weights",
                   "weights_detail": "weights", "device_type": "device", "model": "model"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def plain_text(text: Any, limit: int | None = None) -> str:
    """Text safe for a terminal: control characters (newlines, escape sequences) as one space, optionally cut
    to `limit` characters with an ellipsis."""
    text = _CONTROL.sub(" ", str(text if text is not None else ""))
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"


def run_model(run: Mapping[str, Any]) -> str:
    """The model family a run measured (its session description; runs from before the registry are DeepSeek-OCR)."""
    from ..registry import DEFAULT_MODEL

    meta = run.get("meta") or {}
    return (meta.get("session") or {}).get("model") or meta.get("model") or DEFAULT_MODEL


def run_spec(run: Mapping[str, Any]):
    """The model spec a run was measured with (from its meta; the model's full spec when absent)."""
    from ..registry import get_family

    family = get_family(run_model(run))
    data = (run.get("meta") or {}).get("spec")
    return family.spec_class(**data) if data else family.preset("full")


def recorded_settings(run: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a measured sweep recorded (get_run's dict): the RESUME_SETTINGS keys, None when unknown."""
    meta, weights = run.get("meta") or {}, run.get("weights") or {}
    device = str((run.get("environment") or {}).get("device") or "")
    return {"dtype": run.get("dtype"), "attn": run.get("attn"), "session_mode": run.get("session_mode"),
            "seed": meta.get("seed"), "repeats": meta.get("repeats"), "warmup": meta.get("warmup"),
            "logits": meta.get("logits"), "weights_source": weights.get("source"),
            "weights_detail": weights.get("detail"), "device_type": device.split(":")[0] or None,
            "model": run_model(run)}


def settings_problems(run: Mapping[str, Any], wanted: Mapping[str, Any],
                      point_logits: Iterable[str] = ()) -> list[str]:
    """How `wanted` (some RESUME_SETTINGS keys) differs from what the run recorded, as 'dtype bfloat16 -> float32'
    lines; a key the run never recorded is not compared, except logits, also read from the run's points."""
    old = recorded_settings(run)
    problems = []
    for key, value in wanted.items():
        before = old.get(key)
        if key == "logits" and before is None:
            seen = sorted(set(point_logits) - {None})
            if seen and seen != [value]:
                problems.append(f"logits {'/'.join(seen)} -> {value}")
            continue
        if before is not None and value is not None and before != value:
            problems.append(f"{RESUME_SETTINGS.get(key, key)} {before} -> {value}")
    return problems


def runs_table(runs: Iterable[Mapping[str, Any]], name_width: int = 48) -> str:
    """The runs (list_runs dicts) as a text table: id, kind, name, created, points done / oom / error."""
    rows = [[r["id"], r["kind"], plain_text(r.get("name") or "", name_width),
             str(r.get("created_at") or "")[:16].replace("T", " "), r.get("n_done", 0), r.get("n_oom", 0),
             r.get("n_error", 0)] for r in runs]
    return format_table(["id", "kind", "name", "created (UTC)", "done", "oom", "error"], rows, align="lllrrrr")


def engine_note(run: Mapping[str, Any]) -> str:
    """What is said about a run's engine description: recorded, or assumed (runs stored before descriptions)."""
    engine, recorded = run_engine(run)
    if recorded:
        return f"engine {engine.label()} (recorded with the run)"
    return (f"engine {engine.label()} (assumed: the run predates engine descriptions; the {engine.kind} engine of "
            "that time)")


def run_details(run: Mapping[str, Any]) -> str:
    """One run in a few lines: label, settings, model and weights, counts, how to resume it."""
    from ..registry import get_family

    s = recorded_settings(run)
    lines = [f"run {run['id']}  ({run['kind']})", f"  {plain_text(run.get('label') or run.get('name') or '', 200)}",
             f"  created {run.get('created_at')}  device {s['device_type'] or '?'}  dtype {s['dtype']}  "
             f"attention {s['attn']}  session {s['session_mode']}",
             f"  model {get_family(run_model(run)).label}; {engine_note(run)}",
             f"  weights {s['weights_source']}: {plain_text(s['weights_detail'] or '', 120)}",
             f"  points {run.get('n_points', 0)}: {run.get('n_done', 0)} done, {run.get('n_oom', 0)} oom, "
             f"{run.get('n_error', 0)} error"]
    if run.get("imported_from"):
        lines.append(f"  imported from {plain_text(run['imported_from'], 200)}")
    if run["kind"] in ("sweep", "reference") and not run.get("imported_from"):
        lines.append(f"  resume with: python -m dsocr_core measure ... --resume {run['id'][:12]}")
    elif run["kind"] == "dataset":
        lines.append(f"  resume with: python -m dsocr_core profile ... --resume {run['id'][:12]}")
    return "\n".join(lines)
