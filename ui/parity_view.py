"""Running parity on the pages the user chose, and showing each report: the renderings with boxes side by
side, the texts, block counts, the detection comparison, the first divergence and the timings."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from io import BytesIO

import pandas as pd
import streamlit as st
from PIL import Image

from dsocr_core.registry import stage_labels, vision_stage_names

from . import resources
from .inputs import Page

THIRD = {"vendor": "vendor output", "sample": "sample layout (drawn)"}
MAX_PREVIEW = 900  # pixels: renderings are downscaled for the browser


@dataclass
class ParityResult:
    page: str
    model_label: str
    session_mode: str = "reference"  # the session mode both paths ran in
    report: object | None = None  # dsocr_core.measure.parity_run.ParityReport
    error: str | None = None
    renderings: dict = field(default_factory=dict)  # output name -> PNG bytes of the boxes image
    markdown: dict = field(default_factory=dict)  # output name -> cleaned markdown
    third: str = "vendor"  # how the third column is named ("vendor" upload or the drawn "sample" layout)

    def export(self) -> str:
        data = json.loads(self.report.to_json())
        data["model_label"] = self.model_label
        data["session_mode"] = self.session_mode
        return json.dumps(data, indent=1)


def _png(image: Image.Image) -> bytes:
    image = image.copy()
    image.thumbnail((MAX_PREVIEW, MAX_PREVIEW))
    buf = BytesIO()
    image.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def run_pages(session, pages: list[Page], vendor: dict[str, tuple[str, str]], *, mode: str, prompt: str,
              max_new_tokens: int, model_label: str) -> list[ParityResult]:
    """Both generation paths on every page, one at a time, holding the device. vendor: page -> (text, kind)."""
    from dsocr_core.measure import parity_run as parity  # imports torch: after the page's session loaded it
    from dsocr_core.runtime.oom import out_of_memory

    results = []
    with resources.gpu_turn():
        for page in pages:
            text, kind = vendor.get(page.name, (None, "vendor"))
            res = ParityResult(page.name, model_label, session.session_mode, third=kind)
            try:
                report = parity.run_parity(session, page.image, prompt=prompt, mode=mode,
                                           max_new_tokens=max_new_tokens, vendor_text=text, image_name=page.name)
                res.report = report
                for name, assets in report.renderings(page.image).items():
                    res.renderings[name] = _png(assets.boxes_image)
                    res.markdown[name] = assets.markdown
            except Exception as exc:  # noqa: BLE001 - an OOM or a bad prompt is shown for this page
                if out_of_memory(exc):
                    resources.free_device_memory()
                    res.error = (f"out of memory on {page.name} ({mode} mode, {max_new_tokens} new tokens): choose "
                                 "a smaller mode or fewer tokens, or the CPU")
                else:
                    res.error = f"{page.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            results.append(res)
    return results


TIMING_ROWS = [  # (timings key, row name): every family's vision stages (registry); a result has its model's
    *((s, stage_labels()[s]) for s in vision_stage_names()), ("prefill", stage_labels()["prefill"]),
    ("decode", "decode, all steps"), ("ttft_s", "time to first token"), ("tpot_s", "time per output token (median)"),
    ("total_s", "total"),
]
NOT_APART = "— (in prefill)"  # the one-shot path's vision stages: timed only as part of its prefill


def timing_table(timings: dict) -> pd.DataFrame:
    """One row per stage or figure, one column per path, every time in milliseconds; the one-shot path's vision
    stages, which run inside its prefill call, say so instead of showing 0."""
    rows = []
    for key, name in TIMING_ROWS:
        if key in vision_stage_names() and not any(key in t for t in timings.values()):
            continue  # a stage of the other model family
        row = {"": name}
        for path, t in timings.items():
            v = t.get(key)
            if path == "one-shot" and key in vision_stage_names() and not v:
                row[f"{path} (ms)"] = NOT_APART
            elif key == "prefill" and path == "one-shot":
                row[""] = "LM prefill (one-shot: with vision)"
                row[f"{path} (ms)"] = _ms_text(v)
            else:
                row[f"{path} (ms)"] = _ms_text(v)
        rows.append(row)
    return pd.DataFrame(rows)


NO_BLOCKS = "no grounding blocks (<|ref|>...<|/ref|><|det|>...<|/det|>) in its text"


def detection_table(d, res: ParityResult) -> pd.DataFrame:
    """One row per compared pair. Scores only where there is something to score: a pair with no blocks on either
    side says so instead of 'precision 1, recall 1, F1 1, mean IoU None', and no matched box leaves the IoU empty
    with the reason."""
    rows = []
    for p in d.pairs:
        empty = not (p.n_reference or p.n_other)
        row = {"reference": _title(p.reference, res), "other": _title(p.other, res),
               "blocks": f"{p.n_reference} / {p.n_other}", "matched": len(p.matches)}
        for name, value in (("precision", p.precision), ("recall", p.recall), ("F1", p.f1), ("mean IoU", p.mean_iou)):
            row[name] = "" if empty or value is None else f"{value:.3f}"
        row["same text"] = p.identical_text
        row["note"] = ("nothing to compare: neither has blocks" if empty else
                       f"no box matched (IoU >= {d.iou_threshold:g})" if not p.matches else "")
        rows.append(row)
    return pd.DataFrame(rows)


def _ms_text(seconds) -> str:
    return "n/a" if seconds is None else f"{float(seconds) * 1e3:,.2f}"


def _title(name: str, res: ParityResult) -> str:
    return THIRD[res.third] if name == "vendor" else name


def show(res: ParityResult) -> None:
    if res.error:
        st.error(res.error)
        return
    r = res.report
    n = len(r.separated.generated_ids[0])
    head = (f"{r.image_name}: {r.image_size[0]}x{r.image_size[1]} px, {r.mode} mode, grid "
            f"{r.grid[0]}x{r.grid[1]}, {r.prompt_tokens} prompt tokens · {res.model_label} · "
            f"{res.session_mode} session mode")
    if r.passed:
        st.success(f"Parity passed — {head}. The separated prefill + decode loop produced the same {n} tokens as "
                   "the one-shot generate() path, with no image reaching a decode step.")
    else:
        st.error(f"Parity FAILED — {head}.")
    if res.session_mode == "fast":
        st.caption("Fast session mode: the separated path ran the fast engine; the one-shot path is generate()'s "
                   "call pattern on the reference model, the yardstick both modes are held to.")
    for note in r.notes:
        st.caption(note)

    cols = st.columns(len(res.renderings))
    counts = {o.name: o.blocks for o in r.detections.outputs}
    for col, (name, png) in zip(cols, res.renderings.items()):
        blocks = counts.get(name, 0)
        col.image(png, caption=f"{_title(name, res)}: {blocks} blocks" + (f" — {NO_BLOCKS}" if not blocks else ""),
                  width="stretch")

    d = r.detections
    div = d.token_divergence
    if div is None:
        st.markdown(f"**First divergence:** none — the token ids of both paths are identical ({n} tokens).")
    else:
        st.markdown(f"**First divergence:** token {div.index}: one-shot `{div.a}` vs separated `{div.b}`.")
    for p in d.pairs:
        if p.text_divergence is not None and not p.identical_text:
            t = p.text_divergence
            st.caption(f"{_title(p.reference, res)} vs {_title(p.other, res)}: texts first differ at line "
                       f"{t.line}, column {t.column}.")

    # one above the other: side by side, the blocks table (five columns) was cut at the right
    t1, t2 = st.container(), st.container()
    with t1:
        st.markdown("**Blocks**")
        st.dataframe(pd.DataFrame([{"output": _title(o.name, res), "blocks": o.blocks, "characters": o.characters,
                                    "problems": o.problems,
                                    "labels": ", ".join(f"{k} {v}" for k, v in o.labels.items())}
                                   for o in d.outputs]),
                     hide_index=True, width="stretch")
    with t2:
        st.markdown("**Timings**")
        timings = r.timings()
        st.dataframe(timing_table(timings), hide_index=True, width="stretch")
        st.caption(f"Tokens: one-shot {timings['one-shot']['tokens']}, separated {timings['separated']['tokens']}. "
                   "The one-shot path runs vision inside its first model call (its prefill), so its SAM, CLIP and "
                   "projector are not timed apart (—). Both paths ran twice untimed before (a warm-up), so neither "
                   "pays one-off costs here.")
    st.markdown("**Detection comparison**")
    if not any(p.n_reference or p.n_other for p in d.pairs):
        st.info(f"Nothing to compare: {NO_BLOCKS} in any of the outputs, so there are no boxes to match (no "
                "precision, recall or IoU). The texts are compared above (first divergence).")
    else:
        st.dataframe(detection_table(d, res), hide_index=True, width="stretch")

    tabs = st.tabs([f"{_title(name, res)} text" for name in res.markdown] + ["verification"])
    for tab, name in zip(tabs, res.markdown):
        text = {"one-shot": r.one_shot.texts[0], "separated": r.separated.texts[0]}.get(name, r.vendor_text)
        tab.code(text or "(empty)", language=None, wrap_lines=True)
    tabs[-1].json(r.separated.verification or {})
    st.download_button("Parity report (JSON)", res.export(), f"parity_{r.image_name}.json", "application/json",
                       key=f"pa_dl_{r.image_name}")
