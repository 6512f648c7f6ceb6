"""How a stored run is named wherever the pages list one: ui.measured.run_title plus the engine it was measured
with (its session mode and any non-default option; the run store records the engine description with every run),
and its order check. Torch-free."""
from __future__ import annotations

import streamlit as st

from dsocr_core.engines import run_engine
from dsocr_core.measure.order_check import failed as order_check_failed, summary as order_summary
from dsocr_core.results.runs import engine_note

from . import measured as ms
from . import resources


def run_mode(run: dict) -> str:
    """e.g. 'fast session mode', 'fast session mode (bucket=128)' ('unrecorded session mode' for runs stored
    before modes were recorded). Options only where the run recorded its engine: an assumed engine of the time
    is said in the run's caption (results.runs.engine_note), not put in its name."""
    if not run.get("session_mode"):
        return "unrecorded session mode"
    engine, recorded = run_engine(run)
    options = engine.label()[len(engine.kind):] if recorded else ""
    return f"{engine.kind} session mode{options}"


def run_session_mode(run: dict) -> str:
    """The mode a run's prediction is made in: its own (runs stored before modes were recorded ran the
    reference engine, the only one there was)."""
    return run.get("session_mode") or "reference"


def run_title(run: dict, size: bool = True) -> str:
    """size=False for a picker whose run may still be growing: a keyed selectbox keeps the option texts it was
    first drawn with, so a count in them stays at what it was when the run started ('[dataset run, 0 points]'
    under a finished run of 4 pages)."""
    return f"{ms.run_title(run, str(resources.reference_dir()), size)} · {run_mode(run)}"


def run_caption(run: dict) -> str:
    """The caption under a chosen run (markdown-escaped): its label, engine, flags and whether the engine
    description was recorded with it."""
    return f"{ms.md(run['label'])}: {', '.join([run_mode(run), *ms.flag_notes(run)])}; {ms.md(engine_note(run))}"


def show_order_check(run: dict) -> None:
    """The run's order check (its first point measured again after the others): an error when the two
    measurements disagree beyond their spread, else a caption; nothing for runs without one."""
    check = (run.get("meta") or {}).get("order_check")
    text = order_summary(check)
    if order_check_failed(check):
        st.error(ms.md(text))
    elif text:
        st.caption(ms.md(text))
