"""SAM's compiled blocks in the fast plan (fast/plan.py, docs/accuracy.md "SAM planned kernel by kernel"): every
kernel Inductor runs in a block, by the bytes it moves, and cuDNN's attention as a blend of the default backend's
table at the padded head-dim tile and at the value head dim; no overlap credit in the block rows."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points
from dsocr_core.analytic.kernels import Call
from dsocr_core.analytic.predict import with_profile
from dsocr_core.analytic.stages import vision_rows
from dsocr_core.calibration.profile import uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.results.prediction_check import predicted_stages
from dsocr_core.spec import ModelSpec, Workload

SPEC = ModelSpec()
FOLD = EngineSpec.of("fast").kernel_plan("cuda")
DENSE = EngineSpec.of("fast", {"sam_attention": "dense"}).kernel_plan("cuda")
C, DT = SPEC.sam_width, 2


def _rows(mode="base", batch=4):
    pts = Points.build(mode=mode, text_tokens=10, batch=batch, decode_steps=0, logits="last")
    return {r.kind: r for r in vision_rows(SPEC, pts)}


def _plan(plan, row, part=0):
    return plan.plan(Call(row.kind, row.parts[part], row.ctx[part]))


def _moved(plan):
    return sorted(float(np.sum(k.real_bytes)) for k in plan.kernels if k.table.startswith("memory."))


def test_a_windowed_block_moves_what_its_kernels_read_and_write():
    """Base at batch 4: 4 x 64 x 64 tokens, windows padded to 70 x 70; the attention's copies over the padded
    windows, the norms and the MLP's elementwise kernels over the map (the windows' padding cropped unread)."""
    rows = _rows()
    t, n = 4 * 64 * 64, 4 * 70 * 70
    heads, d, span = SPEC.sam_heads, C // SPEC.sam_heads, SPEC.sam_window
    dq = -(-(d + 2 * span) // 8) * 8
    attn = _moved(_plan(FOLD, rows["sam.attn.windowed"]))
    want = sorted([(t + n) * C * DT, 4 * n * C * DT, 2 * ((2 * span - 1) * d + span * span * d) * DT,
                   (n * C + n * heads * 2 * span + n * heads * dq) * DT, (n * C + n * heads * dq) * DT,
                   2 * n * C * DT])
    assert attn == pytest.approx(want)
    assert _moved(_plan(FOLD, rows["sam.norm1.windowed"])) == pytest.approx([2 * t * C * DT])
    assert _moved(_plan(FOLD, rows["sam.norm2.windowed"])) == pytest.approx([3 * t * C * DT])
    assert _moved(_plan(FOLD, rows["sam.mlp.windowed"])) == pytest.approx(
        sorted([2 * t * SPEC.sam_mlp_dim * DT, 4 * t * C * DT]))


def test_the_attention_is_one_launch_at_the_padded_tile_and_the_value_head_dim():
    """The global block at 1024 px: q' and k' have head dim 64 + 2 x 64 = 192 (a tile of 192), v 64; the two parts
    weigh 3/4 and 1/4 and together are one launch."""
    plan = _plan(FOLD, _rows()["sam.attn.global"])
    parts = [k for k in plan.kernels if k.table == "attention.default"]
    assert [k.coords["d"] for k in parts] == [192, 64]
    assert [float(k.launches) for k in parts] == pytest.approx([0.75, 0.25])
    assert all(float(np.sum(k.coords["bh"])) == 4 * SPEC.sam_heads for k in parts)


def test_a_part_without_views_costs_nothing():
    """The tile part of an untiled mode has no call: none of its kernels launches or moves a byte."""
    rows = _rows()
    for kind in ("sam.attn.windowed", "sam.attn.global", "sam.norm2.global", "sam.mlp.windowed"):
        plan = _plan(FOLD, rows[kind], part=1)
        for k in plan.kernels:
            assert float(np.sum(k.launches)) == 0.0, kind
            assert float(np.sum(k.real_bytes if k.real_bytes is not None else k.nbytes)) == 0.0, kind


def test_the_block_rows_are_separate_only_with_the_folded_attention():
    assert {"sam.attn.windowed", "sam.mlp.global", "sam.norm2.windowed", "clip.mlp"} <= FOLD.separate_rows
    assert DENSE.separate_rows == {"clip.mlp", "lm.self_attn", "lm.lm_head", "projector"}
    # the dense option keeps the analytic rows' norms and MLP (one memory.norm kernel, the MLP's GEMMs)
    rows = _rows()
    assert [k.table for k in _plan(DENSE, rows["sam.norm2.global"]).kernels] == ["memory.norm"]
    assert [k.table for k in _plan(DENSE, rows["sam.mlp.global"]).kernels] == ["gemm", "gemm"]


@pytest.mark.parametrize("work", ["engine", "analytic"])
def test_the_sam_stage_is_the_sum_of_its_kernels_at_efficiency_one(work):
    """At efficiency 1 and no launch cost, each SAM block row is its kernels' own time (what they move or compute,
    no overlap) with work='engine'; with work='analytic' the analytic row's roofline; both finite and positive."""
    prof = uniform_profile(1e15, 3e12, kind="cuda")
    hw = with_profile(get_hardware("h100-sxm"), prof, "fast", work)
    w = Workload(mode="base", batch=4, text_tokens=10, decode_steps=1)
    sam = predicted_stages(SPEC, [w], hw)[0]["sam"]
    assert np.isfinite(sam) and sam > 0
    if work == "engine":
        rows = _rows()
        total = 0.0
        for kind in FOLD.sam_rows:
            plan = _plan(FOLD, rows[kind])
            for k in plan.kernels:
                f = k.flops if k.real_flops is None else k.real_flops
                b = k.nbytes if k.real_bytes is None else k.real_bytes
                total += max(float(np.sum(f)) / 1e15, float(np.sum(b)) / 3e12) * len(rows[kind].paths)
        assert sam > total  # the block rows are part of the stage (patch embedding, neck and convs besides)
