"""The MoE routing of the sidebar's what-if predictions: uniform (assumed, the default) or a routing profile file
(dsocr_core/analytic/routing.py): the repository's `data/routing/*.json` ($DSOCR_ROUTING_DIR) and the ones saved
from a measured run on the MFU page (`routing_profiles/` in the app's data folder). A measured run is always
predicted with the routing it observed, whatever is chosen here (results.analytic_join.run_prediction).

Torch-free, like the rest of the sidebar.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import streamlit as st

from dsocr_core.analytic.predict import UNIFORM_ROUTING
from dsocr_core.analytic.routing import Routing, RoutingError, load_routing

from . import resources
from .measured import md

ROUTING_ENV = "DSOCR_ROUTING_DIR"
UNIFORM = "uniform"
PICKER = "sb_routing"
PENDING = "_sb_routing_pending"  # a profile saved on the MFU page: selected on the next run
KINDS = {"repo": "data/routing", "saved": "saved from a run"}


def repo_dir() -> Path:
    return Path(os.environ.get(ROUTING_ENV) or resources.ROOT / "data" / "routing")


def saved_dir() -> Path:
    from .prediction import data_dir

    return data_dir() / "routing_profiles"


def choices() -> dict[str, Path | None]:
    out: dict[str, Path | None] = {UNIFORM: None}
    for kind, folder in (("repo", repo_dir()), ("saved", saved_dir())):
        if folder.is_dir():
            for f in sorted(folder.glob("*.json"), key=lambda f: f.name):
                out[f"{kind}:{f.name}"] = f
    return out


def option_name(key: str) -> str:
    if key == UNIFORM:
        return UNIFORM_ROUTING
    kind, name = key.split(":", 1)
    return f"{name} ({KINDS[kind]})"


@st.cache_resource(max_entries=16, show_spinner=False)
def load(path: str, mtime_ns: int) -> Routing:
    """A routing profile, read and validated once per (path, mtime)."""
    return load_routing(path)


def render(side) -> tuple[str | None, int, str]:
    """The routing picker: (path or None for uniform, file mtime, label). A malformed file is an error naming
    the problem, and the prediction falls back to uniform routing."""
    options = choices()
    pending = st.session_state.pop(PENDING, None)
    if pending in options:
        st.session_state[PICKER] = pending
    elif st.session_state.get(PICKER) not in options:
        st.session_state[PICKER] = UNIFORM
    pick = side.selectbox("MoE routing (what-if)", list(options), format_func=option_name, key=PICKER,
                          help="How many distinct experts a batch's tokens reach, for predictions of workloads "
                               "that were not measured. Uniform routing is the analytic model's assumption; a "
                               "routing profile is what a measured run observed (save one on the MFU page). "
                               "Measured runs are always predicted with their own observed routing.")
    if pick == UNIFORM:
        return None, 0, UNIFORM_ROUTING
    path = options[pick]
    try:
        mtime = path.stat().st_mtime_ns
        routing = load(str(path), mtime)
    except (OSError, RoutingError) as exc:
        side.error(f"{md(exc)} — predicting with uniform routing instead.")
        return None, 0, UNIFORM_ROUTING
    side.caption(f"Routing: {md(routing.label())}, for models whose tokens pick k={routing.k} of E={routing.experts} "
                 "routed experts")
    return str(path), mtime, routing.label()


def save_run_routing(routing: Routing, run_id: str) -> Path:
    """Save a run's observed routing as a routing profile (routing_profiles/) and select it in the sidebar."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"run_{run_id[:8]}.json")
    out = routing.save(saved_dir() / name)
    st.session_state[PENDING] = f"saved:{out.name}"
    return out


def show_run_routing(run: dict, points) -> None:
    """The MoE routing a run observed beside the uniform routing the analytic model assumes (the MFU page), and
    a button that saves it as a routing profile for what-if predictions."""
    from dsocr_core.analytic.routing import routing_table
    from dsocr_core.results.analytic_join import observed_routing

    st.subheader("MoE routing: observed vs assumed")
    routing = observed_routing(run, points)
    if routing is None:
        st.caption("This run recorded no routing (measured before routing was recorded, or a model without MoE "
                   "layers): its predictions assume uniform routing.")
        return
    st.dataframe(routing_table(routing), hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.2f") for c in
                                ("observed distinct experts", "uniform (assumed)", "observed / uniform")})
    st.caption(f"Distinct routed experts per MoE layer and call, by tokens per call (a decode step: the batch; a "
               f"prefill: batch x prompt), recorded in each point's FLOP-counting pass; {routing.label()}. The run's "
               "predicted times use this routing; uniform routing is the analytic model's assumption.")
    if st.button("Save as a routing profile", key="mfu_save_routing",
                 help="Saved in routing_profiles/ beside the run store and selected in the sidebar's MoE routing "
                      "picker, for what-if predictions of workloads this run did not measure."):
        out = save_run_routing(routing, str(run["id"]))
        st.success(f"Saved {md(out.name)}; selected in the sidebar.")
