"""The DeepseekV2 LM: eager == SDPA, cached decoding == full forward, grouped MoE == dense reference, generation."""
import pytest
import torch
import torch.nn.functional as F

from dsocr_core.model import KVCache, flop_counter, meta_model, synthetic_model
from dsocr_core.model.decoder import MoE, RMSNorm, meta_routing, rope_cos_sin
from dsocr_core.spec import ModelSpec, tiny_spec


@pytest.fixture(scope="module")
def tiny():
    return synthetic_model(tiny_spec(), seed=0, dtype="float32")


def ids(b, s, seed=0):
    return torch.randint(3, 5000, (b, s), generator=torch.Generator().manual_seed(seed))


def run(model, attn, *args, **kw):
    model.set_attn_impl(attn)
    try:
        with torch.inference_mode():
            return model(*args, **kw)
    finally:
        model.set_attn_impl("sdpa")


def test_eager_equals_sdpa_fp32(tiny):
    x = ids(2, 33)
    full_e, cache_e = run(tiny, "eager", x)
    full_s, cache_s = run(tiny, "sdpa", x)
    torch.testing.assert_close(full_e, full_s, rtol=1e-5, atol=1e-5)
    step = ids(2, 1, seed=1)
    dec_e, _ = run(tiny, "eager", step, cache=cache_e)
    dec_s, _ = run(tiny, "sdpa", step, cache=cache_s)
    torch.testing.assert_close(dec_e, dec_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_cached_decode_equals_full_forward(tiny, attn):
    x = ids(2, 24, seed=2)
    full, _ = run(tiny, attn, x)
    logits, cache = run(tiny, attn, x[:, :15])
    steps = [logits]
    for i in range(15, 24):
        step, cache = run(tiny, attn, x[:, i:i + 1], cache=cache)
        steps.append(step)
    assert cache.length == 24
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    # a chunk of several tokens on top of a cache (S_q > 1, S_q != S_kv) uses the offset causal mask
    first, cache = run(tiny, attn, x[:, :10])
    rest, cache = run(tiny, attn, x[:, 10:], cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, rtol=1e-5, atol=1e-5)


def test_logits_last_and_cache_shapes(tiny):
    s = tiny.spec
    x = ids(3, 7)
    with torch.inference_mode():
        full, _ = tiny(x)
        last, cache = tiny(x, logits="last")
    assert last.shape == (3, 1, s.vocab_size) and last.dtype == torch.float32
    torch.testing.assert_close(last[:, 0], full[:, -1])
    assert isinstance(cache, KVCache) and len(cache) == s.num_hidden_layers and cache.length == 7
    for i in range(s.num_hidden_layers):
        assert cache.keys[i].shape == cache.values[i].shape == (3, s.num_attention_heads, 7, s.head_dim)
    assert cache.bytes_used == cache.bytes_allocated == 2 * s.num_hidden_layers * 3 * 7 * s.hidden_size * 4


def test_batch_rows_are_independent(tiny):
    x = ids(2, 12, seed=5)
    with torch.inference_mode():
        both, _ = tiny(x)
        one, _ = tiny(x[1:])
    torch.testing.assert_close(both[1:], one, rtol=1e-5, atol=1e-5)


def dense_moe_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, then pick the top-k by the router's fp32 softmax (no renorm)."""
    flat = x.reshape(-1, x.shape[-1])
    scores = torch.softmax(flat.double() @ moe.gate.weight.double().t(), dim=-1)
    w, idx = scores.topk(moe.k, dim=-1)
    all_out = torch.stack([e(flat).double() for e in moe.experts], dim=1)  # [T, E, H]
    picked = all_out.gather(1, idx[..., None].expand(-1, -1, flat.shape[-1]))
    y = (picked * w[..., None]).sum(1) * moe.gate.scale + moe.shared_experts(flat).double()
    return y.view(x.shape)


def test_moe_grouped_equals_dense_reference(tiny):
    moe = tiny.model.layers[1].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(3, 11, tiny.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    calls = []
    hooks = [e.register_forward_hook(lambda mod, inp, out, i=i: calls.append((i, inp[0].shape[0])))
             for i, e in enumerate(moe.experts)]
    try:
        with torch.inference_mode():
            got = moe(x)
    finally:
        for h in hooks:
            h.remove()
    with torch.inference_mode():
        ref = dense_moe_reference(moe, x)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
    # each expert that got tokens ran exactly once; together they saw T*k token rows
    experts = [i for i, _ in calls]
    assert len(experts) == len(set(experts))
    assert sum(n for _, n in calls) == 3 * 11 * tiny.spec.num_experts_per_tok


def test_moe_single_token_runs_only_k_experts(tiny):
    moe = tiny.model.layers[2].mlp
    calls = []
    hooks = [e.register_forward_hook(lambda *a: calls.append(1)) for e in moe.experts]
    try:
        with torch.inference_mode():
            moe(torch.randn(1, 1, tiny.spec.hidden_size))
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == tiny.spec.num_experts_per_tok


def test_meta_routing_counts_t_times_k():
    spec = ModelSpec()
    routing = meta_routing(37, spec.num_experts_per_tok, spec.n_routed_experts)
    assert all(len(set(row)) == spec.num_experts_per_tok for row in routing.tolist())
    moe = meta_model(spec).model.layers[1].mlp
    T = 37
    with flop_counter() as fc:
        moe(torch.empty(1, T, spec.hidden_size, device="meta", dtype=torch.bfloat16))
    H = spec.hidden_size
    want = (2 * T * H * spec.n_routed_experts + 3 * 2 * T * spec.num_experts_per_tok * H * spec.moe_intermediate_size
            + 3 * 2 * T * H * spec.shared_intermediate_size)
    assert fc.get_total_flops() == want


def test_rmsnorm_computes_in_fp32():
    norm = RMSNorm(8, 1e-6).bfloat16()
    x = torch.randn(4, 8) * 300
    got = norm(x.bfloat16())
    ref = (x.bfloat16().float() * torch.rsqrt(x.bfloat16().float().pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    assert got.dtype == torch.bfloat16 and torch.equal(got, ref)


def test_rope_rotates_all_dims_with_theta():
    cos, sin = rope_cos_sin(torch.tensor([0, 1, 5]), 8, 10000.0, torch.float32)
    assert cos.shape == (3, 8)
    assert torch.equal(cos[0], torch.ones(8)) and torch.equal(sin[0], torch.zeros(8))
    inv = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)
    torch.testing.assert_close(cos[2], torch.cat([(5 * inv).cos()] * 2))


def test_eager_mask_offset_matches_reference():
    """S_q < S_kv: query i sees keys 0..(S_kv - S_q + i); compare with SDPA on the full sequence."""
    from dsocr_core.model.decoder import causal_mask
    m = causal_mask(3, 5, "cpu")
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    part = F.scaled_dot_product_attention(q[:, :, 2:], k, v, attn_mask=m)
    torch.testing.assert_close(part, full[:, :, 2:])


def test_tiny_bf16_generates_varied_tokens():
    model = synthetic_model(tiny_spec(), seed=0, dtype="bfloat16")
    prompt = torch.tensor([[0, 128825, 400, 401, 402, 128826]])
    from types import SimpleNamespace

    from dsocr_core.runtime.engine import OneShotEngine
    from dsocr_core.runtime.generate import Greedy

    text_only = SimpleNamespace(input_ids=prompt, images=None, images_seq_mask=None, images_spatial_crop=None)
    out = torch.stack(list(Greedy(OneShotEngine(model), text_only, 24, 0, stop_at_eos=False)), 1)
    assert out.shape == (1, 24)
    assert len(set(out[0].tolist())) > 5
    with torch.inference_mode():
        logits, _ = model(torch.cat([prompt, out], dim=1))
    assert torch.isfinite(logits).all()


def test_attn_impl_validated():
    with pytest.raises(ValueError, match="attn_impl"):
        meta_model(tiny_spec(), attn_impl="flash")
