"""The fast engine: prefill and decode of DeepSeek-OCR close to the hardware, on the reference model's weights.

What it does differently from the reference path (each point is explained in docs/fast-mode.md):
* static KV cache (static_cache.py), one per batch size, reused across requests; decode attends over a
  length bucket (a multiple of `bucket` slots) with later slots masked, so each bucket's step has fixed shapes;
* positions, the new token and the cache write position live on the device; no `.item()`/`.tolist()` in a step;
* MoE without host sync (moe.py): in decode up to batch 64 (`gather_max_rows` (token, slot) rows) Triton's
  routing kernel and by-expert kernels (triton_kernels.py), grouped GEMM with sort-free grouping above that and
  in prefill, its grouping, copy into expert order and weighted combine as Triton row kernels on a GPU
  (moe_rows.py, option `moe_rows`); the shared expert runs as two extra experts;
* decode attention over the cache by a Triton split-KV kernel (torch formulations on a CPU);
* logits for the last position only;
* at batch 1 (with Triton) the whole step is decode_kernels.FusedDecode in one graph: 5 fused Triton kernels
  for the dense layer and 6 per MoE layer (72 with the lm_head for the 12 layers; 74 in generation, where the
  n-gram ban and the greedy choice run on the device too and the choice advances the position), launched with
  programmatic dependent launch on Hopper (`pdl`), two steps per graph launch in generation (`graph_steps`;
  `fused=False` turns it off);
* each decode step (all 12 layers + final norm + lm_head) is captured in a CUDA graph per (batch, bucket); the
  static-shape pieces between the attention and expert kernels (norms, q/k/v, RoPE, cache write, o_proj,
  router, top-k, combine, lm_head) are compiled with torch.compile when `compile` is on;
* prefill is captured per input shape as four graphs (sam, clip, projector, LM) so each stage stays timeable;
  SAM attention folds the relative-position bias into q/k (attention.py) so a flash kernel runs; SAM's patch
  embedding is one GEMM; SAM blocks and CLIP layers are compiled with static shapes (`compile_vision`), CLIP runs
  every view group's rows through each layer at once (`clip_packed`), convolutions use cuDNN's autotuned
  algorithms, and the LM prefill layers are compiled (`compile_prefill`) with symbolic batch, prompt length and
  cache capacity, once per batch class on canonical sizes (so a point runs the same kernels whatever was
  measured before it), the last one on the last position only when only the last logits are wanted.

On a CPU everything runs eagerly (no graphs, no compile): the same functions, so CPU tests check the tokens.
Outside the fused path the n-gram ban and greedy choice are `generate.next_tokens`, applied after each step's
graph on the state's history buffer. The engine implements the interface of runtime/engine.py.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from ..model.decoder import rope_cos_sin
from ..runtime.generate import next_tokens
from ..runtime.timing import StageTimer
from .attention import SAM_ATTENTION, decode_attention
from .compiled import COMPILE_OPTIONS, Compiled
from .decode_kernels import FusedDecode
from .graphs import Captured
from .lm import LMConfig, make_decode_fns, make_prefill_layer
from .moe_rows import HAS_ROW_KERNELS
from .options import DEFAULT_NEW_TOKENS  # cache room a bare prefill() leaves for decoding (grown on demand)
from .options import TRITON_CHOICES, decode_moe, resolve_auto
from .prefill import prefill_entry, prefill_key
from .state import DecodeState, FastCache
from .static_cache import StaticKVCache, round_up
from .triton_kernels import HAS_TRITON
from .vision import Positions, clip_layer_fn, sam_block_eager, sam_block_fn
from .weights import LMWeights

# The LM prefill layers are compiled once per batch class on these sizes (see compile_prefill_layers): a
# mid-sized prompt, so Inductor's size-based kernel choices suit the prompts of every mode.
CANONICAL_PROMPT = 1000
CANONICAL_BATCH = 2


class FastEngine:
    mode = "fast"
    eos_check_interval = 32  # the only host syncs of a generation: look for EOS every 32 tokens

    def __init__(self, model, *, compile: bool | None = None, graphs: bool | None = None, moe: str = "auto",
                 attention: str = "auto", bucket: int = 256, gather_max_rows: int = 512, sam_attention: str = "auto",
                 compile_vision: bool | None = None, compile_prefill: bool | None = None, clip_packed: bool = True,
                 topk: str = "auto", cudnn_benchmark: bool = True, compile_options: dict | None = None,
                 fused: bool | None = None, fused_blocks: dict | None = None, pdl: bool | None = None,
                 graph_steps: int = 2, min_room: int = DEFAULT_NEW_TOKENS, projector_layout: str = "gather",
                 moe_rows: str = "auto", expert_fusion: str = "auto", batched_choice: str = "auto"):
        if moe not in ("auto", "triton", "gather", "grouped"):
            raise ValueError(f"moe must be 'auto', 'triton', 'gather' or 'grouped', got {moe!r}")
        if attention not in ("auto", "triton", "reduce", "sdpa"):
            raise ValueError(f"attention must be 'auto', 'triton', 'reduce' or 'sdpa', got {attention!r}")
        if sam_attention not in ("auto", *SAM_ATTENTION):
            raise ValueError(f"sam_attention must be 'auto' or one of {SAM_ATTENTION}, got {sam_attention!r}")
        if projector_layout not in ("gather", "per_image"):
            raise ValueError(f"projector_layout must be 'gather' or 'per_image', got {projector_layout!r}")
        self.projector_layout = projector_layout
        for name, value in (("moe_rows", moe_rows), ("expert_fusion", expert_fusion),
                            ("batched_choice", batched_choice)):
            if value not in ("auto", *TRITON_CHOICES[name]):
                raise ValueError(f"{name} must be 'auto' or one of {TRITON_CHOICES[name]}, got {value!r}")
        self.model = model.eval()
        self.spec = model.spec
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        cuda = self.device.type == "cuda"
        self.triton = cuda and HAS_TRITON
        self.graphs = cuda if graphs is None else bool(graphs and cuda)
        self.compile = cuda if compile is None else bool(compile)
        self.compile_vision = self.compile if compile_vision is None else bool(compile_vision)
        self.compile_prefill = self.compile if compile_prefill is None else bool(compile_prefill)
        self.clip_packed = bool(clip_packed)
        self.moe = moe
        if attention == "auto":
            attention = "triton" if self.triton else ("sdpa" if cuda else "reduce")
        if attention == "triton" and not self.triton:
            raise ValueError("attention 'triton' needs a CUDA device and Triton")
        self.attention = attention
        # CPU tests of the kernels run them in Triton's interpreter
        self.interpreted = interpreted = os.environ.get("TRITON_INTERPRET") == "1" and HAS_TRITON
        if fused and not (self.triton or interpreted):
            raise ValueError("fused decode needs a CUDA device and Triton (or TRITON_INTERPRET=1 on a CPU)")
        self.fused = self.triton if fused is None else bool(fused)
        if moe_rows == "triton" and not ((self.triton or interpreted) and HAS_ROW_KERNELS):
            raise ValueError("moe_rows 'triton' needs a CUDA device and Triton (or TRITON_INTERPRET=1 on a CPU) "
                             "and torch.library.triton_op")
        # the grouped MoE's grouping, copy into expert order and weighted combine + residual (fast/moe_rows.py)
        self.moe_rows = resolve_auto("moe_rows", moe_rows, self.triton and HAS_ROW_KERNELS)
        if expert_fusion == "fused" and not (self.triton or interpreted):
            raise ValueError("expert_fusion 'fused' needs a CUDA device and Triton (or TRITON_INTERPRET=1 on a CPU)")
        # batched decode's by-expert MoE: 'fused' routes inside one kernel from the normalised rows (router GEMM
        # included) and combines the slots + residual inside the down kernel; 'separate', the router GEMM compiled
        # with the step, the routing kernel, and the combine as an Inductor kernel (every run before 2026-11-28)
        self.expert_fusion = resolve_auto("expert_fusion", expert_fusion, self.triton)
        if batched_choice == "graph" and not (self.triton or interpreted):
            raise ValueError("batched_choice 'graph' needs a CUDA device and Triton (or TRITON_INTERPRET=1 on a CPU)")
        # the greedy choice outside the fused batch-1 step: kernels in the step's graph ('graph', the default with
        # Triton on a GPU), or eager ops between replays ('host', every run before 2026-11-28)
        self.batched_choice = resolve_auto("batched_choice", batched_choice, self.triton)
        self.fused_blocks = {k: tuple(v) for k, v in (fused_blocks or {}).items()}
        # programmatic dependent launch between the fused kernels: Hopper or newer, not in the interpreter
        sm90 = self.triton and torch.cuda.get_device_capability(self.device)[0] >= 9
        if pdl and not sm90:
            raise ValueError("pdl (programmatic dependent launch) needs a CUDA GPU of compute capability 9.0+")
        self.pdl = sm90 if pdl is None else bool(pdl)
        if graph_steps < 1:
            raise ValueError(f"graph_steps must be >= 1, got {graph_steps}")
        self.graph_steps = int(graph_steps)  # fused batch-1 generation: tokens per graph replay
        self.min_room = int(min_room)  # decode positions every prefill leaves room for, whatever it is asked
        self.topk = ("argmax" if self.compile else "torch") if topk == "auto" else topk
        self.gemv = "linear"
        self.bucket = bucket
        self.gather_max_rows = gather_max_rows
        if sam_attention == "auto":  # the fold; FlexAttention's kernel measured 5x slower (docs/fast-mode.md)
            sam_attention = "fold"
        self.sam_attention = sam_attention
        self.cudnn_benchmark = cudnn_benchmark
        self.compile_options = COMPILE_OPTIONS if compile_options is None else compile_options
        self.w = LMWeights.from_model(model)
        self.cfg = LMConfig.from_spec(self.spec, self.w.shared_slots)
        self._rope_len = 0
        self._states: dict[int, DecodeState] = {}
        # bumped whenever captured graphs are dropped (a state replaced, grown or released): the next run of any
        # shape captures again, so a caller's per-shape warm-up is due again
        self.state_epoch = 0
        self._ensure_rope(self.spec.max_position_embeddings)
        self._fns: dict[str, dict[str, Any]] = {}
        self._prefill_fns: dict[str, Any] | None = None
        self._prefill_compiled: set[int] = set()  # batch classes whose LM prefill layers are compiled
        self.positions = Positions()  # SAM/CLIP position tables per grid size

    # ------------------------------------------------------------------ set-up
    def _ensure_rope(self, length: int) -> None:
        """RoPE tables [length, d] from the reference's own rope_cos_sin (same values per position)."""
        if length <= self._rope_len:
            return
        self.cos_t, self.sin_t = rope_cos_sin(torch.arange(length, device=self.device), self.spec.head_dim,
                                              self.spec.rope_theta, self.dtype)
        self._rope_len = length
        for st in self._states.values():  # graphs captured the old tables' addresses
            self._drop_captures(st)

    def moe_impl(self, batch: int) -> str:
        if self.moe != "auto":
            if self.moe == "triton" and not (self.triton or self.interpreted):
                raise ValueError("moe 'triton' needs a CUDA device and Triton (or TRITON_INTERPRET=1 on a CPU)")
        # on a CPU the gather path: torch's CPU grouped GEMM is a slow fallback (prefill still uses it)
        return decode_moe(self.moe, batch, self.cfg.k + self.cfg.shared_slots, self.gather_max_rows,
                          self.device.type == "cuda", self.triton)

    def _compiled(self, fn, options=None):
        return Compiled(fn, options) if self.compile else fn

    def fns(self, moe_impl: str) -> dict[str, Any]:
        """The decode step's pieces for one MoE kind (compiled when `compile` is on)."""
        if moe_impl not in self._fns:
            impl = "grouped" if moe_impl == "triton" else moe_impl  # 'moe' is unused with the triton kernel
            eager = make_decode_fns(self.cfg, impl, self.gemv, self.topk, self.moe_rows)
            self._fns[moe_impl] = {k: self._compiled(f, self.compile_options) for k, f in eager.items()}
        return self._fns[moe_impl]

    def prefill_fns(self) -> dict[str, Any]:
        """SAM block, CLIP layer and LM prefill layer functions (SAM blocks and CLIP layers compiled with
        `compile_vision`, LM layers with `compile_prefill`; on a GPU only)."""
        if self._prefill_fns is None:
            cuda = self.device.type == "cuda"
            vis = self.compile_vision and cuda
            # compiled, the one-hot grouping is a parallel scan; eagerly ATen's cumsum is serial: sort instead
            compiled = self.compile_prefill and cuda
            topk, grouping = ("argmax", "onehot") if compiled else ("torch", "sort")
            lm, lm_last = (make_prefill_layer(self.cfg, topk, grouping, last_only, self.moe_rows)
                           for last_only in (False, True))
            if compiled:  # symbolic batch, prompt length and capacity, compiled once on canonical sizes: see
                # compile_prefill_layers for why neither static nor torch's automatic dynamic shapes
                lm, lm_last = Compiled(lm, None), Compiled(lm_last, None)
            # SAM blocks and CLIP layers: one static compile per (view size, window, view count) / view layout
            self._prefill_fns = {
                # FlexAttention's score_mod cannot take symbolic sizes (the window width it divides by), and
                # static shapes give Inductor better kernels; eagerly flex would materialise every score, so
                # a failed compile falls back to the folded attention
                "sam_block": Compiled(sam_block_fn, None, dynamic=False, fallback=sam_block_eager) if vis
                else sam_block_fn,
                "clip_layer": Compiled(clip_layer_fn, None, dynamic=False) if vis else clip_layer_fn,
                "lm_layer": lm,
                "lm_last_layer": lm_last,  # the final layer when only the last position's logits are wanted
            }
        return self._prefill_fns

    def compile_prefill_layers(self, batch: int, like: torch.Tensor) -> None:
        """Compile the LM prefill layers for this batch class (one row, or several) on canonical sizes, once.

        Why: a layer compiled with static shapes recompiles for every new (batch, prompt length), seconds each,
        which would make a sweep of many points several times slower; torch's automatic dynamic compiles a static
        variant for the first shape and a symbolic one at the second, so what ran for a point (and the kernel
        configurations Inductor picks from the sizes it compiled on) depended on the points measured before it.
        Here every prompt of a batch class runs the one symbolic variant compiled on CANONICAL_PROMPT tokens
        (and CANONICAL_BATCH rows for batches > 1; one row is its own class, as dynamo specialises size 1), in a
        sweep and in a fresh process alike. `like` (a tensor of the real run) gives the inference-mode flag the
        compiled guards check, so the real call hits the canonical variant (grad mode is the caller's, as it is
        for the real call)."""
        fns = self.prefill_fns()
        rows = 1 if batch == 1 else CANONICAL_BATCH
        if (not isinstance(fns["lm_layer"], Compiled) or rows in self._prefill_compiled
                or torch.cuda.is_current_stream_capturing()):
            return
        self._prefill_compiled.add(rows)
        t, cfg = CANONICAL_PROMPT, self.cfg
        # inference_mode(False) would switch grad mode on (another guard, another variant): enter it only to match
        with torch.inference_mode() if like.is_inference() else contextlib.nullcontext():
            gen = torch.Generator(device=self.device).manual_seed(0)
            x = torch.randn(rows, t, cfg.hidden, generator=gen, device=self.device, dtype=self.dtype)
            keys, values = (torch.zeros(rows, cfg.heads, round_up(t + self.min_room, self.bucket), cfg.head_dim,
                                        device=self.device, dtype=self.dtype) for _ in range(2))
            cos, sin = self.cos_t[:t], self.sin_t[:t]
            layers = self.w.layers
            dense = [lw for lw in layers if not lw.moe][:1]
            moe = [lw for lw in layers if lw.moe][:1]
            for name, chosen in (("lm_layer", dense + moe), ("lm_last_layer", layers[-1:])):
                for lw in chosen:
                    self.mark_prefill_sizes(x, cos, sin, keys, values)
                    fns[name](x, cos, sin, keys, values, lw.ln1, lw.wqkv, lw.wo, lw.ln2, lw.w13, lw.w2, lw.gate)

    def mark_prefill_sizes(self, x, cos, sin, keys, values) -> None:
        """Mark the sizes a prefill layer's inputs vary in (batch when > 1, prompt length, cache capacity) as
        symbolic for the compiled layers; the weights' sizes stay static."""
        if not self._prefill_compiled:
            return
        mark = torch._dynamo.maybe_mark_dynamic
        for tensor, dims in ((x, (0, 1)), (cos, (0,)), (sin, (0,)), (keys, (0, 2)), (values, (0, 2))):
            for d in dims:
                if tensor.shape[d] > 1:  # a size-1 batch is specialised (its own class)
                    mark(tensor, d)

    def state(self, batch: int, needed: int) -> DecodeState:
        """The static state of this batch size with room for `needed` positions (a bigger one replaces it)."""
        st = self._states.get(batch)
        if st is not None and st.capacity >= needed:
            return st
        if st is not None:
            del self._states[batch]
            self._drop_captures(st)
            del st
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        capacity = round_up(max(needed, 1), self.bucket)
        self._ensure_rope(capacity)
        s = self.spec
        cache = StaticKVCache(s.num_hidden_layers, batch, s.num_attention_heads, capacity, s.head_dim, self.dtype,
                              self.device)
        st = DecodeState(batch, cache, torch.zeros(batch, dtype=torch.long, device=self.device),
                         torch.zeros(1, dtype=torch.long, device=self.device),
                         torch.zeros(batch, s.vocab_size, dtype=torch.float32, device=self.device),
                         torch.zeros(batch, capacity, dtype=torch.long, device=self.device), self.moe_impl(batch))
        if batch == 1 and self.fused:
            st.fused = FusedDecode(self.w, self.cfg, s.vocab_size, self.device, self.dtype, self.fused_blocks,
                                   self.pdl)
        self._states[batch] = st
        return st

    def _grow(self, st: DecodeState, needed: int) -> DecodeState:
        """Move a state's cache and history into bigger buffers, in place (handles stay valid; graphs are
        captured again)."""
        old_cache, old_hist, length = st.cache, st.history, st.cache.length
        capacity = round_up(needed, self.bucket)
        self._ensure_rope(capacity)
        s = self.spec
        cache = StaticKVCache(s.num_hidden_layers, st.batch, s.num_attention_heads, capacity, s.head_dim,
                              self.dtype, self.device)
        cache.copy_from(old_cache, length)
        history = torch.zeros(st.batch, capacity, dtype=torch.long, device=self.device)
        history[:, : old_hist.shape[1]].copy_(old_hist)
        st.cache, st.history = cache, history
        self._drop_captures(st)
        return st

    def _drop_captures(self, st: DecodeState) -> None:
        """Forget a state's captured decode and prefill graphs (their buffers moved or went away). A caller that
        warms up once per input shape must warm up again: see state_epoch."""
        st.graphs.clear()
        st.prefills.clear()
        self.state_epoch += 1

    def release(self, batch: int | None = None) -> None:
        """Free the static state (cache, buffers, graphs) of one batch size, or of all; handles to it go stale."""
        for b in ([batch] if batch is not None else list(self._states)):
            st = self._states.pop(b, None)
            if st is not None:
                st.serial += 1
                self._drop_captures(st)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, inputs, *, logits: str = "last", upto: int | None = None, timer: StageTimer | None = None,
                room: int = 0) -> tuple[torch.Tensor, FastCache]:
        """Vision + LM over the prompt (its first `upto` tokens). Returns float32 logits [B, T_logits, V]
        ('last': T_logits = 1; the stage's output buffer, valid until the next prefill of this shape) and a cache
        handle with room for `room` decode steps, `min_room` at least (grown on demand). Stages timed:
        sam, clip, projector, prefill."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
        timer = timer or StageTimer(self.device)
        prompt = inputs.input_ids
        ids = prompt if upto is None else prompt[:, :upto]
        b, t = ids.shape
        # at least min_room, so a short warm-up and the longer run after it share one state (a new capacity would
        # capture every graph and compile the prefill again inside the timed run)
        st = self.state(b, prompt.shape[1] + max(room, self.min_room) + 1)
        st.serial += 1
        st.primed = None
        key, feed = prefill_key(self, inputs, t, logits)
        entry = st.prefills.get(key)
        if entry is None:
            entry = st.prefills[key] = prefill_entry(self, st, ids, feed, logits)
        bufs = entry["bufs"]
        bufs["ids"].copy_(ids)
        if feed["views"]:
            bufs["slots"].copy_(feed["slots"])
            for buf, v in zip(bufs["views"], feed["views"]):
                buf.copy_(v)
        outs = entry["outs"]
        for name, run in entry["stages"]:
            with timer.stage(name, track_memory=True):
                outs[name] = run()
        st.cache.length = t
        st.history[:, :prompt.shape[1]].copy_(prompt)  # the whole prompt: a redecode feeds its last token
        return outs["prefill"], FastCache(st, st.serial)

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache: FastCache) -> torch.Tensor:
        """One step for every row: `token` [B] at position cache.length. Returns the state's logits buffer
        [B, V] float32 (overwritten by the next step)."""
        st = cache.check()
        n = st.cache.length
        if n >= st.capacity:
            st = self._grow(st, n + DEFAULT_NEW_TOKENS)
        st.token.copy_(token.reshape(-1))
        st.pos.fill_(n)
        st.primed = None
        self._replay(st, n, choose=False)
        st.cache.length = n + 1
        return st.logits

    @torch.no_grad()
    def greedy(self, cache: FastCache, token: torch.Tensor, limit: int, ngram: int,
               finished: torch.Tensor) -> torch.Tensor:
        """Decode steps from `token` (chosen last, at position cache.length), choosing like next_tokens.
        Fused batch-1 path: the ban, the choice and the position update run in the step's graph and up to
        `graph_steps` steps share one launch (never across a bucket edge); rows are not marked finished there
        (one row: the generator cuts after its EOS). Otherwise one step: with batched_choice 'graph' the ban, the
        choice, finished rows' pad, EOS and the position run in the step's graph (choice_kernels.py) and `finished`
        is copied back once a step; with 'host' the choice runs as eager ops after the replay."""
        st = cache.check()
        n = st.cache.length  # position of `token`
        if st.fused is None and self.batched_choice == "host":
            logits = self.decode_step(token, cache)
            chosen = next_tokens(logits, st.history[:, :n + 1], ngram, finished, self.spec.pad_token_id)
            finished |= chosen == self.spec.eos_token_id
            st.history[:, n + 1].copy_(chosen)
            return chosen[:, None]
        k = 1 if st.fused is None else min(self.graph_steps, limit)
        if round_up(n + k, self.bucket) != round_up(n + 1, self.bucket):
            k = 1
        if n + k + 1 > st.capacity:  # the steps' cache slots n .. n+k-1 and the last chosen token's history slot
            st = self._grow(st, n + k + 1 + DEFAULT_NEW_TOKENS)
        if st.fused is None and st.choice is None:  # before any capture
            from .choice_kernels import BatchedChoice
            st.choice = BatchedChoice(st.batch, self.spec.vocab_size, self.device)
        if st.primed != n:  # else the previous launch's last kernel left token, history and position in place
            st.token.copy_(token.reshape(-1))
            st.history[:, n].copy_(token.reshape(-1))
            st.pos.fill_(n)
            if st.choice is not None:  # and the finished flags
                st.choice.finished.copy_(finished)
        self._replay(st, n, choose=True, ngram=ngram, steps=k)
        st.cache.length = st.primed = n + k
        if st.choice is not None:
            finished.copy_(st.choice.finished)
        return st.history[:, n + 1:n + 1 + k]

    def _replay(self, st: DecodeState, n: int, choose: bool, ngram: int = 0, steps: int = 1) -> None:
        """Run (capturing on first use) the step graph of the bucket holding positions n .. n+steps-1.
        `choose` (the fused batch-1 path, or batched_choice 'graph'): each step also bans n-grams, picks the greedy
        token into st.token and history and advances st.pos (several steps per graph: the fused path only)."""
        if steps > 1 and not (choose and st.fused is not None):
            raise ValueError("several steps per graph need the fused batch-1 path with the choice on the device")
        length = min(st.capacity, round_up(n + steps, self.bucket))
        key = (length, choose, ngram, steps)
        run = st.graphs.get(key)
        if run is None:
            if st.fused is not None:
                def fn():
                    for _ in range(steps):
                        st.fused.step(st, length, self.cos_t, self.sin_t, choose, ngram)
            elif choose:
                def fn():
                    self._step(st, length)
                    st.choice.choose(st, ngram, self.spec.pad_token_id, self.spec.eos_token_id)
            else:
                fn = lambda: self._step(st, length)  # noqa: E731
            run = st.graphs[key] = Captured(fn, self.graphs, advances=choose)
        run()

    def _step(self, st: DecodeState, length: int) -> torch.Tensor:
        """One decode step for every row over cache slots < `length` (static shapes; graph-capturable)."""
        fns = self.fns(st.moe_impl)
        mark = self.compile and st.batch > 1
        if mark:
            torch._dynamo.maybe_mark_dynamic(st.token, 0)
        x = fns["embed"](st.token, self.w.embed)
        for i, lw in enumerate(self.w.layers):
            keys, values = st.cache.layer_keys(i), st.cache.layer_values(i)  # whole capacity: static shapes
            if self.compile:
                for t in (keys, values):
                    torch._dynamo.maybe_mark_dynamic(t, 2)  # capacity differs between states
                    if mark:
                        torch._dynamo.maybe_mark_dynamic(t, 0)
                if mark:
                    torch._dynamo.maybe_mark_dynamic(x, 0)
            q = fns["pre"](x, keys, values, st.pos, self.cos_t, self.sin_t, lw.ln1, lw.wqkv)
            o = self._attend(q, keys[:, :, :length], values[:, :, :length], st.pos)
            if mark:
                torch._dynamo.maybe_mark_dynamic(q, 0)
                torch._dynamo.maybe_mark_dynamic(o, 0)
            if not lw.moe:
                x = fns["dense"](x, o, lw.wo, lw.ln2, lw.w13, lw.w2)
            elif st.moe_impl == "triton" and self.expert_fusion == "fused":  # 3 Triton launches after the norm
                from .triton_kernels import moe_gemv, route_hidden
                x, h = fns["attn_out"](x, o, lw.wo, lw.ln2)
                w, ids = route_hidden(h, lw.gate, self.cfg.k, self.cfg.shared_slots, self.cfg.norm_topk_prob,
                                      self.cfg.scale)
                x = moe_gemv(h, ids, lw.w13, lw.w2, w, x)
            elif st.moe_impl == "triton":  # routing in one kernel, then the experts by expert: no routing glue
                from .triton_kernels import moe_gemv, route_rows
                x, h, logits = fns["logits"](x, o, lw.wo, lw.ln2, lw.gate)
                w, ids = route_rows(logits, self.cfg.k, self.cfg.shared_slots, self.cfg.norm_topk_prob,
                                    self.cfg.scale)
                x = fns["combine"](x, moe_gemv(h, ids, lw.w13, lw.w2), w)
            else:
                x = fns["moe"](x, o, lw.wo, lw.ln2, lw.w13, lw.w2, lw.gate)
        if mark:
            torch._dynamo.maybe_mark_dynamic(x, 0)
        st.logits.copy_(fns["final"](x, self.w.norm, self.w.lm_head))
        return st.logits

    def _attend(self, q, keys, values, pos) -> torch.Tensor:
        if self.attention == "triton":
            from .triton_kernels import decode_attention_splitkv
            return decode_attention_splitkv(q, keys, values, pos)
        return decode_attention(q, keys, values, pos, self.attention)

    # ------------------------------------------------------------------ reporting
    def point_state(self, batch: int) -> dict:
        """How the runs at this batch size were executed, for a measured point's record: each compiled prefill
        function's shape policy, variants held and generation (or its eager fallback and why); the state's cache
        capacity; the decode path, the buckets it ran and whether their graphs were captured; whether each
        prefill stage ran as a captured graph."""
        compiled = {name: f.state() for name, f in (self._prefill_fns or {}).items() if isinstance(f, Compiled)}
        out: dict[str, Any] = {"engine": "fast", "compiled_prefill": compiled or "eager",
                               "graphs_enabled": self.graphs}
        st = self._states.get(batch)
        if st is None:
            return out
        decode = {}
        for (length, choose, _ngram, steps), run in sorted(st.graphs.items()):
            decode[f"l{length}{'.choose' if choose else ''}.x{steps}"] = graph_state(run)
        prefill: dict[str, set] = {}
        for entry in st.prefills.values():
            for name, run in entry["stages"]:
                prefill.setdefault(name, set()).add(graph_state(run))
        out.update(capacity=st.capacity, bucket=self.bucket, prefill_shapes=len(st.prefills),
                   decode_path="fused" if st.fused is not None else st.moe_impl, decode_graphs=decode,
                   prefill_graphs={name: "/".join(sorted(v)) for name, v in prefill.items()})
        return out

    def describe(self) -> dict:
        errors = {}
        for impl, fns in [*self._fns.items(), ("prefill", self._prefill_fns or {})]:
            for name, f in fns.items():
                if isinstance(f, Compiled) and f.error:
                    errors[f"{impl}.{name}"] = f.error
        capture_errors = {}
        for b, st in self._states.items():
            for (length, choose, _ngram, steps), run in st.graphs.items():
                if run.error:
                    capture_errors[f"decode.b{b}.l{length}{'.choose' if choose else ''}.x{steps}"] = run.error
            for key, entry in st.prefills.items():
                for name, run in entry["stages"]:
                    if run.error:
                        capture_errors[f"prefill.b{b}.{name}"] = run.error
        return {
            "session_mode": "fast", "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
            "cuda_graphs": self.graphs, "compile": self.compile, "compile_vision": self.compile_vision,
            "compile_prefill": self.compile_prefill, "clip_packed": self.clip_packed,
            "projector_layout": self.projector_layout, "moe_rows": self.moe_rows,
            "expert_fusion": self.expert_fusion, "batched_choice": self.batched_choice,
            "triton": self.triton, "attention": self.attention, "topk": self.topk,
            "moe": self.moe, "moe_by_batch": {b: st.moe_impl for b, st in self._states.items()},
            "fused_decode_b1": self.fused, "fused_blocks": self.fused_blocks, "pdl": self.pdl,
            "graph_steps": self.graph_steps, "bucket": self.bucket, "min_room": self.min_room,
            "sam_attention": self.sam_attention, "cudnn_benchmark": self.cudnn_benchmark,
            "grouped_mm": hasattr(torch, "_grouped_mm"),
            "extra_weight_bytes": self.w.extra_bytes, "extra_weight_bytes_by_kind": dict(self.w.extra),
            "kv_cache_bytes": {b: st.cache.bytes_allocated for b, st in self._states.items()},
            "compile_errors": errors, "capture_errors": capture_errors,
        }


def graph_state(run: Captured) -> str:
    """'graph' (captured, replayed), 'eager: reason' (capture given up) or 'eager' (graphs off)."""
    if run.graph is not None:
        return "graph"
    return f"eager: {run.error}" if run.error else "eager"
