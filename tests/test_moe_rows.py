"""The grouped MoE's row kernels (dsocr_core/fast/moe_rows.py) on the CPU, through Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess): the grouping gives exactly the stable
sort's places and group ends, the copy into expert order is exact, the weighted combine with the residual equals
torch's formulation (float32: the interpreter rounds to bfloat16 by truncation, unlike the GPU), and the fast
engine's prefill and generation with the kernels (moe_rows='triton') equal the torch formulation's. On a GPU the
same kernels run compiled inside the prefill layer (tests/test_fast_gpu.py, benchmarks/moe_rows.py)."""
import importlib.util

import pytest
from triton_interpreter import interpreted_result

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed: the row kernels exist only as Triton code")

SCRIPT = r"""
import json
import torch
from dsocr_core.fast import moe, moe_rows
from dsocr_core.model.checkpoint import synthetic_model
from dsocr_core.runtime.inputs import synthetic_inputs
from dsocr_core.runtime.session import Session
from dsocr_core.spec import tiny_spec
from dsocr_core.runtime.tokenizer import load_tokenizer

out = {"grouping": [], "scatter": [], "combine": []}
g = torch.Generator().manual_seed(0)
# (tokens, slots, experts): one token; routed + shared slots of distinct experts; more rows than one chunk; a
# skewed draw with repeats across tokens; several chunks of a few experts
for t, k, e in ((1, 8, 66), (37, 8, 66), (700, 8, 66), (300, 3, 10), (1500, 4, 66)):
    if t < 1000:
        skew = torch.arange(e, dtype=torch.float64).add(1).pow(-1.2)
        ids = torch.multinomial(skew.expand(t, e), k, replacement=False, generator=g)
    else:
        ids = torch.randint(0, e, (t, k), generator=g)
    dest, ends = moe_rows.group_rows(ids, e)
    want_dest, want_ends = moe.group_rows_sorted(ids, e)
    out["grouping"].append([torch.equal(dest, want_dest), torch.equal(ends, want_ends.to(torch.int32)),
                            str(dest.dtype), str(ends.dtype)])
    h = 40
    x = torch.randn(t, h, generator=g)
    xs = moe_rows.scatter_rows(x, dest, k)
    out["scatter"].append(torch.equal(xs, moe.to_expert_order(x, dest, k)))
    ys = torch.randn(t * k, h, generator=g)
    w = torch.rand(t, k, generator=g)
    got = moe_rows.gather_combine(ys, dest, w, x)
    want = moe.combine_rows(ys, dest, w, x)
    out["combine"].append(float((got - want).abs().max()))
# more rows than one step of the chunks' offsets scan: its steps are 1,024 chunks of 256 rows, here 8 chunks (the
# kernel takes the step as a parameter), so 24,000 rows take 12 steps without interpreting 260,000 rows
scan, moe_rows.GROUP_SCAN = moe_rows.GROUP_SCAN, 8
ids = torch.randint(0, 66, (3000, 8), generator=g)
dest, ends = moe_rows.group_rows(ids, 66)
want_dest, want_ends = moe.group_rows_sorted(ids, 66)
out["two_scan_steps"] = [ids.numel() > moe_rows.GROUP_CHUNK * moe_rows.GROUP_SCAN, torch.equal(dest, want_dest),
                         torch.equal(ends, want_ends.to(torch.int32))]
moe_rows.GROUP_SCAN = scan
# above the kernels' row limit expert_rows groups with torch's formulation, the same places
t, e, h, im = 9, 6, 16, 8
ids = torch.stack([torch.randperm(e, generator=g)[:3] for _ in range(t)])
x, w13, w2 = torch.randn(t, h, generator=g), torch.randn(e, 2 * im, h, generator=g), torch.randn(e, h, im, generator=g)
want = moe.expert_rows(x, ids, w13, w2, im, "sort", "torch")
limit, moe_rows.GROUP_MAX_ROWS = moe_rows.GROUP_MAX_ROWS, 10
got = moe.expert_rows(x, ids, w13, w2, im, "sort", "triton")
moe_rows.GROUP_MAX_ROWS = limit
out["fallback"] = [torch.equal(got[1], want[1]), float((got[0] - want[0]).abs().max())]
try:
    moe_rows.group_rows(torch.zeros(moe_rows.GROUP_MAX_ROWS + 1, dtype=torch.long), 4)
    out["too_many_rows"] = None
except ValueError as exc:
    out["too_many_rows"] = str(exc)

# the engine: prefill logits and generated tokens with the kernels against the torch formulation
spec = tiny_spec()
ref = Session(synthetic_model(spec, seed=0, dtype="float32"), spec, load_tokenizer(None), torch.device("cpu"),
              "float32", {"source": "synthetic", "detail": "tiny seed 0", "synthetic": True})
few = synthetic_inputs("small", (1, 1), text_tokens=12, batch=2, seed=3)
fast_rows = ref.with_mode("fast", bucket=32, moe_rows="triton", moe="grouped")
torch_rows = ref.with_mode("fast", bucket=32, moe_rows="torch", moe="grouped")
out["engine_rows"] = [fast_rows.engine.moe_rows, torch_rows.engine.moe_rows]
a, b = fast_rows.prefill(few, logits="all", room=4), torch_rows.prefill(few, logits="all", room=4)
out["prefill_max_abs_diff"] = float((a.logits - b.logits).abs().max())
out["tokens_triton"] = fast_rows.generate(few, max_new_tokens=5, no_repeat_ngram_size=0).generated_ids
out["tokens_torch"] = torch_rows.generate(few, max_new_tokens=5, no_repeat_ngram_size=0).generated_ids
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def result():
    return interpreted_result(SCRIPT)


def test_grouping_gives_the_stable_sorts_places_and_ends(result):
    assert result["grouping"] == [[True, True, "torch.int64", "torch.int32"]] * 5


def test_the_offsets_scan_carries_across_its_steps(result):
    assert result["two_scan_steps"] == [True, True, True]


def test_too_many_rows_are_refused_and_expert_rows_groups_them_with_torch(result):
    assert "group_rows takes up to" in result["too_many_rows"]
    assert result["fallback"] == [True, 0.0]


def test_copy_into_expert_order_is_exact(result):
    assert result["scatter"] == [True] * 5


def test_weighted_combine_with_the_residual_equals_torch(result):
    assert max(result["combine"]) < 1e-5


def test_engine_with_the_row_kernels_equals_the_torch_rows(result):
    assert result["engine_rows"] == ["triton", "torch"]
    assert result["prefill_max_abs_diff"] < 1e-4
    assert result["tokens_triton"] == result["tokens_torch"]


def test_the_torch_formulations_are_the_indexing_they_replace():
    """moe.to_expert_order and moe.combine_rows (what moe_rows' kernels are checked against, and what the engine
    runs with moe_rows='torch') against plain loops over the tokens and slots."""
    import torch

    from dsocr_core.fast import moe

    g = torch.Generator().manual_seed(1)
    t, k, h = 5, 3, 4
    ids = torch.stack([torch.randperm(6, generator=g)[:k] for _ in range(t)])
    dest, _ = moe.group_rows_sorted(ids, 6)
    x, w = torch.randn(t, h, generator=g), torch.rand(t, k, generator=g)
    xs = moe.to_expert_order(x, dest, k)
    ys = torch.randn(t * k, h, generator=g)
    for i in range(t):
        for j in range(k):
            assert torch.equal(xs[dest[i * k + j]], x[i])
    want = torch.stack([x[i] + sum(ys[dest[i * k + j]] * w[i, j] for j in range(k)) for i in range(t)])
    assert torch.allclose(moe.combine_rows(ys, dest, w, x), want, atol=1e-6)
