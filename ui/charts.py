"""Altair chart builders. They draw frames that dsocr_core computed; none of them computes a cost."""
from __future__ import annotations

import functools
import os

import altair as alt
import pandas as pd

from dsocr_core.registry import stage_labels

VALIDATE_ENV = "DSOCR_VALIDATE_CHARTS"  # set (the app tests do): every chart is checked against the Vega-Lite schema

# display names of every family's stages (registry), in display order, then the per-step decode and the total
STAGE_ORDER = [*(label for s, label in stage_labels().items() if s != "total"), "decode step", stage_labels()["total"]]
# by display name; CLIP and DeepSeek-OCR 2's encoder, the second vision stage of each family, in neighbouring hues
COLOURS = {"SAM": "#4c78a8", "CLIP": "#72b7b2", "encoder": "#17becf", "projector": "#54a24b", "vision": "#2f6b2b",
           "LM prefill": "#f58518", "LM decode": "#e45756", "decode step": "#b279a2", "total": "#595959"}
STAGE_COLOURS = [COLOURS.get(s, "#9d755d") for s in STAGE_ORDER]
# whole-number x axes
INTEGER_FIELDS = {"crop_count", "batch", "decode_steps", "sequence", "text_tokens", "prompt_tokens"}
DASHES = {"datasheet roofline": [8, 4], "calibrated roofline": [2, 3],  # both roofline lines dashed, told apart
          "predicted": [1, 0]}  # the time model's prediction: solid, where the measured points should lie
SERIES_DASHES = {"roofline": [6, 3], "predicted": [1, 0]}  # analytic sweeps: the bound dashed, the prediction solid
UNITS = {  # name -> (factor applied to the base unit, axis suffix)
    "FLOPs": (1.0, "FLOPs"), "bytes": (1.0, "bytes"), "GB": (1e-9, "GB"), "ms": (1e3, "ms"), "s": (1.0, "s"),
    "share": (100.0, "%"), "FLOP/s": (1.0, "FLOP/s"),
}


def finish(chart):
    """Every chart: legend labels and titles never cut ('at the calib...', 'NVIDIA H200 SXM (datas...'). And no
    JSON-schema validation of the spec when the page draws it (a quarter of a warm page run; the charts are built
    the same way every time, and the app tests validate them all with DSOCR_VALIDATE_CHARTS=1)."""
    chart = chart.configure_legend(labelLimit=0, titleLimit=0)
    if not os.environ.get(VALIDATE_ENV):
        object.__setattr__(chart, "to_dict", functools.partial(type(chart).to_dict, chart, validate=False))
    return chart


def dash_legend(title: str) -> alt.Legend:
    """A legend of line dashes drawn as lines 30 px long: the default symbol (a dot, or a 10 px stroke) shows an
    8-4 dash and a solid line as the same glyph, so 'datasheet roofline' and 'predicted' could not be told apart."""
    return alt.Legend(title=title, symbolType="stroke", symbolSize=900, symbolStrokeColor="#333333",
                      symbolStrokeWidth=2)


def _config_width() -> alt.StrokeWidth:
    """A thick and B thin: B is drawn after A, so where the two coincide B shows inside A instead of hiding it."""
    return alt.StrokeWidth("config:N", title="configuration", scale=alt.Scale(range=[4.5, 1.5]))


def _x(field: str, title: str, data: pd.DataFrame, log: bool = False) -> alt.X:
    """The x channel. Whole-number fields (crop count, batch, steps, lengths) get whole-number ticks, and a single
    value gets a domain around it (Vega would otherwise tick 9.9, 10.0, ... and print '10.000000')."""
    scale = alt.Scale(type="log" if log else "linear", zero=False)
    if field not in INTEGER_FIELDS:
        return alt.X(f"{field}:Q", title=title, scale=scale)
    values = pd.to_numeric(data[field], errors="coerce").dropna() if field in data else pd.Series(dtype=float)
    if values.nunique() == 1:
        v = float(values.iloc[0])
        domain = [v / 2, v * 2] if log else [max(v - 1, 0), v + 1]
        scale = alt.Scale(type="log" if log else "linear", zero=False, domain=domain)
    return alt.X(f"{field}:Q", title=title, scale=scale, axis=alt.Axis(format="d", tickMinStep=1))


def _stage_colour(stages) -> alt.Scale:
    present = [s for s in STAGE_ORDER if s in set(stages)]
    extra = [s for s in dict.fromkeys(stages) if s not in STAGE_ORDER]
    domain = present + extra
    colours = [STAGE_COLOURS[STAGE_ORDER.index(s)] if s in STAGE_ORDER else "#9d755d" for s in domain]
    return alt.Scale(domain=domain, range=colours)


def _y(unit: str, title: str, log: bool) -> alt.Y:
    factor, suffix = UNITS[unit]
    fmt = "~s" if unit in ("FLOPs", "bytes", "FLOP/s") else ",.4~r"
    return alt.Y("value:Q", title=f"{title} ({suffix})", scale=alt.Scale(type="log" if log else "linear"),
                 axis=alt.Axis(format=fmt))


def _scaled(data: pd.DataFrame, unit: str) -> pd.DataFrame:
    factor = UNITS[unit][0]
    out = data.copy()
    out["value"] = out["value"].astype(float) * factor
    return out


def _tooltip(data: pd.DataFrame, x: str, extra: list[str]) -> list:
    cols = [c for c in ["config", *extra, x, "grid", "page", "sequence", "batch", "decode_steps", "hardware"]
            if c in data]
    return [alt.Tooltip(c) for c in dict.fromkeys(cols)] + [alt.Tooltip("value:Q", format=",.4~r")]


def lines(data: pd.DataFrame, x: str, x_title: str, unit: str, title: str, colour: str = "stage",
          log_y: bool = False, log_x: bool = False, side_by_side: bool = False, height: int = 300,
          series: str | None = None) -> alt.Chart:
    """Lines with points: one per `colour` value; configurations dashed when overlaid, or in columns. With
    `series` (a column: roofline | predicted) the series are told apart by the dash (the bound dashed, the
    prediction solid) and overlaid configurations by the line width."""
    data = _scaled(data, unit)
    if log_y:
        data = data[data["value"] > 0]
    several = data["config"].nunique() > 1 if "config" in data else False
    enc = dict(
        x=_x(x, x_title, data, log_x),
        y=_y(unit, title, log_y),
        color=alt.Color(f"{colour}:N", title=colour,
                        scale=_stage_colour(data[colour]) if colour == "stage" else alt.Undefined,
                        sort=STAGE_ORDER if colour == "stage" else alt.Undefined),
        tooltip=_tooltip(data, x, [colour] + ([series] if series else [])),
    )
    if series and series in data:
        kinds = [k for k in SERIES_DASHES if k in set(data[series])]
        enc["strokeDash"] = alt.StrokeDash(f"{series}:N",
                                           scale=alt.Scale(domain=kinds, range=[SERIES_DASHES[k] for k in kinds]),
                                           legend=dash_legend("time"))
        if several and not side_by_side:  # configurations: thick and thin lines (no points here, see below)
            enc["strokeWidth"] = _config_width()
    elif several and not side_by_side:
        enc["strokeDash"] = alt.StrokeDash("config:N", legend=dash_legend("configuration"))
        enc["shape"] = alt.Shape("config:N", title="configuration")
        enc["strokeWidth"] = _config_width()
    # points on the lines, except where dashes tell series apart: a point overlay makes the dash legend's symbols
    # transparent (Vega-Lite draws the legend of the filled points), so the dashes would not be explained
    chart = alt.Chart(data).mark_line(point=not (series and series in data)).encode(**enc).properties(height=height)
    if several and side_by_side:
        chart = chart.properties(width=320).facet(column=alt.Column("config:N", title=None))
    return finish(chart.interactive() if not (several and side_by_side) else chart)


def roofline(points: pd.DataFrame, roofs: pd.DataFrame, title: str = "Roofline",
             x_field: str = "intensity", y_field: str = "flops_per_s", height: int = 360,
             shape: str = "config") -> alt.LayerChart:
    """Attainable FLOP/s against arithmetic intensity (log-log) with each stage as a point; the point shape
    tells the values of `shape` apart (configurations, or configuration and series: bound vs predicted)."""
    roof = alt.Chart(roofs).mark_line(color="#333333").encode(
        x=alt.X("intensity:Q", title="arithmetic intensity (FLOPs per byte)", scale=alt.Scale(type="log")),
        y=alt.Y("attainable_flops:Q", title="FLOP/s", scale=alt.Scale(type="log"), axis=alt.Axis(format="~s")),
        strokeDash=alt.StrokeDash("hardware:N", legend=dash_legend("roof")),
        tooltip=[alt.Tooltip("hardware:N"), alt.Tooltip("intensity:Q", format=",.3~g"),
                 alt.Tooltip("attainable_flops:Q", format="~s")],
    )
    tips = [c for c in ["config", "series", "run", "stage", "point", "bound", "hardware"] if c in points]
    dots = alt.Chart(points).mark_point(filled=True, size=90).encode(
        x=alt.X(f"{x_field}:Q", scale=alt.Scale(type="log")),
        y=alt.Y(f"{y_field}:Q", scale=alt.Scale(type="log")),
        color=alt.Color("stage:N", scale=_stage_colour(points["stage"]), sort=STAGE_ORDER),
        shape=(alt.Shape(f"{shape}:N", title="configuration" if shape == "config" else shape)
               if shape in points and points[shape].nunique() > 1 else alt.Undefined),
        tooltip=[alt.Tooltip(c) for c in tips] + [alt.Tooltip(f"{x_field}:Q", format=",.3~g", title="intensity"),
                                                   alt.Tooltip(f"{y_field}:Q", format="~s", title="FLOP/s")],
    )
    return finish(alt.layer(roof, dots).properties(title=title, height=height).interactive())


def bars(data: pd.DataFrame, x: str, y: str, colour: str, unit: str, title: str, column: str | None = None,
         x_title: str | None = None, height: int = 280, log_y: bool = False, colour_title: str | None = None,
         x_order: list[str] | None = None) -> alt.Chart:
    """Grouped bars: `x` categories (in `x_order` where given), one bar per `colour` value (xOffset), optional
    facet columns; `log_y` for values spanning decades (a decode total next to a projector)."""
    factor, suffix = UNITS[unit]
    data = data.copy()
    data[y] = data[y].astype(float) * factor
    if log_y:
        data = data[data[y] > 0]
    sort = x_order or (STAGE_ORDER if x == "stage" else alt.Undefined)
    enc = dict(
        x=alt.X(f"{x}:N", title=x_title or x, sort=sort),
        xOffset=alt.XOffset(f"{colour}:N"),
        y=alt.Y(f"{y}:Q", title=f"{title} ({suffix}{', log scale' if log_y else ''})",
                scale=alt.Scale(type="log") if log_y else alt.Undefined, axis=alt.Axis(format=",.4~r")),
        color=alt.Color(f"{colour}:N", title=colour_title or colour),
        tooltip=[alt.Tooltip(c) for c in [x, colour, column] if c] + [alt.Tooltip(f"{y}:Q", format=",.4~r")],
    )
    if log_y and len(data):  # a log axis has no zero: bars rise from below the smallest value
        enc["y2"] = alt.datum(float(data[y].min()) / 3)
    chart = alt.Chart(data).mark_bar().encode(**enc).properties(height=height)
    if column:
        chart = chart.properties(width=300).facet(column=alt.Column(f"{column}:N", title=None))
    return finish(chart)


def measured_vs_analytic(measured: pd.DataFrame, predicted: pd.DataFrame, x: str, x_title: str,
                         unit: str = "ms", title: str = "time", log_y: bool = True) -> alt.LayerChart:
    """Measured medians as points (with their p10-p90 spread) over analytic lines, colour = stage."""
    factor = UNITS[unit][0]
    m = measured.copy()
    for c in ("value", "low", "high"):
        if c in m:
            m[c] = m[c].astype(float) * factor
    p = predicted.copy()
    p["value"] = p["value"].astype(float) * factor
    if log_y:
        m, p = m[m["value"] > 0], p[p["value"] > 0]
    stages = list(dict.fromkeys([*m.get("stage", []), *p.get("stage", [])]))
    colour = alt.Color("stage:N", scale=_stage_colour(stages), sort=STAGE_ORDER)
    xs = _x(x, x_title, m)
    y_title = f"{title} ({UNITS[unit][1]})"
    ys = alt.Y("value:Q", title=y_title, scale=alt.Scale(type="log" if log_y else "linear"),
               axis=alt.Axis(format=",.4~r"))
    tips = [c for c in ["run", "stage", "grid", "mode", "sequence", "batch", "decode_steps", "source"] if c in m]
    layers = []
    if not p.empty:
        sources = [s for s in DASHES if s in set(p["source"])]
        layers.append(alt.Chart(p).mark_line().encode(
            x=xs, y=ys, color=colour, detail="source:N",
            strokeDash=alt.StrokeDash("source:N", legend=dash_legend("line"),
                                      scale=alt.Scale(domain=sources, range=[DASHES[s] for s in sources])),
            tooltip=[alt.Tooltip(c) for c in ["run", "stage", "source"] if c in p]
            + [alt.Tooltip("value:Q", format=",.4~r")]))
    if "low" in m and m["low"].notna().any():
        spread = m.dropna(subset=["low", "high"])
        spread = spread[(spread["low"] > 0) | (not log_y)]
        layers.append(alt.Chart(spread).mark_rule(strokeWidth=2).encode(
            x=xs, y=alt.Y("low:Q", title=y_title), y2="high:Q", color=colour))
    spread = [alt.Tooltip(f"{c}:Q", format=",.4~r", title=f"{n} {unit}") for c, n in (("low", "p10"), ("high", "p90"))
              if c in m and m[c].notna().any()]
    layers.append(alt.Chart(m).mark_point(filled=True, size=70).encode(
        x=xs, y=ys, color=colour, shape=alt.Shape("run:N", title="measured run") if "run" in m else alt.Undefined,
        tooltip=[alt.Tooltip(c) for c in tips] + [alt.Tooltip("value:Q", format=",.4~r", title=f"measured {unit}")]
        + spread))
    return finish(alt.layer(*layers).properties(height=340).interactive())


def params_bar(data: pd.DataFrame) -> alt.Chart:
    return finish(alt.Chart(data).mark_bar().encode(
        x=alt.X("parameters:Q", title="parameters", axis=alt.Axis(format="~s")),
        y=alt.Y("group:N", sort="-x", title=None, axis=alt.Axis(labelOverlap=False)),
        tooltip=["group", alt.Tooltip("parameters:Q", format=",")],
    ).properties(height=22 * len(data) + 20))
