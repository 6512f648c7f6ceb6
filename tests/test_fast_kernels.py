"""The fused batch-1 decode kernels (dsocr_core/fast/decode_kernels.py) on the CPU, through Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess): one decode step equals the engine's
torch step, greedy generation with an active n-gram ban equals the torch path token for token, and the ban kernel
bans exactly what generate.ban_repeated_ngrams bans. On a GPU the same kernels run compiled
(tests/test_fast_gpu.py, benchmarks/session_speed.py)."""
import importlib.util

import pytest
from triton_interpreter import interpreted_result

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed: the fused kernels exist only as Triton code")

SCRIPT = r"""
import json
import torch
from dsocr_core.fast import decode_kernels as dk
from dsocr_core.runtime.generate import ban_repeated_ngrams
from dsocr_core.model.checkpoint import synthetic_model
from dsocr_core.runtime.inputs import synthetic_inputs
from dsocr_core.runtime.session import Session
from dsocr_core.spec import tiny_spec
from dsocr_core.runtime.tokenizer import load_tokenizer

out = {}
# the ban kernel against the reference ban: history with repeated 3-grams
hist = torch.tensor([5, 6, 7, 1, 5, 6, 9, 2, 5, 6, 3, 5, 6], dtype=torch.long)
v = 16
scores = ban_repeated_ngrams(hist[None], torch.zeros(1, v), 3)
stamp = torch.full((v,), -1, dtype=torch.long)
serial = torch.tensor([7])
pos = torch.tensor([len(hist) - 1])
dk._ngram_ban[(1,)](hist, pos, stamp, serial, 0, 0, N=3, BW=16)
out["ban_ref"] = sorted(torch.nonzero(scores[0] == float("-inf"))[:, 0].tolist())
out["ban_kernel"] = sorted(torch.nonzero(stamp == 7)[:, 0].tolist())

spec = tiny_spec()
model = synthetic_model(spec, seed=5, dtype="float32")
ref = Session(model, spec, load_tokenizer(None), torch.device("cpu"), "float32",
              {"source": "synthetic", "detail": "tiny seed 5", "synthetic": True})
few = {"lm_head": (4096, 64, 4)}  # few programs: the interpreter runs them one by one
plain = ref.with_mode("fast", bucket=32, fused=False)
fused = ref.with_mode("fast", bucket=32, fused=True, fused_blocks=few)
inputs = synthetic_inputs("gundam", (2, 1), text_tokens=10, batch=1, seed=3)
p1, p2 = plain.prefill(inputs, room=4), fused.prefill(inputs, room=4)
tok = p1.logits[:, -1].argmax(-1)
diffs = []
for _ in range(2):
    l1 = plain.decode_step(tok, p1.cache)
    l2 = fused.decode_step(tok, p2.cache)
    diffs.append(float((l1 - l2).abs().max()))
    tok = l1.argmax(-1)
out["step_max_abs_diff"] = max(diffs)
out["fused_on"] = fused.describe()["engine"]["fused_decode_b1"]
# generation with a head that knows three tokens (all other logits 0): greedy repeats itself unless banned (6
# tokens: each fused token costs seconds in the interpreter, and the ban bites within the first few)
with torch.no_grad():
    keep = model.lm_head.weight[[500, 900, 1300]].clone()
    model.lm_head.weight.zero_()
    model.lm_head.weight[[500, 900, 1300]] = keep * 20
plain = ref.with_mode("fast", bucket=32, fused=False)
fused = ref.with_mode("fast", bucket=32, fused=True, fused_blocks=few)
small = synthetic_inputs("small", (1, 1), text_tokens=10, batch=1, seed=3)
out["free"] = plain.generate(small, max_new_tokens=6, no_repeat_ngram_size=0).generated_ids
out["plain"] = plain.generate(small, max_new_tokens=6, no_repeat_ngram_size=2).generated_ids
out["fused"] = fused.generate(small, max_new_tokens=6, no_repeat_ngram_size=2).generated_ids
out["reference"] = ref.generate(small, max_new_tokens=6, no_repeat_ngram_size=2).generated_ids
# the batched greedy choice in the step's graph (batched_choice='graph', choice_kernels.py) against the host's
# next_tokens at batch 3, with and without the ban; the rows end with EOS at different steps (finished rows: pad)
b3 = synthetic_inputs("small", (1, 1), text_tokens=10, batch=3, seed=4)
host_choice = ref.with_mode("fast", bucket=32, batched_choice="host")
device_choice = ref.with_mode("fast", bucket=32, batched_choice="graph")
for ng in (2, 0):
    out[f"choice_host_{ng}"] = host_choice.generate(b3, max_new_tokens=6, no_repeat_ngram_size=ng).generated_ids
    out[f"choice_graph_{ng}"] = device_choice.generate(b3, max_new_tokens=6, no_repeat_ngram_size=ng).generated_ids
out["choice_used"] = device_choice.engine._states[3].choice is not None
# the choice kernel alone: equal maxima in two blocks (the first index wins), a finished row (pad), an EOS
from dsocr_core.fast import choice_kernels as ck
pmax = torch.tensor([[1.0, 3.0, 3.0], [2.0, 1.0, 0.0], [0.5, 4.0, 4.0]])
parg = torch.tensor([[3, 17, 30], [5, 12, 20], [1, 11, 29]], dtype=torch.int32)
fin = torch.tensor([0, 1, 0], dtype=torch.int8)
tok_out = torch.zeros(3, dtype=torch.long)
hist = torch.zeros(3, 8, dtype=torch.long)
pos, serial, count = torch.tensor([4]), torch.tensor([7], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
ck._choose_rows[(3,)](pmax, parg, 3, tok_out, hist, hist.stride(0), pos, serial, fin, count, 8, 0, 11, BP=4)
out["choose_rows"] = {"tokens": tok_out.tolist(), "history": hist[:, 5].tolist(), "finished": fin.tolist(),
                      "pos": int(pos), "serial": int(serial), "count": int(count)}

# the same generation under a GPU's first-call semantics (graphs.Captured: a warm-up run, then a replay of the
# captured graph unless the work advances its own state), which the CPU path (no graphs) never exercises
from dsocr_core.fast import engine as engine_module


class GpuLikeCaptured:
    def __init__(self, fn, enabled, pool=None, warmup=1, advances=False):
        self.fn, self.warmup, self.advances, self.first, self.error = fn, warmup, advances, True, None

    def __call__(self):
        if self.first:
            self.first = False
            for _ in range(self.warmup):
                result = self.fn()
            if self.advances:
                return result
        return self.fn()


engine_module.Captured = GpuLikeCaptured
graphed = ref.with_mode("fast", bucket=32, fused=True, fused_blocks=few)
res = graphed.generate(small, max_new_tokens=6, no_repeat_ngram_size=2)
out["fused_graph_like"] = res.generated_ids
st = graphed.engine._states[1]
out["graph_like_pos"], out["graph_like_length"] = int(st.pos), st.cache.length
out["graph_like_keys"] = sorted({k[3] for k in st.graphs})  # steps per launch seen
out["graph_like_tpot"], out["graph_like_steps"] = res.timings["tpot_s"], len(res.timings["decode_steps"])
# the batched choice on the device under the same first-call semantics, every step's raw tokens (pads after EOS
# included) and the finished flags, through a state that grows past its capacity mid-generation (min_room 1)
from dsocr_core.runtime.generate import Greedy
raw = {}
for name, opts in (("host", {"batched_choice": "host"}), ("graph", {"batched_choice": "graph"})):
    s3 = ref.with_mode("fast", bucket=32, min_room=1, **opts)
    gen = Greedy(s3.engine, b3, 40, 2, stop_at_eos=False)
    raw[name] = [t.tolist() for t in gen.run()]
    raw[name + "_capacity"] = s3.engine._states[3].capacity
out["raw_host"], out["raw_graph"] = raw["host"], raw["graph"]
out["raw_capacity"] = raw["graph_capacity"]
out["pad_id"], out["eos_id"] = spec.pad_token_id, spec.eos_token_id

# the by-expert MoE kernels (triton_kernels.moe_gemv) at batch 3: one step's logits and a generation against the
# torch experts: 3 rows choosing 2 of 8 routed experts each (some chosen by several rows) and the shared slots
few_b3 = synthetic_inputs("small", (1, 1), text_tokens=10, batch=3, seed=4)
by_expert = ref.with_mode("fast", bucket=32, moe="triton")
torch_moe = ref.with_mode("fast", bucket=32, moe="gather")
q1, q2 = by_expert.prefill(few_b3, room=4), torch_moe.prefill(few_b3, room=4)
tok3 = q2.logits[:, -1].argmax(-1)
out["moe_b3_step_max_abs_diff"] = float((by_expert.decode_step(tok3, q1.cache)
                                         - torch_moe.decode_step(tok3, q2.cache)).abs().max())
out["moe_b3_impl"] = by_expert.engine._states[3].moe_impl
out["moe_b3_triton"] = by_expert.generate(few_b3, max_new_tokens=6, no_repeat_ngram_size=0).generated_ids
out["moe_b3_gather"] = torch_moe.generate(few_b3, max_new_tokens=6, no_repeat_ngram_size=0).generated_ids
# the same with the routing kernel computing the logits and the combine + residual in the down kernel
fused_moe = ref.with_mode("fast", bucket=32, moe="triton", expert_fusion="fused")
q3 = fused_moe.prefill(few_b3, room=4)
q2 = torch_moe.prefill(few_b3, room=4)
out["fused_moe_b3_step_max_abs_diff"] = float((fused_moe.decode_step(tok3, q3.cache)
                                               - torch_moe.decode_step(tok3, q2.cache)).abs().max())
out["fused_moe_b3_fusion"] = fused_moe.describe()["engine"]["expert_fusion"]
out["fused_moe_b3"] = fused_moe.generate(few_b3, max_new_tokens=6, no_repeat_ngram_size=0).generated_ids
# the kernels alone, against torch at batch 5: the routing from the normalised rows, the combine + residual
from dsocr_core.fast import moe as torch_moe_ops, triton_kernels as tk
torch.manual_seed(0)
h, gate, x = torch.randn(5, 96), torch.randn(8, 96), torch.randn(5, 96)
w13, w2 = torch.randn(10, 64, 96) * 0.1, torch.randn(10, 96, 32) * 0.1
wk, ik = tk.route_hidden(h, gate, 2, 2, True, 1.5)
wt, it = torch_moe_ops.with_shared(*torch_moe_ops.route(h, gate, 2, True, 1.5), 8, 2)
out["route_hidden_ids_equal"] = bool((ik == it).all())
out["route_hidden_weight_diff"] = float((wk - wt).abs().max())
want = x + torch_moe_ops.combine(tk.moe_gemv(h, ik, w13, w2), wk)
out["combine_diffs"] = [float((tk.moe_gemv(h, ik, w13, w2, wk, x) - want).abs().max()) for _ in range(2)]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def result():
    return interpreted_result(SCRIPT)


def test_ban_kernel_bans_what_the_reference_bans(result):
    assert result["ban_ref"] == result["ban_kernel"] == [3, 7, 9]


def test_fused_step_equals_the_torch_step(result):
    assert result["fused_on"] is True
    assert result["step_max_abs_diff"] < 1e-5


def test_fused_generation_equals_torch_generation_with_an_active_ban(result):
    assert result["fused"] == result["plain"] == result["reference"]
    assert result["plain"] != result["free"]  # the ban changed the tokens, so it was exercised


def test_by_expert_moe_kernels_equal_the_torch_experts_at_batch_3(result):
    assert result["moe_b3_impl"] == "triton"
    assert result["moe_b3_step_max_abs_diff"] < 1e-5
    assert result["moe_b3_triton"] == result["moe_b3_gather"]


def test_fused_routing_and_combine_equal_the_torch_experts_at_batch_3(result):
    """expert_fusion='fused': the routing kernel computes the router logits itself and the down kernel's last
    program of each block combines the slots and adds the residual; the counters reset themselves, so a second
    call gives the same answer."""
    assert result["fused_moe_b3_fusion"] == "fused"
    assert result["fused_moe_b3_step_max_abs_diff"] < 1e-5
    assert result["fused_moe_b3"] == result["moe_b3_gather"]
    assert result["route_hidden_ids_equal"] and result["route_hidden_weight_diff"] < 1e-6
    assert max(result["combine_diffs"]) < 1e-6


def test_the_batched_choice_in_the_graph_chooses_what_the_host_chooses(result):
    """batched_choice='graph': the n-gram ban, the blocks' best tokens and the rows' choice as kernels give the
    host's next_tokens tokens at batch 3, with the ban active and without, rows finishing at different steps; the
    choice kernel takes the first of equal maxima, emits the pad id for a finished row, marks a row that chose EOS
    finished, writes history[pos + 1], advances the position and the ban serial once and leaves its counter at 0."""
    assert result["choice_used"]
    for ng in (2, 0):
        assert result[f"choice_graph_{ng}"] == result[f"choice_host_{ng}"]
    assert result["choice_host_2"] != result["choice_host_0"]  # the ban changed the tokens
    assert len({len(r) for r in result["choice_host_2"]}) > 1  # rows stopped at different steps
    assert result["choose_rows"] == {"tokens": [17, 0, 11], "history": [17, 0, 11], "finished": [0, 1, 1],
                                     "pos": 5, "serial": 8, "count": 0}


def test_the_batched_choice_in_the_graph_under_graph_first_call_semantics(result):
    """The same choice with a GPU's first-call semantics (graphs.Captured: the warm-up is the step), 40 raw steps
    (no cut at EOS: finished rows' pad ids compared too) through a state that grew mid-generation."""
    assert result["raw_graph"] == result["raw_host"]
    assert len(result["raw_graph"]) == 40
    rows = list(zip(*result["raw_graph"]))  # per row, its 40 tokens
    ended = [r for r in rows if result["eos_id"] in r]
    assert ended  # some row chose EOS, and every token after it is the pad id
    for r in ended:
        after = r[r.index(result["eos_id"]) + 1:]
        assert after and set(after) == {result["pad_id"]}
    assert result["raw_capacity"] > 32 + 10  # grown past the first bucket


def test_fused_generation_under_graph_first_call_semantics(result):
    """Each new step graph's first call must take one step, not two (warm-up + replay): the tokens, the device
    position and the per-token times all stay right with two steps per launch."""
    assert result["graph_like_keys"] == [1, 2]  # single and double steps were both captured
    assert result["fused_graph_like"] == result["plain"]
    assert result["graph_like_pos"] == result["graph_like_length"]  # next position = tokens in the cache
    assert result["graph_like_steps"] == 5  # one time per decoded token, though launches hold two
