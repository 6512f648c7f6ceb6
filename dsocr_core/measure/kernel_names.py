"""Readable names for profiler operators and CUDA kernels.

A CUDA kernel's name as torch.profiler reports it is its full C++ signature: `void at::native::
vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::
MulFunctor<float> >, at::detail::Array<char*, 3> >(int, ...)` is one multiply. `short_name` keeps what tells
kernels apart: the function's own name (namespaces, return type, template arguments and parameters dropped) and,
for PyTorch's generic elementwise / reduction kernels, the operation they were instantiated with (`MulFunctor`,
`MeanOps`, `direct_copy_kernel_cuda`); a generic wrapper (`cutlass::Kernel2<cutlass_80_..._gemm_...>`) is named by
what it wraps. Operator names without templates (`aten::mm`, `triton_poi_fused_add_0`, `Memcpy HtoD`, the
breakdown's own `(untraced ...)` rows) are kept, cut to `limit` characters with an ellipsis. The full name stays
beside the short one wherever it is shown (a tooltip on the dashboard).
"""
from __future__ import annotations

import re

DEFAULT_LIMIT = 56
_WRAPPERS = {"Kernel", "Kernel2", "device_kernel", "kernel", "GenericKernel", "launch_kernel"}
_GENERIC = {"BinaryFunctor", "UnaryFunctor", "AUnaryFunctor", "BUnaryFunctor", "ReduceOp", "CUDAFunctorOnSelf",
            "CUDAFunctorOnOther", "OpaqueType", "func_wrapper_t"}
_DETAIL = (re.compile(r"\b([A-Za-z_]\w*_kernel_cuda)\b"), re.compile(r"\b([A-Za-z_]\w*(?:Functor|Ops|Op))\b"))


def _cut(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: one long identifier (a cuBLAS / CUTLASS GEMM names its tile and layout
    at the end) keeps its start and its end, anything else its start."""
    if len(text) <= limit:
        return text
    if " " not in text and limit >= 24:
        tail = limit // 3
        return text[:limit - tail - 1] + "…" + text[-tail:]
    return text[:limit - 1].rstrip() + "…"


def _split_head(text: str) -> tuple[str, str]:
    """(the name before the first top-level '<' or '(', the text inside that first '<...>' (or ''))."""
    for i, ch in enumerate(text):
        if ch in "<(":
            head = text[:i]
            if ch == "(":
                return head, ""
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "<":
                    depth += 1
                elif text[j] == ">":
                    depth -= 1
                    if depth == 0:
                        return head, text[i + 1:j]
            return head, text[i + 1:]
    return text, ""


def _first_arg(args: str) -> str:
    depth = 0
    for i, ch in enumerate(args):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i].strip()
    return args.strip()


def short_name(name: str, limit: int = DEFAULT_LIMIT) -> str:
    """A readable name for an operator or kernel (see the module docstring)."""
    full = " ".join(str(name).split())
    if not full or full.startswith("(") or ("<" not in full and "(" not in full):
        return _cut(full, limit)
    if full.startswith(("Memcpy", "Memset")):  # CUDA runtime activity, not a kernel signature
        return _cut(full, limit)
    text = full[5:] if full.startswith("void ") else full
    text = text.replace("(anonymous namespace)::", "")
    if text.startswith("std::enable_if<"):  # a SFINAE return type before the function: skip it
        _, cond = _split_head(text)
        rest = text[len("std::enable_if<") + len(cond) + 1:]
        text = rest.split(" ", 1)[1] if rest.startswith("::type ") else text
    head, args = _split_head(text)
    base = head.strip().split("::")[-1].split(" ")[-1] or head.strip()
    if not base:
        return _cut(full, limit)
    if base in _WRAPPERS and args:
        inner = _first_arg(args)
        inner_head, _ = _split_head(inner)
        wrapped = inner_head.strip().split("::")[-1]
        if wrapped and re.search(r"[a-z]_|\d[a-z]|[a-z][A-Z]", wrapped) and "kernel" not in wrapped.lower()[:6]:
            return _cut(wrapped, limit)  # a named kernel class (cutlass_80_..._gemm_...), not a plain type
        base = "::".join(head.strip().split(" ")[-1].split("::")[-2:])  # gemvx::kernel, not just kernel
    detail = None
    for pattern in _DETAIL:
        found = [m for m in pattern.findall(args) if m not in _GENERIC and m != base]
        if found:
            detail = found[-1]  # the innermost: BinaryFunctor<..., MulFunctor<float>> -> MulFunctor
            break
    return _cut(f"{base} · {detail}" if detail else base, limit)
