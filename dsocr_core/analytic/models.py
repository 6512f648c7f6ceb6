"""The same pages under every model family: each family tiles a page its own way (DeepSeek-OCR: gundam, 640 px tiles,
newline slots; DeepSeek-OCR 2: 768 px crops, no newlines), then each stage is priced with that family's spec.
One vectorised sweep per family; the long table lines the families' stages up for an overlaid chart (a stage one
family lacks, CLIP or the encoder, has rows for the other family only)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import pandas as pd

from ..registry import FAMILIES, stage_labels, stage_rank
from ..spec import Hardware
from .points import Points
from ..engines import as_engine
from .sweep import sweep_table

COLUMNS = ("model", "model_label", "page", "mode", "grid", "image_slots", "sequence", "stage", "stage_label",
           "flops", "bytes", "time_s", "bound", "predicted_s", "predicted_mode", "predicted_routing",
           "predicted_clocks")


def models_on_pages(pages: Sequence[tuple[int, int]], hardware: Hardware | None = None, *, preset: str = "full",
                    text_tokens: int = 10, decode_steps: int = 512, batch: int = 1, dtype: str = "bfloat16",
                    attn: str = "sdpa", logits: str = "all", models: Sequence[str] | None = None) -> pd.DataFrame:
    """COLUMNS: one row per page x model x stage (each family's stages, `vision` and `total`; pages in the order
    given, stages in display order, the models interleaved), in each family's default mode and crop range with
    its `preset` spec. Times need a hardware (NaN without one); predicted_s
    needs a hardware carrying a prediction (analytic.predict.with_profile), else NaN; a fast-mode prediction of a
    model the fast engine does not run is made in the reference mode, and `predicted_mode` says so on its rows."""
    labels = stage_labels()
    parts = []
    pred = getattr(hardware, "prediction", None)
    for name in models or tuple(FAMILIES):
        fam = FAMILIES[name]
        hw, mode = hardware, None if pred is None else pred.session_mode
        if pred is not None and mode == "fast" and not fam.fast_engine:  # the same prediction on the reference
            # engine: its routing, host speed and clocks kept
            hw = hardware.model_copy(update={"prediction": replace(pred, engine=as_engine("reference"))})
            mode = "reference"
        pts = Points.grid(mode=fam.default_mode, images=[tuple(p) for p in pages], text_tokens=[text_tokens],
                          batch=[batch], decode_steps=[decode_steps], dtype=dtype, attn=attn, logits=logits)
        table = sweep_table(fam.preset(preset), pts, hw)
        page = table["image_w"].astype(int).astype(str) + "x" + table["image_h"].astype(int).astype(str)
        grid = table["crops_w"].astype(int).astype(str) + "x" + table["crops_h"].astype(int).astype(str)
        for stage in fam.all_stages:
            def col(metric: str, stage: str = stage):
                return table[f"{stage}.{metric}"] if f"{stage}.{metric}" in table else float("nan")

            parts.append(pd.DataFrame({
                "model": name, "model_label": fam.label, "page": page, "mode": table["mode"], "grid": grid,
                "image_slots": table["image_slots"], "sequence": table["sequence"], "stage": stage,
                "stage_label": labels[stage], "flops": col("flops"), "bytes": col("bytes"), "time_s": col("time_s"),
                "bound": col("bound"), "predicted_s": col("predicted_s"), "predicted_mode": mode,
                "predicted_routing": None if pred is None else pred.routing_label(),
                "predicted_clocks": None if pred is None else pred.clock_label()}))
    out = pd.concat(parts, ignore_index=True)
    rank = {"page": {f"{w}x{h}": i for i, (w, h) in enumerate(pages)},  # the pages in the order given
            "stage": {s: (stage_rank(s), s) for s in out["stage"].unique()}}
    out = out.sort_values(["page", "stage"], key=lambda c: c.map(rank[c.name]), kind="stable")
    return out.reset_index(drop=True).reindex(columns=list(COLUMNS))


def model_summary(long: pd.DataFrame) -> pd.DataFrame:
    """One row per page x model from models_on_pages: image slots, vision / prefill / total FLOPs and times (the
    times in seconds; predicted where the long table has them)."""
    wide = long.pivot(index=["page", "model_label", "grid", "image_slots"], columns="stage",
                      values=["flops", "time_s", "predicted_s"])
    out = pd.DataFrame(index=wide.index)
    for metric in ("flops", "time_s", "predicted_s"):
        for stage in ("vision", "prefill", "total"):
            if (metric, stage) in wide:
                out[f"{stage}_{metric}"] = wide[(metric, stage)]
    return out.reset_index()
