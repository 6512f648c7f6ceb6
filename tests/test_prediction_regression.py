"""The prediction regression set: every GPU stage-time measurement the project ships is predicted again with the
current time model and engine plans, and each stage's median and max absolute error must stay within the figure
docs/accuracy.md states for it (plus MARGIN), so that no change to an engine, its plan, the analytic model or the
profiles silently breaks the prediction.

Shipped measurements: the accuracy benchmark's results (docs/results/*prediction_accuracy*.json, every point's
workload and measured stage times) and the bundled runs (data/reference/*.json). The stated figures are read from
the tables of docs/accuracy.md (cells "median / p90 / max (median signed)"), so the docs and the check cannot
drift apart; every column of those tables maps to one source below, and every shipped file to a column.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsocr_core.analytic.predict import profile_hardware, with_profile
from dsocr_core.calibration.profile import load_profile, profile_from_dict
from dsocr_core.results.prediction_check import accuracy_errors, exceeded, run_errors, summarize
from dsocr_core.results.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "accuracy.md"
RESULTS = ROOT / "docs" / "results"
REFERENCE = ROOT / "data" / "reference"
MARGIN = 0.01  # one percentage point: the docs round medians to 0.1 and most maxima to 1 percentage point

# table title in docs/accuracy.md -> column -> (source file, session mode, points kept: None = all)
BATCH_1 = ("batch", 1)
ACCURACY = {
    "Fast session mode": {
        "H200 own": ("h200_prediction_accuracy.json", None),
        "H200 own, batch 1": ("h200_prediction_accuracy.json", BATCH_1),
        "H200 confirmation": ("h200_prediction_accuracy_confirm.json", None),
        "H100 own": ("h100_prediction_accuracy.json", None),
        "H100 confirmation": ("h100_prediction_accuracy_confirm.json", None),
        "H100 from the H200-derived profile": ("h100_from_h200_prediction_accuracy.json", None),
        "H100 re-measured": ("h100_prediction_accuracy_2026-11-26.json", None),
        "H100 confirmation re-measured": ("h100_prediction_accuracy_confirm_2026-11-26.json", None),
        "H100 random": ("h100_prediction_accuracy_random_2026-11-26.json", None),
        "H100 random, frozen": ("h100_prediction_accuracy_random_frozen_2026-11-26.json", None),
        "H100 random, new engine": ("h100_prediction_accuracy_random11_2026-11-26.json", None),
        "H100 native, fused kernels 2026-11-27": ("h100_prediction_accuracy_native_2026-11-27.json", None),
        "H100 text lengths, fused kernels 2026-11-27": ("h100_prediction_accuracy_text_2026-11-27.json", None),
        "H100 random, 2026-11-27": ("h100_prediction_accuracy_random27_2026-11-27.json", None),
        "H100 batch group, 2026-11-27": ("h100_prediction_accuracy_batch_2026-11-27.json", None),
        "H100 random, 2026-11-27, re-measured": ("h100_prediction_accuracy_random27_rerun_2026-11-27.json", None),
        "H100 random, seed 28": ("h100_prediction_accuracy_random28_2026-11-27.json", None),
        "H100 random, seed 29, held out": ("h100_prediction_accuracy_random29_2026-11-27.json", None),
        "H100 random, seed 30": ("h100_prediction_accuracy_random30_2026-11-27.json", None),
        "H100 random, seed 31, held out": ("h100_prediction_accuracy_random31_2026-11-27.json", None),
        "H100 random, seed 40, held out": ("h100_prediction_accuracy_random40_2026-11-27.json", None),
        "H100 random, seed 42, held out": ("h100_prediction_accuracy_random42_2026-11-27.json", None),
        "H100 random, seed 43, held out": ("h100_prediction_accuracy_random43_fast_2026-11-27.json", None),
        "H100 random, seed 40, profile of the day": ("h100_prediction_accuracy_random40_own_profile_2026-11-27.json",
                                                      None),
        "H200 random, seed 52, held out": ("h200_prediction_accuracy_random52_fast_2026-11-27.json", None),
        "H100 random, seed 54, held out": ("h100_prediction_accuracy_random54_fast_2026-11-27.json", None),
        "H200 random, seed 55, held out": ("h200_prediction_accuracy_random55_fast_2026-11-27.json", None),
        "H100 random, seed 56, held out": ("h100_prediction_accuracy_random56_fast_2026-11-27.json", None),
        "H200 native, loads recorded, held out": ("h200_prediction_accuracy_native_loads_2026-11-27.json", None),
        "H200 random, seed 58, MoE row kernels, held out": ("h200_prediction_accuracy_random58_fast_2026-11-27.json",
                                                            None),
        "H100 random, seed 59, MoE row kernels, held out": ("h100_prediction_accuracy_random59_fast_2026-11-27.json",
                                                            None),
        "H100 random, seed 60, attention kernels add up, held out": (
            "h100_prediction_accuracy_random60_fast_2026-11-27.json", None),
        "H200 random, seed 61, attention kernels add up, held out": (
            "h200_prediction_accuracy_random61_fast_2026-11-27.json", None),
        "H100 random, seed 62, split-KV table": (
            "h100_prediction_accuracy_random62_fast_2026-11-27.json", None),
        "H200 random, seed 63, split-KV table, held out": (
            "h200_prediction_accuracy_random63_fast_2026-11-27.json", None),
        "H200 random, seed 64, GPU state recorded, held out": (
            "h200_prediction_accuracy_random64_fast_2026-11-27.json", None),
        "H100 random, seed 65, GPU state recorded, held out": (
            "h100_prediction_accuracy_random65_fast_2026-11-27.json", None),
        "H100 random, seed 66, no order check, held out": (
            "h100_prediction_accuracy_random66_fast_2026-11-27.json", None),
        "H200 random, seed 67, cast table, held out": (
            "h200_prediction_accuracy_random67_fast_2026-11-27.json", None),
        "H100 random, seed 68, cast table, held out": (
            "h100_prediction_accuracy_random68_fast_2026-11-27.json", None),
        "H200 native and text lengths, batch 1": ("h200_prediction_accuracy_native_text_2026-11-27.json", None),
        "H100 random, seed 69, lm_head table, held out": (
            "h100_prediction_accuracy_random69_fast_2026-11-27.json", None),
        "H200 random, seed 70, lm_head table, held out": (
            "h200_prediction_accuracy_random70_fast_2026-11-27.json", None),
        "H200 batch 1, long texts, seed 71, attention by length, held out": (
            "h200_prediction_accuracy_b1long71_fast_2026-11-28.json", None),
        "H100 batch 1, long texts, seed 72, one point": ("h100_prediction_accuracy_b1long72_fast_2026-11-28.json", None),
        "H100 random, seed 73, attention by length, held out": (
            "h100_prediction_accuracy_random73_fast_2026-11-28.json", None),
        "H200 random, seed 74, projector cat, no order check, held out": (
            "h200_prediction_accuracy_random74_fast_2026-11-28.json", None),
        "H100 random, seed 75, projector cat measured, held out": (
            "h100_prediction_accuracy_random75_fast_2026-11-28.json", None),
        "H200 random, seed 76, order check failed, held out": (
            "h200_prediction_accuracy_random76_fast_2026-11-28.json", None),
        "H200 random, seed 77, held out": ("h200_prediction_accuracy_random77_fast_2026-11-28.json", None),
        "H200 random, seed 79, stage clocks recorded, held out": (
            "h200_prediction_accuracy_random79_fast_2026-11-28.json", None),
        "H200 random, seed 80, batch 20-64, stage clocks, held out": (
            "h200_prediction_accuracy_random80_fast_2026-11-28.json", None),
        "H200 random, seed 81, batch 16-64, stage clocks, held out": (
            "h200_prediction_accuracy_random81_fast_2026-11-28.json", None),
        "H200 random, seed 82, batch 16-64, held out": ("h200_prediction_accuracy_random82_fast_2026-11-28.json", None),
        "H200 random, seed 83, batch 16-64, no order check, held out": (
            "h200_prediction_accuracy_random83_fast_2026-11-28.json", None),
        "H200 random, seed 84, fused MoE kernels, held out": (
            "h200_prediction_accuracy_random84_fast_2026-11-28.json", None),
        "H200 random, seed 85, choice in the graph, held out": (
            "h200_prediction_accuracy_random85_fast_2026-11-28.json", None),
        "H200 random, seed 86, choice in the graph, order check failed, held out": (
            "h200_prediction_accuracy_random86_fast_2026-11-28.json", None),
        "H200 random, seed 87, choice in the graph, held out": (
            "h200_prediction_accuracy_random87_fast_2026-11-28.json", None),
        "H200 random, seed 88, choice in the graph, held out": (
            "h200_prediction_accuracy_random88_fast_2026-11-28.json", None),
        "H200 random, seed 89, token-tile MoE tables, held out": (
            "h200_prediction_accuracy_random89_fast_2026-11-28.json", None),
        "H200 random, seed 90, batch 17-64, token-tile MoE tables, held out": (
            "h200_prediction_accuracy_random90_fast_2026-11-28.json", None),
        "H200 random, seed 91, attention by fill, held out": (
            "h200_prediction_accuracy_random91_fast_2026-11-28.json", None),
        "H200 random, seed 92, batch 17-64, attention by fill, held out": (
            "h200_prediction_accuracy_random92_fast_2026-11-28.json", None),
    },
    "Reference session mode": {
        "H200 own": ("h200_prediction_accuracy.json", None),
        "H200 own, batch 1": ("h200_prediction_accuracy.json", BATCH_1),
        "H200 confirmation": ("h200_prediction_accuracy_confirm.json", None),
        "H100 own": ("h100_prediction_accuracy.json", None),
        "H100 from the H200-derived profile": ("h100_from_h200_prediction_accuracy.json", None),
        "H100 re-measured": ("h100_prediction_accuracy_2026-11-26.json", None),
        "H100 confirmation re-measured": ("h100_prediction_accuracy_confirm_2026-11-26.json", None),
        "H100 random, seed 43, held out": ("h100_prediction_accuracy_random43_reference_2026-11-27.json", None),
        "H100 random, seed 44, held out": ("h100_prediction_accuracy_random44_reference_2026-11-27.json", None),
        "H100 random, seed 46, profile of the day": ("h100_prediction_accuracy_random46_reference_2026-11-27.json",
                                                     None),
        "H100 random, seed 47, held out": ("h100_prediction_accuracy_random47_reference_2026-11-27.json", None),
        "H100 random, seed 48, own host costs": ("h100_prediction_accuracy_random48_reference_2026-11-27.json", None),
        "H100 random, seed 49, own profile": ("h100_prediction_accuracy_random49_reference_2026-11-27.json", None),
        "H100 random, seed 50, own host speed": ("h100_prediction_accuracy_random50_reference_2026-11-27.json", None),
        "H200 random, seed 53, own host costs": ("h200_prediction_accuracy_random53_reference_2026-11-27.json", None),
        "H200 random, seed 94, eager-op tables, own host costs, held out": (
            "h200_prediction_accuracy_random94_reference_2026-11-28.json", None),
        "H200 random, seed 95, eager-op tables, shipped profile, held out": (
            "h200_prediction_accuracy_random95_reference_2026-11-28.json", None),
        "H200 random, seed 97, expert segments, shipped profile, held out": (
            "h200_prediction_accuracy_random97_reference_2026-11-28.json", None),
        "H200 random, seed 99, expert segments, own host costs, held out": (
            "h200_prediction_accuracy_random99_reference_2026-11-28.json", None),
        "H200 random, seed 101, own host costs, order check failed, held out": (
            "h200_prediction_accuracy_random101_reference_2026-11-28.json", None),
    },
    "DeepSeek-OCR 2, reference session mode": {
        "H200 random, seed 96, first GPU measurement": (
            "h200_prediction_accuracy_v2_random96_reference_2026-11-28.json", None),
        "H200 random, seed 98, shipped profile, held out": (
            "h200_prediction_accuracy_v2_random98_reference_2026-11-28.json", None),
        "H200 random, seed 100, own host costs, held out": (
            "h200_prediction_accuracy_v2_random100_reference_2026-11-28.json", None),
    },
    "With overlap=kernel": {
        "H200 fast": ("h200_prediction_accuracy_kernel_overlap.json", None),
        "H100 fast": ("h100_prediction_accuracy_kernel_overlap.json", None),
        "H200 reference": ("h200_prediction_accuracy_kernel_overlap.json", None),
        "H100 reference": ("h100_prediction_accuracy_kernel_overlap.json", None),
    },
}
MODE_OF_TABLE = {"Fast session mode": "fast", "Reference session mode": "reference",
                 "DeepSeek-OCR 2, reference session mode": "reference"}
# the bundled runs' table: column -> (run file, profile); its stage names -> the comparison's stages
BUNDLED_TITLE = "A third, independent check: the bundled H200 runs"
BUNDLED = {"fast mode": ("h200_fast.json", "h200.json"), "reference mode": ("h200_reference.json", "h200.json")}
BUNDLED_STAGES = {"LM prefill": "prefill", "decode step": "decode_step"}
# the batched points' TPOT with uniform and with the observed routing: row (mode, point set) -> source file
ROUTED_TITLE = "Batched decode with the observed routing"
ROUTED_ROWS = {"H200 own": "h200_prediction_accuracy.json",
               "H200 confirmation": "h200_prediction_accuracy_confirm.json",
               "H100 own": "h100_prediction_accuracy.json",
               "H100 confirmation": "h100_prediction_accuracy_confirm.json",
               "H100 from the H200-derived profile": "h100_from_h200_prediction_accuracy.json"}
ROUTING = ROOT / "data" / "routing" / "h200_synthetic_decode.json"
ROUTED_COLUMNS = {"uniform routing (assumed)": None, "observed routing": ROUTING}

CELL = re.compile(r"^\s*([\d.]+)% / ([\d.]+)% / ([\d.]+)% \([+-]?[\d.]+%\)\s*$")


def stated_tables(text: str) -> dict[str, dict]:
    """{table title: {"columns": [names], "points": {column: n} (from the header or the title line's "points:
    ..."), "rows": {row: [(median, max) per column]}, "points_line"}} for every table of error cells (rows by
    stage, or by point set), titled by the bold text of the paragraph just before it (tables of other cells, e.g.
    the roofline's, are left out)."""
    found, title, points_line, current = [], None, "", None
    for line in text.splitlines():
        if line.startswith("**") or line.startswith("### ") or line.startswith("## "):
            bold = re.match(r"\*\*(.+?)\*\*", line)
            title, points_line, current = (bold.group(1).rstrip(".:") if bold else None), line, None
        elif re.match(r"\| (stage|points) \|", line) and title is not None:
            columns = [c.strip() for c in line.strip().strip("|").split("|")][1:]
            current = {"columns": [re.sub(r" \(\d+ points\)$", "", c) for c in columns], "points": {}, "rows": {},
                       "points_line": points_line}
            found.append((title, current))
            for c in columns:
                n = re.search(r"\((\d+) points\)$", c)
                if n:
                    current["points"][re.sub(r" \(\d+ points\)$", "", c)] = int(n.group(1))
            listed = re.search(r"points: (.*)$", points_line)
            for c in current["columns"] if listed else ():
                n = re.search(re.escape(c) + r" (\d+)(,|$)", listed.group(1))
                if n:
                    current["points"][c] = int(n.group(1))
        elif current is not None and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            parsed = [CELL.match(c) for c in cells[1:]]
            if all(parsed):
                current["rows"][cells[0]] = [(float(m.group(1)) / 100, float(m.group(3)) / 100) for m in parsed]
        elif current is not None and not line.startswith("|"):
            current = None
    return {title: table for title, table in found if table["rows"]}


@pytest.fixture(scope="module")
def tables():
    return stated_tables(DOC.read_text(encoding="utf-8"))


def stated(table: dict, column: str) -> dict[str, tuple[float, float]]:
    i = table["columns"].index(column)
    return {stage: cells[i] for stage, cells in table["rows"].items()}


# A profile's tables time an engine's kernels as they were when it was calibrated. When kernels change, their
# tables are measured again and the profile as it was before is kept here, with the day the new tables came:
# results measured before that day are predicted with the tables of the kernels they ran (the fused batch-1 decode
# kernels load their weights before waiting for the previous kernel since 2026-11-27, and the fused attention's
# blocks follow the cache length since 2026-11-28, docs/fast-mode.md). The fast engine's projector concatenation did
# not change that day: the 2026-11-27 profiles carry its table of 2026-11-28, memory.projector_cat (before it the fast
# plan priced that cat on the reference's memory.transposed_cat). The by-expert MoE tables gained their token-tile
# axis at 16:34 on 2026-11-28 and the split-KV attention's table its fill axis at 17:06 (the kernels did not change),
# and the reference plan's eager ops their tables (memory.broadcast, memory.index_put) at 19:18:
# the sets measured before each stay predicted with the profile that was frozen before them, so their columns remain
# held-out figures; "The H200's sets of 2026-11-28 predicted with the shipped profile" checks the newest tables on
# them.
PROFILE_BEFORE = {
    "data/profiles/h100.json": (("2026-11-27", "data/profiles/history/h100_2026-11-26.json"),
                                ("2026-11-28", "data/profiles/history/h100_2026-11-27.json")),
    "data/profiles/h200.json": (("2026-11-27", "data/profiles/history/h200_2026-11-23.json"),
                                ("2026-11-28", "data/profiles/history/h200_2026-11-27.json"),
                                ("2026-11-28T16:34:14", "data/profiles/history/h200_2026-11-28.json"),
                                ("2026-11-28T17:06:47", "data/profiles/history/h200_2026-11-28_1634.json"),
                                ("2026-11-28T19:18:56", "data/profiles/history/h200_2026-11-28_1706.json")),
    "data/profiles/h100_from_h200.json": (("2026-11-27", "data/profiles/history/h100_from_h200_2026-11-26.json"),
                                          ("2026-11-28", "data/profiles/history/h100_from_h200_2026-11-27.json"),
                                          ("2026-11-28T16:34:14",
                                           "data/profiles/history/h100_from_h200_2026-11-28.json"),
                                          ("2026-11-28T17:06:47",
                                           "data/profiles/history/h100_from_h200_2026-11-28_1634.json"),
                                          ("2026-11-28T19:18:56",
                                           "data/profiles/history/h100_from_h200_2026-11-28_1706.json"))}


def test_the_profiles_of_before_are_listed_in_time_order():
    for path, befores in PROFILE_BEFORE.items():
        days = [day for day, _ in befores]
        assert days == sorted(days) and len(set(days)) == len(days), path
        assert all((ROOT / before).is_file() for _, before in befores), path


def result_profile(result: dict):
    """The profile a result is predicted with: the one it names, or that profile before its kernels changed. The
    keys are UTC ISO times (a day, or the second the new tables' calibration was written) in increasing order; a
    result's captured_at is a UTC ISO time, so the two compare as strings."""
    path = result["profile"]["path"]
    measured = result.get("environment", {}).get("captured_at") or ""
    path = next((before for day, before in PROFILE_BEFORE.get(path, ()) if measured < day), path)
    return load_profile(ROOT / path)


_SUMMARIES: dict = {}  # (file, mode, keep) -> accuracy_summary with the result's own profile: several tests ask


def accuracy_summary(file: str, mode: str, keep, profile=None, routing=None) -> tuple[dict, int]:
    """The summary of one result's points of `mode` predicted again; `keep`: (workload field, value) or a
    predicate on the workload; None keeps every point."""
    if profile is None and routing is None:
        key = (file, mode, keep)
        if key not in _SUMMARIES:
            _SUMMARIES[key] = _accuracy_summary(file, mode, keep)
        return _SUMMARIES[key]
    return _accuracy_summary(file, mode, keep, profile, routing)


def _accuracy_summary(file: str, mode: str, keep, profile=None, routing=None) -> tuple[dict, int]:
    result = json.loads((RESULTS / file).read_text())
    profile = profile or result_profile(result)
    rows = accuracy_errors(result, profile, mode, routing)
    if keep is not None:
        test = keep if callable(keep) else (lambda w: getattr(w, keep[0]) == keep[1])
        rows = [r for r in rows if test(r["workload"])]
    return summarize(rows), len(rows)


def test_the_docs_state_every_table_and_column_this_check_reads(tables):
    for title, columns in {**ACCURACY, BUNDLED_TITLE: BUNDLED}.items():
        assert title in tables, f"docs/accuracy.md has no table titled {title!r}"
        assert set(tables[title]["columns"]) == set(columns), title
        assert len(tables[title]["rows"]) >= 6, f"{title}: fewer stages than expected"


def test_every_shipped_measurement_is_in_the_regression_set():
    used = {f for cols in ACCURACY.values() for f, _ in cols.values()}
    shipped = {p.name for p in RESULTS.glob("*prediction_accuracy*.json")}
    assert shipped and shipped == used, f"accuracy results without a stated column: {sorted(shipped - used)}"
    bundled = {p.name for p in REFERENCE.glob("*.json")}
    assert bundled == {f for f, _ in BUNDLED.values()}


def overlap_mode(column: str) -> str:
    return column.split()[1]


@pytest.mark.parametrize("title,column", [(t, c) for t, cols in ACCURACY.items() for c in cols])
def test_accuracy_results_predict_within_the_stated_errors(tables, title, column):
    file, keep = ACCURACY[title][column]
    mode = MODE_OF_TABLE.get(title) or overlap_mode(column)
    summary, n = accuracy_summary(file, mode, keep)
    table = tables[title]
    if column in table["points"]:
        assert n == table["points"][column], f"{title} / {column}: {n} points, the docs say {table['points'][column]}"
    breaches = exceeded(summary, stated(table, column), MARGIN, f"{file} {mode}: ")
    assert not breaches, "\n".join(breaches)


@pytest.fixture(scope="module")
def bundled_store(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("regression") / "runs.sqlite")
    return store, {p.name: rid for p, rid in ((p, store.import_run(p)) for p in sorted(REFERENCE.glob("*.json")))}


@pytest.mark.parametrize("column", list(BUNDLED))
def test_bundled_runs_predict_within_the_stated_errors(tables, bundled_store, column):
    store, ids = bundled_store
    file, profile_file = BUNDLED[column]
    run_id = ids[file]
    prof = load_profile(ROOT / "data" / "profiles" / profile_file)
    mode = store.get_run(run_id)["session_mode"]
    rows = run_errors(store, run_id, with_profile(profile_hardware(prof), prof, mode))
    table = tables[BUNDLED_TITLE]
    assert len(rows) == table["points"][column]
    want = {BUNDLED_STAGES.get(s, s): v for s, v in stated(table, column).items()}
    breaches = exceeded(summarize(rows, tuple(want)), want, MARGIN, f"{file}: ")
    assert not breaches, "\n".join(breaches)


def test_the_routed_table_names_every_row_this_check_reads(tables):
    table = tables[ROUTED_TITLE]
    assert set(table["columns"]) == set(ROUTED_COLUMNS)
    want = {f"{mode}, {name}" for name in ROUTED_ROWS for mode in ("fast", "reference")} - {
        "reference, H100 confirmation"}  # the H100 confirmation set measured the fast mode only
    assert set(table["rows"]) == want


@pytest.mark.parametrize("column", list(ROUTED_COLUMNS))
def test_batched_decode_predicts_within_the_stated_errors_with_each_routing(tables, column):
    from dsocr_core.analytic.routing import load_routing

    table = tables[ROUTED_TITLE]
    routing = None if ROUTED_COLUMNS[column] is None else load_routing(ROUTED_COLUMNS[column])
    breaches = []
    for row in table["rows"]:
        mode, name = row.split(", ", 1)
        summary, n = accuracy_summary(ROUTED_ROWS[name], mode, lambda w: w.batch > 1, routing=routing)
        stated_n = re.search(re.escape(row) + r" (\d+)(,|$)", table["points_line"])
        assert stated_n and n == int(stated_n.group(1)), f"{row}: {n} batched points"
        breaches += exceeded(summary, {"tpot": stated(table, column)[row]}, MARGIN, f"{row}, {column}: ")
    assert not breaches, "\n".join(breaches)


def test_the_check_catches_a_prediction_that_got_worse(tables):
    """The same check on a profile whose launch costs are tripled (a change that slows every predicted kernel by
    a few microseconds): the short stages' errors grow past the stated figures and are reported."""
    prof = result_profile(json.loads((RESULTS / "h100_prediction_accuracy.json").read_text()))
    raw = prof.to_dict()
    raw["launch"] = {k: v * 3 if isinstance(v, (int, float)) else v for k, v in raw["launch"].items()}
    summary, _ = accuracy_summary("h100_prediction_accuracy.json", "fast", None, profile_from_dict(raw))
    breaches = exceeded(summary, stated(tables["Fast session mode"], "H100 own"), MARGIN)
    assert breaches and any("decode" in b or "projector" in b for b in breaches)


def test_a_stage_that_stops_being_predicted_is_a_breach():
    assert exceeded({}, {"sam": (0.05, 0.1)}, MARGIN) == ["sam: stated but no longer predicted"]
    ok = {"sam": {"median_abs": 0.055, "max_abs": 0.1}}
    assert exceeded(ok, {"sam": (0.05, 0.1)}, MARGIN) == []
    assert "median error 6.5%" in exceeded({"sam": {"median_abs": 0.065, "max_abs": 0.1}}, {"sam": (0.05, 0.1)},
                                           MARGIN)[0]


# ------------------------------------------------------------------------- profiles derived from the other GPU's
DERIVED_TITLE = "**Profiles derived for a GPU they were not measured on"
DERIVED_STAGES = {"TTFT": "ttft", "TPOT": "tpot", "decode": "decode", "LM prefill": "prefill", "SAM": "sam",
                  "CLIP": "clip", "vision": "vision", "projector": "projector"}


def derived_ranges() -> dict[str, dict[str, float]]:
    """{"H100" | "H200": {stage: the largest set median the docs state now}} from the derived profiles' table: its
    cells read "before / now", each a range over the sets."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(DERIVED_TITLE))
    rows = [line for line in lines[start:start + 40] if line.startswith("| ") and line.split("|")[1].strip()
            in DERIVED_STAGES]
    out: dict[str, dict[str, float]] = {"H100": {}, "H200": {}}
    for row in rows:
        stage, *cells = [c.strip() for c in row.strip("|").split("|")]
        for gpu, cell in zip(("H100", "H200"), cells):
            now = cell.split(" / ")[1]
            out[gpu][DERIVED_STAGES[stage]] = float(re.search(r"[\d.]+-([\d.]+)%", now).group(1)) / 100
    return out


def test_profiles_derived_from_the_other_gpu_predict_its_sets_within_the_stated_ranges():
    """Each GPU's random sets predicted with the profile derived from the other GPU's (the shipped
    h100_from_h200.json; an H200 profile derived from h100.json here): no set's median may grow past the largest
    one the docs state (plus the margin)."""
    from dsocr_core.calibration.derive import derive_profile

    profiles = {"H100": load_profile(ROOT / "data" / "profiles" / "h100_from_h200.json"),
                "H200": derive_profile(load_profile(ROOT / "data" / "profiles" / "h100.json"), "h200")}
    stated_now = derived_ranges()
    breaches = []
    for gpu, prof in profiles.items():
        assert prof.derived
        sets = [(c, f, keep) for c, (f, keep) in ACCURACY["Fast session mode"].items()
                if c.startswith(f"{gpu} random, seed") and "profile of the day" not in c]
        assert len(sets) == {"H100": 18, "H200": 25}[gpu]  # the table's header
        for column, file, keep in sets:
            summary, _ = accuracy_summary(file, "fast", keep, profile=prof)
            for stage, limit in stated_now[gpu].items():
                got = summary[stage]["median_abs"]
                if got > limit + MARGIN:
                    breaches.append(f"{gpu} {column}: {stage} median {got:.1%} > stated {limit:.1%} + 1 point")
    assert not breaches, "\n".join(breaches)


# ------------------------------------------------------------------------- the summary at the top of the docs
SUMMARY_TITLE = "## Where the prediction stands"
# the latest held-out sets of each GPU and session mode: (table, columns); the summary states, per stage, the range
# of the sets' median errors and the largest single-point error among them
SUMMARY_SETS = {
    "fast, H100": ("Fast session mode", ("H100 random, seed 68, cast table, held out",
                                         "H100 random, seed 69, lm_head table, held out",
                                         "H100 random, seed 73, attention by length, held out",
                                         "H100 random, seed 75, projector cat measured, held out")),
    "fast, H200": ("Fast session mode", ("H200 random, seed 85, choice in the graph, held out",
                                         "H200 random, seed 86, choice in the graph, order check failed, held out",
                                         "H200 random, seed 87, choice in the graph, held out",
                                         "H200 random, seed 88, choice in the graph, held out",
                                         "H200 random, seed 89, token-tile MoE tables, held out",
                                         "H200 random, seed 90, batch 17-64, token-tile MoE tables, held out",
                                         "H200 random, seed 91, attention by fill, held out",
                                         "H200 random, seed 92, batch 17-64, attention by fill, held out")),
    "reference, H100": ("Reference session mode", ("H100 random, seed 48, own host costs",
                                                   "H100 random, seed 49, own profile",
                                                   "H100 random, seed 50, own host speed")),
    "reference, H200": ("Reference session mode", ("H200 random, seed 97, expert segments, shipped profile, held out",
                                                   "H200 random, seed 99, expert segments, own host costs, held out",
                                                   "H200 random, seed 101, own host costs, order check failed, "
                                                   "held out")),
}
SUMMARY_STAGES = {"TTFT": "ttft", "TPOT": "tpot", "SAM": "sam", "CLIP": "clip", "projector": "projector",
                  "vision": "vision", "LM prefill": "prefill", "decode step": "decode"}


def summary_figures() -> dict[str, dict[str, tuple[float, float, float]]]:
    """{group: {stage: (lowest set median, highest set median, largest point error)}} from the shipped results."""
    out = {}
    for group, (title, columns) in SUMMARY_SETS.items():
        mode = MODE_OF_TABLE[title]
        sums = [accuracy_summary(ACCURACY[title][c][0], mode, ACCURACY[title][c][1])[0] for c in columns]
        out[group] = {st: (min(x[st]["median_abs"] for x in sums), max(x[st]["median_abs"] for x in sums),
                           max(x[st]["max_abs"] for x in sums)) for st in SUMMARY_STAGES.values()}
    return out


def summary_rows() -> list[str]:
    """The summary table's lines as the docs print them (the test's failure message shows them)."""
    figs = summary_figures()
    cell = lambda f: (f"{f[1] * 100:.1f}%" if round(f[0], 3) == round(f[1], 3)  # noqa: E731
                      else f"{f[0] * 100:.1f}-{f[1] * 100:.1f}%") + f" / {f[2] * 100:.1f}%"
    lines = ["| stage | " + " | ".join(SUMMARY_SETS) + " |", "|---|" + "---:|" * len(SUMMARY_SETS)]
    for name, st in SUMMARY_STAGES.items():
        lines.append(f"| {name} | " + " | ".join(cell(figs[g][st]) for g in SUMMARY_SETS) + " |")
    return lines


def test_the_summary_at_the_top_of_the_docs_holds():
    """Every cell of docs/accuracy.md's summary (the sets' median range / the largest point error) is what the
    shipped results give now, within the margin: a change that makes the latest sets worse must change it."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(SUMMARY_TITLE))
    head = next(i for i in range(start, len(lines)) if lines[i].startswith("| stage |"))
    end = next((i for i in range(head, len(lines)) if not lines[i].startswith("|")), len(lines))
    header = [c.strip() for c in lines[head].strip("|").split("|")]
    assert header == ["stage", *SUMMARY_SETS], header
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[head + 2:end]]
    assert sorted(r[0] for r in rows) == sorted(SUMMARY_STAGES), [r[0] for r in rows]  # each stage once
    figs = summary_figures()
    stale = []
    for stage, *cells in rows:
        assert len(cells) == len(SUMMARY_SETS), (stage, cells)
        for group, text in zip(SUMMARY_SETS, cells):
            nums = [float(v) / 100 for v in re.findall(r"[\d.]+", text)]
            low, high, worst = (nums[0], nums[0], nums[1]) if len(nums) == 2 else nums
            got = figs[group][SUMMARY_STAGES[stage]]
            if abs(got[0] - low) > MARGIN or abs(got[1] - high) > MARGIN or abs(got[2] - worst) > MARGIN:
                stale.append(f"{stage}, {group}: docs {text}, results {got}")
    assert not stale, "\n".join(stale + ["the table as the results give it now:", *summary_rows()])


# ------------------------------------------------------------------ the newest tables on the sets measured before them
SHIPPED_TITLE = "The H200's sets of 2026-11-28 predicted with the shipped profile"
SHIPPED_STAGES = {"decode step": "decode", "TPOT": "tpot"}


def test_the_shipped_h200_profile_predicts_that_days_sets_within_the_stated_errors(tables):
    """The H200's sets of 2026-11-28 (seeds 80-90) predicted with data/profiles/h200.json as shipped, not the profile
    frozen before each (its by-tile MoE and by-fill attention tables were measured after them): every row of the
    docs' table, its points and its decode step and TPOT within the stated errors (plus the margin)."""
    table = tables[SHIPPED_TITLE]
    assert table["columns"] == list(SHIPPED_STAGES)
    profile = load_profile(ROOT / "data" / "profiles" / "h200.json")
    assert set(table["rows"]) == {f"seed {s}" for s in range(80, 91)}
    breaches = []
    for row in table["rows"]:
        file = f"h200_prediction_accuracy_random{row.split()[1]}_fast_2026-11-28.json"
        summary, n = accuracy_summary(file, "fast", None, profile=profile)
        stated_n = re.search(re.escape(row) + r" (\d+)(,|$)", table["points_line"])
        assert stated_n and n == int(stated_n.group(1)), f"{row}: {n} points"
        want = {SHIPPED_STAGES[c]: v for c, v in zip(table["columns"], table["rows"][row])}
        breaches += exceeded(summary, want, MARGIN, f"{row}: ")
    assert not breaches, "\n".join(breaches)
