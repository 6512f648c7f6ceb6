"""The language model's weights rearranged for the fast engine, built FROM a loaded `DeepseekOCRForCausalLM`.

What is shared and what is copied (the copies are counted in `LMWeights.extra_bytes`):
* shared (same storage as the reference model): embed_tokens, norms, o_proj, lm_head;
* copied once: q/k/v stacked into one [3H, H] matrix per layer; the dense MLP's gate/up stacked into [2I, H];
  the router weight in float32 (the reference casts it to float32 on every call; same values);
  the routed experts stacked into w13 [E + S, 2*Im, H] (gate rows, then up rows) and w2 [E + S, H, Im].
* The shared expert (one SwiGLU of width S*Im) is split into S pseudo-experts of width Im, appended after the
  routed ones (ids E .. E+S-1) and always chosen with weight 1.0. SwiGLU is separable over its inner units, so
  down(silu(gate(x)) * up(x)) over 1792 units equals the sum of the two halves: the same function, one grouped
  kernel instead of a separate MLP. Only the rounding differs (the reference rounds the shared output to the
  model dtype before adding it to the routed sum; here everything is summed in float32 and rounded once).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.decoder import MLP, MoE
from ..spec import ModelSpec


@dataclass
class LayerWeights:
    index: int
    ln1: torch.Tensor  # [H] input_layernorm
    wqkv: torch.Tensor  # [3H, H] q, k, v projections stacked
    wo: torch.Tensor  # [H, H] o_proj (shared)
    ln2: torch.Tensor  # [H] post_attention_layernorm
    w13: torch.Tensor  # dense [2I, H]; MoE [E + S, 2Im, H]
    w2: torch.Tensor  # dense [H, I]; MoE [E + S, H, Im]
    gate: torch.Tensor | None = None  # MoE router weight, float32 [E, H]

    @property
    def moe(self) -> bool:
        return self.gate is not None


@dataclass
class LMWeights:
    spec: ModelSpec
    embed: torch.Tensor  # [V, H] (shared)
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H] (shared)
    lm_head: torch.Tensor  # [V, H] (shared)
    shared_slots: int  # pseudo-experts appended for the shared expert (S)
    extra_bytes: int = 0  # bytes of the tensors copied for the fast layout
    extra: dict[str, int] = field(default_factory=dict)  # the same, by kind

    @classmethod
    @torch.no_grad()
    def from_model(cls, model) -> "LMWeights":
        spec: ModelSpec = model.spec
        m = model.model
        extra: dict[str, int] = {"qkv": 0, "dense_mlp": 0, "router_fp32": 0, "experts": 0}
        shared_slots = spec.n_shared_experts if spec.n_shared_experts else 0
        layers = []
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0)
            extra["qkv"] += _nbytes(wqkv)
            mlp = layer.mlp
            if isinstance(mlp, MoE):
                w13, w2 = stack_experts(mlp, spec)
                gate = mlp.gate.weight.float()
                extra["experts"] += _nbytes(w13) + _nbytes(w2)
                extra["router_fp32"] += _nbytes(gate)
            elif isinstance(mlp, MLP):
                w13 = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0)
                w2, gate = mlp.down_proj.weight, None
                extra["dense_mlp"] += _nbytes(w13)
            else:  # pragma: no cover - the model has only these two kinds
                raise TypeError(f"layer {i}: unexpected MLP {type(mlp).__name__}")
            layers.append(LayerWeights(i, layer.input_layernorm.weight, wqkv, a.o_proj.weight,
                                       layer.post_attention_layernorm.weight, w13, w2, gate))
        return cls(spec, m.embed_tokens.weight, layers, m.norm.weight, model.lm_head.weight, shared_slots,
                   sum(extra.values()), extra)


def stack_experts(moe: MoE, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 [E + S, 2Im, H] (gate rows then up rows of each expert) and w2 [E + S, H, Im]; the last S entries are
    the shared expert's S slices of width Im."""
    im = spec.moe_intermediate_size
    gates = [e.gate_proj.weight for e in moe.experts]
    ups = [e.up_proj.weight for e in moe.experts]
    downs = [e.down_proj.weight for e in moe.experts]
    if moe.shared_experts is not None:
        s = moe.shared_experts
        for j in range(spec.n_shared_experts):
            rows = slice(j * im, (j + 1) * im)
            gates.append(s.gate_proj.weight[rows])
            ups.append(s.up_proj.weight[rows])
            downs.append(s.down_proj.weight[:, rows])
    w13 = torch.stack([torch.cat([g, u], 0) for g, u in zip(gates, ups)])
    w2 = torch.stack([d.contiguous() for d in downs])
    return w13, w2


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
