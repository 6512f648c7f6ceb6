"""Fast session mode on the CPU: tiny spec, float32, the same weights as the reference. Greedy tokens must match
the reference exactly; the fast kernels' building blocks must compute the reference functions."""
import pytest
import torch

from dsocr_core.fast import FastEngine, StaleCacheError
from dsocr_core.fast.attention import decode_attention, sam_attention
from dsocr_core.fast.moe import (experts_gather, experts_grouped, group_rows, group_rows_sorted, moe_forward,
                                  route, topk_argmax, with_shared)
from dsocr_core.measure.token_parity import compare
from dsocr_core.runtime.generate import cut_after_all_finished
from dsocr_core.fast.vision import sam_block_args
from dsocr_core.fast.weights import LMWeights, stack_experts
from dsocr_core.model.checkpoint import synthetic_model
from dsocr_core.model.decoder import MoE
from dsocr_core.model.sam import SamAttention, SamBlock
from dsocr_core.runtime.inputs import synthetic_inputs
from dsocr_core.runtime.session import Session
from dsocr_core.spec import tiny_spec
from dsocr_core.runtime.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def sessions():
    spec = tiny_spec()
    model = synthetic_model(spec, seed=5, dtype="float32")
    ref = Session(model, spec, load_tokenizer(None), torch.device("cpu"), "float32",
                  {"source": "synthetic", "detail": "tiny seed 5", "synthetic": True})
    return ref, ref.with_mode("fast", bucket=32)


def _close(a, b, tol=1e-5):
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


# ------------------------------------------------------------------------------------------ building blocks
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("impl", ["fold", "flex", "dense"])
@pytest.mark.parametrize("h,w,rel", [(14, 14, 14), (16, 16, 16), (10, 10, 16), (12, 7, 12)])
def test_sam_attention_equals_dense_bias(impl, h, w, rel):
    """The rel-pos bias folded into q/k, or added per score by FlexAttention, gives the reference attention
    (incl. resized tables and non-square windows, where row = j // w and column = j % w must not be swapped)."""
    torch.manual_seed(0)
    attn = SamAttention(width=32, heads=2, rel_size=rel)
    with torch.no_grad():
        attn.rel_pos_h.normal_(0, 0.5)
        attn.rel_pos_w.normal_(0, 0.5)
    x = torch.randn(3, h, w, 32)
    with torch.no_grad():
        assert _close(sam_attention(attn, x, impl), attn(x))


def test_sam_attention_rejects_unknown_impl():
    attn = SamAttention(width=32, heads=2, rel_size=4)
    with pytest.raises(ValueError, match="SAM attention"):
        sam_attention(attn, torch.randn(1, 4, 4, 32), "cudnn")
    with pytest.raises(ValueError, match="sam_attention"):
        FastEngine(synthetic_model(tiny_spec(), seed=0, dtype="float32"), sam_attention="cudnn")


def test_packed_clip_equals_per_group(sessions):
    """CLIP over every view group's rows at once (one layer call per layer) equals one group at a time."""
    from dsocr_core.fast.vision import run_clip
    ref, _ = sessions
    torch.manual_seed(2)
    clip = ref.model.model.vision_model
    width = clip.embeddings.class_embedding.shape[0]
    sams = [torch.randn(1, width, 4, 4), torch.randn(3, width, 2, 2)]  # a global view and three tiles
    with torch.no_grad():
        packed = run_clip(ref.model, sams, packed=True)
        apart = run_clip(ref.model, sams, packed=False)
        want = [clip(s) for s in sams]
    for p, a, w in zip(packed, apart, want):
        assert p.shape == w.shape
        assert _close(p, w) and _close(a, w)


@pytest.mark.parametrize("grids", [[(1, 1)], [(3, 2)], [(2, 3), (1, 1), (3, 1)], [(1, 1), (1, 1), (2, 2)]])
def test_gathered_projector_layout_equals_the_reference_loop(sessions, grids):
    """run_projector writes each view group's projected rows into one source beside the layout vectors and
    gathers every slot from it (slot_sources, once per input shape): exactly the slots the reference's per-image
    layout_image loop writes, for untiled, tiled and mixed rows (the global views and the tiles are two view
    groups of different sizes)."""
    ref, _ = sessions
    m = ref.model.model
    torch.manual_seed(4)
    saved = m.image_newline.detach().clone(), m.view_seperator.detach().clone()
    try:
        with torch.no_grad():  # layout vectors that differ from each other and from the features
            m.image_newline.copy_(torch.randn_like(m.image_newline))
            m.view_seperator.copy_(torch.randn_like(m.view_seperator))
        _check_gathered_layout(ref, grids)
    finally:  # the module's sessions share this model
        with torch.no_grad():
            m.image_newline.copy_(saved[0])
            m.view_seperator.copy_(saved[1])


def _check_gathered_layout(ref, grids):
    from dsocr_core.fast.vision import run_projector, run_projector_per_image, slot_sources, view_groups
    m, spec = ref.model.model, ref.spec
    px, g, t = 4 * spec.sam_patch, 4, 2
    views = []
    for tw, th in grids:
        views.append(torch.zeros(1, 3, g * px, g * px))
        if (tw, th) != (1, 1):
            views.append(torch.zeros(tw * th, 3, t * px, t * px))
    groups = view_groups(views)
    width = m.vision_model.embeddings.class_embedding.shape[0]
    sams, clips = [], []
    for grp in groups:
        n, side = sum(views[i].shape[0] for i in grp), views[grp[0]].shape[-1] // px
        sams.append(torch.randn(n, spec.sam_downsample[-1], side, side))
        clips.append(torch.randn(n, 1 + side * side, width))
    layout = slot_sources(views, groups, grids, px)
    with torch.no_grad():
        got = run_projector(ref.model, groups, sams, clips, layout, layout.source(ref.model, sams[0]))
        want = run_projector_per_image(ref.model, views, groups, grids, sams, clips)  # layout_image per image
    assert [w.shape[0] for w in want] == [
        (th * t * (tw * t + 1) if (tw, th) != (1, 1) else 0) + g * (g + 1) + 1 for tw, th in grids]
    assert layout.count == sum(w.shape[0] for w in want)
    assert torch.equal(got, torch.cat(want))


def test_slot_sources_refuses_views_that_do_not_fit_their_grid():
    """A crop count other than the grid's, or a row with more than one global view, is a clear error (the
    reference's layout_image raises for the first too), not a shape error inside a GEMM."""
    from dsocr_core.fast.vision import slot_sources, view_groups
    px = 16
    bad = [torch.zeros(1, 3, 4 * px, 4 * px), torch.zeros(5, 3, 2 * px, 2 * px)]  # a 3x2 grid needs 6 crops
    with pytest.raises(ValueError, match="needs 6 crops"):
        slot_sources(bad, view_groups(bad), [(3, 2)], px)
    two = [torch.zeros(2, 3, 4 * px, 4 * px)]
    with pytest.raises(ValueError, match="global view must be one view"):
        slot_sources(two, view_groups(two), [(1, 1)], px)


def test_moe_grouped_and_gather_equal_reference():
    spec = tiny_spec()
    torch.manual_seed(1)
    moe = MoE(spec)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    w13, w2 = stack_experts(moe, spec)
    assert w13.shape == (spec.n_routed_experts + spec.n_shared_experts, 2 * spec.moe_intermediate_size,
                         spec.hidden_size)
    x = torch.randn(7, spec.hidden_size)
    gate32 = moe.gate.weight.float()
    kw = dict(k=spec.num_experts_per_tok, n_routed=spec.n_routed_experts, shared_slots=spec.n_shared_experts,
              inner=spec.moe_intermediate_size, norm_topk_prob=False, scale=1.0)
    with torch.no_grad():
        want = moe(x[None])[0]
        for impl, gemv in (("grouped", "linear"), ("gather", "linear"), ("gather", "reduce")):
            assert _close(moe_forward(x, gate32, w13, w2, impl=impl, gemv=gemv, **kw), want), (impl, gemv)
        # the two expert kernels agree slot by slot
        w, ids = with_shared(*route(x, gate32, spec.num_experts_per_tok, False, 1.0), spec.n_routed_experts,
                             spec.n_shared_experts)
        assert _close(experts_grouped(x, ids, w13, w2, spec.moe_intermediate_size),
                      experts_gather(x, ids, w13, w2, spec.moe_intermediate_size, "reduce"))


def test_sort_free_grouping_and_argmax_topk_match_torch():
    torch.manual_seed(3)
    ids = torch.randint(0, 10, (37, 8))
    (dest_a, ends_a), (dest_b, ends_b) = group_rows(ids, 12), group_rows_sorted(ids, 12)
    assert torch.equal(dest_a, dest_b) and torch.equal(ends_a, ends_b)
    order = torch.sort(ids.reshape(-1), stable=True)[1]
    assert torch.equal(dest_a[order], torch.arange(ids.numel()))  # dest is the stable sort's inverse
    scores = torch.softmax(torch.randn(9, 64), -1)
    v, i = topk_argmax(scores, 6)
    tv, ti = torch.topk(scores, 6)
    assert torch.equal(i, ti) and torch.equal(v, tv)


def test_decode_attention_masks_later_slots():
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 4, 16), torch.randn(2, 4, 40, 16), torch.randn(2, 4, 40, 16)
    pos = torch.tensor([22])
    want = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k[:, :, :23], v[:, :, :23])[:, :, 0]
    k[:, :, 23:] = 1e3  # garbage beyond pos must not matter
    for impl in ("reduce", "sdpa"):
        assert _close(decode_attention(q, k, v, pos, impl), want)


def test_weights_share_and_count_copies(sessions):
    ref, _ = sessions
    w = LMWeights.from_model(ref.model)
    assert w.embed.data_ptr() == ref.model.model.embed_tokens.weight.data_ptr()
    assert w.lm_head.data_ptr() == ref.model.lm_head.weight.data_ptr()
    assert w.extra_bytes == sum(w.extra.values()) > 0
    assert [lw.moe for lw in w.layers] == [False, True, True]


# ------------------------------------------------------------------------------------------ same answers
@pytest.mark.parametrize("mode,grid,batch,steps", [("small", (1, 1), 2, 40), ("gundam", (2, 1), 1, 40)])
def test_fast_tokens_equal_reference(sessions, mode, grid, batch, steps):
    ref, fast = sessions
    inputs = synthetic_inputs(mode, grid, text_tokens=10, batch=batch, seed=11)
    r = compare(ref, fast, inputs, steps, no_repeat_ngram_size=20, teacher_forced=False)
    assert r["tokens_equal"], r["first_divergence"]
    assert r["max_logit_abs_diff"] < 1e-4


def test_the_per_image_projector_layout_gives_the_same_tokens(sessions):
    """projector_layout='per_image' (the reference's cats per image, how runs before that option ran) stays
    selectable and gives what the default gather gives."""
    ref, fast = sessions
    per_image = ref.with_mode("fast", bucket=32, projector_layout="per_image")
    assert per_image.engine.describe()["projector_layout"] == "per_image"
    inputs = synthetic_inputs("gundam", (2, 1), text_tokens=10, batch=2, seed=12)
    r = compare(fast, per_image, inputs, 12, no_repeat_ngram_size=20, teacher_forced=False)
    assert r["tokens_equal"], r["first_divergence"]
    assert r["max_logit_abs_diff"] == 0.0


def test_generate_matches_reference_with_active_ngram_ban(sessions):
    ref, fast = sessions
    inputs = synthetic_inputs("small", (1, 1), text_tokens=10, batch=2, seed=3)
    free = fast.generate(inputs, max_new_tokens=60, no_repeat_ngram_size=0)
    want = ref.generate_one_shot(inputs, max_new_tokens=60, no_repeat_ngram_size=3)
    got = fast.generate(inputs, max_new_tokens=60, no_repeat_ngram_size=3)
    assert got.generated_ids == want.generated_ids
    assert free.generated_ids != got.generated_ids  # the ban is active
    assert got.path == "separated" and got.session_mode == "fast"
    assert got.timings["tpot_s"] > 0 and got.timings["prefill"] > 0
    assert want.path == "one-shot" and want.session_mode == "reference"  # one-shot is always the yardstick
    d = fast.describe()
    assert d["session_mode"] == "fast" and d["engine"]["cuda_graphs"] is False and d["engine"]["compile"] is False


def test_separated_path_verifies_and_old_handles_go_stale(sessions):
    _, fast = sessions
    inputs = synthetic_inputs("small", (1, 1), text_tokens=10, batch=1, seed=4)
    sep = fast.generate_separated(inputs, max_new_tokens=12, logits="last")
    assert sep.verification["passed"], sep.verification
    first = fast.prefill(inputs)
    fast.prefill(inputs)
    with pytest.raises(StaleCacheError):
        fast.decode_step(first.logits[:, -1].argmax(-1), first.cache)


def test_cache_grows_past_its_capacity(sessions):
    """A bare prefill leaves room for some tokens; decoding past it moves the cache, tokens unchanged."""
    ref, _ = sessions
    fast = ref.with_mode("fast", bucket=16, min_room=0)
    inputs = synthetic_inputs("small", (1, 1), text_tokens=10, batch=1, seed=6)
    pre = fast.prefill(inputs, room=2)
    cap = pre.cache.state.capacity
    rpre = ref.prefill(inputs, logits="last")
    tok = rtok = pre.logits[:, -1].argmax(-1)
    rcache, cache = rpre.cache, pre.cache
    for _ in range(cap - inputs.seq_len + 20):
        logits = fast.decode_step(tok, cache)
        rlogits = ref.decode_step(rtok, rcache)
        tok, rtok = logits.argmax(-1), rlogits.argmax(-1)
        assert torch.equal(tok, rtok)
    assert cache.state.capacity > cap and cache.length == rcache.length


def test_steps_after_every_row_finished_are_dropped():
    eos = 1
    steps = [torch.tensor([5, 6]), torch.tensor([eos, 7]), torch.tensor([2, eos]), torch.tensor([2, 2])]
    assert len(cut_after_all_finished(steps, eos)) == 3
    assert len(cut_after_all_finished(steps[:2], eos)) == 2  # row 1 never finished: keep everything


def test_load_session_modes():
    fast = Session.load(synthetic="tiny", device="cpu", dtype="float32", session_mode="fast",
                        engine_options={"bucket": 64})
    assert fast.describe()["session_mode"] == "fast" and fast.session_mode == "fast"
    assert fast.engine.bucket == 64 and fast.engine.mode == "fast"
    ref = fast.with_mode("reference")
    assert ref.model is fast.model and ref.lock is fast.lock and ref.engine.mode == "reference"
    with pytest.raises(ValueError, match="session_mode"):
        Session.load(synthetic="tiny", device="cpu", session_mode="turbo")
    with pytest.raises(ValueError, match="reference engine takes no options"):
        Session.load(synthetic="tiny", device="cpu", dtype="float32", engine_options={"bucket": 64}).engine
    with pytest.raises(ValueError):
        FastEngine(fast.model, moe="loop")


def test_a_short_warm_up_and_the_longer_run_share_one_state(sessions):
    """Every prefill leaves min_room decode positions, so the state (its graphs and compiled prefill) built by a
    short warm-up is the one the longer timed run uses."""
    ref, _ = sessions
    fast = ref.with_mode("fast", bucket=16, min_room=64)
    inputs = synthetic_inputs("small", (1, 1), text_tokens=10, batch=1, seed=6)
    warm = fast.prefill(inputs, room=2).cache.state
    timed = fast.prefill(inputs, room=40).cache.state
    assert timed is warm and warm.capacity >= inputs.seq_len + 64
    assert fast.prefill(inputs, room=100).cache.state.capacity >= inputs.seq_len + 100  # more room: grown


def test_both_engines_share_one_cache_interface(sessions):
    """length, history, bytes used and allocated mean the same in both engines' caches."""
    inputs = synthetic_inputs("small", (1, 1), text_tokens=10, batch=1, seed=2)
    for session in sessions:
        pre = session.prefill(inputs, room=8)
        cache = pre.cache
        t = inputs.seq_len
        assert cache.length == t and torch.equal(cache.history[:, :t], inputs.input_ids)
        kv_row = 2 * session.spec.num_hidden_layers * session.spec.hidden_size * 4  # float32 keys + values
        assert cache.bytes_used == t * kv_row
        assert cache.bytes_allocated >= cache.bytes_used
        session.decode_step(pre.logits[:, -1].argmax(-1), cache)
        assert cache.length == t + 1 and cache.bytes_used == (t + 1) * kv_row


def test_fast_separated_kv_length_is_its_own():
    """The verification reads the separated run's cache before the reference run reuses any buffers."""
    fast = Session.load(synthetic="tiny", device="cpu", dtype="float32", session_mode="fast")
    inputs = fast.to_device(synthetic_inputs("tiny", (1, 1), 10, 1))
    sep = fast.generate_separated(inputs, max_new_tokens=6)
    v = sep.verification
    assert v["kv_length"] == inputs.seq_len + 5 == v["kv_length_expected"] and v["passed"]


def test_compiled_falls_back_and_says_why():
    """A function that cannot compile runs its fallback (SAM: folded attention instead of eager FlexAttention,
    which would materialise every score) and keeps the reason for describe()."""
    from dsocr_core.fast.compiled import Compiled
    from dsocr_core.fast.vision import sam_block_eager, sam_block_fn

    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    f = Compiled(breaks, None, dynamic=False, fallback=lambda x: x + 2)
    assert torch.equal(f(torch.zeros(2)), torch.full((2,), 2.0)) and "graph_break" in f.error.replace(" ", "_")
    block = SamBlock(tiny_spec(), window=4)
    x = torch.randn(1, 8, 8, block.norm1.weight.shape[0])
    args = (x, *sam_block_args(block), block.window, block.attn.heads)
    with torch.no_grad():
        assert torch.equal(sam_block_eager(*args, "flex"), sam_block_fn(*args, "fold"))


def test_out_of_memory_fails_the_call_without_giving_up_compiling_or_capturing():
    """A CUDA out-of-memory error belongs to one call's size, not to the function: it reaches the caller (a sweep
    records the point as oom) and the next call compiles, or captures, as a fresh process would. (Kept as a
    reason to fall back for good, one large point ran every later point of a sweep on the eager fallback.)"""
    from dsocr_core.fast.compiled import Compiled
    from dsocr_core.runtime.oom import out_of_memory

    f = Compiled(lambda x: x + 1, None, dynamic=False, fallback=lambda x: x + 2)
    calls = []

    def fails_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("compile failed") from torch.OutOfMemoryError("CUDA out of memory")
        return args[0] + 1

    f.compiled = fails_once
    with pytest.raises(RuntimeError, match="compile failed"):
        f(torch.zeros(2))
    assert f.error is None and torch.equal(f(torch.zeros(2)), torch.ones(2)) and f.state()["shapes"] == "static"
    assert out_of_memory(torch.OutOfMemoryError("x")) and not out_of_memory(RuntimeError("x"))
    assert out_of_memory(RuntimeError("CUDA error: out of memory"))  # the sweep records such a point as oom
    wrapped = RuntimeError("compile failed")
    wrapped.__cause__ = torch.OutOfMemoryError("CUDA out of memory")
    from dsocr_core.measure.sweep import failure
    assert failure(wrapped)[0] == "oom" and failure(RuntimeError("shape mismatch"))[0] == "error"
    # CUDA graph capture: tests/test_fast_gpu.py (capturing needs a GPU)


def test_patch_embed_gemm_equals_conv():
    from dsocr_core.fast.vision import patch_embed
    torch.manual_seed(4)
    conv = torch.nn.Conv2d(3, 24, kernel_size=16, stride=16)
    pixels = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        assert _close(patch_embed(conv, pixels), conv(pixels).permute(0, 2, 3, 1))


def test_last_only_layer_equals_last_row_and_fills_the_cache(sessions):
    """The final prefill layer on the last position only: same output row, same keys/values written."""
    from dsocr_core.fast.lm import make_prefill_layer
    _, fast = sessions
    eng = fast.engine
    cfg, lw = eng.cfg, eng.w.layers[-1]
    torch.manual_seed(6)
    b, t = 2, 9
    x = torch.randn(b, t, cfg.hidden)
    cos, sin = eng.cos_t[:t], eng.sin_t[:t]
    caches = [torch.zeros(b, cfg.heads, t + 5, cfg.head_dim) for _ in range(4)]  # room after the prompt
    args = (lw.ln1, lw.wqkv, lw.wo, lw.ln2, lw.w13, lw.w2, lw.gate)
    with torch.no_grad():
        full = make_prefill_layer(cfg)(x, cos, sin, caches[0], caches[1], *args)
        last = make_prefill_layer(cfg, last_only=True)(x, cos, sin, caches[2], caches[3], *args)
    assert last.shape == (b, 1, cfg.hidden)
    assert _close(last, full[:, -1:])
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0][:, :, :t].abs().sum() > 0 and not caches[0][:, :, t:].any()  # the prompt's positions only


def test_resized_positions_are_cached_per_grid(sessions):
    from dsocr_core.fast.vision import Positions, run_clip, run_sam, view_groups
    ref, _ = sessions
    torch.manual_seed(8)
    px = ref.spec.sam_patch * 4 * 2
    views = [torch.randn(1, 3, 2 * px, 2 * px), torch.randn(2, 3, px, px)]
    cache = Positions()
    with torch.no_grad():
        sams = run_sam(ref.model, views, view_groups(views), positions=cache)
        keys = set(cache)
        run_clip(ref.model, sams, positions=cache)
        clip_keys = set(cache) - keys
        first = dict(cache)
        run_sam(ref.model, views, view_groups(views), positions=cache)
        run_clip(ref.model, sams, positions=cache)
    assert {k[0] for k in keys} == {"sam"} and len(keys) == 2
    assert {k[0] for k in clip_keys} == {"clip"} and len(clip_keys) == 2
    assert set(cache) == set(first) and all(cache[k] is first[k] for k in cache)  # reused, not recomputed
    g = sams[1].shape[-1]  # the tiles' grid, resized from the table's
    assert torch.equal(cache[("clip", g, g)], ref.model.model.vision_model.embeddings._positions(g, g))
