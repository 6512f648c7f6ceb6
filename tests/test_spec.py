"""ModelSpec defaults, vendor config.json round trips and clear failures, Workload and Hardware validation."""
import json

import pytest
from pydantic import ValidationError

from dsocr_core.spec import Hardware, ModelSpec, SpecError, Workload, tiny_spec


def test_defaults_are_the_official_checkpoint():
    s = ModelSpec()
    assert (s.hidden_size, s.num_hidden_layers, s.num_attention_heads, s.head_dim) == (1280, 12, 10, 128)
    assert (s.n_routed_experts, s.num_experts_per_tok, s.shared_intermediate_size) == (64, 6, 1792)
    assert s.moe_layers == list(range(1, 12)) and s.vocab_size == 129280
    assert s.sam_pos_grid == 64 and s.clip_pos_grid == 16 and s.projector_input_dim == 2048


def test_tiny_spec_keeps_every_structure():
    s = tiny_spec()
    assert s.first_k_dense_replace == 1 and len(s.moe_layers) == 2 and s.n_shared_experts
    assert s.sam_global_blocks and len(s.sam_global_blocks) < s.sam_layers


@pytest.mark.parametrize("spec", [ModelSpec(), tiny_spec()])
def test_vendor_config_round_trip(tmp_path, spec):
    (tmp_path / "config.json").write_text(json.dumps(spec.to_config_dict()))
    assert ModelSpec.from_config_json(tmp_path) == spec
    assert ModelSpec.from_config_json(tmp_path / "config.json") == spec


def test_vendor_layout_reads_the_top_level():
    cfg = ModelSpec().to_config_dict()
    assert cfg["model_type"] == "deepseek_vl_v2" and cfg["language_config"]["hidden_size"] == 1280
    assert cfg["vision_config"]["width"]["sam_vit_b"]["global_attn_indexes"] == [2, 5, 8, 11]
    cfg["vocab_size"] = 129300  # vendor code reads the top level, not language_config
    assert ModelSpec.from_config_dict(cfg).vocab_size == 129300


def write(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000}


def broken(**changes):
    cfg = ModelSpec().to_config_dict()
    cfg.update(changes)
    return cfg


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (LLAMA, "not a DeepSeek-OCR config"),
    (broken(num_attention_heads=7), "divisible"),
    (broken(num_key_value_heads=2), "num_key_value_heads"),
    (broken(num_experts_per_tok=80), "num_experts_per_tok"),
    (broken(intermediate_size=0), "invalid DeepSeek-OCR config: intermediate_size"),
    (broken(use_mla=True), "use_mla"),
    (broken(topk_method="group_limited_greedy"), "greedy"),
    (broken(moe_layer_freq=2), "moe_layer_freq"),
    (broken(projector_config={"projector_type": "mlp_gelu", "input_dim": 2048, "n_embed": 1280}), "projector_type"),
    (broken(projector_config={"projector_type": "linear", "input_dim": 1000, "n_embed": 1280}), "projector_input_dim"),
    (broken(vocab_size=100), "special token ids"),
])
def test_broken_configs_fail_clearly(tmp_path, content, needle):
    with pytest.raises(SpecError, match=needle) as info:
        ModelSpec.from_config_json(write(tmp_path, content))
    assert "\n" not in str(info.value)


def test_missing_config(tmp_path):
    with pytest.raises(SpecError, match="no config.json"):
        ModelSpec.from_config_json(tmp_path)


def test_inconsistent_vision_dims(tmp_path):
    cfg = ModelSpec().to_config_dict()
    cfg["vision_config"]["width"]["sam_vit_b"]["downsample_channels"] = [512, 768]
    with pytest.raises(SpecError, match="clip_width"):
        ModelSpec.from_config_json(write(tmp_path, cfg))
    cfg = ModelSpec().to_config_dict()
    cfg["vision_config"]["width"]["sam_vit_b"]["global_attn_indexes"] = [2, 12]
    with pytest.raises(SpecError, match="sam_global_blocks"):
        ModelSpec.from_config_json(write(tmp_path, cfg))


def test_replace_validates():
    assert ModelSpec().replace(num_hidden_layers=4).num_hidden_layers == 4
    with pytest.raises(SpecError):
        ModelSpec().replace(num_attention_heads=3)


@pytest.mark.parametrize("kwargs", [dict(batch=0), dict(text_tokens=0), dict(decode_steps=-1),
                                    dict(crops=(0, 2)), dict(image_size=(100, -1)), dict(min_crops=5, max_crops=3),
                                    dict(mode="base", crops=(2, 2)), dict(attn="xformers"), dict(mode="huge")])
def test_bad_workloads(kwargs):
    with pytest.raises(ValidationError):
        Workload(**kwargs)


def test_workload_defaults_and_frozen():
    w = Workload()
    assert (w.mode, w.batch, w.text_tokens, w.attn, w.logits, w.dtype_bytes) == ("gundam", 1, 10, "sdpa", "all", 2)
    with pytest.raises(ValidationError):
        w.batch = 3


def test_hardware():
    hw = Hardware(name="x", peak_tflops=100, bandwidth_tbs=2, memory_gb=10)
    assert hw.peak_flops == 1e14 and hw.bandwidth == 2e12 and hw.ridge_intensity == 50
    with pytest.raises(ValidationError):
        Hardware(name="x", peak_tflops=0, bandwidth_tbs=2, memory_gb=10)
