"""The by-expert MoE kernels' token tile as an axis of their tables (memory.moe_gemv_combine, and memory.moe_gemv
for expert_fusion 'separate'): every program of triton_kernels.moe_gemv loads and multiplies a [rows, tile] block,
the batch rounded up to a power of two (16 at least), so the kernels' time follows the tile. The plan looks the
table up at the tile; a table measured before the axis existed (timed at 8-9 tokens) reads back as measured at a
tile of 16 and prices every batch as before."""
import json
from pathlib import Path

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.predict import with_profile
from dsocr_core.calibration.microbench import _entries, grids
from dsocr_core.calibration.profile import ProfileError, load_profile, profile_from_dict, table_axes, uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.fast.options import expert_token_tile
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec
from prediction_notes import table_notes

ROOT = Path(__file__).resolve().parents[1]
TABLE = "memory.moe_gemv_combine"
# the H200 profile as it was before its by-expert tables were measured by tile (2026-11-28 16:34), and the profile
# derived from it then: their tables have the one axis
BEFORE = ROOT / "data/profiles/history/h200_2026-11-28.json"
DERIVED_BEFORE = ROOT / "data/profiles/history/h100_from_h200_2026-11-28.json"


def test_the_tile_is_the_batch_rounded_up_to_a_power_of_two_and_16_at_least():
    assert [expert_token_tile(t) for t in (1, 2, 8, 16, 17, 32, 33, 56, 64)] == [16, 16, 16, 16, 32, 32, 64, 64, 64]
    assert list(expert_token_tile(np.array([3.0, 20.0, 40.0]))) == [16.0, 32.0, 64.0]


def test_the_calibration_times_every_tile_at_every_size():
    for name in (TABLE, "memory.moe_gemv"):  # with the combine ('fused') and without ('separate')
        grid = grids(False, "cuda")[name]
        assert table_axes(name) == ("bytes", "tokens") and grid["tokens"] == [16.0, 32.0, 64.0]
        assert len(_entries(name, grid)) == 7 * 3
    assert table_axes("memory.fused_gemv") == ("bytes",)  # the other memory tables keep their one axis


def test_a_table_measured_before_the_axis_reads_back_at_a_tile_of_16():
    raw = json.loads(BEFORE.read_text())
    assert list(raw["tables"][TABLE]["axes"]) == ["bytes"]  # as it was kept
    table = load_profile(BEFORE).table(TABLE)
    assert table.axes == ("bytes", "tokens") and [list(g) for g in table.grid][1] == [16.0]
    assert table.lookup(bytes=1e8, tokens=64) == table.lookup(bytes=1e8, tokens=16)
    again = profile_from_dict(load_profile(BEFORE).to_dict()).table(TABLE)
    assert np.array_equal(again.efficiency, table.efficiency)  # written back with the axis, read the same


def test_the_shipped_h200_profile_has_both_tables_measured_at_every_tile():
    """Measured 2026-11-28: on an H200 the tile of 64 streams 6-24% slower than 16 over the same experts."""
    profile = load_profile(ROOT / "data/profiles/h200.json")
    for name in (TABLE, "memory.moe_gemv"):
        table = profile.table(name)
        assert [list(g) for g in table.grid][1] == [16.0, 32.0, 64.0] and "axes_added" not in table.meta
        assert np.all(table.measured)
        assert np.all(table.efficiency[:, 2] < table.efficiency[:, 0])  # every size: slower at 64 than at 16


def test_a_table_with_its_axes_in_another_order_is_refused():
    raw = json.loads(BEFORE.read_text())
    t = raw["tables"][TABLE]
    raw["tables"][TABLE] = {**t, "axes": {"tokens": [16.0], "bytes": t["axes"]["bytes"]},
                            "efficiency": [t["efficiency"]], "measured": [t["measured"]]}
    with pytest.raises(ProfileError, match="moe_gemv_combine: axes"):
        profile_from_dict(raw)


def _with_tiles(slow_at_64: float) -> dict:
    """The H200 profile of before with its table as if measured at tiles 16, 32 and 64: the first two as it was,
    the largest `slow_at_64` times slower."""
    raw = json.loads(BEFORE.read_text())
    t = raw["tables"][TABLE]
    eff = [[e, e, e / slow_at_64] for e in t["efficiency"]]
    raw["tables"][TABLE] = {**t, "axes": {"bytes": t["axes"]["bytes"], "tokens": [16.0, 32.0, 64.0]},
                            "efficiency": eff, "measured": [[m] * 3 for m in t["measured"]]}
    return raw


def _decode_s(raw: dict, batches: list[int]) -> np.ndarray:
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=batches, decode_steps=[1], logits="last")
    hw = with_profile(get_hardware("h200"), profile_from_dict(raw), EngineSpec.of("fast"))
    return np.asarray(evaluate(ModelSpec(), pts, hw)["decode"]["predicted_kernel_s"]) \
        + np.asarray(evaluate(ModelSpec(), pts, hw)["decode"]["predicted_roofline_s"])


def test_the_plan_looks_the_kernels_up_at_their_tile():
    """Batches 8 and 20 (tiles 16 and 32) cost the same whichever the 64-tile entries say; batch 40 (tile 64)
    costs more where they are slower, and every batch costs what the one-axis table says where they are not."""
    shipped = json.loads(BEFORE.read_text())
    batches = [8, 20, 40]
    base, same, slow = _decode_s(shipped, batches), _decode_s(_with_tiles(1.0), batches), _decode_s(
        _with_tiles(2.0), batches)
    assert np.allclose(same, base, rtol=1e-9)
    assert np.allclose(slow[:2], base[:2], rtol=1e-9)
    assert slow[2] > base[2] * 1.05  # the experts' two launches are a large share of a batch-40 step


def test_a_prediction_off_the_tile_an_older_table_was_timed_at_says_so():
    """The H200 profile of before had its table timed at a tile of 16: a batch-40 step (tile 64) is priced as at 16
    and its prediction says so (in the notes every export carries); a batch-8 step is not; a table measured with
    the axis (the shipped one) adds no note. The note survives the profile being written and read back."""
    def notes(raw, batch):
        return table_notes(raw, TABLE, EngineSpec.of("fast"), batch, crops=[(2, 2)])

    shipped = json.loads(BEFORE.read_text())
    assert notes(shipped, 8) == []
    (note,) = notes(shipped, 40)
    assert "measured at tokens 16 only" in note and "calibrate --tables memory.moe_gemv_combine" in note
    assert len(notes(profile_from_dict(shipped).to_dict(), 40)) == 1  # written back: still known as added
    assert notes(_with_tiles(1.5), 40) == []
    assert notes(json.loads((ROOT / "data/profiles/h200.json").read_text()), 40) == []
    # the profile derived from the H200's of before: the advice is to measure it there and derive again
    (derived,) = notes(json.loads(DERIVED_BEFORE.read_text()), 40)
    assert "derived from a table measured at tokens 16" in derived and "derive again" in derived
    # the measured H100 profile has no table with the combine: priced on memory.moe_gemv, and the note says both
    pts = Points.grid(crops=[(2, 2)], text_tokens=[10], batch=[40], decode_steps=[1], logits="last")
    hw = with_profile(get_hardware("h100-sxm"), load_profile(ROOT / "data/profiles/h100.json"), EngineSpec.of("fast"))
    evaluate(ModelSpec(), pts, hw)
    (older,) = [n for n in hw.prediction.notes if n.startswith("memory.moe_gemv:")]
    assert f"priced on memory.moe_gemv: the profile has no {TABLE}" in older
    assert f"calibrate --tables {TABLE}" in older
    # a synthetic profile has every axis: no note
    uniform = uniform_profile(989e12, 4.8e12, 0.5, 0.0, kind="cuda").to_dict()
    assert notes(uniform, 40) == []
