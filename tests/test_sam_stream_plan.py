"""SAM's residual stream in the reference plan (docs/accuracy.md, "SAM's residual stream"): the model keeps the stream
channels first in memory, so each LayerNorm copies it and each add reads across the channel stride; the reference plan
prices those kernels on their own tables and gives no row an overlap credit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.kernels import Call
from dsocr_core.analytic.predict import with_profile
from dsocr_core.analytic.stages import vision_rows
from dsocr_core.calibration.ops import kernel_op
from dsocr_core.calibration.profile import profile_from_dict, uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.model import synthetic_model
from dsocr_core.runtime.reference_plan import PERMUTED_ADD, PERMUTED_COPY, ReferenceOptions, ReferencePlan
from dsocr_core.spec import ModelSpec, tiny_spec

H100 = get_hardware("h100-sxm")
PLAN = ReferencePlan(ReferenceOptions(), "cuda")


def test_the_models_residual_stream_reaches_every_norm_channels_first():
    """What the plan assumes, checked on the model: every SAM block's norms see a non-contiguous stream whose
    channels are the slowest axis in memory (so the norm copies it), and the blocks' adds keep that layout."""
    model = synthetic_model(tiny_spec(), seed=0, dtype="float32")
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
             for name, m in model.named_modules() if name.startswith("model.sam_model.blocks.")
             and name.endswith(("norm1", "norm2"))]
    with torch.no_grad():
        model.model.sam_model(torch.randn(1, 3, 512, 512))
    for h in hooks:
        h.remove()
    assert len(seen) == 2 * tiny_spec().sam_layers
    for x in seen:
        assert not x.is_contiguous()
        assert x.stride()[-1] == x.shape[1] * x.shape[2]  # channels strided by the whole grid: [N, C, P, P] memory


def _rows(mode="base", batch=4):
    pts = Points.build(mode=mode, text_tokens=10, batch=batch, decode_steps=0, logits="last")
    return {r.kind: r for r in vision_rows(ModelSpec(), pts)}


def _plan(row):
    return PLAN.plan(Call(row.kind, row.parts[0], row.ctx[0]))


def test_the_norm_copies_the_stream_inside_its_op_and_the_adds_read_it():
    rows = _rows(batch=4)
    stream = 4 * 64 * 64 * 768 * 2  # bytes of four 1024 px views' stream, bf16
    norm = _plan(rows["sam.norm1.windowed"])
    copy = [k for k in norm.kernels if k.table == PERMUTED_COPY]
    assert len(copy) == 1 and copy[0].host_ops == 0.0  # launched inside native_layer_norm: no host op
    assert np.sum(copy[0].real_bytes) == 2 * stream and np.sum(copy[0].nbytes) == 0.0  # the engine's work only
    for kind in ("sam.attn.windowed", "sam.attn.global", "sam.mlp.global"):
        adds = [k for k in _plan(rows[kind]).kernels if k.table == PERMUTED_ADD]
        assert len(adds) == 1 and np.sum(adds[0].real_bytes) == 3 * stream, kind
        assert np.sum(adds[0].coords["bytes"]) == 3 * stream
    pos = [k for k in _plan(rows["sam.pos_embed"]).kernels if k.table == PERMUTED_ADD]  # the whole row: the table
    assert len(pos) == 1 and pos[0].real_bytes is None and np.sum(pos[0].coords["bytes"]) == 3 * stream  # once


def _profile(with_tables: bool, transposed: bool = True):
    """A profile at efficiency 0.5 whose stream tables (or, without them, transposed_cat) run at 0.1."""
    d = uniform_profile(H100.peak_flops, H100.bandwidth, 0.5, 0.0, kind="cuda").to_dict()
    slow = dict(d["tables"]["memory.copy"], efficiency=[0.1] * len(d["tables"]["memory.copy"]["efficiency"]))
    tables = ((PERMUTED_COPY, with_tables), (PERMUTED_ADD, with_tables), ("memory.transposed_cat", transposed))
    for name, keep in tables:
        if keep:
            d["tables"][name] = slow
        else:
            d["tables"].pop(name, None)
    return profile_from_dict(d)


def test_the_stream_tables_price_sam_and_profiles_without_them_fall_back_and_say_so():
    pts = Points.build(mode="base", text_tokens=10, batch=8, decode_steps=0, logits="last")
    engine = EngineSpec.of("reference")
    timed = {}
    for label, prof in (("tables", _profile(True)), ("transposed", _profile(False)),
                        ("elementwise", _profile(False, transposed=False))):
        hw = with_profile(H100, prof, engine)
        timed[label] = float(evaluate(ModelSpec(), pts, hw)["sam"]["predicted_s"][0])
        notes = " ".join(hw.prediction.notes)
        assert (PERMUTED_COPY + " (bfloat16) timed with table") in notes or label == "tables"
    # at efficiency 0.1 the stream's kernels take ten times their roofline; on the 0.5 tables half as long
    assert timed["tables"] == pytest.approx(timed["transposed"])
    assert timed["tables"] > timed["elementwise"] * 1.05


def test_the_fast_projector_cat_has_its_own_table_and_the_reference_keeps_the_transposed_one():
    """The fast engine's SAM map is channels-last, so its projector cat reads whole rows (memory.projector_cat); the
    reference model's is channels-first (memory.transposed_cat). A profile without projector_cat prices the fast
    cat on transposed_cat and says so."""
    pts = Points.build(mode="gundam", crops=(2, 2), text_tokens=10, batch=8, decode_steps=0, logits="last")
    d = uniform_profile(H100.peak_flops, H100.bandwidth, 0.5, 0.0, kind="cuda").to_dict()
    d["tables"]["memory.transposed_cat"] = dict(d["tables"]["memory.copy"],
                                                efficiency=[0.05] * len(d["tables"]["memory.copy"]["efficiency"]))
    d["tables"]["memory.projector_cat"] = d["tables"]["memory.copy"]  # at 0.5
    both = profile_from_dict(d)
    d["tables"].pop("memory.projector_cat")
    older = profile_from_dict(d)
    proj = {}
    for label, prof, engine in (("fast", both, "fast"), ("fast, older profile", older, "fast"),
                                ("reference", both, "reference"), ("reference, older profile", older, "reference")):
        hw = with_profile(H100, prof, EngineSpec.of(engine))
        proj[label] = float(evaluate(ModelSpec(), pts, hw)["projector"]["predicted_s"][0])
        noted = "memory.projector_cat (bfloat16) timed with table memory.transposed_cat" in " ".join(hw.prediction.notes)
        assert noted == (label == "fast, older profile"), label
    assert proj["fast, older profile"] > proj["fast"] * 1.2  # the slow transposed table instead of its own
    assert proj["reference"] == pytest.approx(proj["reference, older profile"])  # never the fast engine's table


def test_no_reference_row_gets_an_overlap_credit():
    """Eager kernels run one after another: with the credit, a SAM MLP row's GELU and add hide under its GEMMs."""
    pts = Points.build(mode="base", text_tokens=10, batch=8, decode_steps=0, logits="last")
    prof = _profile(True)
    seq = with_profile(H100, prof, EngineSpec.of("reference"))
    kernel = with_profile(H100, prof, EngineSpec.of("reference"), overlap="kernel")
    a, b = evaluate(ModelSpec(), pts, seq), evaluate(ModelSpec(), pts, kernel)
    for stage in ("sam", "clip", "prefill"):  # the default equals the kernel-overlap option for this engine
        np.testing.assert_allclose(a[stage]["predicted_s"], b[stage]["predicted_s"], rtol=1e-12)
    analytic = evaluate(ModelSpec(), pts, with_profile(H100, prof, EngineSpec.of("reference"), work="analytic"))
    assert float(a["sam"]["predicted_roofline_s"][0]) > float(analytic["sam"]["predicted_roofline_s"][0])


@pytest.mark.parametrize("name", [PERMUTED_COPY, PERMUTED_ADD])
@pytest.mark.parametrize("nbytes", [1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 28])  # a stream: 1.5 MB up
def test_the_calibration_times_the_models_own_op_at_the_bytes_of_its_entry(name, nbytes):
    make, op, input_set, kernels = kernel_op(name, {"bytes": nbytes}, "cpu", 64)
    x = make()
    stream = x if name == PERMUTED_COPY else x[0]
    moved = stream.numel() * 2 * (2 if name == PERMUTED_COPY else 3)  # bf16: read, write / read both, write
    assert input_set == stream.numel() * 2 * (1 if name == PERMUTED_COPY else 2)
    assert not stream.is_contiguous() and stream.shape[-1] == 768  # the stream seen channels last
    out = op(x)
    assert out.is_contiguous() if name == PERMUTED_COPY else out.stride() == stream.stride()
    # the entry moves its bytes (its efficiency is computed from them): within 10% from 1 MB up
    assert kernels == 1 and (abs(moved / nbytes - 1) < 0.1 if nbytes >= 1 << 20 else nbytes / 4 <= moved <= 4 * nbytes)


def test_the_patch_embedding_conv_has_its_own_table_and_falls_back_to_its_gemm():
    rows = _rows(batch=4)
    (conv,) = _plan(rows["sam.patch_embed"]).kernels
    assert conv.table == "conv" and conv.coords == dict(m=4 * 64 * 64, n=768, k=768)
    pts = Points.build(mode="base", text_tokens=10, batch=4, decode_steps=0, logits="last")
    slow = _profile(True)
    d = slow.to_dict()
    d["tables"]["conv.bfloat16"] = dict(d["tables"]["gemm.bfloat16"], efficiency=(
        np.asarray(d["tables"]["gemm.bfloat16"]["efficiency"]) * 0 + 0.01).tolist())
    conv_profile = profile_from_dict(d)
    hw = with_profile(H100, slow, EngineSpec.of("reference"))
    without = float(evaluate(ModelSpec(), pts, hw)["sam"]["predicted_s"][0])
    assert any("conv (bfloat16) timed with table gemm.bfloat16" in n for n in hw.prediction.notes)
    with_conv = float(evaluate(ModelSpec(), pts, with_profile(H100, conv_profile, EngineSpec.of("reference")))["sam"][
        "predicted_s"][0])
    assert with_conv > without  # the conv at 1% efficiency, against the GEMM table's 50%
    fast = [evaluate(ModelSpec(), pts, with_profile(H100, p, EngineSpec.of("fast")))["sam"]["predicted_s"][0]
            for p in (slow, conv_profile)]
    assert fast[0] == fast[1]  # the fast engine runs that conv as a GEMM


def test_the_conv_calibration_runs_the_models_conv_at_the_entrys_shape():
    make, op, nbytes, kernels = kernel_op("conv.bfloat16", {"m": 1024, "n": 768, "k": 768}, "cpu", 64)
    pixels, weight, bias = make()  # 1,024 positions: one 512 px view (32 x 32 patches); views of 64 x 64 from 4,096 up
    assert tuple(pixels.shape) == (1, 3, 512, 512) and tuple(weight.shape) == (768, 3, 16, 16)
    assert tuple(op((pixels, weight, bias)).shape) == (1, 768, 32, 32) and kernels == 1
