"""Block sizes of the fused batch-1 decode kernels (dsocr_core/fast/decode_kernels.py), measured on this GPU.

Each kernel runs alone on the full-size model's shapes (random bf16 weights), 20 launches captured in one CUDA
graph (so the time includes the gap between dependent kernels, as in the real step), each launch on another copy
of the weights so they come from HBM and not from the 50 MB L2 (as in the real step), for a grid of
(rows per program, reduction chunk, warps). Prints the bytes each kernel must read, the median time per launch
and the achieved GB/s per configuration, then the best configuration of each kernel as a JSON line usable as
`FastEngine(fused_blocks=...)` (or `session_speed.py --engine '{"fused_blocks": ...}'`).

    python benchmarks/decode_kernels_tune.py --out out/decode_kernels_tune.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch

from dsocr_core.fast import decode_kernels as dk
from dsocr_core.fast.triton_kernels import decode_attention_splitkv, triton
from dsocr_core.spec import ModelSpec

LAUNCHES = 20


def graph_time(fn, repeats: int = 15) -> float:
    """Median seconds per launch of `fn`, LAUNCHES launches captured in one graph."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(LAUNCHES):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / LAUNCHES)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/decode_kernels_tune.json")
    ap.add_argument("--context", type=int, default=830, help="cache positions filled (attention timing)")
    args = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    s = ModelSpec()
    hd, d, heads, inter, im, e, k = (s.hidden_size, s.head_dim, s.num_attention_heads, s.intermediate_size,
                                     s.moe_intermediate_size, s.n_routed_experts, s.num_experts_per_tok)
    slots, v, eps = k + s.n_shared_experts, s.vocab_size, s.rms_norm_eps
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, dtype=bf, scale=0.02):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dtype)

    def copies(*shape, dtype=bf):
        """Enough copies of a weight that LAUNCHES launches cycling through them read >= 400 MB."""
        one = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
        return [rnd(*shape, dtype=dtype) for _ in range(min(LAUNCHES, max(1, -(-400_000_000 // one))))]

    def cycling(launch, ws):
        """A function whose i-th call launches on ws[i % len(ws)] (captured 20 times in the graph)."""
        state = {"i": 0}

        def fn():
            w = ws[state["i"] % len(ws)]
            state["i"] += 1
            launch(w)
        return fn

    x = rnd(1, hd, scale=1.0)
    ln = rnd(hd, scale=1.0)
    wqkv, wo, gate = copies(3 * hd, hd), copies(hd, hd), copies(e, hd, dtype=torch.float32)
    w13, w2 = copies(e + s.n_shared_experts, 2 * im, hd), copies(e + s.n_shared_experts, hd, im)
    dw13, dw2, head = copies(2 * inter, hd), copies(hd, inter), copies(v, hd)
    cap = 1024
    kc, vc = rnd(1, heads, cap, d, scale=1.0), rnd(1, heads, cap, d, scale=1.0)
    cos, sin = rnd(cap, d, scale=1.0), rnd(cap, d, scale=1.0)
    pos = torch.tensor([args.context], device=dev)
    q = torch.empty(1, heads, d, dtype=bf, device=dev)
    lg = torch.randn(e, device=dev, generator=g)
    act = rnd(max(slots * im, inter), scale=1.0)
    logits = torch.empty(1, v, device=dev)
    stamp, serial = torch.full((v,), -1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev)
    o = rnd(1, heads, d, scale=1.0)

    def qkv(br, bk, w):
        return cycling(lambda wt: dk._qkv_rope[(3 * heads * (d // 2) // br,)](
            x, ln, wt, cos, sin, pos, q, kc, vc, pos, x, kc.stride(1), kc.stride(2), vc.stride(1), vc.stride(2),
            eps, H=hd, D=d, BR=br, BK=bk, EMBED=False, num_warps=w), wqkv)

    def oproj(bn, bk, w):
        return cycling(lambda wt: dk._oproj_residual[(triton.cdiv(hd, bn),)](o, wt, x, H=hd, BN=bn, BK=bk,
                                                                             num_warps=w), wo)

    ids = torch.tensor(list(range(0, 6 * 9, 9))[:k] + [e + j for j in range(s.n_shared_experts)], device=dev,
                       dtype=torch.int32)
    wts = torch.rand(slots, device=dev, generator=g)
    rcount = torch.zeros(1, dtype=torch.int32, device=dev)
    rids, rwts = torch.empty_like(ids), torch.empty_like(wts)

    def router(be, bk, w, bn_up=8, bk_up=256):
        def launch(i):
            dk._router[(triton.cdiv(e, be) + s.n_shared_experts * triton.cdiv(im, bn_up),)](
                x, ln, gate[i % len(gate)], lg, rcount, rids, rwts, w13[i % len(w13)], act, eps, 1.0,
                w13[0].stride(0), E=e, EP=e, K=k, SHARED=s.n_shared_experts, NORM=False, H=hd, I=im, BE=be, BK=bk,
                BN_UP=bn_up, BK_UP=bk_up, num_warps=w)
        return cycling(launch, list(range(LAUNCHES)))

    def up(bn, bk, w, dense=False):
        ws, inner, n = (dw13, inter, 1) if dense else (w13, im, k)
        return cycling(lambda wt: dk._expert_up[(n, triton.cdiv(inner, bn))](
            x, ln, ids, wt, act, eps, 0 if dense else wt.stride(0), H=hd, I=inner, DENSE=dense, BN=bn, BK=bk,
            num_warps=w), ws)

    ys = torch.empty(slots, hd, device=dev)
    count = torch.zeros(hd, dtype=torch.int32, device=dev)

    def down(bn, bk, w, dense=False):
        ws, inner, n = (dw2, inter, 1) if dense else (w2, im, slots)
        y = x.clone()
        return cycling(lambda wt: dk._expert_down[(triton.cdiv(hd, bn), n)](
            act, ids, wts, wt, y, ys, count, 0 if dense else wt.stride(0), SLOTS=n, H=hd, I=inner, DENSE=dense,
            BN=bn, BK=bk, num_warps=w), ws)

    pm = torch.empty(v, device=dev)
    pa = torch.empty(v, dtype=torch.int32, device=dev)

    def lm_head(bn, bk, w):
        return cycling(lambda wt: dk._lm_head[(triton.cdiv(v, bn),)](
            x, ln, wt, logits, stamp, serial, pm, pa, eps, v, H=hd, BN=bn, BK=bk, num_warps=w), head)

    am, al, aacc = (torch.empty(heads * 64, device=dev), torch.empty(heads * 64, device=dev),
                    torch.empty(heads * 64, d, device=dev))
    acount = torch.zeros(heads, dtype=torch.int32, device=dev)

    def attention(chunk, _bk, w):
        splits = triton.cdiv(cap, chunk)
        return lambda: dk._attention[(heads, splits)](
            q, kc, vc, pos, am, al, aacc, acount, o, splits, kc.stride(1), kc.stride(2), vc.stride(1),
            vc.stride(2), d ** -0.5, D=d, CHUNK=chunk, BS=dk.next_pow2(splits), num_warps=w)

    kernels = {  # name: (launcher, bytes that must be read, grid of (rows, chunk, warps))
        "qkv": (qkv, 3 * hd * hd * 2, itertools.product([2, 4, 8], [256, 2048], [4, 8])),
        "oproj": (oproj, hd * hd * 2, itertools.product([2, 4, 8], [256, 2048], [4, 8])),
        "router": (router, e * hd * 4 + s.n_shared_experts * 2 * im * hd * 2,
                   itertools.product([1, 2], [2048], [2, 4, 8], [4, 8], [256, 2048])),
        "up": (up, k * 2 * im * hd * 2, itertools.product([2, 4, 8], [256, 2048], [4, 8])),
        "down": (down, slots * hd * im * 2, itertools.product([4, 8, 16], [128, 1024], [4, 8])),
        "attention": (attention, 2 * heads * (args.context + 1) * d * 2,
                      itertools.product([32, 64, 128], [0], [1, 2, 4])),
        "dense_up": (lambda *c: up(*c, dense=True), 2 * inter * hd * 2,
                     itertools.product([4, 8], [256, 2048], [4, 8])),
        "dense_down": (lambda *c: down(*c, dense=True), inter * hd * 2,
                       itertools.product([1, 2, 4], [256, 2048, 8192], [4, 8])),
        "lm_head": (lm_head, v * hd * 2, itertools.product([32, 64, 128], [128, 256], [4, 8, 16])),
    }
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "context": args.context, "kernels": {}, "best": {}}
    print(f"{'kernel':10s} config (rows per program, chunk, warps[, shared-expert rows, chunk]) us GB/s")
    for name, (make, nbytes, grid) in kernels.items():
        rows = []
        for cfg in grid:
            try:
                t = graph_time(make(*cfg))
            except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit is skipped
                print(f"{name:10s} {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            rows.append({"config": list(cfg), "us": t * 1e6, "gbs": nbytes / t / 1e9})
            print(f"{name:10s} {str(cfg):24s} {t * 1e6:8.2f} {nbytes / t / 1e9:7.0f}")
        best = min(rows, key=lambda r: r["us"])
        out["kernels"][name] = {"bytes": nbytes, "configs": rows}
        out["best"][name] = best["config"][:3]
        if name == "router":  # its launch also runs the shared experts' SwiGLU
            out["best"]["shared_up"] = best["config"][3:] + [0]
    t = graph_time(lambda: decode_attention_splitkv(q, kc, vc, pos))
    out["attention_unfused_us"] = t * 1e6
    print(f"unfused split-KV attention + combine kernel ({args.context + 1} positions, bucket {cap}): "
          f"{t * 1e6:.2f} us")
    total = sum(min(r["us"] for r in out["kernels"][n]["configs"]) * c
                for n, c in [("qkv", 12), ("oproj", 12), ("router", 11), ("up", 11), ("down", 11), ("dense_up", 1),
                             ("dense_down", 1), ("lm_head", 1), ("attention", 12)])
    out["sum_of_best_us"] = total
    print(f"sum of the best kernel times over one step: {total:.0f} us")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({"fused_blocks": out["best"]}))


if __name__ == "__main__":
    main()
