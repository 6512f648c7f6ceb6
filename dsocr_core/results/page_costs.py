"""Per-page costs of dataset runs as a user looks at them: each page's stage times beside the analytic bound and the
predicted time of its own workload, the spread per stage, the slowest pages, two runs over the same pages side by
side, and the operator breakdown with readable names.

Everything reads dataset_stats.page_table frames (one row per sample; analytic_* columns given a Hardware, and
predicted_* columns given a prediction Hardware) and returns DataFrames; times stay in seconds. None imports
streamlit or torch.

Conventions: only samples with status `done` count. Per page means the mean over the page's epochs. The spread per
stage is over samples: min, p10, median, mean, p90, max (numpy's linear-interpolated percentiles) and the
population std. Two runs are joined on the page's file and PDF page (`source`, `pdf_page`: the same uploads give
the same content-addressed file in every run), or, where no file is shared (runs measured on other machines), on
the page's name and PDF page.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..measure.kernel_names import short_name
from ..registry import stage_labels, vision_stage_names

# (page-table column, what the dashboard calls it), in the order a page runs
METRICS = {**{f"{s}_s": label for s, label in stage_labels().items() if s not in ("vision", "decode", "total")},
           "ttft_s": "TTFT", "decode_s": stage_labels()["decode"], "tpot_s": "TPOT"}  # every family's stages


def run_metrics(*pages: pd.DataFrame) -> tuple[str, ...]:
    """The METRICS of the runs' models (page tables record their model; dataset_stats.run_stages), in order: a
    DeepSeek-OCR run has no encoder_s, a DeepSeek-OCR 2 run no clip_s, two runs of the two models both."""
    from .dataset_stats import run_stages

    stages = {s for p in pages for s in run_stages(p)}
    return tuple(m for m in METRICS if m[:-2] not in vision_stage_names() or m[:-2] in stages)


X_AXES = {"crop_count": "crop tiles (number)", "prompt_tokens": "prompt length (tokens)"}
LONG_COLUMNS = ("label", "page", "pdf_page", "epoch", "source", "mode", "grid", "crop_count", "prompt_tokens",
                "image_w", "image_h", "metric", "stage", "measured_s", "analytic_s", "predicted_s", "beats_bound")
SPREAD_COLUMNS = ("metric", "stage", "n", "min", "p10", "median", "mean", "p90", "max", "std")
OTHERS = "(other operators)"


def _done(pages: pd.DataFrame) -> pd.DataFrame:
    return pages[pages["status"] == "done"]


def _num(frame: pd.DataFrame, col: str) -> np.ndarray:
    if col not in frame:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[col], errors="coerce").astype("float64").to_numpy()


# ---------------------------------------------------------------------------------------------- per page
def page_stage_long(pages: pd.DataFrame, metrics=None) -> pd.DataFrame:
    """LONG_COLUMNS: one row per done sample and metric, its measured time beside the analytic (roofline) time
    and the predicted time of the same page's workload (NaN where the page table has no such column: no
    hardware, or no prediction). `crop_count` = grid width x height (1 for the modes without tiles). `metrics`
    defaults to the run's (run_metrics)."""
    metrics = run_metrics(pages) if metrics is None else metrics
    done = _done(pages)
    parts = []
    for metric in metrics:
        if metric not in done:
            continue
        part = pd.DataFrame({c: done[c].to_numpy() for c in ("label", "page", "pdf_page", "epoch", "source", "mode",
                                                             "grid", "prompt_tokens", "image_w", "image_h")
                             if c in done})
        gw, gh = _num(done, "grid_w"), _num(done, "grid_h")
        part["crop_count"] = gw * gh
        part["metric"] = metric
        part["stage"] = METRICS.get(metric, metric)
        part["measured_s"] = _num(done, metric)
        part["analytic_s"] = _num(done, f"analytic_{metric}")
        part["predicted_s"] = _num(done, f"predicted_{metric}")
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=list(LONG_COLUMNS))
    out = pd.concat(parts, ignore_index=True)
    out = out.dropna(subset=["measured_s"]).reset_index(drop=True)
    out["beats_bound"] = out["measured_s"] < out["analytic_s"]  # False where there is no bound (NaN)
    return out.reindex(columns=list(LONG_COLUMNS))


def bound_defects(long: pd.DataFrame) -> pd.DataFrame:
    """Per stage, the measured samples faster than their analytic bound (page_stage_long rows): stage, n (such
    samples), of (samples with a bound), lowest (the smallest measured / bound ratio). A lower bound can never
    exceed a measurement, so every row is a defect of the bound (ceilings below what the device reaches, or work
    the model over-counts), never a fast page."""
    cols = ["stage", "n", "of", "lowest"]
    bounded = long[long["analytic_s"].notna() & (long["analytic_s"] > 0)] if len(long) else long
    rows = []
    for stage, group in bounded.groupby("stage", sort=False):
        beats = group[group["beats_bound"].astype(bool)]
        if len(beats):
            rows.append({"stage": stage, "n": len(beats), "of": len(group),
                         "lowest": float((beats["measured_s"] / beats["analytic_s"]).min())})
    return pd.DataFrame(rows, columns=cols)


def stage_spread(pages: pd.DataFrame, metrics=None) -> pd.DataFrame:
    """SPREAD_COLUMNS: the distribution of each metric (default: the run's) over the done samples (seconds)."""
    metrics = run_metrics(pages) if metrics is None else metrics
    done = _done(pages)
    rows = []
    for metric in metrics:
        v = _num(done, metric)
        v = v[np.isfinite(v)]
        if not v.size:
            continue
        p10, med, p90 = np.percentile(v, [10, 50, 90])
        rows.append({"metric": metric, "stage": METRICS.get(metric, metric), "n": int(v.size), "min": float(v.min()),
                     "p10": float(p10), "median": float(med), "mean": float(v.mean()), "p90": float(p90),
                     "max": float(v.max()), "std": float(v.std())})
    return pd.DataFrame(rows, columns=list(SPREAD_COLUMNS))


def page_means(pages: pd.DataFrame, metrics=None) -> pd.DataFrame:
    """One row per page (file and PDF page) over its done epochs: label, source, pdf_page, epochs, mode, grid,
    prompt_tokens, image_w, image_h, the mean of each metric and of wall_s and generated_tokens."""
    metrics = run_metrics(pages) if metrics is None else metrics
    done = _done(pages).copy()
    cols = [m for m in (*metrics, "wall_s", "generated_tokens") if m in done]
    for c in cols:
        done[c] = pd.to_numeric(done[c], errors="coerce").astype("float64")
    done["_file"] = done["source"].fillna(done["page"]) if "source" in done else done["page"]
    done["_pdf"] = done["pdf_page"].astype("float64").fillna(-1)
    g = done.groupby(["_file", "_pdf"], sort=False)
    out = g[cols].mean()
    out["epochs"] = g.size()
    for c in ("label", "page", "source", "pdf_page", "mode", "grid", "prompt_tokens", "image_w", "image_h"):
        if c in done:
            out[c] = g[c].first()
    return out.reset_index(drop=True)


def slowest_pages(pages: pd.DataFrame, metric: str = "wall_s", n: int = 6) -> pd.DataFrame:
    """The `n` pages with the largest mean `metric` (page_means rows, slowest first)."""
    means = page_means(pages)
    if metric not in means or means.empty:
        return means.head(0)
    return means.sort_values(metric, ascending=False, kind="stable").head(n).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- two runs
@dataclass
class RunComparison:
    stages: pd.DataFrame  # stage, metric, n, median_a, median_b, b_over_a (medians over the shared pages)
    pages: pd.DataFrame  # label, metric, stage, a_s, b_s, b_over_a (one row per shared page and metric)
    shared: int  # pages measured in both runs
    only_a: int
    only_b: int
    joined_on: str  # "file" | "name"


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, metrics=None) -> RunComparison:
    """Two dataset runs (page tables) on the pages they share (see the module docstring for the join). The runs
    may be of two models (DeepSeek-OCR vs DeepSeek-OCR 2): a stage only one of them has (CLIP, the encoder) gets a
    row with that run's median over the shared pages, n = 0 and no ratio."""
    metrics = run_metrics(a, b) if metrics is None else metrics
    ma, mb = page_means(a, metrics), page_means(b, metrics)
    joined_on = "file"
    key = ["source", "pdf_page"]
    if ma.empty or mb.empty or not set(ma["source"].dropna()) & set(mb["source"].dropna()):
        joined_on, key = "name", ["page", "pdf_page"]
    for m in (ma, mb):
        m["_pdf"] = m["pdf_page"].astype("float64").fillna(-1) if len(m) else pd.Series(dtype="float64")
    on = [key[0], "_pdf"]
    both = ma.merge(mb, on=on, how="inner", suffixes=("_a", "_b"))
    shared = len(both)
    rows, stages = [], []
    for metric in metrics:
        if f"{metric}_a" not in both or f"{metric}_b" not in both:
            continue
        va, vb = both[f"{metric}_a"].to_numpy(float), both[f"{metric}_b"].to_numpy(float)
        ok = np.isfinite(va) & np.isfinite(vb)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(va > 0, vb / va, np.nan)
        rows.append(pd.DataFrame({"label": both["label_a"], "metric": metric, "stage": METRICS.get(metric, metric),
                                  "a_s": va, "b_s": vb, "b_over_a": ratio})[ok])
        if ok.any():
            med_a, med_b = float(np.median(va[ok])), float(np.median(vb[ok]))
            stages.append({"stage": METRICS.get(metric, metric), "metric": metric, "n": int(ok.sum()),
                           "median_a": med_a, "median_b": med_b, "b_over_a": med_b / med_a if med_a > 0 else np.nan})
        elif np.isfinite(va).any() or np.isfinite(vb).any():  # a stage of one model only
            med = [float(np.median(v[np.isfinite(v)])) if np.isfinite(v).any() else np.nan for v in (va, vb)]
            stages.append({"stage": METRICS.get(metric, metric), "metric": metric, "n": 0,
                           "median_a": med[0], "median_b": med[1], "b_over_a": np.nan})
    per_page = (pd.concat(rows, ignore_index=True) if rows else
                pd.DataFrame(columns=["label", "metric", "stage", "a_s", "b_s", "b_over_a"]))
    return RunComparison(pd.DataFrame(stages, columns=["stage", "metric", "n", "median_a", "median_b", "b_over_a"]),
                         per_page, shared, len(ma) - shared, len(mb) - shared, joined_on)


# ---------------------------------------------------------------------------------------------- operators
def operator_breakdown(ops: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """The `top` operators of each (stage, device) by self time, the rest folded into one row, with a readable
    `short` name beside the full `operator` name and self time in ms: stage, device, short, operator, calls,
    self_ms, share, rank."""
    cols = ["stage", "device", "short", "operator", "calls", "self_ms", "share", "rank"]
    if ops is None or ops.empty:
        return pd.DataFrame(columns=cols)
    parts = []
    for (_stage, _device), group in ops.groupby(["stage", "device"], sort=False):
        group = group.sort_values("self_us", ascending=False, kind="stable")
        named = group[group["operator"] != OTHERS]
        head = named.head(top).copy()
        rest = pd.concat([named.iloc[top:], group[group["operator"] == OTHERS]])
        if len(rest):
            first = group.iloc[0]
            head = pd.concat([head, pd.DataFrame([{
                "stage": first["stage"], "device": first["device"], "operator": OTHERS,
                "calls": int(rest["calls"].sum()), "self_us": float(rest["self_us"].sum()),
                "share": float(rest["share"].sum())}])], ignore_index=True)
        head["rank"] = np.arange(1, len(head) + 1)
        parts.append(head)
    out = pd.concat(parts, ignore_index=True)
    out["short"] = [short_name(o) for o in out["operator"]]
    out["self_ms"] = out["self_us"].astype(float) / 1e3
    out["calls"] = out["calls"].astype(int)
    return out[cols]
