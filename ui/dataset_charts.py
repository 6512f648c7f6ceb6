"""Altair charts of dataset runs (frames from dsocr_core.results.page_costs; times in seconds, drawn in ms). They
draw; none computes a cost."""
from __future__ import annotations

import altair as alt
import pandas as pd

from dsocr_core.results.page_costs import METRICS, X_AXES

from .charts import _x as x_channel  # whole-number ticks, a domain around a single value
from .charts import finish

SERIES = {"measured": "#4c78a8", "analytic bound": "#595959", "predicted": "#f58518"}
DASH = {"measured": [1, 0], "analytic bound": [6, 4], "predicted": [1, 0]}
STAGE_SORT = list(METRICS.values())


def page_stages(long: pd.DataFrame, x: str = "crop_count", columns: int = 3) -> alt.FacetChart:
    """Each page's stage times (points) against its crop grid or prompt length, with the analytic bound (dashed)
    and, where the frame has it, the predicted time (solid) of the same workloads drawn through them (their mean
    at each x). One panel per stage, each with its own log y scale (a CPU run sits decades above a GPU bound)."""
    keep = list(dict.fromkeys(["label", "grid", "prompt_tokens", "stage", "beats_bound", x]))
    series = {"measured": "measured_s", "analytic bound": "analytic_s", "predicted": "predicted_s"}
    parts = []
    for name, col in series.items():
        if col in long and long[col].notna().any():
            part = long[keep].copy()
            part["series"] = name
            part["ms"] = long[col].astype(float) * 1e3
            parts.append(part.dropna(subset=["ms"]))
    data = pd.concat(parts, ignore_index=True)
    present = [s for s in SERIES if s in set(data["series"])]
    colour = alt.Color("series:N", title=None, scale=alt.Scale(domain=present, range=[SERIES[s] for s in present]),
                       legend=alt.Legend(orient="top"))
    data = data[data["ms"] > 0]
    xs = x_channel(x, X_AXES.get(x, x), data)
    ys = alt.Y("ms:Q", title="ms (log scale)", scale=alt.Scale(type="log"))
    base = alt.Chart()
    points = base.mark_point(filled=True, size=60, opacity=0.8, strokeWidth=2).encode(
        x=xs, y=ys, color=colour,
        stroke=alt.condition("datum.beats_bound", alt.value("#d62728"), alt.value("transparent")),
        tooltip=["label:N", "grid:N", alt.Tooltip("prompt_tokens:Q", title="prompt tokens"),
                 alt.Tooltip("ms:Q", format=",.4~r", title="measured ms"),
                 alt.Tooltip("beats_bound:N", title="faster than its bound (a defect of the bound)")],
    ).transform_filter(alt.datum.series == "measured")
    lines = base.mark_line(point=alt.OverlayMarkDef(size=20)).encode(
        x=xs, y=alt.Y("mean(ms):Q", title="ms (log scale)", scale=alt.Scale(type="log")), color=colour,
        strokeDash=alt.StrokeDash("series:N", legend=None,
                                  scale=alt.Scale(domain=present, range=[DASH[s] for s in present])),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip(f"{x}:Q", title=X_AXES.get(x, x)),
                 alt.Tooltip("mean(ms):Q", format=",.4~r", title="ms (mean at this x)")],
    ).transform_filter(alt.datum.series != "measured")
    chart = alt.layer(lines, points, data=data).properties(width=215, height=180).facet(
        facet=alt.Facet("stage:N", title=None, sort=STAGE_SORT), columns=columns).resolve_scale(y="independent")
    return finish(chart)


LATENCY_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT"}


def latency_histogram(latency: pd.DataFrame) -> alt.HConcatChart:
    """Histograms of TTFT and TPOT over the samples (dataset_stats.distributions), each binned over its own range:
    a TPOT is tens of times shorter than a TTFT, and bins shared by both would put every TPOT in the first one."""
    data = latency.assign(ms=latency["value"] * 1e3)
    panels = []
    for metric in [m for m in LATENCY_NAMES if m in set(data["metric"])]:
        name = LATENCY_NAMES[metric]
        panels.append(alt.Chart(data[data["metric"] == metric], title=name).mark_bar(
            color="#4c78a8" if metric == "ttft_s" else "#f58518").encode(
            x=alt.X("ms:Q", bin=alt.Bin(maxbins=30), title=f"{name} (ms)"),
            y=alt.Y("count():Q", title="samples"),
            tooltip=[alt.Tooltip("ms:Q", bin=alt.Bin(maxbins=30), title=f"{name} (ms)"),
                     alt.Tooltip("count():Q", title="samples")],
        ).properties(height=200, width=330))
    return finish(alt.hconcat(*panels))


def spread(table: pd.DataFrame) -> alt.LayerChart:
    """Per stage over the samples: whisker min-max, bar p10-p90, tick at the median (log ms axis)."""
    data = table.copy()
    for c in ("min", "p10", "median", "mean", "p90", "max"):
        data[f"{c}_ms"] = data[c].astype(float) * 1e3
    data = data[data["min_ms"] > 0]
    y = alt.Y("stage:N", title=None, sort=STAGE_SORT)
    xs = alt.Scale(type="log")
    tips = [alt.Tooltip("stage:N"), alt.Tooltip("n:Q", title="samples")] + [
        alt.Tooltip(f"{c}_ms:Q", format=",.4~r", title=f"{c} ms") for c in ("min", "p10", "median", "p90", "max")]
    whisker = alt.Chart(data).mark_rule(color="#888888").encode(
        x=alt.X("min_ms:Q", title="ms (log scale)", scale=xs), x2="max_ms:Q", y=y, tooltip=tips)
    box = alt.Chart(data).mark_bar(size=14, color="#4c78a8", opacity=0.55).encode(
        x=alt.X("p10_ms:Q", scale=xs), x2="p90_ms:Q", y=y, tooltip=tips)
    median = alt.Chart(data).mark_tick(color="#1f3b5c", thickness=3, size=22).encode(
        x=alt.X("median_ms:Q", scale=xs), y=y, tooltip=tips)
    return finish(alt.layer(whisker, box, median).properties(height=40 * max(len(data), 1) + 30))


def operators(table: pd.DataFrame) -> alt.Chart:
    """Self time of a stage's top operators (readable names; the full name in the tooltip)."""
    return finish(alt.Chart(table).mark_bar(color="#72b7b2").encode(
        x=alt.X("self_ms:Q", title="self time (ms)"),
        y=alt.Y("short:N", title=None, sort="-x", axis=alt.Axis(labelLimit=420, labelOverlap=False)),
        tooltip=[alt.Tooltip("operator:N", title="full name"), alt.Tooltip("calls:Q"),
                 alt.Tooltip("self_ms:Q", format=",.4~r", title="self ms"),
                 alt.Tooltip("share:Q", format=".1%", title="share of the stage")],
    ).properties(height=28 * max(len(table), 1) + 30))


def compare_stages(stages: pd.DataFrame, names: tuple[str, str]) -> alt.Chart:
    """Median per stage of two runs over their shared pages, side by side (log ms axis)."""
    data = pd.concat([pd.DataFrame({"stage": stages["stage"], "run": names[0], "ms": stages["median_a"] * 1e3}),
                      pd.DataFrame({"stage": stages["stage"], "run": names[1], "ms": stages["median_b"] * 1e3})])
    data = data[data["ms"] > 0]
    return finish(alt.Chart(data).mark_bar().encode(
        x=alt.X("stage:N", title=None, sort=STAGE_SORT), xOffset="run:N",
        y=alt.Y("ms:Q", title="median ms (log scale)", scale=alt.Scale(type="log")),
        y2=alt.datum(float(data["ms"].min()) / 3 if len(data) else 1e-3),
        color=alt.Color("run:N", title=None, sort=list(names)),
        tooltip=["stage:N", "run:N", alt.Tooltip("ms:Q", format=",.4~r", title="median ms")],
    ).properties(height=280))


def compare_pages(pages: pd.DataFrame, names: tuple[str, str]) -> alt.LayerChart:
    """Every shared page and stage: run A's time (x) against run B's (y), log-log, with the y = x line."""
    data = pages.assign(a_ms=pages["a_s"] * 1e3, b_ms=pages["b_s"] * 1e3)
    data = data[(data["a_ms"] > 0) & (data["b_ms"] > 0)]
    low = float(min(data["a_ms"].min(), data["b_ms"].min())) if len(data) else 1e-3
    high = float(max(data["a_ms"].max(), data["b_ms"].max())) if len(data) else 1.0
    diagonal = alt.Chart(pd.DataFrame({"a_ms": [low, high], "b_ms": [low, high]})).mark_line(
        color="#999999", strokeDash=[4, 4]).encode(x="a_ms:Q", y="b_ms:Q")
    dots = alt.Chart(data).mark_point(filled=True, size=60).encode(
        x=alt.X("a_ms:Q", title=f"{names[0]} (ms, log)", scale=alt.Scale(type="log")),
        y=alt.Y("b_ms:Q", title=f"{names[1]} (ms, log)", scale=alt.Scale(type="log")),
        color=alt.Color("stage:N", title="stage", sort=STAGE_SORT),
        tooltip=["label:N", "stage:N", alt.Tooltip("a_ms:Q", format=",.4~r", title=f"{names[0]} ms"),
                 alt.Tooltip("b_ms:Q", format=",.4~r", title=f"{names[1]} ms"),
                 alt.Tooltip("b_over_a:Q", format=".3~g", title="B / A")])
    return finish(alt.layer(diagonal, dots).properties(height=320).interactive())
