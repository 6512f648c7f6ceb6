"""The fast engine's MoE routing and expert kernels compiled for a Hopper GPU (sm90) on this CPU machine: Triton
compiles ahead of time for a named target with the ptxas its wheel ships, so a kernel that would not compile on
the GPU fails here, before any device time is spent. The interpreter tests (test_fast_kernels.py) check what the
kernels compute; this checks that the GPU compiler accepts them at the shapes the engine launches."""
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed: the kernels exist only as Triton code")

SM90 = ("cuda", 90, 32)
ROUTER = {"x_ptr": "*bf16", "ln_ptr": "*bf16", "g_ptr": "*fp32", "lg_ptr": "*fp32", "cnt_ptr": "*i32",
          "ids_ptr": "*i32", "wts_ptr": "*fp32", "w13_ptr": "*bf16", "act_ptr": "*bf16", "eps": "fp32",
          "scale": "fp32", "swe": "i32"}
UP = {"x_ptr": "*bf16", "ids_ptr": "*i64", "w_ptr": "*bf16", "out_ptr": "*bf16", "T": "i32", "K8": "i32",
      "sxt": "i32", "swe": "i32", "swn": "i32"}
DOWN = {"a_ptr": "*bf16", "ids_ptr": "*i64", "w_ptr": "*bf16", "out_ptr": "*bf16", "wts_ptr": "*fp32",
        "res_ptr": "*bf16", "x_ptr": "*bf16", "cnt_ptr": "*i32", "T": "i32", "K8": "i32", "swe": "i32", "swn": "i32"}
ROUTE_HIDDEN = {"h_ptr": "*bf16", "g_ptr": "*fp32", "lg_ptr": "*fp32", "cnt_ptr": "*i32", "ids_ptr": "*i64",
                "wts_ptr": "*fp32", "scale": "fp32", "sht": "i32"}


def _compile(fn, signature: dict, constexprs: dict):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(signature, **{name: "constexpr" for name in constexprs})
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget(*SM90))


def _ptxas_present() -> bool:
    from pathlib import Path

    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").is_file()


@pytest.fixture(scope="module")
def kernels():
    if not _ptxas_present():
        pytest.skip("this Triton wheel ships no ptxas: it cannot compile for a GPU target here")
    from dsocr_core.fast import decode_kernels, triton_kernels
    from dsocr_core.fast.options import BY_EXPERT_MAX_TOKENS
    from dsocr_core.fast.triton_kernels import MOE_BLOCK_K, MOE_BLOCK_N

    return decode_kernels, triton_kernels, BY_EXPERT_MAX_TOKENS, (MOE_BLOCK_N, MOE_BLOCK_K)


@pytest.mark.parametrize("norm", [False, True])
def test_both_routers_compile(kernels, norm):
    """route_rows and the fused batch-1 router (both route with pick_experts), as DeepSeek-OCR launches them."""
    dk, tk, _, _ = kernels
    routing = {"E": 64, "EP": 64, "K": 6, "SHARED": 2, "NORM": norm}
    assert _compile(tk._route_rows, {"lg_ptr": "*fp32", "ids_ptr": "*i64", "wts_ptr": "*fp32", "scale": "fp32"},
                    routing).asm["cubin"]
    hidden = dict(routing, H=1280, BE=tk.ROUTE_EXPERTS, BK=2048)
    assert _compile(tk._route_hidden, ROUTE_HIDDEN, hidden).asm["cubin"]
    for pdl in (False, True):
        fused = dict(routing, H=1280, I=896, BE=1, BK=2048, BN_UP=8, BK_UP=256, PDL=pdl)
        assert _compile(dk._router, ROUTER, fused).asm["cubin"]


def test_the_by_expert_kernels_compile_up_to_their_token_tile(kernels):
    """The expert kernels at the smallest token tile and at the largest the engine allows, with its blocks; the
    largest stays within Hopper's 228 KB of shared memory per block."""
    _, tk, max_tokens, (bn, bk) = kernels
    for tp in (16, max_tokens):
        shapes = {"H": 1280, "I": 896, "BN": bn, "BK": bk, "TP": tp, "KP": 8}
        for fn, sig, extra in ((tk._moe_up, UP, {}), (tk._moe_down, DOWN, {"COMBINE": False}),
                               (tk._moe_down, DOWN, {"COMBINE": True})):
            k = _compile(fn, sig, {**shapes, **extra})
            assert k.asm["cubin"] and k.metadata.shared <= 228 * 1024


BF16 = "*bf16"
FUSED = {  # the fused batch-1 kernels as FusedDecode launches them for DeepSeek-OCR (blocks of decode_kernels.BLOCKS)
    "_qkv_rope": ({"x_ptr": BF16, "ln_ptr": BF16, "w_ptr": BF16, "cos_ptr": BF16, "sin_ptr": BF16, "pos_ptr": "*i64",
                   "q_ptr": BF16, "kc_ptr": BF16, "vc_ptr": BF16, "tok_ptr": "*i64", "emb_ptr": BF16, "s_kh": "i32",
                   "s_kl": "i32", "s_vh": "i32", "s_vl": "i32", "eps": "fp32"},
                  {"H": 1280, "D": 128, "BR": 2, "BK": 2048, "EMBED": False}),
    "_oproj_residual": ({"o_ptr": BF16, "w_ptr": BF16, "x_ptr": BF16}, {"H": 1280, "BN": 2, "BK": 2048}),
    "_router": (ROUTER, {"E": 64, "EP": 64, "K": 6, "SHARED": 2, "NORM": False, "H": 1280, "I": 896, "BE": 1,
                         "BK": 2048, "BN_UP": 4, "BK_UP": 2048}),
    "dense _expert_up": ({"x_ptr": BF16, "ln_ptr": BF16, "ids_ptr": "*i32", "w_ptr": BF16, "act_ptr": BF16,
                          "eps": "fp32", "swe": "i32"}, {"H": 1280, "I": 6848, "DENSE": True, "BN": 4, "BK": 2048}),
    "_expert_up": ({"x_ptr": BF16, "ln_ptr": BF16, "ids_ptr": "*i32", "w_ptr": BF16, "act_ptr": BF16, "eps": "fp32",
                    "swe": "i32"}, {"H": 1280, "I": 896, "DENSE": False, "BN": 8, "BK": 256}),
    "_expert_down": ({"act_ptr": BF16, "ids_ptr": "*i32", "wts_ptr": "*fp32", "w_ptr": BF16, "x_ptr": BF16,
                      "ys_ptr": "*fp32", "cnt_ptr": "*i32", "swe": "i32"},
                     {"SLOTS": 8, "H": 1280, "I": 896, "DENSE": False, "BN": 16, "BK": 1024}),
    "_attention": ({"q_ptr": BF16, "k_ptr": BF16, "v_ptr": BF16, "pos_ptr": "*i64", "m_ptr": "*fp32",
                    "l_ptr": "*fp32", "acc_ptr": "*fp32", "cnt_ptr": "*i32", "o_ptr": BF16, "n_splits": "i32",
                    "skh": "i32", "skl": "i32", "svh": "i32", "svl": "i32", "scale": "fp32"},
                   {"D": 128, "CHUNK": 32, "BS": 32}),
}
# the batched greedy choice's kernels (choice_kernels.py) and the n-gram ban over rows (batched_choice 'graph')
CHOICE = {
    "_best_rows": ({"logits_ptr": "*fp32", "stamp_ptr": "*i32", "serial_ptr": "*i32", "pmax_ptr": "*fp32",
                    "parg_ptr": "*i32", "V": "i32", "s_row": "i32", "P": "i32"}, {"BN": 4096}),
    "_choose_rows": ({"pmax_ptr": "*fp32", "parg_ptr": "*i32", "P": "i32", "token_ptr": "*i64", "hist_ptr": "*i64",
                      "s_hist": "i32", "pos_ptr": "*i64", "serial_ptr": "*i32", "fin_ptr": "*i8", "cnt_ptr": "*i32",
                      "capacity": "i32", "pad": "i32", "eos": "i32"}, {"BP": 32}),
}


def test_the_batched_choice_kernels_compile(kernels):
    from dsocr_core.fast import choice_kernels as ck

    for name, (sig, consts) in CHOICE.items():
        assert _compile(getattr(ck, name), sig, consts).asm["cubin"], name
    dk = kernels[0]
    ban = {"hist_ptr": "*i64", "pos_ptr": "*i64", "stamp_ptr": "*i32", "serial_ptr": "*i32", "s_hist": "i32",
           "s_stamp": "i32"}
    assert _compile(dk._ngram_ban, ban, {"N": 20, "BW": 256, "PDL": False}).asm["cubin"]


# the attention's blocks for longer caches (decode_kernels.attention_blocks): 64 slots a program on 2 warps, 128 on 4
for _chunk, _splits, _warps in ((64, 32, 2), (128, 32, 4)):
    FUSED[f"{_chunk}-slot _attention"] = (FUSED["_attention"][0], {"D": 128, "CHUNK": _chunk, "BS": _splits}, _warps)


def _loads_around_the_wait(kernel) -> tuple[list[int], int, bool]:
    """Global loads in the kernel's SASS before each of its waits for the previous kernel (ACQBULK,
    griddepcontrol.wait; counted from the wait before it: a kernel whose programs take different branches has a
    wait in each), the loads after the last wait, and whether it lets the next kernel launch (PREEXIT,
    griddepcontrol.launch_dependents) only after its first wait. Read as ptxas scheduled them: what the GPU will
    issue, not what the source says."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        pytest.skip("this Triton wheel ships no cuobjdump: the compiled code cannot be read here")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(tool), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in sass.splitlines() if "LDG" in ln or "ACQBULK" in ln or "PREEXIT" in ln]
    waits = [i for i, ln in enumerate(lines) if "ACQBULK" in ln]
    launch = next(i for i, ln in enumerate(lines) if "PREEXIT" in ln)
    loads = ["LDG" in ln for ln in lines]
    before = [sum(loads[start + 1 if start >= 0 else 0:w]) for start, w in zip([-1] + waits[:-1], waits)]
    return before, sum(loads[waits[-1]:]), launch > waits[0]


def _compile_aligned(fn, signature: dict, constexprs: dict, warps: int | None = None):
    """As Triton's launcher specialises them: every pointer 16-byte aligned (vector loads); `warps` as launched
    (None: Triton's default)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items() if t.startswith("*")}
    sig = dict(signature, **{name: "constexpr" for name in constexprs})
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget(*SM90), options={"num_warps": warps} if warps else None)


@pytest.mark.parametrize("name", list(FUSED))
def test_fused_kernels_load_their_weights_before_waiting_for_the_previous_kernel(kernels, name):
    """With programmatic dependent launch a kernel's programs start while the previous kernel runs; the weights
    (which nothing in a step writes) are loaded before the wait, so their HBM latency overlaps the previous
    kernel's tail. Only a routed expert's gate/up rows wait (for the router's choice). The q/k/v and routed gate/up
    kernels let the next kernel launch only after their own wait, which is what makes the attention's early loads
    (the position and earlier steps' cache slots) and the down kernel's (the router's expert ids) safe: those two
    must let the next kernel launch late, every other kernel as early as it can."""
    dk = kernels[0]
    sig, shapes, *warps = FUSED[name]
    before, after, late = _loads_around_the_wait(_compile_aligned(getattr(dk, name.split()[-1]), sig,
                                                                  dict(shapes, PDL=True), *warps))
    assert after > 0
    if name == "_expert_up":  # one wait, nothing to load before it
        assert before == [0]
    else:  # every branch's wait (the router's two: the routing's, the shared experts') has loads before it
        assert before and all(n > 0 for n in before), before
    assert late == (name in ("_qkv_rope", "_expert_up"))
