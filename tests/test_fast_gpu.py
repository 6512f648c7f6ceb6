"""Fast vs reference on a GPU with the FULL spec (bf16, synthetic weights): same greedy tokens up to bf16
rounding. Run on the device machine: `pytest -m gpu tests/test_fast_gpu.py`.

bf16 logits are coarse (one unit in the last place is 1/64 near 2), so two correct implementations that round
differently can pick different tokens where the reference's top two scores are (nearly) tied; after such a
flip the histories differ and so does everything after. The test therefore checks (1) greedy tokens, and when
they differ, that the first divergence sits where the reference's margin is within the logit difference the
two paths show on identical inputs; (2) teacher forcing (both paths fed the reference's tokens): every step
agrees except at such rounding ties.
"""
import pytest
import torch

from dsocr_core.measure.token_parity import compare, greedy_trace
from dsocr_core.model.checkpoint import synthetic_model
from dsocr_core.runtime.inputs import synthetic_inputs
from dsocr_core.runtime.session import Session
from dsocr_core.spec import ModelSpec
from dsocr_core.runtime.tokenizer import load_tokenizer

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def sessions():
    spec = ModelSpec()
    model = synthetic_model(spec, seed=0, dtype="bfloat16", device="cuda")
    ref = Session(model, spec, load_tokenizer(None), torch.device("cuda"), "bfloat16",
                  {"source": "synthetic", "detail": "full seed 0", "synthetic": True})
    return ref, ref.with_mode("fast")


def _page(batch: int, seed: int):
    return synthetic_inputs("gundam", (2, 2), text_tokens=10, batch=batch, seed=seed, dtype=torch.bfloat16,
                            device="cuda")


@pytest.mark.parametrize("batch,steps", [(1, 48), (4, 32)])
def test_full_spec_greedy_tokens_match_up_to_rounding(sessions, batch, steps):
    ref, fast = sessions
    r = compare(ref, fast, _page(batch, 21 + batch), steps, no_repeat_ngram_size=20)
    tf = r["teacher_forced"]
    print({k: v for k, v in r.items() if k not in ("reference_tokens", "fast_tokens")})
    assert tf["all_rounding_flips"], tf["disagreements"]
    assert tf["agree"] >= 0.9 * tf["total"]
    if not r["tokens_equal"]:
        d = r["first_divergence"]
        assert d["reference_margin"] <= 2 * tf["max_logit_abs_diff"], d
    # the fast path's logits stay within bf16 rounding of the reference's on identical inputs
    assert tf["median_logit_abs_diff"] <= 0.05


def test_fused_generation_is_what_its_own_logits_choose(sessions):
    """The fused batch-1 generation (ban, choice and position update on the device, two steps per graph launch,
    graphs captured during this very call), checked with teacher-forced evidence on its own 300 tokens:
    1. the fused kernels, fed those tokens one step at a time with the choice made on the host (next_tokens),
       choose every one of them again: the device-side ban, choice and position update agree with the host's;
    2. the unfused path (compiled torch pieces) fed the same tokens agrees at every step but where the top two
       scores lie within the two paths' logit difference on that history (a bf16 rounding tie; on an H200 with
       page seed 31: one step, 80, whose fused and reference margins are exactly 0);
    3. the device position equals the cache length afterwards.
    Comparing the two free-running generations instead would fail on such a tie at any step (it did, at 40 and
    80 of 300), and would prove nothing about either path."""
    ref, _ = sessions
    page = _page(1, 31)
    fused = ref.with_mode("fast")  # fresh engine: every step graph is captured during the generation
    plain = ref.with_mode("fast", fused=False)
    gen = fused.generate(page, max_new_tokens=300, no_repeat_ngram_size=20)  # crosses a bucket edge
    st = fused.engine._states[1]
    assert int(st.pos) == st.cache.length
    tokens = gen.generated_ids[0]
    forced = torch.tensor([tokens], device="cuda")
    own = greedy_trace(fused, page, len(tokens), 20, force=forced)
    assert own["tokens"][0].tolist() == tokens
    other = greedy_trace(plain, page, len(tokens), 20, force=forced)
    parted = (other["tokens"][0] != own["tokens"][0]).nonzero()[:, 0].tolist()
    for step in parted:
        diff = float((other["logits"][step] - own["logits"][step]).abs().max())
        margins = float(own["margins"][0, step]), float(other["margins"][0, step])
        assert max(margins) <= 2 * diff, (step, margins, diff)
    assert len(parted) <= 0.02 * len(tokens), parted


def test_fast_engine_uses_graphs_and_compiles_without_errors(sessions):
    _, fast = sessions
    d = fast.describe()["engine"]
    assert d["cuda_graphs"] and d["compile"]
    assert not d["capture_errors"], d["capture_errors"]
    assert not d["compile_errors"], d["compile_errors"]


def test_out_of_memory_during_capture_fails_the_call_and_captures_next_time():
    """A CUDA graph capture that runs out of memory fails that call (the sweep records its point as oom) without
    giving up capture for good: the next call captures and replays as in a fresh process."""
    from dsocr_core.fast.graphs import Captured

    calls = []
    out = torch.zeros(4, device="cuda")

    def work():
        calls.append(1)
        if len(calls) == 2:  # the first capture (after one warm-up): far more than the GPU holds
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        return out.add_(1)

    cap = Captured(work, enabled=True)
    with pytest.raises(torch.OutOfMemoryError):
        cap()
    assert cap.enabled and cap.error is None and cap.graph is None
    cap()  # warm-up and capture succeed, then one replay
    assert cap.graph is not None and cap.error is None
    torch.cuda.synchronize()


@pytest.mark.parametrize("tokens", [2, 8, 33, 64])
def test_routing_kernel_and_by_expert_kernels_equal_the_torch_moe(tokens):
    """Batched decode's Triton MoE (route_rows + moe_gemv, the engine's path at batch 2-64) against the torch
    routing and the grouped GEMMs at DeepSeek-OCR's widths: the same expert ids, weights to float32 rounding, per-slot
    outputs to bf16 rounding (the two accumulate in different orders)."""
    from dsocr_core.fast.moe import experts_grouped, route, with_shared
    from dsocr_core.fast.triton_kernels import moe_gemv, route_rows

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    rnd = lambda *shape, s: torch.randn(*shape, device="cuda", generator=gen) * s  # noqa: E731
    experts, hidden, inner = 64, 1280, 896
    w13 = rnd(experts + 2, 2 * inner, hidden, s=0.03).bfloat16()  # 64 routed + 2 shared pseudo-experts
    w2 = rnd(experts + 2, hidden, inner, s=0.03).bfloat16()
    gate, h = rnd(experts, hidden, s=0.03), rnd(tokens, hidden, s=1.0).bfloat16()
    want_w, want_ids = with_shared(*route(h, gate, 6, False, 1.0), experts, 2)
    w, ids = route_rows(h.float() @ gate.t(), 6, 2, False, 1.0)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)
    got, want = moe_gemv(h, ids, w13, w2).float(), experts_grouped(h, ids, w13, w2, inner).float()
    assert float((got - want).abs().max()) <= 0.02 * float(want.abs().max())


@pytest.mark.parametrize("tokens", [2, 8, 33, 64])
def test_fused_routing_and_combine_equal_the_torch_moe(tokens):
    """expert_fusion='fused' (the engine's default on a GPU): route_hidden computes the float32 router logits
    itself, and the down kernel's last program of each block combines the slots and adds the residual. Against
    the torch router and the separate kernels + torch combine: the same expert ids, weights to float32 rounding, the
    combined rows to bf16 rounding; replayed from a CUDA graph three times, the same bits (the arrival counters
    reset themselves)."""
    from dsocr_core.fast.moe import combine, route, with_shared
    from dsocr_core.fast.triton_kernels import moe_gemv, route_hidden

    gen = torch.Generator(device="cuda").manual_seed(100 + tokens)
    rnd = lambda *shape, s: torch.randn(*shape, device="cuda", generator=gen) * s  # noqa: E731
    experts, hidden, inner = 64, 1280, 896
    w13 = rnd(experts + 2, 2 * inner, hidden, s=0.03).bfloat16()
    w2 = rnd(experts + 2, hidden, inner, s=0.03).bfloat16()
    gate, h, x = rnd(experts, hidden, s=0.03), rnd(tokens, hidden, s=1.0).bfloat16(), rnd(tokens, hidden, s=1.0)
    x = x.bfloat16()
    want_w, want_ids = with_shared(*route(h, gate, 6, False, 1.0), experts, 2)
    w, ids = route_hidden(h, gate, 6, 2, False, 1.0)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)
    want = (x + combine(moe_gemv(h, ids, w13, w2), w)).float()
    got = moe_gemv(h, ids, w13, w2, w, x).float()
    assert float((got - want).abs().max()) <= 0.01 * float(want.abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gw, gids = route_hidden(h, gate, 6, 2, False, 1.0)
        gout = moe_gemv(h, gids, w13, w2, gw, x)
    runs = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        runs.append(gout.clone())
    assert all(torch.equal(r, runs[0]) for r in runs) and torch.equal(gids, ids)
    assert torch.equal(runs[0].float(), got)


def test_early_loads_under_programmatic_dependent_launch_change_no_bit(sessions):
    """The fused kernels load their weights, and after the q/k/v and routed gate/up kernels' late launch also the
    position, earlier steps' cache slots and the chosen experts, before waiting for the previous kernel
    (decode_kernels._wait_previous). A mistake in that order reads stale data only now and then; the arithmetic
    does not depend on how kernels are launched, so the same kernels launched in plain stream order (pdl=False)
    must give bit for bit the same tokens (up to 300) and last logits as with programmatic dependent launch, one or two
    steps per graph, run twice."""
    ref, _ = sessions
    page = _page(1, 41)
    runs = {}
    for name, opts in (("plain", {"pdl": False, "graph_steps": 1}), ("pdl", {"pdl": True, "graph_steps": 1}),
                       ("pdl x2", {"pdl": True, "graph_steps": 2})):
        fast = ref.with_mode("fast", **opts)
        for attempt in range(1 if name == "plain" else 2):
            gen = fast.generate(page, max_new_tokens=300, no_repeat_ngram_size=20)
            runs[f"{name} #{attempt}"] = (gen.generated_ids[0], fast.engine._states[1].logits.clone())
        del fast
        torch.cuda.empty_cache()
    tokens, logits = runs["plain #0"]
    for name, (t, lg) in runs.items():
        assert t == tokens, (name, next(i for i, (a, b) in enumerate(zip(t, tokens)) if a != b))
        if not name.startswith("pdl x2"):  # the same steps per launch: the last step's logits too
            assert torch.equal(lg, logits), name
    assert torch.equal(runs["pdl x2 #0"][1], runs["pdl x2 #1"][1])


def test_the_batched_choice_in_the_graph_chooses_the_hosts_tokens(sessions):
    """batched_choice='graph' at batch 4 on the full spec: the n-gram ban, the blocks' best tokens and the rows'
    choice run as kernels inside the step's graph, on the same logits the host would read, so the tokens must be
    the host's bit for bit: 300 raw steps (no cut at EOS) with the ban at 20, crossing a bucket edge (the state
    grows and its graphs are captured again mid-generation)."""
    from dsocr_core.runtime.generate import Greedy
    ref, _ = sessions
    page = _page(4, 51)
    raw = {}
    for name in ("host", "graph"):
        fast = ref.with_mode("fast", batched_choice=name)
        assert fast.engine.batched_choice == name
        raw[name] = torch.stack(list(Greedy(fast.engine, page, 300, 20, stop_at_eos=False).run()))
        assert (fast.engine._states[4].choice is not None) == (name == "graph")
        del fast
        torch.cuda.empty_cache()
    assert raw["graph"].shape == (300, 4)
    differ = (raw["graph"] != raw["host"]).nonzero()[:, 0].tolist()
    assert not differ, f"first differing step {differ[0]}"
