"""The split-KV decode attention's fill as an axis of its table (attention.split_kv): the fast engine's static cache
ends at a bucket's end (fast/options.bucket), triton_kernels.decode_attention_splitkv launches a program per chunk of
that whole length, and the programs past the position load nothing but still run, so a step at a short context
takes longer than the table at a full cache says (a batch of 57 at 146 cached tokens: 28 us a layer against 21 on an
H200, docs/results/h200_moe_decode_tiles_2026-11-28/). The plan looks the table up at the position's share of the
cache; a table measured before the axis existed reads back as measured at a fill of 1, and a prediction off it
says so."""
import json
from pathlib import Path

import numpy as np

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.predict import with_profile
from dsocr_core.calibration.microbench import _entries, grids
from dsocr_core.calibration.ops import Settings, input_bytes, split_kv_length
from dsocr_core.calibration.profile import load_profile, profile_from_dict, table_axes, uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec
from prediction_notes import table_notes

ROOT = Path(__file__).resolve().parents[1]
TABLE = "attention.split_kv"
BEFORE = ROOT / "data/profiles/history/h200_2026-11-28.json"  # its split-KV table has no fill axis
ENGINE = EngineSpec.of("fast", {"attention": "triton"})  # the batched decode attention the default takes on a GPU


def test_the_calibration_times_every_fill_at_every_shape():
    grid = grids(False, "cuda")[TABLE]
    assert table_axes(TABLE) == ("bh", "q", "k", "d", "fill") and grid["fill"] == [0.25, 0.5, 0.75, 1.0]
    assert len(_entries(TABLE, grid)) == 7 * 7 * 4


def test_an_entry_allocates_the_whole_cache_its_fill_makes():
    assert split_kv_length(150, 0.5) == 300 and split_kv_length(150, 1.0) == 150
    assert split_kv_length(16, 0.25) == 64  # one chunk of 64 either way
    st = Settings("cuda", False, 60.0, flops_cap=4e12, memory_cap=8e9, target_s=2e-3, repeats=5, max_inner=200,
                  l2_bytes=60 << 20)
    full = input_bytes(TABLE, {"bh": 640, "q": 1, "k": 8192, "d": 128, "fill": 1.0}, st)[2]
    quarter = input_bytes(TABLE, {"bh": 640, "q": 1, "k": 8192, "d": 128, "fill": 0.25}, st)[2]
    assert quarter > 3.9 * full  # the caps see the cache the entry allocates


def _with_fill(slow_at_quarter: float) -> dict:
    """The H200 profile of before with its split-KV table as if measured at fills 0.25, 0.5 and 1: at a full cache
    as it was, at a quarter `slow_at_quarter` times slower, at half between."""
    raw = json.loads(BEFORE.read_text())
    t = raw["tables"][TABLE]
    eff = np.asarray(t["efficiency"], dtype=float)  # [bh, q, k, d]
    deep = np.stack([eff / slow_at_quarter, eff / np.sqrt(slow_at_quarter), eff], axis=-1)
    measured = np.repeat(np.asarray(t["measured"])[..., None], 3, axis=-1)
    raw["tables"][TABLE] = {**t, "axes": {**t["axes"], "fill": [0.25, 0.5, 1.0]}, "efficiency": deep.tolist(),
                            "measured": measured.tolist()}
    return raw


def _attention_s(raw: dict, mode: str, text: int, batch: int = 32) -> float:
    crops = [(2, 2)] if mode == "gundam" else None
    pts = Points.grid(mode=mode, crops=crops, text_tokens=[text], batch=[batch], decode_steps=[1], logits="last")
    hw = with_profile(get_hardware("h200"), profile_from_dict(raw), ENGINE)
    d = evaluate(ModelSpec(), pts, hw)["decode"]
    return float(d["predicted_kernel_s"][0] + d["predicted_roofline_s"][0])


def test_the_plan_looks_the_attention_up_at_the_positions_share_of_the_cache():
    """A Gundam 2x2 page (703 prompt tokens: 92% of a 768-slot cache) costs about what the one-fill table says,
    whatever the quarter-fill entries say; a Tiny page (76 tokens: 30% of 256 slots) costs more where they are
    slower, and exactly what the one-fill table says where they are not."""
    before = json.loads(BEFORE.read_text())
    same, slow = _with_fill(1.0), _with_fill(3.0)
    assert np.isclose(_attention_s(same, "tiny", 10), _attention_s(before, "tiny", 10), rtol=1e-9)
    assert _attention_s(slow, "tiny", 10) > _attention_s(before, "tiny", 10) * 1.05
    assert np.isclose(_attention_s(slow, "gundam", 10), _attention_s(before, "gundam", 10), rtol=0.02)


def test_a_prediction_off_the_fill_an_older_table_was_timed_at_says_so():
    """The H200 profile of before timed the split-KV kernels with the cache ending at the position: a batched step
    at a short context is priced as at a full cache and its prediction says so; the fused batch-1 step (which has
    no split-KV kernel) does not; a table measured with the axis adds no note."""
    def notes(raw, batch):
        return table_notes(raw, TABLE, ENGINE, batch, mode="tiny")

    before = json.loads(BEFORE.read_text())
    assert notes(before, 1) == []
    (note,) = notes(before, 8)
    assert "measured at fill 1 only" in note and "chunks past the position" in note
    assert f"calibrate --tables {TABLE}" in note
    assert notes(_with_fill(1.5), 8) == []
    uniform = uniform_profile(989e12, 4.8e12, 0.5, 0.0, kind="cuda").to_dict()  # synthetic: every axis, no note
    assert notes(uniform, 8) == []
    assert load_profile(BEFORE).table(TABLE).meta["axes_added"] == {"fill": 1.0}


def test_the_plan_gives_the_kernel_the_positions_share_of_its_buckets_end():
    """The split-KV kernel's fill at a cache of 77, 256 and 257 slots (the step's own slot included): 77/256, a
    full bucket, then just past its edge, 257/512."""
    from dsocr_core.analytic.kernels import Call
    from dsocr_core.analytic.stages import decode_step_rows

    plan = ENGINE.kernel_plan("cuda")
    pts = Points.grid(mode="tiny", text_tokens=[10], batch=[8, 8, 8], decode_steps=[1], logits="last")
    row = next(r for r in decode_step_rows(ModelSpec(), pts, np.array([76.0, 255.0, 256.0]))
               if r.kind == "lm.self_attn")
    (attn,) = [k for k in plan.plan(Call(row.kind, row.cost, row.ctx[0], "triton", None)).kernels
               if k.table == TABLE]
    assert np.allclose(attn.coords["fill"], [77 / 256, 1.0, 257 / 512])
    assert np.allclose(attn.coords["k"], [77, 256, 257])


def test_a_decode_rows_steps_are_summed_bucket_by_bucket():
    """Hundreds of steps across bucket edges (the fill jumps from 1 to about 0.5 at each) cost what the steps cost
    one by one: within 0.2% where each bucket has its own Simpson panel (one panel over all of them missed by up to
    3.6% here), within 1% beyond predict.MAX_BUCKET_PANELS buckets, where whole buckets share a panel."""
    raw = json.loads((ROOT / "data/profiles/h200.json").read_text())
    hw = with_profile(get_hardware("h200"), profile_from_dict(raw), ENGINE)
    for mode, text, steps, batch, within in (("tiny", 181, 510, 64, 0.002), ("tiny", 10, 450, 64, 0.002),
                                             ("small", 20, 300, 57, 0.002), ("tiny", 10, 2000, 64, 0.01)):
        whole = Points.grid(mode=mode, text_tokens=[text], batch=[batch], decode_steps=[steps], logits="last")
        each = Points.grid(mode=mode, text_tokens=list(range(text, text + steps)), batch=[batch], decode_steps=[1],
                           logits="last")
        summed = evaluate(ModelSpec(), whole, hw)["decode"]["predicted_s"][0]
        one_by_one = np.sum(evaluate(ModelSpec(), each, hw)["decode"]["predicted_s"])
        assert abs(summed / one_by_one - 1) < within, (mode, text, steps, batch, summed, one_by_one)
