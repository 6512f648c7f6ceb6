"""Vendor parity: one or more pages through the one-shot generate() path and the separated prefill + decode
loop; renderings with boxes side by side, texts, block counts, detection comparison, first divergence,
timings; an optional vendor output as a third column."""
from pathlib import Path

import streamlit as st

import ui
from dsocr_core.grounding import samples
from dsocr_core.registry import DEFAULT_MODEL
from ui import forms, inputs, parity_view, resources

settings = ui.page_setup()
st.title("Vendor parity")
model = settings.model
session = resources.page_session(settings)
if session is None:
    st.stop()
if model.synthetic:
    st.info(f"Running the **{model.label}** in the {resources.mode_text(session)}: its text is meaningless, but "
            "both paths must still agree token for token. Choose a checkpoint folder in the sidebar for real "
            "output.")
else:
    st.caption(f"Running the **{model.label}** in the {resources.mode_text(session)}.")

left, right = st.columns([3, 2])
with left:
    source = st.radio("Pages", ["samples", "upload"], horizontal=True, key="pa_source",
                      format_func={"samples": "Bundled sample pages", "upload": "Upload page images"}.get)
    pages, problems, vendor = [], [], {}
    if source == "samples":
        paths = {p.stem: p for p in samples.sample_pages()}
        chosen = st.multiselect("Sample pages", list(paths), default=["small"] if "small" in paths else list(paths)[:1],
                                key="pa_samples")
        use_layout = st.checkbox("Third column: the sample's drawn layout (its grounding text)", value=True,
                                 key="pa_layout")
        for name in chosen:
            try:
                pages.append(inputs.read_sample(paths[name]))
                if use_layout:
                    vendor[name] = (samples.sample_grounding(name), "sample")
            except (inputs.InputError, OSError) as exc:
                problems.append(str(exc))
    else:
        uploads = st.file_uploader("Page images (PNG, JPEG, WebP, TIFF, ...)", accept_multiple_files=True,
                                   type=["png", "jpg", "jpeg", "webp", "tif", "tiff", "bmp", "gif"], key="pa_upload")
        for up in uploads or []:
            try:
                pages.append(inputs.read_page(up.name, up.getvalue()))
            except inputs.InputError as exc:
                problems.append(str(exc))
    texts = st.file_uploader("Vendor output text (optional, .mmd / .md / .txt; matched to a page by file name)",
                             accept_multiple_files=True, type=["mmd", "md", "txt"], key="pa_vendor")
    for up in texts or []:
        try:
            text = inputs.read_text(up.name, up.getvalue())
        except inputs.InputError as exc:
            problems.append(str(exc))
            continue
        stem = Path(up.name).stem.removesuffix(".grounding")
        target = stem if any(p.name == stem for p in pages) else (pages[0].name if len(pages) == 1 else None)
        if target is None:
            problems.append(f"{up.name}: no chosen page is called {stem!r}; name the text after its page")
        else:
            vendor[target] = (text, "vendor")
with right:
    modes = list(model.family.modes)  # the sidebar model's modes (registry)
    mode = st.selectbox("Mode", modes, index=modes.index(forms.cheap_modes(model.family, model.on_cpu)[0]),
                        key="pa_mode" if model.model == DEFAULT_MODEL else f"pa_mode_{model.model}")
    prompt_kind = st.selectbox("Prompt", [*inputs.PROMPTS, "custom"], key="pa_prompt")
    prompt = inputs.PROMPTS.get(prompt_kind) or st.text_area("Custom prompt (must contain <image> once)",
                                                                  "<image>\nFree OCR.", key="pa_custom")
    max_new = st.number_input("Max new tokens", 1, 8192, 64 if model.on_cpu else 512, key="pa_tokens")
    run = st.button("Run both paths", type="primary", disabled=not pages, key="pa_run")

for p in problems:
    st.error(p)
if run:
    try:
        with st.spinner(f"Running {len(pages)} page(s) through both paths ..."):
            st.session_state["pa_results"] = parity_view.run_pages(
                session, pages, vendor, mode=mode, prompt=prompt, max_new_tokens=int(max_new),
                model_label=model.label)
    except resources.Busy as exc:
        st.warning(str(exc))
results = st.session_state.get("pa_results") or []
if not results:
    st.caption("Choose pages and press **Run both paths**.")
for res in results:
    st.divider()
    parity_view.show(res)
