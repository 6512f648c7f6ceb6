"""Analytic sweep requests and the long-form frames the charts draw.

A SweepRequest is one configuration (mode, attention, dtype, batch, ...) and one varying axis. Its table is
`dsocr_core.analytic.sweep_table` over `Points.grid`; this module only chooses the grid and reshapes the
result for the charts (no cost formula lives here).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pandas as pd

from dsocr_core import analytic, tiling
from dsocr_core.registry import LM_STAGES, get_family, stage_labels, vision_stage_names
from dsocr_core.spec import Hardware, ModelSpec, Workload

AXES = {
    "crops": "Crop count (Gundam tiles)",
    "text": "Text length (prompt tokens)",
    "image": "Page sizes",
    "batch": "Batch size",
    "decode": "Decode steps",
}
STAGES = (*vision_stage_names(), *LM_STAGES)  # every family's (registry); a table has its own model's columns
STAGE_NAMES = {**stage_labels(), "decode_step": "decode step"}
MEMORY = {"total.weight_memory": "weights", "total.peak_activation_memory": "activations (peak)",
          "total.kv_cache_memory": "KV cache"}
TRAFFIC = {"total.weight_bytes": "weight reads", "total.activation_bytes": "activation reads + writes",
           "total.kv_bytes": "KV cache reads + writes"}
X_FIELDS = {"crop_count": "crop count (1 = global view only)", "sequence": "sequence length (prompt tokens)",
            "batch": "batch size", "decode_steps": "decode steps"}


@dataclass(frozen=True)
class SweepRequest:
    label: str = "A"
    mode: str = get_family().default_mode
    attn: str = "sdpa"
    dtype: str = "bfloat16"
    logits: str = "all"
    axis: str = "crops"
    values: tuple = (1, 2, 3, 4, 6, 9)
    text_tokens: int = 10
    batch: int = 1
    decode_steps: int = 512
    crops: tuple[int, int] | None = (2, 2)  # the fixed grid when another axis varies (tiling modes only)
    min_crops: int = tiling.HF_CROP_RANGE[0]
    max_crops: int = tiling.HF_CROP_RANGE[1]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SweepRequest":
        d = json.loads(text)
        d["values"] = tuple(tuple(v) if isinstance(v, list) else v for v in d["values"])
        d["crops"] = tuple(d["crops"]) if d.get("crops") else None
        return cls(**d)

    @property
    def max_batch(self) -> int:
        return max(self.values) if self.axis == "batch" else self.batch

    @property
    def tiles(self) -> bool:
        return tiling.mode_info(self.mode).crop_mode

    def points(self) -> analytic.Points:
        """The sweep grid (raises SpecError for impossible settings)."""
        fixed_crops = [self.crops if self.tiles and self.crops else (1, 1)]
        kw = dict(mode=self.mode, text_tokens=[self.text_tokens], batch=[self.batch],
                  decode_steps=[self.decode_steps], dtype=self.dtype, attn=self.attn, logits=self.logits,
                  min_crops=self.min_crops, max_crops=self.max_crops)
        if self.axis == "crops":
            grids = [tiling.most_square_grid(n) if self.tiles else (1, 1) for n in self.values]
            return analytic.Points.grid(crops=grids, **kw)
        if self.axis == "image":
            return analytic.Points.grid(images=list(self.values), **kw)
        axis_key = {"text": "text_tokens", "batch": "batch", "decode": "decode_steps"}[self.axis]
        kw[axis_key] = list(self.values)
        return analytic.Points.grid(crops=fixed_crops, **kw)

    def table(self, spec: ModelSpec, hw: Hardware) -> pd.DataFrame:
        df = analytic.sweep_table(spec, self.points(), hw, with_capacity=True)
        df.insert(0, "config", self.label)
        df["grid"] = df["crops_w"].astype(str) + "x" + df["crops_h"].astype(str)
        if self.axis == "crops":  # untiled modes cost the same at every count: keep the requested count as x
            df["crop_count"] = list(self.values)
        else:
            df["crop_count"] = df["crops_w"] * df["crops_h"]
        if "image_w" in df:
            df["page"] = df["image_w"].astype(str) + "x" + df["image_h"].astype(str)
        df["hardware"] = hw.name
        return df

    def workload(self, row: pd.Series) -> Workload:
        """The single workload of one sweep point (for the per-module table and capacity planning)."""
        crops = (int(row["crops_w"]), int(row["crops_h"])) if self.tiles else None
        return Workload(mode=self.mode, crops=crops, text_tokens=int(row["text_tokens"]), batch=int(row["batch"]),
                        decode_steps=int(row["decode_steps"]), dtype=self.dtype, attn=self.attn,
                        logits=self.logits, min_crops=self.min_crops, max_crops=self.max_crops)


def x_field(axis: str, crops_x: str = "crop_count") -> str:
    """The column a sweep is plotted against."""
    return {"crops": crops_x, "image": crops_x, "text": "sequence", "batch": "batch",
            "decode": "decode_steps"}[axis]


def config_labels(a: dict, b: dict) -> tuple[str, str]:
    """'A: sdpa' / 'B: eager': each configuration named by what differs between the two."""
    names = {"mode": "", "attn": "", "dtype": "", "batch": "batch ", "decode_steps": "steps ",
             "text_tokens": "text ", "crops": "grid ", "hardware": "", "logits": "logits "}
    diff = [k for k in names if a.get(k) != b.get(k)]

    def show(d: dict) -> str:
        parts = []
        for k in diff:
            v = d.get(k)
            v = "x".join(map(str, v)) if isinstance(v, (tuple, list)) else v
            parts.append(f"{names[k]}{v}")
        return ", ".join(parts)

    if not diff:
        return "A", "B (same settings)"
    return f"A: {show(a)}", f"B: {show(b)}"


def _base_columns(df: pd.DataFrame, x: str) -> list[str]:
    keep = ["config", x, "mode", "grid", "crop_count", "sequence", "text_tokens", "batch", "decode_steps",
            "hardware"]
    if "page" in df:
        keep.append("page")
    return list(dict.fromkeys(c for c in keep if c in df))


def stage_long(df: pd.DataFrame, metric: str, x: str, stages=STAGES) -> pd.DataFrame:
    """One row per point and stage: config, x, stage, value (= the stage's `metric`)."""
    base = _base_columns(df, x)
    parts = []
    for s in stages:
        col = f"{s}.{metric}"
        if col in df:
            part = df[base].copy()
            part["stage"] = STAGE_NAMES.get(s, s)
            part["value"] = df[col].astype(float)
            parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*base, "stage", "value"])


TIME_SERIES = {"time_s": "roofline", "predicted_s": "predicted"}  # metric -> series name in the time charts


def time_long(df: pd.DataFrame, x: str, stages=STAGES) -> pd.DataFrame:
    """stage_long of the roofline time, plus the time model's predicted time where the sweep has it (a profile
    was chosen), one `series` column telling them apart."""
    parts = [stage_long(df, metric, x, stages).assign(series=name) for metric, name in TIME_SERIES.items()
             if f"total.{metric}" in df]
    return pd.concat(parts, ignore_index=True)


def has_prediction(df: pd.DataFrame) -> bool:
    return "total.predicted_s" in df


def component_long(df: pd.DataFrame, columns: dict[str, str], x: str) -> pd.DataFrame:
    """One row per point and component (e.g. weights / activations / KV cache memory of the whole run)."""
    base = _base_columns(df, x)
    parts = []
    for col, name in columns.items():
        part = df[base].copy()
        part["component"] = name
        part["value"] = df[col].astype(float)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def stage_points(df: pd.DataFrame, index: int, stages=STAGES) -> pd.DataFrame:
    """Each stage of one sweep point as a roofline point: intensity (FLOPs per byte), the FLOP/s the stage
    reaches at its modelled time, its bound and time. With a prediction, a second point per stage at its
    predicted time (`series` roofline | predicted): how far below the roof the stage is expected to run."""
    row = df.iloc[index]
    rows = []
    for s in stages:
        for metric, series in TIME_SERIES.items():
            if f"{s}.{metric}" not in row:
                continue
            t = float(row[f"{s}.{metric}"])
            if t <= 0:
                continue  # a stage that does nothing (decode with 0 steps)
            rows.append({"config": row["config"], "series": series, "stage": STAGE_NAMES[s],
                         "intensity": float(row[f"{s}.intensity"]), "flops_per_s": float(row[f"{s}.flops"]) / t,
                         "time_s": t, "bound": row[f"{s}.bound"], "flops": float(row[f"{s}.flops"]),
                         "bytes": float(row[f"{s}.bytes"]), "hardware": row["hardware"]})
    return pd.DataFrame(rows)


def roofline_points(frames: list[pd.DataFrame], index: int) -> pd.DataFrame:
    """stage_points of every configuration at sweep point `index`, with the `marker` the chart's point shape
    tells apart: the configuration and the series (bound or predicted) where both vary, else the one that does."""
    pts = pd.concat([stage_points(f, min(index, len(f) - 1)) for f in frames], ignore_index=True)
    if pts.empty:
        return pts
    several, predicted = pts["config"].nunique() > 1, pts["series"].nunique() > 1
    pts["marker"] = (pts["config"] + ", " + pts["series"] if several and predicted
                     else pts["series"] if predicted else pts["config"])
    return pts


def export_frame(frames: list[pd.DataFrame], spec_label: str) -> pd.DataFrame:
    """The sweep tables of every configuration, with the model dimensions named on each row."""
    out = pd.concat(frames, ignore_index=True)
    out.insert(1, "model_dimensions", spec_label)
    return out
