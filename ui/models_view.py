"""The analytic page's "Models compared" tab: the same pages under DeepSeek-OCR and DeepSeek-OCR 2 (each in its own
tiling), per stage, overlaid. dsocr_core.analytic.models computes every figure; this module only draws them."""
from __future__ import annotations

import json

import streamlit as st

from dsocr_core.analytic.models import model_summary

from . import charts, inputs, resources

DEFAULT_PAGES = "1920x1080, 1024x1024, 1191x1684, 800x600, 640x480"
METRICS = {"time_s": ("roofline time", "ms"), "predicted_s": ("predicted time", "ms"), "flops": ("FLOPs", "FLOPs"),
           "bytes": ("DRAM traffic", "bytes")}
SUMMARY_UNITS = {"vision_flops": ("vision GFLOP", 1e-9), "prefill_flops": ("prefill GFLOP", 1e-9),
                 "total_flops": ("total GFLOP", 1e-9), "vision_time_s": ("vision ms", 1e3),
                 "prefill_time_s": ("prefill ms", 1e3), "total_time_s": ("total ms", 1e3),
                 "vision_predicted_s": ("vision predicted ms", 1e3),
                 "prefill_predicted_s": ("prefill predicted ms", 1e3), "total_predicted_s": ("total predicted ms", 1e3)}


def draw(v) -> None:
    """`v`: the analytic page's View (configuration A's text length, decode steps, batch, dtype, attention,
    logits and hardware; the sidebar's prediction)."""
    from .analytic_view import in_units

    req, hw = v.configs[0]
    text = st.text_input("Page sizes (WIDTHxHEIGHT)", DEFAULT_PAGES, key="an_models_pages",
                         help="Each page is tiled the way each model tiles it (DeepSeek-OCR: gundam, 640 px tiles, "
                              "2..9; DeepSeek-OCR 2: 768 px crops, 2..6), then priced with that model's dimensions.")
    try:
        pages = inputs.pair_list(text, "page sizes", 1, 1 << 17)
    except inputs.InputError as exc:
        st.error(str(exc))
        return
    long = resources.models_frame(hw.model_dump_json(), json.dumps(pages), v.preset, req.text_tokens,
                                  req.decode_steps, req.batch, req.dtype, req.attn, req.logits, v.pkey)
    c = st.columns([2, 2, 1])
    names = list(dict.fromkeys(long["page"]))
    page = c[0].selectbox("Page", names, key="an_models_page")
    shown = [m for m in METRICS if m != "predicted_s" or long["predicted_s"].notna().any()]
    metric = c[1].radio("Metric", shown, format_func=lambda m: METRICS[m][0], horizontal=True,
                        key="an_models_metric")
    log_y = c[2].checkbox("Log y axis", value=True, key="an_models_logy")
    one = long[(long["page"] == page) & long[metric].notna()]
    title, unit = METRICS[metric]
    # the page is the picker's just above: the y title stays short enough for the chart's height
    st.altair_chart(charts.bars(one, "stage_label", metric, "model_label", unit, title, x_title=f"stage ({page})",
                                log_y=log_y, colour_title="model", x_order=list(dict.fromkeys(one["stage_label"]))),
                    width="stretch")
    grids = one.drop_duplicates("model_label")
    st.caption(" · ".join(f"**{r.model_label}**: grid {r.grid}, {int(r.image_slots):,} image slots, "
                          f"{int(r.sequence):,} prompt tokens" for r in grids.itertuples())
               + f". Configuration A's settings: {req.text_tokens} text tokens, {req.decode_steps} decode steps, "
               f"batch {req.batch}, {req.dtype}, {req.attn}; hardware {hw.name}.")
    if metric == "predicted_s" and (one["predicted_mode"] == "reference").any() and \
            (one["predicted_mode"] == "fast").any():
        st.caption("DeepSeek-OCR 2 is predicted in the reference session mode: the fast engine runs DeepSeek-OCR "
                   "only.")
    st.markdown("**Every page, both models**")
    summary = model_summary(long)
    st.dataframe(in_units(summary, SUMMARY_UNITS), hide_index=True, width="stretch")
    st.download_button("Models compared (CSV, SI units)", long.to_csv(index=False), "models_compared.csv",
                       "text/csv", key="an_dl_models")
    st.caption(v.pred_note)
