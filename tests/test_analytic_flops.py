"""The analytic tensor_flops against torch's FlopCounterMode on our torch model, per stage AND per module path
(the join the measurement code does): the full spec on the meta device, a tiny spec on CPU."""
import re

import pytest
import torch

from dsocr_core.analytic import decode_step_table, module_table, param_counts, stage_totals
from dsocr_core.model import flop_counter, meta_model, synthetic_model
from dsocr_core.spec import ModelSpec, Workload, tiny_spec
from dsocr_core.tiling import MODES, token_counts


def model_inputs(spec, mode, grid, text_tokens, batch, device):
    """input_ids, images, images_seq_mask, images_spatial_crop for `batch` identical pages (values irrelevant)."""
    info, tc = MODES[mode], token_counts(mode, grid)
    seq = tc.image_slots + text_tokens
    ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[:, 1:1 + tc.image_slots] = True  # BOS, image slots, then the rest of the text
    glob = torch.zeros(1, 3, info.base_size, info.base_size, device=device)
    crops = torch.zeros(tc.n_tiles, 3, info.tile_size, info.tile_size, device=device) if tc.n_tiles else None
    return dict(input_ids=ids, images=[(crops, glob)] * batch, images_seq_mask=mask.to(device),
                images_spatial_crop=[list(grid)] * batch), seq


def counts_by_path(fc) -> dict[str, int]:
    """FlopCounterMode's per-module counts keyed by module path (the root class name stripped)."""
    out = {}
    for name, ops in fc.get_flop_counts().items():
        if "." in name:
            out[name.split(".", 1)[1]] = sum(ops.values())
    return out


def measured(counts: dict[str, int], path: str) -> int:
    """A row's measured FLOPs: the module's own count, or the sum over its numbered children (experts.{e})."""
    if path in counts:
        return counts[path]
    child = re.compile(re.escape(path) + r"\.\d+$")
    return sum(v for k, v in counts.items() if child.match(k))


def check_rows(table, counts, stages):
    rows = table[table.stage.isin(stages)]
    assert len(rows) > 0
    bad = [(r.stage, r.module, r.tensor_flops, measured(counts, r.module)) for r in rows.itertuples()
           if r.tensor_flops != measured(counts, r.module)]
    assert not bad, bad[:5]


def run_and_compare(model, spec, workload, device):
    kw, seq = model_inputs(spec, workload.mode, workload.crops or (1, 1), workload.text_tokens, workload.batch,
                           device)
    with torch.inference_mode(), flop_counter(depth=100) as fc:
        _, cache = model(**kw, logits=workload.logits)
    totals = stage_totals(spec, workload)
    assert fc.get_total_flops() == totals["vision"]["tensor_flops"] + totals["prefill"]["tensor_flops"]
    check_rows(module_table(spec, workload), counts_by_path(fc), ("sam", "clip", "projector", "prefill"))
    step = torch.zeros(workload.batch, 1, dtype=torch.long, device=device)
    with torch.inference_mode(), flop_counter(depth=100) as fc:
        model(step, cache=cache, logits="last")
    table = decode_step_table(spec, workload, context=seq)
    assert fc.get_total_flops() == table.tensor_flops.sum()
    check_rows(table, counts_by_path(fc), ("decode",))


@pytest.mark.parametrize("mode,grid,text,batch,attn,logits", [
    ("gundam", (2, 2), 10, 1, "sdpa", "all"),
    ("gundam", (2, 2), 10, 1, "eager", "last"),
    ("gundam", (3, 2), 500, 1, "sdpa", "all"),  # longer text: decode context 1,093 + 490
    ("gundam", (1, 1), 2000, 2, "sdpa", "last"),  # untiled page, long prompt, batch 2
    ("base", (1, 1), 10, 1, "sdpa", "all"),
    ("tiny", (1, 1), 10, 4, "eager", "all"),
    ("large", (1, 1), 100, 1, "sdpa", "last"),
])
def test_full_spec_on_meta(mode, grid, text, batch, attn, logits):
    spec = ModelSpec()
    w = Workload(mode=mode, crops=grid if mode == "gundam" and grid != (1, 1) else None, text_tokens=text,
                 batch=batch, attn=attn, logits=logits)
    run_and_compare(meta_model(spec, attn_impl=attn), spec, w, "meta")


@pytest.fixture(scope="module")
def tiny_models():
    spec = tiny_spec()
    return spec, {a: synthetic_model(spec, seed=0, dtype="float32", attn_impl=a) for a in ("sdpa", "eager")}


@pytest.mark.parametrize("mode,grid,batch,attn,logits", [
    ("gundam", (3, 2), 2, "eager", "last"),  # tiles, batch of two, eager LM
    ("gundam", (1, 1), 1, "sdpa", "all"),  # untiled gundam: global view only
    ("small", (1, 1), 3, "sdpa", "last"),  # 640 px view: windows padded 40 -> 42 patches
    ("gundam-m", (2, 1), 1, "sdpa", "all"),
])
def test_tiny_spec_on_cpu(tiny_models, mode, grid, batch, attn, logits):
    spec, models = tiny_models
    w = Workload(mode=mode, crops=grid if grid != (1, 1) else None, text_tokens=7, batch=batch, attn=attn,
                 logits=logits)
    run_and_compare(models[attn], spec, w, "cpu")


def test_row_paths_are_torch_paths_and_params_join():
    """Every analytic row names a module (or, for pos_embed and the layout vectors, a parameter) of the torch
    model, and param_counts agrees with the model's parameters grouped by row key."""
    spec = ModelSpec()
    model = meta_model(spec)
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    table = module_table(spec, Workload(crops=(2, 2), decode_steps=3))
    for path in table.module.unique():
        assert path in modules or path in params, path
    keys = sorted(param_counts(spec), key=len, reverse=True)
    grouped = dict.fromkeys(keys, 0)
    for name, p in params.items():
        owner = next(k for k in keys if name == k or name.startswith(k + "."))
        grouped[owner] += p.numel()
    assert grouped == param_counts(spec)
