"""runtime/gpu_state.py: the GPU's clocks read beside a measurement, and the order check's use of them."""
from __future__ import annotations

import subprocess

import torch

from dsocr_core.measure import order_check
from dsocr_core.runtime import gpu_state

CAPPED = "1620, 2619, 699.31, 58, 0x0000000000000004"
IDLE = "345, 2619, 71.45, 31, 0x0000000000000001"


def test_a_line_parses_into_clocks_power_temperature_and_named_throttle_reasons():
    state = gpu_state.parse(CAPPED)
    assert state["sm_clock_mhz"] == 1620 and state["mem_clock_mhz"] == 2619
    assert state["power_w"] == 699.31 and state["temperature_c"] == 58
    assert state["throttle_mask"] == 4 and state["throttle"] == ["software power cap"]
    assert gpu_state.slowdowns(state) == ["software power cap"]
    assert gpu_state.describe(state) == "SM 1,620 MHz, 699 W, 58 C, slowed by software power cap"


def test_idle_is_not_a_slowdown_and_unknown_fields_stay_unknown():
    idle = gpu_state.parse(IDLE)
    assert idle["throttle"] == ["idle"] and gpu_state.slowdowns(idle) == []
    partial = gpu_state.parse("1980, 2619, [N/A], 40, [Not Supported]")
    assert partial["power_w"] is None and partial["throttle_mask"] is None and partial["throttle"] == []
    assert gpu_state.describe(partial) == "SM 1,980 MHz, 40 C"
    assert gpu_state.parse("garbage") is None
    assert gpu_state.describe(None) == "GPU state unknown"


def test_no_state_on_a_cpu_or_without_nvidia_smi(monkeypatch):
    assert gpu_state.read("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_state, "_smi_target", lambda device: "0")

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")
    monkeypatch.setattr(subprocess, "run", missing)
    assert gpu_state.read("cuda:0") is None
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 9, "", "no GPU"))
    assert gpu_state.read("cuda:0") is None
    seen = {}

    def answers(cmd, **k):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, CAPPED + "\n", "")
    monkeypatch.setattr(subprocess, "run", answers)
    assert gpu_state.read("cuda:0")["sm_clock_mhz"] == 1620

    def renamed(cmd, **k):  # a driver that knows only the new name of the throttle reasons
        ok = "clocks_event_reasons.active" in cmd[3]
        return subprocess.CompletedProcess(cmd, 0 if ok else 2, CAPPED if ok else "", "" if ok else "bad field")
    monkeypatch.setattr(subprocess, "run", renamed)
    assert gpu_state.read("cuda:0")["throttle"] == ["software power cap"]
    assert seen["cmd"][:3] == ["nvidia-smi", "-i", "0"] and "--format=csv,noheader,nounits" in seen["cmd"]


def test_a_failed_order_check_says_at_which_clocks_each_measurement_ran():
    check = order_check.compare({"decode_step": {"median_s": 1.745e-3, "min_s": 1.740e-3, "max_s": 1.748e-3}},
                                {"decode_step": {"median_s": 2.235e-3, "min_s": 2.230e-3, "max_s": 2.240e-3}},
                                {"batch": 62})
    line = order_check.summary(check)
    assert line.startswith("order check FAILED") and "GPU at" not in line  # nothing recorded: nothing said
    check["gpu_state_first"] = {"before": None, "after": gpu_state.parse("1980, 2619, 420, 41, 0x0")}
    check["gpu_state_again"] = {"before": None, "after": gpu_state.parse(CAPPED)}
    line = order_check.summary(check)
    assert ("GPU at the first measurement: SM 1,980 MHz, 420 W, 41 C; at the repeat: SM 1,620 MHz, 699 W, 58 C, "
            "slowed by software power cap") in line


def test_a_points_line_gives_the_clock_at_both_ends_of_its_repeats():
    recorded = {"before": gpu_state.parse("1980, 2619, 131, 41, 0x0"), "after": gpu_state.parse(CAPPED)}
    assert gpu_state.point_text(recorded) == "SM 1,980 -> 1,620 MHz, 699 W, 58 C, slowed by software power cap"
    assert gpu_state.point_text({"before": recorded["before"], "after": None}) == "SM 1,980 MHz, 131 W, 41 C"
    assert gpu_state.point_text(None) is None and gpu_state.point_text({"before": None, "after": None}) is None


def _clocks_read_as(monkeypatch, states):
    """gpu_state.read answering from `states` in turn (a CPU test of what a GPU run stores)."""
    answers = iter(states)
    monkeypatch.setattr(gpu_state, "read", lambda device: gpu_state.parse(next(answers)))


def test_a_sweeps_points_and_its_order_check_keep_the_gpu_state(tmp_path, monkeypatch):
    from dsocr_core.measure.sweep import run_sweep, sweep_workloads
    from dsocr_core.results.store import RunStore
    from dsocr_core.runtime.session import Session

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore(tmp_path / "runs.sqlite")
    cool, capped = "1980, 2619, 300, 40, 0x0", CAPPED
    _clocks_read_as(monkeypatch, [cool, cool, cool, cool, cool, capped])  # before/after: 2 points, the repeat
    run_id = run_sweep(session, store, sweep_workloads(["tiny"], [(1, 1)], [10, 30], [1], [2], dtype="float32"),
                       repeats=1)
    extras = store.points(run_id).drop_duplicates("point_id")["extra"].tolist()
    assert [e["gpu_state"]["after"]["sm_clock_mhz"] for e in extras] == [1980, 1980]
    check = store.get_run(run_id)["meta"]["order_check"]
    assert check["gpu_state_first"]["after"]["sm_clock_mhz"] == 1980
    assert check["gpu_state_again"]["after"]["throttle"] == ["software power cap"]


def test_a_dataset_page_keeps_the_gpu_state(tmp_path, monkeypatch):
    import shutil

    from dsocr_core.grounding.samples import sample_pages
    from dsocr_core.measure.dataset_run import ProfileSettings, measure_page
    from dsocr_core.measure.datasets import discover, sample
    from dsocr_core.runtime.session import Session

    pages = tmp_path / "pages"
    pages.mkdir()
    shutil.copy(next(p for p in sample_pages() if p.stem == "card"), pages / "card.png")
    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    _clocks_read_as(monkeypatch, ["1980, 2619, 300, 40, 0x0", CAPPED])
    page = measure_page(session, sample(discover(pages).pages, order="fixed")[0], ProfileSettings(mode="tiny",
                        max_new_tokens=2))
    assert page.status == "done"
    assert gpu_state.point_text(page.extra["gpu_state"]).startswith("SM 1,980 -> 1,620 MHz")


def test_the_measured_point_table_shows_the_engine_and_gpu_state_of_stored_points(tmp_path, monkeypatch):
    from dsocr_core.measure.sweep import run_sweep, sweep_workloads
    from dsocr_core.results.store import RunStore
    from dsocr_core.runtime.session import Session
    from ui.measured import point_table

    session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    store = RunStore(tmp_path / "runs.sqlite")
    _clocks_read_as(monkeypatch, ["1980, 2619, 300, 40, 0x0", CAPPED])
    run_id = run_sweep(session, store, sweep_workloads(["tiny"], [(1, 1)], [10], [1], [2], dtype="float32"),
                       repeats=1, order_check=False)
    table = point_table(store.points(run_id))
    assert table["GPU before -> after repeats"].tolist() == [
        "SM 1,980 -> 1,620 MHz, 699 W, 58 C, slowed by software power cap"]
    assert table["engine state"].iloc[0].startswith("reference")
