"""Widget groups used by more than one place (the two analytic configurations, the sweep form)."""
from __future__ import annotations

import streamlit as st

from dsocr_core import tiling
from dsocr_core.hardware import PRESETS
from dsocr_core.registry import get_family, native_modes
from dsocr_core.spec import Hardware

from . import inputs
from .analytic import AXES, SweepRequest

ATTN = ["sdpa", "eager", "flash"]
DTYPES = ["bfloat16", "float16", "float32"]
SIDEBAR = "sidebar"
AXIS_DEFAULTS = {
    "text": "10, 100, 250, 500, 1000, 2000, 4000",
    "image": "640x832, 1024x1024, 1240x1754, 1920x1080, 2480x3508",
    "batch": "1, 2, 4, 8, 16, 32, 64",
    "decode": "0, 64, 256, 512, 1024, 2048, 4096",
}


def axis_values(axis: str, problems: list[str]) -> tuple:
    """The values the sweep runs over. A typing mistake is added to `problems` and the default values are used,
    so every other widget still renders (and keeps its state) until the mistake is fixed."""
    if axis == "crops":
        lo, hi = st.slider("Crop counts (most-square grid of each count; 1 = global view only)", 1, 100, (1, 16),
                           key="an_crops_range")
        return tuple(range(lo, hi + 1))
    label = {"text": "Text lengths (non-image prompt tokens, BOS included)", "image": "Page sizes (WIDTHxHEIGHT)",
             "batch": "Batch sizes", "decode": "Decode steps"}[axis]
    text = st.text_input(label, AXIS_DEFAULTS[axis], key=f"an_values_{axis}")

    def parse(t: str) -> tuple:
        if axis == "image":
            return tuple(inputs.pair_list(t, "page sizes", 1, 1 << 17))
        return tuple(inputs.int_list(t, label.split(" (")[0].lower(), 0 if axis == "decode" else 1))

    try:
        return parse(text)
    except inputs.InputError as exc:
        problems.append(str(exc))
        return parse(AXIS_DEFAULTS[axis])


def config(prefix: str, axis: str, values: tuple, label: str, sidebar_hw: Hardware, problems: list[str],
           defaults: dict | None = None, family=None) -> tuple[SweepRequest, Hardware, dict]:
    """One configuration's widgets for a model family (registry; default DeepSeek-OCR). Returns the request, its
    hardware and the raw choices (for labels); typing mistakes go to `problems`."""
    family = family or get_family()
    d = {"mode": family.default_mode, "attn": "sdpa", "dtype": "bfloat16", "batch": 1, "decode_steps": 512,
         "text_tokens": 10, "crops": "2x2", "hardware": SIDEBAR, "logits": "all", **(defaults or {})}
    modes = list(family.modes)
    c = st.columns(2)
    mode = c[0].selectbox("Mode", modes, index=modes.index(d["mode"]), key=f"{prefix}_mode_{family.name}")
    attn = c[1].selectbox("Attention", ATTN, index=ATTN.index(d["attn"]), key=f"{prefix}_attn",
                          help="LM attention: eager materialises the score matrix; sdpa/flash do not.")
    c = st.columns(2)
    dtype = c[0].selectbox("Dtype", DTYPES, index=DTYPES.index(d["dtype"]), key=f"{prefix}_dtype")
    hw_keys = [SIDEBAR, *PRESETS]
    hw_names = {SIDEBAR: f"sidebar: {sidebar_hw.name}", **{k: v.name for k, v in PRESETS.items()}}
    hw_key = c[1].selectbox("Hardware", hw_keys, index=hw_keys.index(d["hardware"]), format_func=hw_names.get,
                            key=f"{prefix}_hw")
    # the numbers that do not vary along the sweep axis, two per row
    fields = [f for f in ("batch", "decode_steps", "text_tokens", "crops")
              if not (f == "batch" and axis == "batch") and not (f == "decode_steps" and axis == "decode")
              and not (f == "text_tokens" and axis == "text")
              and not (f == "crops" and (axis in ("crops", "image") or not family.modes[mode].crop_mode))]
    fixed = {"batch": d["batch"], "decode_steps": d["decode_steps"], "text_tokens": d["text_tokens"]}
    crops = None
    for i, f in enumerate(fields):
        if i % 2 == 0:
            row = st.columns(2)
        cell = row[i % 2]
        if f == "batch":
            fixed[f] = cell.number_input("Batch", 1, 65536, d["batch"], key=f"{prefix}_batch")
        elif f == "decode_steps":
            fixed[f] = cell.number_input("Decode steps", 0, 10_000_000, d["decode_steps"], key=f"{prefix}_steps")
        elif f == "text_tokens":
            fixed[f] = cell.number_input("Text tokens", 1, 10_000_000, d["text_tokens"], key=f"{prefix}_text")
        else:
            grid = cell.text_input("Crop grid", d["crops"], key=f"{prefix}_grid", help="width x height tiles")
            try:
                crops = inputs.pair_list(grid, f"configuration {label}: crop grid", 1, tiling.MAX_CROPS)[0]
            except inputs.InputError as exc:
                problems.append(str(exc))
                crops = inputs.pair_list(d["crops"], "crop grid")[0]
    batch, steps, text = fixed["batch"], fixed["decode_steps"], fixed["text_tokens"]
    logits = st.radio("Prefill logits", ["all", "last"], horizontal=True, key=f"{prefix}_logits",
                      index=["all", "last"].index(d["logits"]),
                      help="all: fp32 logits at every prompt position (vendor HF); last: only the last (vLLM)")
    hardware = sidebar_hw if hw_key == SIDEBAR else PRESETS[hw_key]
    low, high = family.modes[mode].crop_range  # the vendor's crop range of the mode (page-size sweeps)
    request = SweepRequest(label=label, mode=mode, attn=attn, dtype=dtype, logits=logits, axis=axis,
                           values=values, text_tokens=int(text), batch=int(batch), decode_steps=int(steps),
                           crops=crops, min_crops=low, max_crops=high)
    raw = {"mode": mode, "attn": attn, "dtype": dtype, "batch": int(batch), "decode_steps": int(steps),
           "text_tokens": int(text), "crops": crops, "hardware": hardware.name, "logits": logits}
    return request, hardware, raw


def cheap_modes(family, cpu: bool) -> list[str]:
    """The modes a page preselects for a session's model: on the CPU its smallest untiled modes (DeepSeek-OCR: tiny,
    small), on a GPU (or for a model with one mode) its default mode (gundam, dynamic)."""
    native = list(native_modes(family.name))
    return native[:2] if cpu and native else [family.default_mode]


def axis_choice() -> str:
    return st.radio("Sweep over", list(AXES), format_func=AXES.get, horizontal=True, key="an_axis")
