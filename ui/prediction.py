"""Predicted time in the dashboard: the sidebar's calibration-profile picker, the profile the pages predict with,
and "Calibrate this machine" (kernel microbenchmarks in the background job, saved as a profile).

Where profiles come from: every `*.json` in the repository's `data/profiles/` ($DSOCR_PROFILES_DIR), the profiles
calibrated from the dashboard and the uploaded ones (both in the app's data folder: the run store's folder,
$DSOCR_STORE's or `data/`), and an upload. A malformed file is an error naming the problem (ProfileError's message)
and the pages fall back to the roofline alone.

The pages' cached functions (ui/resources.py) never take the Profile object as an argument (st.cache_data would
hash its tables on every call): they take `key(settings)`, the JSON text of (path, file mtime, session mode, routing
profile path and mtime, what-if SM clock), and build the predicting Hardware inside (`attach`), from a profile loaded
once per (path, mtime).

Nothing here imports torch (the sidebar is drawn on every page): calibration/profile.py and analytic/predict.py
need none, and the microbenchmarks are imported by the background job only.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import streamlit as st

from dsocr_core.analytic.known_misses import DOC, known_misses
from dsocr_core.analytic.predict import (UNIFORM_ROUTING, WHAT_IF_MHZ, at_sm_clock, prediction_gaps,
                                         profile_hardware, what_if_mhz, with_profile)
from dsocr_core.calibration.profile import MAX_PROFILE_BYTES, Profile, ProfileError, load_profile
from dsocr_core.results.schema import default_path
from dsocr_core.spec import Hardware

from . import resources, routing_choice, sweeps
from .measured import md

PROFILES_ENV = "DSOCR_PROFILES_DIR"  # the repository's profiles (tests point it at their own folder)
NONE, UPLOAD = "none", "upload"
PICKER = "sb_profile"
PENDING = "_sb_profile_pending"  # a profile calibrated here: selected on the next run, before the picker is drawn
KINDS = {"repo": "data/profiles", "calibrated": "calibrated here", "uploaded": "uploaded"}
CPU_NOTE = "CPU profile: its kernels are this CPU's, not a GPU's"
# why a quick profile predicts nothing: said once, in the picker's caption, an upload's refusal and the CPU panel
QUICK_WHY = "quick grids, a smoke test of the calibration: their kernel tables stop far below the model's shapes " \
            "and their times miss by 10x or more"
NOT_OFFERED = f"Not offered as predictors ({QUICK_WHY}): "
HOW_TO = ("No prediction: choose a calibration profile in the sidebar (**Predicted time**), or calibrate this "
          "machine there, to see the predicted time beside the roofline bound.")
CPU_BUDGET_S = 60.0  # the quick CPU grids take a few seconds; the budget only stops a machine far too busy
GPU_BUDGET_S = (30, 600, 300)  # slider range and default for the full GPU grids (calibrate's --budget-s)


@dataclass(frozen=True)
class ProfileChoice:
    """The profile chosen in the sidebar (validated in this script run)."""

    path: str
    mtime_ns: int
    label: str  # describe(profile): the profile's label, DERIVED or CPU said
    derived: bool
    device_kind: str  # "cuda" | "cpu"
    origin: str  # where it came from (KINDS value)
    routing_path: str | None = None  # the what-if routing profile (ui/routing_choice.py); None: uniform
    routing_mtime_ns: int = 0
    routing_label: str = UNIFORM_ROUTING
    derived_tables: tuple[str, ...] = ()  # tables of a measured profile derived from another GPU's, not measured
    clock_mhz: float | None = None  # the clock the profile's tables were timed at (None: not recorded, or derived)
    sm_clock_mhz: float | None = None  # the what-if SM clock of every stage (None: the calibration's full clock)


# ------------------------------------------------------------------------------------------- folders
def repo_dir() -> Path:
    return Path(os.environ.get(PROFILES_ENV) or resources.ROOT / "data" / "profiles")


def data_dir() -> Path:
    """The app's data folder: the run store's (so a test or a user pointing DSOCR_STORE elsewhere moves both)."""
    return default_path().parent


def calibrated_dir() -> Path:
    return data_dir() / "calibrated_profiles"


def uploaded_dir() -> Path:
    return data_dir() / "uploaded_profiles"


def listing() -> tuple[dict[str, Path | None], list[str]]:
    """({picker key: file} in picker order: none, the repository's, the calibrated, the uploaded, 'upload'; the
    names of the quick profiles left out of it): they test the calibration and predict nothing. Each file is
    looked at once (its profile is cached per path and mtime)."""
    out: dict[str, Path | None] = {NONE: None}
    hidden = []
    for kind, folder in (("repo", repo_dir()), ("calibrated", calibrated_dir()), ("uploaded", uploaded_dir())):
        if folder.is_dir():
            for f in sorted(folder.glob("*.json"), key=lambda f: f.name):
                if _is_quick_file(f):
                    hidden.append(f.name)
                else:
                    out[f"{kind}:{f.name}"] = f
    out[UPLOAD] = None
    return out, hidden


def _is_quick_file(path: Path) -> bool:
    """A readable quick profile. A file that cannot be read is offered, so that choosing it shows why (this is a
    probe drawn on every page: whatever a damaged file raises, the sidebar is drawn)."""
    try:
        return _load(str(path), path.stat().st_mtime_ns).quick
    except Exception:  # noqa: BLE001 - see above; choose() reports the file's problem
        return False


def option_name(key: str) -> str:
    if key == NONE:
        return "none (roofline only)"
    if key == UPLOAD:
        return "upload a profile (.json) ..."
    kind, name = key.split(":", 1)
    return f"{name} ({KINDS[kind]})"


# ------------------------------------------------------------------------------------------- loading
@st.cache_resource(max_entries=64, show_spinner=False)
def _load(path: str, mtime_ns: int) -> Profile:
    """A profile file, read and validated once per (path, mtime): a rewritten file is read again."""
    return load_profile(path)


def describe(profile: Profile) -> str:
    """How every caption and export names the profile: its label (DERIVED said there), and for a CPU profile that
    its kernels are not a GPU's; a calibration stopped early says so. (A quick profile is never chosen.)"""
    label = profile.label()
    if profile.device.get("kind") == "cpu":
        label += f" — {CPU_NOTE}"
    cal = profile.raw.get("calibration") or {}
    if cal.get("complete") is False:
        label += " (calibration stopped early: unmeasured shapes take their nearest measured neighbour's value)"
    return label


def choose(path: Path, origin: str) -> ProfileChoice:
    """Load (cached) and describe one profile file; raises ProfileError."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        raise ProfileError(f"no calibration profile at {path}") from None
    prof = _load(str(path), mtime)
    _refuse_quick(prof, path.name)  # a quick file chosen before it was rewritten (the picker offers none)
    gaps = prediction_gaps(prof)
    if gaps:
        raise ProfileError(f"{path.name} cannot predict: no table times {', '.join(gaps)} (the calibration stopped "
                           "before it measured them); calibrate again with a larger budget")
    return ProfileChoice(str(path), mtime, describe(prof), prof.derived, prof.device.get("kind", "?"), origin,
                         derived_tables=tuple(f"`{t}` (from {md(src)})" for t, src in prof.derived_tables.items()),
                         clock_mhz=prof.clock_mhz)


def _refuse_quick(profile: Profile, name: str) -> None:
    if profile.quick:
        raise ProfileError(f"{name} is a quick profile, not a predictor ({QUICK_WHY}). Calibrate a GPU with the "
                           "full grids (python -m dsocr_core calibrate, without --quick) for a predictor")


def _save_upload(name: str, data: bytes) -> Path:
    """Validate an uploaded profile and keep it in the uploaded folder (raises ProfileError naming the upload)."""
    if len(data) > MAX_PROFILE_BYTES:  # refused before it is written or parsed
        raise ProfileError(f"the uploaded file {name} is {len(data):,} bytes, larger than the limit of "
                           f"{MAX_PROFILE_BYTES:,} bytes for a calibration profile")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name).lstrip(".") or "profile.json"
    safe = safe if safe.endswith(".json") else f"{safe}.json"
    out = uploaded_dir() / safe
    if out.is_file() and out.read_bytes() == data:
        return out  # kept on an earlier run: not rewritten (a new mtime would make every cached frame recompute)
    with tempfile.TemporaryDirectory(prefix="dsocr-profile-") as tmp:
        trial = Path(tmp) / safe
        trial.write_bytes(data)
        try:
            _refuse_quick(load_profile(trial), name)  # the same checks, and messages, as a file in data/profiles
        except ProfileError as exc:
            raise ProfileError(str(exc).replace(str(trial), f"the uploaded file {name}")) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(f".{out.name}.part")
    tmp_out.write_bytes(data)
    tmp_out.replace(out)
    return out


# ------------------------------------------------------------------------------------------- the interface
def current_profile(settings) -> Profile | None:
    """The Profile chosen in the sidebar, or None (none chosen, or the file went away since the sidebar read it)."""
    c = getattr(settings, "profile", None)
    if c is None:
        return None
    try:
        return _load(c.path, c.mtime_ns)
    except ProfileError:
        return None


def predicted_hardware(settings) -> Hardware | None:
    """The sidebar's hardware carrying the prediction of the chosen profile in the sidebar's session mode, under
    the sidebar's routing, or None.

    Why the sidebar's ceilings and not the profile's own (profile_hardware): the time model times every row on the
    PROFILE's ceilings whatever Hardware it rides on (predict.Predictor reads profile.peak_flops / bandwidth), so
    the predicted figures are the same either way; the Hardware's ceilings only give the roofline columns
    (time_s, bound, the capacity bounds, memory fit), and the roofline shown beside the prediction must stay the
    one the sidebar chose."""
    pkey = key(settings)
    return None if pkey is None or current_profile(settings) is None else attach(settings.hardware, pkey)


def key(settings, mode: str | None = None) -> str | None:
    """The cache key of the prediction: JSON of (profile path, file mtime, session mode, routing profile path,
    its mtime, what-if SM clock), or None without a profile. `mode`: a stored run's own session mode instead of the
    sidebar's (a run's prediction then takes the run's engine, observed routing and recorded clocks,
    results.analytic_join.run_prediction: the what-if clock is left out)."""
    c = getattr(settings, "profile", None)
    if c is None:
        return None
    clock = None if mode else c.sm_clock_mhz
    return json.dumps([c.path, c.mtime_ns, mode or settings.model.session_mode, c.routing_path, c.routing_mtime_ns,
                       clock])


def attach(hw: Hardware | None, pkey: str | None) -> Hardware | None:
    """`hw` carrying the prediction named by `pkey` (built inside the cached functions). hw None: the profile's
    own ceilings (for joins that only read the predicted time, not the roofline)."""
    if pkey is None:
        return hw
    path, mtime, mode, routing_path, routing_mtime, clock = json.loads(pkey)
    prof = _load(path, mtime)
    routing = None if routing_path is None else routing_choice.load(routing_path, routing_mtime)
    return at_sm_clock(with_profile(hw if hw is not None else profile_hardware(prof), prof, mode, routing=routing),
                       clock)


def note(settings, mode: str | None = None, run: bool = False) -> str:
    """The caption a page shows about its prediction: which profile, mode and routing, or how to get one. `run`:
    the prediction of a measured run (its own engine and observed routing)."""
    c = getattr(settings, "profile", None)
    if c is None:
        return HOW_TO
    # the time model runs on the profile's ceilings and tables: its figures are for the profile's device, whatever
    # hardware a roofline beside them uses (a configuration's preset, the sidebar's ceilings, a run's GPU)
    routing = ("the run's own engine, the MoE routing it observed (uniform, assumed, where it recorded none), "
               "each point's host speed (its probe over the calibration's; as calibrated where either has none) and "
               "the SM clock each of its stages ran at (the kernels' and launches' cycles at the calibration's clock "
               "over it; the full clock where the point recorded none; the table's predicted_clocks column says "
               "which)"
               if run else f"MoE routing {md(c.routing_label)}, " + clock_note(c))
    return (f"Predicted with **{md(c.label)}**, {mode or settings.model.session_mode} session mode, {routing}: "
            "times on the profile's device, whichever hardware the roofline beside them uses.")


def clock_note(choice: ProfileChoice) -> str:
    """What a what-if prediction says about the SM clock it is at."""
    if choice.sm_clock_mhz and choice.clock_mhz:
        return (f"every stage at a what-if SM clock of {what_if_mhz(choice.sm_clock_mhz):,.0f} MHz (the kernels' and "
                f"launches' cycles at the calibration's {choice.clock_mhz:,.0f} MHz over it)")
    return "every kernel at the calibration's full SM clock (a GPU at its power cap runs long batches slower)"


def show_misses(settings, mode: str | None = None, max_batch: int = 1, stages=None) -> None:
    """A warning beside a prediction where docs/accuracy.md measured it outside its targets (the session mode,
    batched decode, a stage, a quick, CPU or derived profile): nothing without a profile or without a known miss."""
    prof = current_profile(settings)
    if prof is None:
        return
    misses = known_misses(prof, mode or settings.model.session_mode, max_batch, stages)
    if misses:
        st.warning(f"**This prediction is known to miss** ({DOC}):\n\n" + "\n".join(f"* {md(m)}" for m in misses))


# ------------------------------------------------------------------------------------------- the sidebar
def render(side, gpu) -> ProfileChoice | None:
    """The 'Predicted time' section of the sidebar: the picker, the chosen profile's label, and calibration."""
    side.header("Predicted time")
    options, hidden = listing()
    pending = st.session_state.pop(PENDING, None)
    if pending in options:
        st.session_state[PICKER] = pending
    elif st.session_state.get(PICKER) not in options:
        st.session_state[PICKER] = NONE  # a file that went away: back to none rather than an error
    pick = side.selectbox("Calibration profile", list(options), format_func=option_name, key=PICKER,
                          help="Kernel microbenchmarks of a GPU (or this CPU): the time model predicts how long "
                               "each stage will take in the sidebar's session mode, beside the roofline bound. "
                               "`python -m dsocr_core calibrate` makes one; data/profiles holds the project's.")
    choice = None
    try:
        if pick == UPLOAD:
            up = side.file_uploader("Profile (.json)", type=["json"], key="sb_profile_upload")
            if up is not None:
                choice = choose(_save_upload(up.name, up.getvalue()), KINDS["uploaded"])
        elif pick != NONE:
            kind = pick.split(":", 1)[0]
            choice = choose(options[pick], KINDS[kind])
    except ProfileError as exc:
        side.error(f"{md(exc)} — predicting nothing (roofline only) until another profile is chosen.")
        choice = None
    if choice is not None:
        side.caption(md(choice.label))
        if choice.derived:
            side.warning("DERIVED profile: its tables were scaled from another GPU's, not measured on this one.")
        elif choice.derived_tables:
            side.warning("Some tables of this profile are DERIVED from another GPU's, not measured on this one: "
                         + ", ".join(choice.derived_tables) + ".")
        path, mtime, label = routing_choice.render(side)
        choice = replace(choice, routing_path=path, routing_mtime_ns=mtime, routing_label=label,
                         sm_clock_mhz=_clock_input(side, choice))
    if hidden:
        side.caption(md(NOT_OFFERED + ", ".join(hidden)))
    _calibrate_panel(side, gpu)
    return choice


def _clock_input(side, choice: ProfileChoice) -> float | None:
    """The what-if SM clock (MHz) of every stage, or None (the calibration's full clock; a profile that records no
    calibration clock offers none)."""
    if not choice.clock_mhz:
        side.caption("This profile records no calibration clock: its predictions stay at its tables' clock.")
        return None
    mhz = side.number_input("What-if SM clock (MHz)", min_value=0, max_value=int(WHAT_IF_MHZ[1]), value=0,
                            step=10, key="sb_sm_clock",
                            help=f"0: the calibration's full clock ({choice.clock_mhz:,.0f} MHz). A GPU at its "
                                 "power cap under large batches runs lower (an H200 about 1,500-1,700 MHz): the "
                                 "what-if predictions then price every kernel's and launch's cycles at this clock "
                                 "(above the full clock: as calibrated). Measured runs are predicted at the clocks "
                                 "they recorded.")
    if mhz and mhz < WHAT_IF_MHZ[0]:
        side.error(f"A what-if SM clock of {mhz} MHz is below any GPU's ({WHAT_IF_MHZ[0]:,.0f} MHz at least): "
                   "predicting at the calibration's full clock.")
        return None
    return float(mhz) if mhz else None


def _calibrate_panel(side, gpu) -> None:
    runner = sweeps.runner()
    with side.expander("Calibrate this machine", expanded=_running_calibration(runner)):
        if gpu.available:
            device = st.radio("Device", ["cuda", "cpu"], horizontal=True, key="sb_cal_device")
        else:
            device = "cpu"
        if device == "cpu":
            quick, budget = True, CPU_BUDGET_S
            st.caption(f"On the CPU: the quick kernel grids (a few seconds), saved but not offered as a predictor "
                       f"({QUICK_WHY}). A predictor needs a CUDA GPU and the full grids.")
        else:
            quick = st.toggle("Quick grids (a smoke test, not for predictions)", key="sb_cal_quick")
            lo, hi, default = GPU_BUDGET_S
            budget = float(st.slider("Time budget (s)", lo, hi, default, step=30, key="sb_cal_budget",
                                     help="Shapes left when the budget runs out take their nearest measured "
                                          "neighbour's value (the profile counts them)."))
        if st.button("Test the calibration" if quick else "Calibrate", key="sb_cal_start", disabled=runner.busy,
                     help="Kernel microbenchmarks (never the model) into a calibration profile, saved in "
                          f"{calibrated_dir()}" + (" (a quick one is not offered as a predictor)." if quick
                                                   else " and selectable above.")):
            # a quick profile only tests the calibration: each test replaces the last one's file
            name = f"{'gpu' if device == 'cuda' else 'cpu'}_quick.json" if quick else \
                f"gpu_{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
            try:
                job = runner.start_calibration(device, quick, budget, calibrated_dir() / name)
                st.session_state["sb_cal_started"] = id(job)
            except resources.Busy as exc:
                st.warning(str(exc))
        _progress(runner)


def _running_calibration(runner) -> bool:
    job = runner.job
    return job is not None and job.kind == "calibration" and job.running


def _progress(runner) -> None:
    """The calibration job (this server's latest): progress with the table being measured and the time left, a
    stop button; when it finishes, the app reruns once with the new profile selected."""
    @st.fragment(run_every=1 if _running_calibration(runner) else None)
    def panel():
        job = runner.job
        if job is None or job.kind != "calibration":
            return
        st.progress(job.fraction, text=f"{job.summary()}" + (f" · {job.current}" if job.current else ""))
        if job.running:
            if st.button("Stop", key="sb_cal_stop", help="Stops between two shapes; the shapes measured so far "
                                                          "are kept and the rest take their neighbours' values."):
                runner.stop()
        elif job.error:
            st.error(f"Calibration failed: {md(job.error)}")
        elif job.output:
            quick = _is_quick_file(Path(job.output))
            st.success(f"Saved {md(Path(job.output).name)}" + (" (stopped early)" if job.stopped else "")
                       + (": the calibration works; a quick profile is not offered as a predictor" if quick else ""))
        if not job.running and st.session_state.get("sb_cal_seen") != id(job):
            st.session_state["sb_cal_seen"] = id(job)
            offered = job.output and not _is_quick_file(Path(job.output))
            if offered and st.session_state.get("sb_cal_started") == id(job):
                st.session_state[PENDING] = f"calibrated:{Path(job.output).name}"  # started here: select it
            st.rerun(scope="app")  # the new profile is listed in the picker

    panel()


__all__ = ["ProfileChoice", "attach", "current_profile", "describe", "key", "note", "predicted_hardware", "render",
           "show_misses"]
