"""The greedy choice of a batched decode step on the device (engine option batched_choice 'graph'), so that it runs
inside the step's CUDA graph like the fused batch-1 step's choice, instead of as about fifteen eager ops between
replays (`runtime.generate.next_tokens` and the history update: 78 us a step at batch 8 on an H200,
docs/fast-mode.md).

Three kernels after the step's float32 logits [B, V]:

  ngram_ban     decode_kernels._ngram_ban over each row's history (a program per block of windows and row):
                stamps[row, token] = serial for every token the vendor's no-repeat-n-gram rule bans
  best_rows     per (block of BN tokens, row): the largest logit not banned (stamps != serial) and its first index
  choose_rows   per row: the first index among the blocks' equal maxima (torch.argmax's), the pad id where the row
                has finished, the row marked finished on EOS, the token written as the next step's input and into
                history[row, pos + 1]; the last row's program advances the ban serial and the shared position

exactly what `next_tokens` chooses and `FastEngine.greedy` records. Stamps are int32 (B x V x 4 bytes): a serial
only grows, so stamps of earlier steps never equal the current one.
"""
from __future__ import annotations

import torch

from .triton_kernels import HAS_TRITON, next_pow2, tl, triton

BEST_BLOCK = 4096  # tokens per best_rows program: 32 programs a row for DeepSeek-OCR's 129,280

if HAS_TRITON:
    from .decode_kernels import BLOCKS, _block_best, _blocks_best, _ngram_ban
    from .triton_kernels import _last_to_arrive

    @triton.jit
    def _best_rows(logits_ptr, stamp_ptr, serial_ptr, pmax_ptr, parg_ptr, V, s_row, P, BN: tl.constexpr):
        """Program (block, row): the largest logit of tokens block*BN .. block*BN+BN-1 not banned this step, and
        its first index (tl.argmax, like torch.argmax, takes the first of equal maxima)."""
        blk = tl.program_id(0)
        row = tl.program_id(1)
        n = blk * BN + tl.arange(0, BN)
        nm = n < V
        lg = tl.load(logits_ptr + row * s_row + n, mask=nm, other=float("-inf"))
        lg = tl.where(lg != lg, float("inf"), lg)  # torch.argmax takes a NaN as the largest; max and argmax agree
        _block_best(lg, blk * BN, n, nm, stamp_ptr + row * s_row, serial_ptr, pmax_ptr + row * P + blk,
                    parg_ptr + row * P + blk)

    @triton.jit
    def _choose_rows(pmax_ptr, parg_ptr, P, token_ptr, hist_ptr, s_hist, pos_ptr, serial_ptr, fin_ptr, cnt_ptr,
                     capacity, pad, eos, BP: tl.constexpr):
        """Program row: the row's greedy token over the blocks' best (the first block among equal maxima holds the
        first index overall), the pad id if the row had finished, then finished |= token == eos; the token into
        token[row] and history[row, pos + 1]. The last program to arrive advances serial and pos (every program has
        read pos by then)."""
        row = tl.program_id(0)
        tok = _blocks_best(pmax_ptr + row * P, parg_ptr + row * P, P, BP).to(tl.int64)
        done = tl.load(fin_ptr + row) != 0
        tok = tl.where(done, pad, tok)
        tl.store(fin_ptr + row, (done | (tok == eos)).to(tl.int8))
        tl.store(token_ptr + row, tok)
        nxt = tl.load(pos_ptr) + 1
        tl.store(hist_ptr + row * s_hist + nxt, tok, mask=nxt < capacity)
        if _last_to_arrive(cnt_ptr, tl.num_programs(0)):
            tl.store(serial_ptr, tl.load(serial_ptr) + 1)
            tl.store(pos_ptr, nxt)
            tl.store(cnt_ptr, 0)


class BatchedChoice:
    """The device buffers of one batch size's in-graph greedy choice (graph-capturable: allocated once, before any
    capture; nothing syncs with the host). `finished` [B] is the device's copy of the generator's finished flags."""

    def __init__(self, batch: int, vocab: int, device):
        self.vocab, self.blocks = vocab, triton.cdiv(vocab, BEST_BLOCK)
        self.stamp = torch.full((batch, vocab), -1, dtype=torch.int32, device=device)
        self.serial = torch.zeros(1, dtype=torch.int32, device=device)
        self.pmax = torch.empty(batch, self.blocks, dtype=torch.float32, device=device)
        self.parg = torch.empty(batch, self.blocks, dtype=torch.int32, device=device)
        self.finished = torch.zeros(batch, dtype=torch.int8, device=device)
        self.count = torch.zeros(1, dtype=torch.int32, device=device)

    def choose(self, st, ngram: int, pad: int, eos: int) -> None:
        """After a step wrote st.logits: ban, choose, write st.token and st.history[:, pos + 1], advance st.pos."""
        b = st.batch
        if st.logits.stride(0) != self.stamp.stride(0):  # best_rows walks both with one row stride
            raise ValueError("the batched choice needs contiguous [B, V] logits")
        if ngram > 0:  # the fused step's ban, a row of programs per row
            bw, _, warps = BLOCKS["ban"]
            _ngram_ban[(triton.cdiv(st.capacity, bw), b)](
                st.history, st.pos, self.stamp, self.serial, st.history.stride(0), self.stamp.stride(0), N=ngram,
                BW=bw, num_warps=warps)
        _best_rows[(self.blocks, b)](st.logits, self.stamp, self.serial, self.pmax, self.parg, self.vocab,
                                     st.logits.stride(0), self.blocks, BN=BEST_BLOCK, num_warps=8)
        _choose_rows[(b,)](self.pmax, self.parg, self.blocks, st.token, st.history, st.history.stride(0), st.pos,
                           self.serial, self.finished, self.count, st.capacity, pad, eos,
                           BP=next_pow2(self.blocks), num_warps=1)
