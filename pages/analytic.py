"""Analytic sweep: FLOPs, bytes, memory and roofline time per stage over a sweep, two configurations compared,
roofline chart, per-module table, image-shapes database, capacity planning, downloads (ui/analytic_view.py draws
the tabs)."""
import dataclasses

import pydantic
import streamlit as st

import ui
from dsocr_core.spec import SpecError
from ui import analytic as an
from ui import analytic_view, forms, inputs, prediction, resources

settings = ui.page_setup()
st.title("Analytic sweep")
st.caption("Closed-form cost of every stage on the chosen hardware's roofline (time = sum over modules of "
           "max(FLOPs / peak, bytes / bandwidth)). Nothing here runs the model.")

family = settings.model.family
specs = {resources.OFFICIAL: f"official {family.label}", resources.TINY: f"synthetic tiny {family.label}'s dimensions"}
if settings.model.source == "checkpoint" and not settings.model_error:
    specs = {"checkpoint": "the sidebar checkpoint's config.json", **specs}
top = st.columns([1, 2])
spec_kind = top[0].selectbox("Model dimensions", list(specs), format_func=specs.get, key="an_spec")

problems: list[str] = []  # typing mistakes: every widget is drawn first, then the mistakes are shown
try:
    spec = resources.spec_from(spec_kind, settings.model.checkpoint, settings.model.model)
    family = settings.model.family if spec_kind != "checkpoint" else resources.family_of_spec(spec)
    with top[1]:
        axis = forms.axis_choice()
    values = forms.axis_values(axis, problems)
    col_a, col_b = st.columns(2)
    with col_a.container(border=True):
        st.markdown("**Configuration A**")
        req_a, hw_a, raw_a = forms.config("an_a", axis, values, "A", settings.hardware, problems, family=family)
    with col_b.container(border=True):
        compare = st.toggle("**Configuration B** (compare)", value=True, key="an_compare")
        if compare:
            req_b, hw_b, raw_b = forms.config("an_b", axis, values, "B", settings.hardware, problems,
                                              defaults={"attn": "eager"}, family=family)
        else:
            st.caption("Turn on to overlay or place side by side a second configuration (eager vs flash, "
                       "H100 vs H200, batch 1 vs 32, ...).")
    if problems:
        raise inputs.InputError("; ".join(problems))
    if compare:
        label_a, label_b = an.config_labels(raw_a, raw_b)
        req_a, req_b = dataclasses.replace(req_a, label=label_a), dataclasses.replace(req_b, label=label_b)
        configs = [(req_a, hw_a), (req_b, hw_b)]
    else:
        configs = [(req_a, hw_a)]
    spec_json = resources.spec_key(spec)
    pkey = prediction.key(settings)  # the sidebar's profile and session mode (None: roofline only)
    frames = [resources.sweep_frame(spec_json, hw.model_dump_json(), req.to_json(), pkey) for req, hw in configs]
except (inputs.InputError, SpecError, pydantic.ValidationError, ValueError) as exc:
    st.error(f"Cannot evaluate these settings: {exc}")
    st.stop()

c1, c2, c3 = st.columns(3)
x_kind = "crop_count"
if axis in ("crops", "image"):
    x_kind = c1.radio("x axis", ["crop_count", "sequence"], format_func=an.X_FIELDS.get, key="an_x")
x = an.x_field(axis, x_kind)
log_y = c2.checkbox("Log y axis", value=True, key="an_logy")
side = c3.radio("Two configurations", ["overlaid", "side by side"], horizontal=True, key="an_layout",
                disabled=len(configs) == 1) == "side by side"
prediction.show_misses(settings, max_batch=max(req.max_batch for req, _ in configs))
view = analytic_view.View(configs, frames, spec_json, specs[spec_kind], axis, x, an.X_FIELDS[x], log_y, side,
                          pkey, prediction.note(settings), "tiny" if spec_kind == resources.TINY else "full")

# Only the open tab runs (on_change="rerun"): a page switch or a changed setting draws one tab, not nine.
for name, tab in zip(analytic_view.TABS, st.tabs(analytic_view.TABS, key="an_tab", on_change="rerun")):
    if tab.open:
        with tab:
            analytic_view.draw(name, view)
