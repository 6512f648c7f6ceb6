"""Reshaping measured runs (store.points / compare.compare_run frames) for tables and charts."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

# run_ceilings: the pages read a run's ceilings from here
from dsocr_core.hardware import match_device_name, run_ceilings  # noqa: F401
from dsocr_core.results.engine_state import state_text
from dsocr_core.runtime.gpu_clocks import stage_clocks_text
from dsocr_core.runtime.gpu_state import point_text as gpu_text
from dsocr_core.results.schema import STAGES as STORED_STAGES
from dsocr_core.spec import Hardware

from .analytic import STAGE_NAMES

TIME_STAGES = STORED_STAGES  # every family's stages (registry), as the run store keeps them
X_CHOICES = {"sequence": "sequence length (prompt tokens)", "crop_count": "crop count (1 = global view only)",
             "batch": "batch size", "decode_steps": "decode steps", "text_tokens": "text tokens"}


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]+")


def md(text: object, one_line: bool = True) -> str:
    """`text` shown literally inside Markdown (st.markdown, captions, alerts): every Markdown character escaped,
    control characters dropped, newlines as spaces unless one_line=False. Run names, labels and messages come
    from imported files: a name like `![x](https://host/y.png)` must stay text, not become an image the browser
    fetches."""
    text = _CONTROL.sub(" ", str(text if text is not None else ""))
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return re.sub(r"\s*\n\s*", " ", text) if one_line else text.replace("\n", "  \n")


# a run's kind as its title says it: kind "reference" is a benchmark sweep (benchmarks/gpu_reference.py), and the
# word beside a session mode ("[reference, 35 points] · fast session mode") read as a contradiction
KIND_TITLES = {"reference": "benchmark sweep", "sweep": "sweep", "dataset": "dataset run", "parity": "parity run"}


def run_title(run: dict, bundled_dir: str | None = None, size: bool = True) -> str:
    """The store's label (it names synthetic weights, CPU and the fallback tokenizer), the run's short id, kind,
    where it came from (bundled: imported from `bundled_dir`, the project's reference folder; or imported) and,
    with `size`, its number of points. The id keeps titles unique: a selectbox keeps its choice as the option's
    text, so of two runs with one title it picks the last (a second run over the same pages showed the first)."""
    origin = run.get("imported_from")
    where = "" if not origin else ", bundled" if bundled_dir and Path(origin).parent == Path(bundled_dir) else \
        ", imported"
    count = f", {run['n_points']} points" if size else ""
    return f"{run['label']} ({run['id'][:8]}) [{KIND_TITLES.get(run['kind'], run['kind'])}{where}{count}]"


def is_gpu_run(run: dict) -> bool:
    return not run["flags"]["cpu"] and bool((run.get("environment") or {}).get("gpu_name"))


def flag_notes(run: dict) -> list[str]:
    notes = []
    if run["flags"]["synthetic_weights"]:
        notes.append("synthetic (random) weights")
    if run["flags"]["cpu"]:
        notes.append("measured on the CPU")
    if run["flags"]["fallback_tokenizer"]:
        notes.append("fallback tokenizer")
    return notes


def sig(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, thousands separated, never in exponent notation where a reader
    compares it with its neighbours: 12,345, 989, 4.8, 0.191, 0.00528."""
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:,.{digits}g}" if abs(value) >= 1e-4 or value == 0 else f"{value:.{digits - 1}e}"


SPREAD_STAGES = ("vision", "prefill", "decode")  # the point table shows their p10-p90 spread


def spread_text(low, high) -> str | None:
    """'181 - 1,682' (ms), or None where the point has no spread (one repeat, or not measured)."""
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return None
    return f"{low:,.4g} - {high:,.4g}"


def stages_as_columns(summary: pd.DataFrame) -> pd.DataFrame:
    """analytic_join.summary_frame turned: one row per figure, one column per stage. Eight columns fit the page;
    its fifteen figure columns were cut at the right."""
    turned = summary.set_index("stage").T.astype(str).replace({"None": "", "nan": ""})
    turned.columns = [STAGE_NAMES.get(s, s) for s in turned.columns]
    return turned.rename_axis("figure").reset_index()


def point_table(points: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its workload, status (done / oom / error) and message, each stage's median in ms, the
    p10-p90 spread of the main stages, the number of timed repeats, the engine state it ran with, the GPU's
    state read just before its first and just after its last timed repeat and the SM clock each stage ran at (None
    where not recorded)."""
    if points.empty:
        return pd.DataFrame(columns=["status", "mode", "grid", "text_tokens", "batch", "decode_steps", "sequence",
                                     "message"])
    base = points.drop_duplicates("point_id").set_index("point_id")
    out = pd.DataFrame(index=base.index)
    out["status"] = base["status"]
    out["mode"] = base["mode"]
    out["grid"] = [None if pd.isna(w) else f"{w}x{h}" for w, h in zip(base["grid_w"], base["grid_h"])]
    for c in ("text_tokens", "batch", "decode_steps", "sequence"):
        out[c] = base[c]
    staged = points[points["stage"].notna()]
    if not staged.empty:
        ms = staged.pivot(index="point_id", columns="stage", values="median_s") * 1e3
        lo = staged.pivot(index="point_id", columns="stage", values="p10_s") * 1e3
        hi = staged.pivot(index="point_id", columns="stage", values="p90_s") * 1e3
        reps = staged.pivot(index="point_id", columns="stage", values="repeats")
        for s in TIME_STAGES:
            if s in ms:
                out[f"{s} ms"] = ms[s].reindex(out.index)
                if s in SPREAD_STAGES:
                    out[f"{s} p10-p90 ms"] = [spread_text(a, b) for a, b in
                                              zip(lo[s].reindex(out.index), hi[s].reindex(out.index))]
        out["repeats"] = reps.max(axis=1).reindex(out.index)
    out["message"] = base["message"]
    # RunStore.points() gives each point's extra as a dict; a frame read back from a file may hold its JSON
    extras = [e if isinstance(e, dict) else json.loads(e) if isinstance(e, str) else {} for e in base["extra"]]
    out["engine state"] = [state_text(e.get("engine_state")) for e in extras]
    out["GPU before -> after repeats"] = [gpu_text(e.get("gpu_state")) for e in extras]
    out["SM clock by stage"] = [stage_clocks_text(e.get("stage_clocks")) for e in extras]
    out["updated"] = base["updated_at"]
    return out.reset_index(drop=True)


def _crop_count(grid: pd.Series) -> list[int]:
    return [int(g.split("x")[0]) * int(g.split("x")[1]) if isinstance(g, str) and "x" in g else 1 for g in grid]


def with_crop_count(cmp: pd.DataFrame) -> pd.DataFrame:
    out = cmp.copy()
    out["crop_count"] = _crop_count(out["grid"]) if "grid" in out else []
    return out


def overlay_frames(cmp: pd.DataFrame, run_name: str, stages: list[str], x: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(measured points, analytic lines) for measured_vs_analytic; roofline lines for the datasheet and the
    calibrated ceilings where the run has them, and the time model's predicted line where a profile was chosen
    (`predicted_s`, compare_run's prediction in the run's own session mode)."""
    if cmp.empty:
        return pd.DataFrame(), pd.DataFrame()
    c = with_crop_count(cmp)
    c = c[c["stage"].isin(stages)].sort_values(x)
    base = ["stage", x, "mode", "grid", "sequence", "batch", "decode_steps"]
    base = list(dict.fromkeys(b for b in base if b in c))
    measured = c[base].copy()
    measured["value"] = c["measured_s"].astype(float)
    for col, name in (("p10_s", "low"), ("p90_s", "high")):  # the spread of the timed repeats
        measured[name] = pd.to_numeric(c[col], errors="coerce") if col in c else float("nan")
    measured["run"] = run_name
    lines = []
    for col, source in (("predicted_datasheet_s", "datasheet roofline"),
                        ("predicted_calibrated_s", "calibrated roofline"), ("predicted_s", "predicted")):
        if col in c and c[col].notna().any():
            part = c[base].copy()
            part["value"] = pd.to_numeric(c[col], errors="coerce")
            part["source"] = source
            part["run"] = run_name
            lines.append(part.dropna(subset=["value"]))
    predicted = pd.concat(lines, ignore_index=True) if lines else pd.DataFrame(columns=[*base, "value", "source"])
    for frame in (measured, predicted):
        if "stage" in frame:
            frame["stage"] = frame["stage"].map(lambda s: STAGE_NAMES.get(s, s))
    return measured, predicted


def flop_frame(cmp: pd.DataFrame, x: str) -> pd.DataFrame:
    """Counted (FlopCounterMode) vs analytic tensor FLOPs per stage, long form."""
    if cmp.empty:
        return pd.DataFrame()
    c = with_crop_count(cmp)
    c = c[c["stage"] != "decode_step"]
    parts = []
    for col, name in (("measured_tensor_flops", "counted"), ("analytic_tensor_flops", "analytic")):
        part = c[["stage", x, "mode", "grid"]].copy()
        part["value"] = pd.to_numeric(c[col], errors="coerce")
        part["config"] = name
        parts.append(part)
    out = pd.concat(parts, ignore_index=True).dropna(subset=["value"])
    out["stage"] = out["stage"].map(lambda s: STAGE_NAMES.get(s, s))
    return out


# ------------------------------------------------------------------------------------------- MFU
def mfu_long(cmp: pd.DataFrame, point: str | None = None) -> pd.DataFrame:
    """Per stage: MFU and MBU against the datasheet and the calibrated peaks (median over the points, or the
    one chosen point), long form: stage, metric (MFU | MBU), peak (datasheet | calibrated), value (share)."""
    rows = []
    if cmp.empty:
        return pd.DataFrame(columns=["stage", "metric", "peak", "value"])
    sel = cmp if point is None else cmp[cmp["point"] == point]
    for stage, g in sel.groupby("stage", sort=False):
        for metric in ("mfu", "mbu"):
            for peak in ("datasheet", "calibrated"):
                vals = pd.to_numeric(g.get(f"{metric}_{peak}"), errors="coerce").dropna()
                if len(vals):
                    rows.append({"stage": STAGE_NAMES.get(stage, stage), "metric": metric.upper(), "peak": peak,
                                 "value": float(vals.median())})
    return pd.DataFrame(rows, columns=["stage", "metric", "peak", "value"])


def limit_long(cmp: pd.DataFrame, point: str | None = None) -> pd.DataFrame:
    """Per stage: measured time, the predicted time (where a profile was chosen) and the time at the limit
    (roofline) of each peak, long form."""
    if cmp.empty:
        return pd.DataFrame(columns=["stage", "time", "value"])
    sel = cmp if point is None else cmp[cmp["point"] == point]
    rows = []
    for stage, g in sel.groupby("stage", sort=False):
        for col, name in (("measured_s", "measured"), ("predicted_s", "predicted"),
                          ("limit_datasheet_s", "at the datasheet limit"),
                          ("limit_calibrated_s", "at the calibrated limit")):
            if col not in g:  # predicted_s: only with a calibration profile
                continue
            vals = pd.to_numeric(g[col], errors="coerce").dropna()
            if len(vals):
                rows.append({"stage": STAGE_NAMES.get(stage, stage), "time": name, "value": float(vals.median())})
    return pd.DataFrame(rows, columns=["stage", "time", "value"])


def roofline_points(cmp: pd.DataFrame, point: str | None = None) -> pd.DataFrame:
    """Measured stages on the roofline: x = analytic FLOPs per analytic byte, y = analytic FLOPs per measured
    second (what the stage achieved)."""
    if cmp.empty:
        return pd.DataFrame()
    sel = cmp if point is None else cmp[cmp["point"] == point]
    sel = sel[(sel["stage"] != "decode_step") & (sel["measured_s"] > 0) & (sel["analytic_bytes"] > 0)]
    out = pd.DataFrame({
        "stage": sel["stage"].map(lambda s: STAGE_NAMES.get(s, s)),
        "intensity": sel["analytic_flops"].astype(float) / sel["analytic_bytes"].astype(float),
        "flops_per_s": sel["analytic_flops"].astype(float) / sel["measured_s"].astype(float),
        "point": [f"{m} {g}, text {t}, batch {b}" for m, g, t, b in
                  zip(sel["mode"], sel["grid"], sel["text_tokens"], sel["batch"])],
        "bound": sel.get("bound_datasheet"),
    })
    out["config"] = "measured"
    return out


def point_choices(cmp: pd.DataFrame) -> dict[str, str]:
    """{point key: short label} of a comparison frame, in order."""
    if cmp.empty:
        return {}
    first = cmp.drop_duplicates("point")
    return {p: f"{m} {g}, text {t}, batch {b}, {k} steps" for p, m, g, t, b, k in
            zip(first["point"], first["mode"], first["grid"], first["text_tokens"], first["batch"],
                first["decode_steps"])}
