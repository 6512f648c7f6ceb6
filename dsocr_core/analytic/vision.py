"""Vision rows (SAM, CLIP, projector): the cost of ONE view of side S pixels, as plain numbers.

A view's cost depends only on the spec and S, so the sweep computes it once per view size and scales it by the
number of views (`Cost.scaled`); the stage code adds the global views and the tile views as two calls.

Byte model (activations): the ops our eager torch model runs (dsocr_core/model), each reading its inputs and
writing its output once in the activation dtype: matmuls, convs, SDPA, nn.LayerNorm and GELU are single kernels;
LayerNorm2d, quick_gelu and the window partition are several ops, each charged. SAM's dense relative-position mask
is materialised in the activation dtype and read by SDPA. Not charged: the bicubic/linear resize of position
tables (once per call, a few MB), `torch.cat` of pixel batches, einsum-internal transposes. Weights are charged
once per forward call.
FLOP constants for non-matmul work (other FLOPs): LayerNorm 7/element, LayerNorm2d 8, exact GELU 8, quick_gelu 6,
softmax with its scale 6 per score, residual add 1, mask add 1.
"""
from __future__ import annotations

from ..spec import ModelSpec
from .cost import Cost
from .params import _linear, clip_layer_params, sam_block_params

# module-path prefixes of the stages after SAM (params.stage_of)
STAGE_PREFIXES = {"model.vision_model": "clip", "model.projector": "projector", "model.image_newline": "projector",
                  "model.view_seperator": "projector"}

LN_FLOPS = 7  # LayerNorm per element: mean, centre, square, variance, normalise, scale, shift
LN2D_FLOPS = 8  # LayerNorm2d as written: mean, centre, square, mean, centre again, divide, scale, shift
GELU_FLOPS = 8  # exact (erf) GELU per element
QUICK_GELU_FLOPS = 6  # h * sigmoid(1.702 h): scale, sigmoid (~4), multiply
SOFTMAX_FLOPS = 6  # per attention score: scale, max, subtract, exp, sum, divide


def sam_patches(spec: ModelSpec, side: int) -> int:
    """SAM patches per side of a view: conv kernel = stride = patch."""
    return side // spec.sam_patch


def conv_out(n: int, kernel: int = 3, stride: int = 2, pad: int = 1) -> int:
    return (n + 2 * pad - kernel) // stride + 1  # output size of a convolution along one side


def sam_out_side(spec: ModelSpec, side: int) -> int:
    """SAM output grid per side (after net_2 and net_3, both stride 2): the vision features per side."""
    return conv_out(conv_out(sam_patches(spec, side)))


def layer_norm(tokens: float, width: int, dt: int, n_params: int) -> Cost:
    """A LayerNorm over tokens x width: one read, one write; peak = input (kept for the residual) + output."""
    el = tokens * width
    return Cost(other_flops=LN_FLOPS * el,  # LayerNorm arithmetic
                weight_bytes=n_params * dt,  # weight + bias
                act_read=el * dt, act_write=el * dt,  # read input, write output
                peak_activation=2 * el * dt,  # input and output alive together
                weight_memory=n_params * dt)


def sam_patch_embed(spec: ModelSpec, side: int, dt: int, params: dict) -> Cost:
    p, w, k = sam_patches(spec, side), spec.sam_width, spec.sam_patch
    n = params["model.sam_model.patch_embed"]
    return Cost(tensor_flops=2 * p * p * w * 3 * k * k,  # conv 3->W, kernel = stride = patch
                tensor_flops_causal=2 * p * p * w * 3 * k * k,
                weight_bytes=n * dt,  # conv weight + bias
                act_read=3 * side * side * dt,  # pixels
                act_write=p * p * w * dt,  # patch embeddings
                peak_activation=(3 * side * side + p * p * w) * dt,  # pixels and patch embeddings
                weight_memory=n * dt)


def sam_pos_embed(spec: ModelSpec, side: int, dt: int, params: dict) -> Cost:
    """Adding the absolute position table (resized to the patch grid; the resize itself is not charged)."""
    p, w = sam_patches(spec, side), spec.sam_width
    n = params["model.sam_model.pos_embed"]
    return Cost(other_flops=p * p * w,  # one add per element
                weight_bytes=n * dt,  # the table
                act_read=p * p * w * dt, act_write=p * p * w * dt,  # x read, x + pos written
                peak_activation=2 * p * p * w * dt,  # x and x + pos
                weight_memory=n * dt)


def sam_attn(spec: ModelSpec, side: int, dt: int, global_block: bool, params_n: int) -> Cost:
    """SAM attention on one view, with the block's window partition and residual add. Windowed blocks pad the
    P x P map to a multiple of the window and run on windows of win^2 tokens; global blocks run on all P^2 tokens.
    The bias rel_h + rel_w is materialised as a dense [groups*heads, L, L] mask in dt and passed to SDPA."""
    p, w, heads = sam_patches(spec, side), spec.sam_width, spec.sam_heads
    if global_block:
        span, groups, padded = p, 1, False  # one group of P x P tokens
    else:
        win = spec.sam_window
        pp = -(-p // win) * win  # P rounded up to a multiple of the window
        span, groups, padded = win, (pp // win) ** 2, pp != p  # windows of win x win tokens
    seq = span * span  # tokens per attention group (L)
    n = groups * seq  # tokens through qkv/proj: padded P^2 for windowed, P^2 for global
    scores = groups * heads * seq * seq  # elements of the dense mask (and of the implicit score matrix)
    rel = 2 * groups * heads * seq * span  # elements of rel_h [.., h, w, h] plus rel_w [.., h, w, w]
    real = p * p * w  # elements of the unpadded map (residual stream)
    windowed = 0 if global_block else 1
    pad = real if padded else 0  # F.pad reads the map (and writes n * w elements)
    tensor = (2 * n * w * 3 * w  # qkv projection
              + 2 * n * w * 2 * span  # rel-pos einsums rel_h and rel_w (q against [span, span, d] tables)
              + 4 * n * seq * w  # SDPA QK^T and PV with the dense mask, non-causal (4 * groups*heads * L*L * d)
              + 2 * n * w * w)  # output projection
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,  # vision attention is not causal
                other_flops=(scores  # mask = rel_h + rel_w, broadcast to [L, L]
                             + SOFTMAX_FLOPS * scores  # softmax over the scores inside SDPA
                             + real),  # residual add (done in the block; charged here)
                weight_bytes=params_n * dt,
                act_read=(windowed * (pad + n * w)  # partition: zero-pad, then the window permute copy
                          + n * w  # qkv reads its input
                          + n * w  # q reshaped to [groups*heads, h, w, d] (a copy)
                          + 2 * n * w  # the two einsums each read q
                          + rel  # building the mask reads rel_h and rel_w
                          + 3 * n * w + scores  # SDPA reads q, k, v and the dense mask
                          + n * w  # head merge (transpose + reshape copy)
                          + n * w  # proj reads the merged heads
                          + windowed * (n * w + (real if padded else 0))  # un-partition copy, crop copy
                          + 2 * real) * dt,  # residual add reads shortcut and attention output
                act_write=(windowed * ((n * w if padded else 0) + n * w)  # padded map, windows
                           + 3 * n * w  # q, k, v
                           + n * w  # reshaped q
                           + rel  # rel_h and rel_w
                           + scores  # the dense mask
                           + n * w  # SDPA output
                           + n * w  # merged heads
                           + n * w  # proj output
                           + windowed * (n * w + (real if padded else 0))  # un-partitioned map, cropped map
                           + real) * dt,  # residual sum
                peak_activation=(real  # shortcut
                                 + 3 * n * w + n * w  # q, k, v and the reshaped q
                                 + rel + scores  # rel_h, rel_w and the dense mask
                                 + n * w) * dt,  # SDPA output
                weight_memory=params_n * dt)


def sam_mlp(spec: ModelSpec, side: int, dt: int, params_n: int) -> Cost:
    p, w, m = sam_patches(spec, side), spec.sam_width, spec.sam_mlp_dim
    t = p * p  # MLP runs on the unpadded map
    tensor = 2 * t * w * m * 2  # lin1 and lin2
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                other_flops=GELU_FLOPS * t * m + t * w,  # exact GELU, residual add
                weight_bytes=params_n * dt,
                act_read=t * (w + m + m + 2 * w) * dt,  # lin1 in, GELU in, lin2 in, residual operands
                act_write=t * (m + m + w + w) * dt,  # lin1 out, GELU out, lin2 out, residual sum
                peak_activation=t * (w + m + m + w) * dt,  # input, hidden, GELU output, output
                weight_memory=params_n * dt)


def sam_neck(spec: ModelSpec, side: int, dt: int, params_n: int) -> Cost:
    p, w, nd = sam_patches(spec, side), spec.sam_width, spec.sam_neck_dim
    t = p * p
    tensor = 2 * t * w * nd + 2 * t * nd * nd * 9  # 1x1 conv W->neck, 3x3 conv neck->neck (pad 1)
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                other_flops=2 * LN2D_FLOPS * t * nd,  # two LayerNorm2d
                weight_bytes=params_n * dt,
                act_read=t * (w + nd + 2 * 8 * nd) * dt,  # conv1 in, conv2 in, 8 reads per LayerNorm2d element
                act_write=t * (2 * nd + 2 * 6 * nd) * dt,  # conv outputs, 6 writes per LayerNorm2d element
                peak_activation=t * max(w + nd, 4 * nd) * dt,  # conv1 in/out, or LN2d input, centred, squared, out
                weight_memory=params_n * dt)


def sam_downsample(spec: ModelSpec, side: int, dt: int, which: int, params_n: int) -> Cost:
    """net_2 (which=0) or net_3 (which=1): 3x3 stride-2 conv, no bias."""
    n_in = sam_patches(spec, side) if which == 0 else conv_out(sam_patches(spec, side))
    c_in = spec.sam_neck_dim if which == 0 else spec.sam_downsample[0]
    c_out = spec.sam_downsample[which]
    o = conv_out(n_in)  # output side
    tensor = 2 * o * o * c_in * c_out * 9  # 3x3 conv, stride 2
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                weight_bytes=params_n * dt,
                act_read=n_in * n_in * c_in * dt, act_write=o * o * c_out * dt,  # input map, output map
                peak_activation=(n_in * n_in * c_in + o * o * c_out) * dt,  # both alive during the conv
                weight_memory=params_n * dt)


def clip_tokens(spec: ModelSpec, side: int) -> int:
    g = sam_out_side(spec, side)
    return g * g + 1  # SAM features + CLS


def clip_embeddings(spec: ModelSpec, side: int, dt: int, params_n: int) -> Cost:
    g, c = sam_out_side(spec, side), spec.clip_width
    n = g * g + 1
    read = c + (spec.clip_pos_grid ** 2 + 1) * c  # class embedding and position table (patch conv never runs)
    return Cost(other_flops=n * c,  # position add
                weight_bytes=read * dt,
                act_read=(g * g * c  # concat reads the (transposed) SAM features
                          + 2 * n * c) * dt,  # position add reads tokens and positions
                act_write=2 * n * c * dt,  # concatenation, sum
                peak_activation=(g * g * c + 3 * n * c) * dt,  # SAM features, concat, positions, sum
                weight_memory=params_n * dt)


def clip_attn(spec: ModelSpec, side: int, dt: int, params_n: int) -> Cost:
    n, c, heads = clip_tokens(spec, side), spec.clip_width, spec.clip_heads
    tensor = (2 * n * c * 3 * c  # qkv_proj
              + 4 * n * n * c  # SDPA QK^T and PV, no mask (4 * heads * N*N * head_dim)
              + 2 * n * c * c)  # out_proj
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                other_flops=SOFTMAX_FLOPS * heads * n * n + n * c,  # softmax in the kernel, residual add
                weight_bytes=params_n * dt,
                act_read=(n * c  # qkv_proj reads x
                          + 3 * n * c  # SDPA reads q, k, v
                          + n * c  # head merge copy
                          + n * c  # out_proj reads merged heads
                          + 2 * n * c) * dt,  # residual add
                act_write=(3 * n * c + n * c + n * c + n * c + n * c) * dt,  # q/k/v, SDPA, merge, out_proj, sum
                peak_activation=(n * c + 3 * n * c + 2 * n * c) * dt,  # shortcut, q/k/v, output and its copy
                weight_memory=params_n * dt)


def clip_mlp(spec: ModelSpec, side: int, dt: int, params_n: int) -> Cost:
    n, c, m = clip_tokens(spec, side), spec.clip_width, spec.clip_mlp_dim
    tensor = 2 * n * c * m * 2  # fc1 and fc2
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                other_flops=QUICK_GELU_FLOPS * n * m + n * c,  # quick_gelu, residual add
                weight_bytes=params_n * dt,
                act_read=n * (c + 4 * m + m + 2 * c) * dt,  # fc1 in; 1.702*h, sigmoid, h*s read 4; fc2 in; residual
                act_write=n * (m + 3 * m + c + c) * dt,  # fc1 out; three quick_gelu outputs; fc2 out; residual sum
                peak_activation=n * (c + 3 * m + c) * dt,  # input, h, sigmoid and product, output
                weight_memory=params_n * dt)


def projector(spec: ModelSpec, side: int, dt: int, params_n: int) -> Cost:
    g, h, din = sam_out_side(spec, side), spec.hidden_size, spec.projector_input_dim
    f = g * g  # features of the view (CLS dropped)
    tensor = 2 * f * din * h  # Linear(projector_input_dim -> hidden)
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                weight_bytes=params_n * dt,  # weight + bias
                act_read=(f * spec.clip_width + f * spec.sam_downsample[1]  # concat reads CLIP and SAM features
                          + f * din) * dt,  # the linear reads the concatenation
                act_write=(f * din + f * h) * dt,  # concatenation, projected features
                peak_activation=f * (spec.clip_width + spec.sam_downsample[1] + din + h) * dt,  # inputs, concat, out
                weight_memory=params_n * dt)


def sam_rows(spec: ModelSpec, side: int, dt: int, params: dict) -> list[tuple[str, str, tuple[str, ...], Cost]]:
    """The SAM tokenizer's rows for one view of `side` pixels (the same in every family)."""
    rows = []
    sam = "model.sam_model"
    rows.append(("sam", "sam.patch_embed", (f"{sam}.patch_embed",), sam_patch_embed(spec, side, dt, params)))
    rows.append(("sam", "sam.pos_embed", (f"{sam}.pos_embed",), sam_pos_embed(spec, side, dt, params)))
    p2 = sam_patches(spec, side) ** 2
    blocks = {False: [b for b in range(spec.sam_layers) if b not in spec.sam_global_blocks],
              True: [b for b in range(spec.sam_layers) if b in spec.sam_global_blocks]}
    for is_global, idx in blocks.items():
        if not idx:
            continue
        tag = "global" if is_global else "windowed"
        n = sam_block_params(spec, is_global)
        paths = lambda name: tuple(f"{sam}.blocks.{b}.{name}" for b in idx)  # noqa: E731
        rows.append(("sam", f"sam.norm1.{tag}", paths("norm1"), layer_norm(p2, spec.sam_width, dt, n["norm1"])))
        rows.append(("sam", f"sam.attn.{tag}", paths("attn"), sam_attn(spec, side, dt, is_global, n["attn"])))
        rows.append(("sam", f"sam.norm2.{tag}", paths("norm2"), layer_norm(p2, spec.sam_width, dt, n["norm2"])))
        rows.append(("sam", f"sam.mlp.{tag}", paths("mlp"), sam_mlp(spec, side, dt, n["mlp"])))
    rows.append(("sam", "sam.neck", (f"{sam}.neck",), sam_neck(spec, side, dt, params[f"{sam}.neck"])))
    rows.append(("sam", "sam.net_2", (f"{sam}.net_2",), sam_downsample(spec, side, dt, 0, params[f"{sam}.net_2"])))
    rows.append(("sam", "sam.net_3", (f"{sam}.net_3",), sam_downsample(spec, side, dt, 1, params[f"{sam}.net_3"])))
    return rows


def view_rows(spec: ModelSpec, side: int, dt: int, params: dict) -> list[tuple[str, str, tuple[str, ...], Cost]]:
    """Every vision row for one view of `side` pixels: (stage, kind, module paths, per-view cost)."""
    rows = sam_rows(spec, side, dt, params)
    vm = "model.vision_model"
    n_tok = clip_tokens(spec, side)
    rows.append(("clip", "clip.embeddings", (f"{vm}.embeddings",),
                 clip_embeddings(spec, side, dt, params[f"{vm}.embeddings"])))
    rows.append(("clip", "clip.pre_layrnorm", (f"{vm}.pre_layrnorm",),
                 layer_norm(n_tok, spec.clip_width, dt, params[f"{vm}.pre_layrnorm"])))
    n = clip_layer_params(spec)
    paths = lambda name: tuple(f"{vm}.transformer.layers.{i}.{name}" for i in range(spec.clip_layers))  # noqa: E731
    rows.append(("clip", "clip.layer_norm1", paths("layer_norm1"), layer_norm(n_tok, spec.clip_width, dt, n["layer_norm1"])))
    rows.append(("clip", "clip.self_attn", paths("self_attn"), clip_attn(spec, side, dt, n["self_attn"])))
    rows.append(("clip", "clip.layer_norm2", paths("layer_norm2"), layer_norm(n_tok, spec.clip_width, dt, n["layer_norm2"])))
    rows.append(("clip", "clip.mlp", paths("mlp"), clip_mlp(spec, side, dt, n["mlp"])))

    rows.append(("projector", "projector", ("model.projector",), projector(spec, side, dt, params["model.projector"])))
    return rows


def head_params(spec: ModelSpec) -> dict[str, int]:
    """Parameters of the stages after SAM: CLIP, the projector and the two layout vectors (params._param_counts)."""
    out: dict[str, int] = {}
    c = spec.clip_width
    out["model.vision_model.embeddings"] = (c  # class_embedding
                                            + c * 3 * spec.clip_patch ** 2  # patch_embedding conv (loaded, never run)
                                            + (spec.clip_pos_grid ** 2 + 1) * c)  # position_embedding incl. CLS
    out["model.vision_model.pre_layrnorm"] = 2 * c
    for i in range(spec.clip_layers):
        for name, n in clip_layer_params(spec).items():
            out[f"model.vision_model.transformer.layers.{i}.{name}"] = n
    out["model.projector"] = _linear(spec.projector_input_dim, spec.hidden_size, True)
    out["model.image_newline"] = spec.hidden_size
    out["model.view_seperator"] = spec.hidden_size
    return out
