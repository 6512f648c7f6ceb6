"""Checkpoints in the official format: vendor config.json + safetensors (one file, or shards with an index).

Loading is strict: every tensor the spec needs must be present with its exact shape, and nothing else may be
(except the buffers the model family's registry entry allows, e.g. DeepSeek-OCR's
`model.vision_model.embeddings.position_ids`, which some re-saved checkpoints carry). The config.json says which
family the folder holds (registry.family_of_config); a folder of the other family is an error naming it. The model is
built on the meta device and the loaded tensors are assigned into it, so loading never holds two copies.
Synthetic weights are seeded per tensor name, so a tensor's values do not depend on the order of generation.
"""
from __future__ import annotations

import json
import math
import re
import time
import zlib
from pathlib import Path
from typing import Iterable, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .. import jsonfile, registry
from ..registry import family_of
from ..spec import MAX_CONFIG_DEPTH, DecoderSpec, SpecError, read_config_json
from .decoder import RMSNorm
from .deepseek_ocr import CausalLM
from .sam import LayerNorm2d

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
LIST_LIMIT = 20  # names shown per kind of problem
# LM sizes a config.json must state: without one the spec takes DeepSeek-OCR's default, and the error that follows
# would speak of a consequence (the projector width, mis-shaped tensors) instead of the missing key
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
             "moe_intermediate_size", "n_routed_experts", "vocab_size")
INIT_STD = 0.02
MAX_INDEX_BYTES = 64 * 2**20  # an index lists one line per tensor: DeepSeek-OCR's is about 300 KB
# counts a config.json states that the tensor names show, compared before the model is built (building is linear in
# them: 10^5 claimed layers took minutes and gigabytes even on the meta device); (config field, pattern, what)
_COUNTS = (
    ("num_hidden_layers", re.compile(r"model\.layers\.(\d+)\."), "LM layers"),
    ("n_routed_experts", re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\."), "experts"),
    ("sam_layers", re.compile(r"model\.sam_model\.blocks\.(\d+)\."), "SAM blocks"),
    ("clip_layers", re.compile(r"model\.vision_model\.transformer\.layers\.(\d+)\."), "CLIP layers"),
    ("enc_layers", re.compile(r"model\.qwen2_model\.model\.model\.layers\.(\d+)\."), "encoder layers"),
)  # a count the spec's family lacks (CLIP layers of DeepSeek-OCR 2, encoder layers of DeepSeek-OCR) is skipped
CHUNK_ELEMENTS = 1 << 28  # tensors read per opening of a safetensors file while loading
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message says what is wrong."""


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"unsupported dtype {dtype}; use bfloat16, float16 or float32")
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use bfloat16, float16 or float32") from None


def model_class(spec: DecoderSpec) -> type[CausalLM]:
    """Our PyTorch model of the spec's family (the registry names it)."""
    return family_of(spec).load("torch_model")


def meta_model(spec: DecoderSpec, attn_impl: str = "sdpa") -> CausalLM:
    """The model with shapes only (no memory): for parameter listings, FLOP counts and loading."""
    with torch.device("meta"):
        return model_class(spec)(spec, attn_impl)


def expected_shapes(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor name of `spec` with its shape."""
    return {name: tuple(t.shape) for name, t in meta_model(spec).state_dict().items()}


# --- synthetic weights ---
def _norm_params(model: nn.Module) -> dict[str, float]:
    """Names of norm parameters with their init value (weight 1, bias 0)."""
    out = {}
    for prefix, module in model.named_modules():
        if isinstance(module, (nn.LayerNorm, LayerNorm2d, RMSNorm)):
            out[f"{prefix}.weight"] = 1.0
            if getattr(module, "bias", None) is not None:
                out[f"{prefix}.bias"] = 0.0
    return out


def synthetic_tensor(name: str, shape: tuple[int, ...], seed: int, fill: float | None = None) -> torch.Tensor:
    """float32 CPU tensor: `fill` if given, else N(0, 0.02) from a generator seeded by (seed, name)."""
    if fill is not None:
        return torch.full(shape, fill, dtype=torch.float32)
    gen = torch.Generator().manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 62))
    return torch.randn(shape, generator=gen, dtype=torch.float32) * INIT_STD


def synthetic_state_dict(spec: DecoderSpec, seed: int = 0, dtype: str | torch.dtype = "bfloat16",
                         device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Seeded random weights for every checkpoint tensor: small N(0, 0.02), norms at weight 1 / bias 0.
    Generated one tensor at a time (float32 scratch, then cast), so the peak is the result plus one tensor."""
    dtype = as_dtype(dtype)
    model = meta_model(spec)
    fills = _norm_params(model)
    return {name: synthetic_tensor(name, tuple(t.shape), seed, fills.get(name)).to(device=device, dtype=dtype)
            for name, t in model.state_dict().items()}


def synthetic_model(spec: DecoderSpec, seed: int = 0, dtype: str | torch.dtype = "bfloat16",
                    device: str | torch.device = "cpu", attn_impl: str = "sdpa") -> CausalLM:
    """A model with synthetic weights (identical to what make-checkpoint writes for the same spec and seed)."""
    model = meta_model(spec, attn_impl)
    model.load_state_dict(synthetic_state_dict(spec, seed, dtype, device), strict=True, assign=True)
    return model.eval()


# --- saving ---
def save_checkpoint(model_or_state: nn.Module | Mapping[str, torch.Tensor], spec: DecoderSpec, folder: str | Path,
                    dtype: str | torch.dtype = "bfloat16", max_shard_bytes: int | None = None,
                    overwrite: bool = False) -> list[Path]:
    """Write config.json (spec.to_config_dict()) and the weights as model.safetensors, or, with
    max_shard_bytes, as model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json.
    Returns the weight files written. Refuses to write tensors that would not load back strictly."""
    folder = Path(folder)
    dtype = as_dtype(dtype)
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else dict(model_or_state)
    _check_names({k: (tuple(v.shape), v.dtype) for k, v in state.items()}, expected_shapes(spec), f"state for {folder}")
    old = sorted(folder.glob("*.safetensors")) + sorted(folder.glob(INDEX_NAME)) if folder.exists() else []
    if old and not overwrite:
        raise CheckpointError(f"{folder} already holds weights ({old[0].name}); pass overwrite=True "
                              "(--force on the command line) to replace them")
    folder.mkdir(parents=True, exist_ok=True)
    for path in old:
        path.unlink()
    # no-op for tensors already on CPU in the target dtype, so a bf16 model is not copied
    state = {k: v.detach().to(device="cpu", dtype=dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in state.items()}
    (folder / "config.json").write_text(json.dumps(spec.to_config_dict(), indent=2) + "\n")
    meta = {"format": "pt"}
    if max_shard_bytes is None:
        save_file(state, folder / SINGLE_NAME, metadata=meta)
        return [folder / SINGLE_NAME]
    shards = _split_shards(state, max_shard_bytes)
    files, weight_map = [], {}
    for i, names in enumerate(shards, 1):
        path = folder / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: state[n] for n in names}, path, metadata=meta)
        weight_map.update({n: path.name for n in names})
        files.append(path)
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return files


def _split_shards(state: Mapping[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    if max_bytes <= 0:
        raise ValueError("max_shard_bytes must be positive")
    shards, size = [[]], 0
    for name in sorted(state):
        n = state[name].numel() * state[name].element_size()
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


# --- loading ---
read_spec = registry.read_spec  # the spec of a checkpoint folder's config.json, in the family it names


def load_model(folder: str | Path, dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
               attn_impl: str = "sdpa") -> tuple[CausalLM, DecoderSpec, dict]:
    """Load a checkpoint folder strictly. Returns (model in eval mode, spec, info). Raises SpecError for a
    broken config.json and CheckpointError for missing files, unreadable safetensors or tensor mismatches."""
    t0 = time.perf_counter()
    folder = Path(folder)
    dtype = as_dtype(dtype)
    if not folder.exists():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder; give the checkpoint folder")
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder} has no config.json; is it a DeepSeek-OCR checkpoint folder?")
    try:
        spec = read_spec(folder)  # SpecError with every problem
    except SpecError as exc:
        _raise_with_missing_keys(folder, exc)
        raise
    files, index = _weight_files(folder)
    listing = _read_listing(files)
    if index is not None:
        _check_index(index, listing, folder)
    try:
        _check_counts(spec, listing, folder / "config.json")
        model = meta_model(spec, attn_impl)
        expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        _check_names(listing, expected, str(folder), family_of(spec).checkpoint.allowed_extra)
    except CheckpointError as exc:
        _raise_with_missing_keys(folder, exc)
        raise

    state = {}
    for path, names in _read_plan(listing, expected, files):
        with _open(path) as f:  # reopened per chunk: the file's mmap (counted in RSS) is released as we go
            for name in names:
                raw = _read(f, name, path)
                tensor = raw.to(device=device, dtype=dtype)  # at most one tensor of scratch at a time
                # safetensors hands out CPU tensors backed by the file's mmap: copy them into our own memory so
                # later edits to the file cannot change the model and timings do not include page faults
                state[name] = raw.clone() if tensor is raw else tensor
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    file_dtypes: dict[str, int] = {}
    for name in expected:
        file_dtypes[listing[name][1]] = file_dtypes.get(listing[name][1], 0) + 1
    info = {
        "folder": str(folder), "files": [p.name for p in files], "sharded": index is not None,
        "tensors": len(state), "parameters": sum(t.numel() for t in state.values()),
        "ignored": sorted(set(listing) - set(expected)), "file_dtypes": file_dtypes,
        "dtype": str(dtype).removeprefix("torch."), "device": str(device), "attn_impl": attn_impl,
        "bytes_on_disk": sum(p.stat().st_size for p in files), "load_seconds": time.perf_counter() - t0,
    }
    return model, spec, info


def _weight_files(folder: Path) -> tuple[list[Path], dict | None]:
    """The safetensors files to read: those the index names, else every *.safetensors in the folder."""
    index_path = folder / INDEX_NAME
    if index_path.exists():
        index = jsonfile.load(index_path, CheckpointError, MAX_INDEX_BYTES, MAX_CONFIG_DEPTH)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index_path} is not a valid safetensors index: its weight_map is not an "
                                  "object of tensor name -> shard file name")
        names = sorted(set(weight_map.values()))
        # a shard is a file of this folder, named as the index format names it: never a path elsewhere
        outside = [n for n in names if Path(n).name != n or n in ("", ".", "..")]
        if outside:
            raise CheckpointError(f"{index_path} names shard files outside its folder: {_names(outside)}; "
                                  "shards must be plain file names in the checkpoint folder")
        absent = [n for n in names if not (folder / n).is_file()]
        if absent:
            raise CheckpointError(f"{index_path.name} names shard files that are missing: {', '.join(absent)}")
        return [folder / n for n in names], weight_map
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors weights (and no {INDEX_NAME})")
    return files, None


def _read_plan(listing: dict, expected: Mapping, files: list[Path]) -> list[tuple[Path, list[str]]]:
    """(file, names) chunks of at most CHUNK_ELEMENTS elements each, skipping allowed extras."""
    plan = []
    for path in files:
        chunk, size = [], 0
        for name in sorted(n for n in expected if listing[n][2] == path.name):
            numel = math.prod(listing[name][0])
            if chunk and size + numel > CHUNK_ELEMENTS:
                plan.append((path, chunk))
                chunk, size = [], 0
            chunk.append(name)
            size += numel
        if chunk:
            plan.append((path, chunk))
    return plan


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"cannot read {path.name}: corrupt or not a safetensors file ({exc})") from None


def _read(f, name: str, path: Path) -> torch.Tensor:
    try:
        return f.get_tensor(name)
    except Exception as exc:
        raise CheckpointError(f"cannot read tensor {name} from {path.name}: {exc}") from None


def _read_listing(files: Iterable[Path]) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """name -> (shape, dtype string, file name), from the headers only (no tensor data read)."""
    listing: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for path in files:
        with _open(path) as f:
            for name in f.keys():
                if name in listing:
                    raise CheckpointError(f"tensor {name} appears in both {listing[name][2]} and {path.name}")
                sl = f.get_slice(name)
                listing[name] = (tuple(sl.get_shape()), sl.get_dtype(), path.name)
    return listing


def _check_counts(spec: DecoderSpec, listing: Mapping[str, tuple], config: Path) -> None:
    """Refuse a config claiming more layers or experts than the tensors hold, from the headers alone. (Fewer is
    cheap to build, and then every unexpected tensor is listed by _check_names.)"""
    wrong = []
    for field, pattern, what in _COUNTS:
        held = {int(m.group(1)) for name in listing if (m := pattern.match(name))}
        if not hasattr(spec, field) or (field == "n_routed_experts" and not spec.moe_layers):
            continue  # the other family's stage, or an all-dense LM (no experts to count)
        claimed = getattr(spec, field)
        if claimed > len(held):
            wrong.append(f"{field}={claimed} but the weights hold {len(held)} {what}")
    if wrong:
        raise CheckpointError(f"{config} does not fit its weights: {'; '.join(wrong)} (refused before building "
                              "the model)")


def _check_index(weight_map: dict, listing: dict, folder: Path) -> None:
    wrong = [n for n, file in weight_map.items() if n not in listing or listing[n][2] != file]
    if wrong:
        raise CheckpointError(f"{INDEX_NAME} in {folder} does not match its shards for {len(wrong)} tensors: "
                              + _names(wrong))


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LIST_LIMIT])
    return shown + (f", ... and {len(names) - LIST_LIMIT} more" if len(names) > LIST_LIMIT else "")


def _check_names(found: Mapping[str, tuple], expected: Mapping[str, tuple[int, ...]], where: str,
                 allowed_extra: frozenset[str] = frozenset()) -> None:
    """found: name -> (shape, dtype, ...). Raise one CheckpointError listing missing, unexpected (beyond
    `allowed_extra`), mis-shaped and non-floating tensors (first LIST_LIMIT of each, with counts)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected) - allowed_extra)
    misshaped = [f"{n} {list(found[n][0])} (expected {list(expected[n])})"
                 for n in sorted(set(found) & set(expected)) if tuple(found[n][0]) != tuple(expected[n])]
    not_float = [f"{n} ({found[n][1]})" for n in sorted(set(found) & set(expected))
                 if str(found[n][1]).removeprefix("torch.").upper() not in
                 ("BF16", "F16", "F32", "F64", "BFLOAT16", "FLOAT16", "FLOAT32", "FLOAT64")]
    if not (missing or unexpected or misshaped or not_float):
        return
    kinds = (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped), ("non-float", not_float))
    counts = [f"{len(v)} {k}" for k, v in kinds if v]
    # the first line is what a command line prints: it names the first tensor of each kind, with its shapes
    first = "; ".join(f"{k} {v[0]}" + (f" (+{len(v) - 1} more)" if len(v) > 1 else "") for k, v in kinds if v)
    lines = [f"{where} does not match the spec of its config.json: {', '.join(counts)} tensors: {first}"]
    for label, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped),
                         ("non-float", not_float)):
        if items:
            lines.append(f"  {label} ({len(items)}): {_names(items)}")
    raise CheckpointError("\n".join(lines))


def _raise_with_missing_keys(folder: Path, exc: Exception) -> None:
    """Re-raise `exc` (same class) led by the SIZE_KEYS its config.json lacks, when it lacks any: the key is
    the cause, the mismatch only its consequence. Returns when nothing is missing."""
    try:
        raw = read_config_json(folder)[1]
    except SpecError:
        return
    if not isinstance(raw, dict):
        return
    lm = raw.get("language_config") if isinstance(raw.get("language_config"), dict) else {}
    missing = [k for k in SIZE_KEYS if k not in raw and k not in lm]
    if not missing:
        return
    defaults = ", ".join(f"{k}={DecoderSpec.model_fields[k].default}" for k in missing)
    raise type(exc)(f"{folder / 'config.json'} has no {', '.join(missing)} (top level or language_config), so "
                    f"the default {defaults} was assumed and the checkpoint does not fit it: {exc}") from None
