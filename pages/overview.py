"""Overview: what the tool does, the detected GPU and its ceilings, the loaded model."""
import pandas as pd
import streamlit as st

import ui
from ui import charts, resources

settings = ui.page_setup()
st.title("DeepSeek-OCR inference cost")
st.markdown(
    """
What does one DeepSeek-OCR page cost, in which stage, and why? Four views:

* **Analytic sweep**: FLOPs, bytes, memory (weights, activations, KV cache) and roofline time of every stage
  (SAM, CLIP, projector, LM prefill, decode) over crop grids, text lengths, batch sizes and decode steps;
  a roofline chart, the per-module table and capacity planning (TTFT, TPOT, pages per day).
* **Measured sweep**: stage times measured on a GPU (bundled reference runs or your own sweep) overlaid on the
  analytic prediction, point by point.
* **Vendor parity**: one page through the one-shot `generate()` path and the separated prefill + decode loop,
  token for token and box for box, optionally against a vendor output.
* **MFU**: how much of the GPU's math (MFU) and memory bandwidth (MBU) each measured stage used, against the
  datasheet and the calibrated ceilings.
"""
)

gpu = settings.gpu
left, right = st.columns(2)
below = st.container()  # the parameters chart: drawn before the model panel, which may load the model first
with left:
    st.subheader("Device")
    if gpu.available:
        st.success(f"Detected GPU: **{gpu.name}** ({gpu.memory_gb:.0f} GB" +
                   (f", {gpu.count} GPUs)" if gpu.count > 1 else ")"))
        if gpu.preset is None:
            st.info("No datasheet preset matches this GPU; calibrate its ceilings in the sidebar, or pick a preset.")
        else:
            st.caption(f"Datasheet preset: {gpu.preset.name}. {gpu.preset.source}")
    else:
        st.info("No CUDA GPU detected. The analytic pages work fully; the measured page shows the bundled "
                "reference runs; the parity page runs a synthetic tiny model on the CPU, in the reference session "
                "mode (the fast mode needs a CUDA GPU).")
    hw = settings.hardware
    st.markdown(f"**Ceilings in use:** {hw.name}" + (" (calibrated)" if hw.calibrated else ""))
    cols = st.columns(2)
    cols[0].metric("Peak matmul (measured)" if hw.calibrated else "Peak BF16 (dense)",
                   f"{hw.peak_tflops:,.4g} TFLOP/s")
    cols[1].metric("DRAM bandwidth", f"{hw.bandwidth_tbs:,.3g} TB/s")
    cols = st.columns(2)
    cols[0].metric("Memory", f"{hw.memory_gb:,.0f} GB")
    cols[1].metric("Ridge point", f"{hw.ridge_intensity:,.0f} FLOP/byte")
    st.caption(settings.hardware_note)

with below:
    st.subheader("Parameters by group")
    kind = settings.spec_kind
    spec = resources.spec_from(kind, settings.model.checkpoint, settings.model.model)
    total, groups = resources.param_frame(resources.spec_key(spec))
    label = settings.model.family.label
    names = {resources.OFFICIAL: f"official {label} dimensions", resources.TINY: f"synthetic tiny {label} dimensions",
             "checkpoint": f"the checkpoint's config.json ({label})"}
    st.caption(f"{total:,} parameters ({total / 1e9:.3f} B) with {names[kind]}, counted from the spec.")
    st.altair_chart(charts.params_bar(groups), width="stretch")

with right:
    st.subheader("Model")
    model = settings.model
    session = resources.page_session(settings)
    if session is not None:
        d = session.describe()
        if model.synthetic:
            st.warning(f"**{model.label}**: the generated text is meaningless; costs and the parity of the "
                       "two generation paths are real.")
        else:
            st.success(f"**{model.label}**")
        cols = st.columns(2)  # two per row: four in a half-width column cut 'reference' to 'refer...'
        cols[0].metric("Parameters", f"{d['parameters'] / 1e6:,.1f} M")
        cols[1].metric("Session mode", d["session_mode"])
        cols = st.columns(2)
        cols[0].metric("Dtype", d["dtype"])
        cols[1].metric("Device", d["device"])
        st.table(pd.DataFrame({"": ["source", "weights", "tokenizer", "LM attention"],
                               "value": [d["source"], d["detail"], d["tokenizer"], d["attn"]]}).set_index(""))
        if d.get("fallback_tokenizer"):
            st.caption("Fallback tokenizer: prompt ids differ from the real tokenizer's (no tokenizer files "
                       "in a checkpoint folder).")
        if d.get("engine"):
            with st.expander("Fast engine", expanded=False):
                st.json(d["engine"])
