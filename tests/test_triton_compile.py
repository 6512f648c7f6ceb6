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
DOWN = {"a_ptr": "*bf16", "ids_ptr": "*i64", "w_ptr": "*bf16", "out_ptr": "*bf16", "T": "i32", "K8": "i32",
        "swe": "i32", "swn": "i32"}


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
    for pdl in (False, True):
        fused = dict(routing, H=1280, I=896, BE=1, BK=2048, BN_UP=8, BK_UP=256, PDL=pdl)
        assert _compile(dk._router, ROUTER, fused).asm["cubin"]


def test_the_by_expert_kernels_compile_up_to_their_token_tile(kernels):
    """The expert kernels at the smallest token tile and at the largest the engine allows, with its blocks; the
    largest stays within Hopper's 228 KB of shared memory per block."""
    _, tk, max_tokens, (bn, bk) = kernels
    for tp in (16, max_tokens):
        shapes = {"H": 1280, "I": 896, "BN": bn, "BK": bk, "TP": tp, "KP": 8}
        for fn, sig in ((tk._moe_up, UP), (tk._moe_down, DOWN)):
            k = _compile(fn, sig, shapes)
            assert k.asm["cubin"] and k.metadata.shared <= 228 * 1024
