"""Checkpoint folders: save/load round trips (single file and sharded), strict errors, make-checkpoint CLI."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dsocr_core.cli import main as cli_main
from dsocr_core.model import CheckpointError, load_model, save_checkpoint, synthetic_model, synthetic_state_dict
from dsocr_core.spec import SpecError, tiny_spec


@pytest.fixture(scope="module")
def spec():
    return tiny_spec()


@pytest.fixture(scope="module")
def state(spec):
    return synthetic_state_dict(spec, seed=7, dtype="float32")


@pytest.fixture()
def folder(tmp_path, spec, state):
    """A valid tiny checkpoint folder (fp32 weights, single file)."""
    save_checkpoint(state, spec, tmp_path / "ck", dtype="float32")
    return tmp_path / "ck"


def assert_same_state(model, state):
    got = model.state_dict()
    assert set(got) == set(state)
    for k, v in state.items():
        assert torch.equal(got[k], v.to(got[k].dtype)), k


def rewrite(folder, tensors):
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_round_trip_fp32(folder, spec, state):
    model, loaded_spec, info = load_model(folder, dtype="float32")
    assert loaded_spec == spec
    assert_same_state(model, state)
    assert not model.training
    assert info["tensors"] == len(state) and info["files"] == ["model.safetensors"] and not info["sharded"]
    assert info["parameters"] == sum(t.numel() for t in state.values())
    assert info["file_dtypes"] == {"F32": len(state)}


def test_default_save_is_bf16_and_loads_in_any_dtype(tmp_path, spec, state):
    save_checkpoint(state, spec, tmp_path / "bf")
    with safe_open(str(tmp_path / "bf" / "model.safetensors"), "pt") as f:
        assert f.get_slice("lm_head.weight").get_dtype() == "BF16"
        assert f.metadata() == {"format": "pt"}
    cfg = json.loads((tmp_path / "bf" / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_vl_v2" and cfg["language_config"]["hidden_size"] == spec.hidden_size
    for dtype, torch_dtype in [("bfloat16", torch.bfloat16), ("float16", torch.float16), (torch.float32, torch.float32)]:
        model, _, info = load_model(tmp_path / "bf", dtype=dtype)
        p = model.lm_head.weight
        assert p.dtype == torch_dtype and p.device.type == "cpu"
        assert torch.equal(p, state["lm_head.weight"].bfloat16().to(torch_dtype))
        assert info["dtype"] == str(torch_dtype).removeprefix("torch.")


def test_synthetic_model_equals_saved_and_loaded(tmp_path, spec):
    model = synthetic_model(spec, seed=3, dtype="bfloat16", attn_impl="eager")
    save_checkpoint(model, spec, tmp_path / "m")
    loaded, _, info = load_model(tmp_path / "m", attn_impl="eager")
    assert loaded.attn_impl == "eager" and info["attn_impl"] == "eager"
    assert_same_state(loaded, model.state_dict())
    x = torch.tensor([[0, 5, 9, 11]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(x)[0], model(x)[0], rtol=0, atol=0)


def test_synthetic_is_seeded(spec):
    a = synthetic_state_dict(spec, seed=1, dtype="float32")
    b = synthetic_state_dict(spec, seed=1, dtype="float32")
    c = synthetic_state_dict(spec, seed=2, dtype="float32")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])
    assert torch.equal(a["model.norm.weight"], torch.ones_like(a["model.norm.weight"]))
    assert torch.equal(a["model.sam_model.neck.1.bias"], torch.zeros_like(a["model.sam_model.neck.1.bias"]))
    assert 0.015 < a["model.embed_tokens.weight"].std().item() < 0.025


def test_sharded_with_index(tmp_path, spec, state):
    files = save_checkpoint(state, spec, tmp_path / "sh", dtype="float32", max_shard_bytes=8_000_000)
    assert len(files) > 2 and all(f.name.startswith("model-0000") for f in files)
    index = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in state.values())
    model, _, info = load_model(tmp_path / "sh", dtype="float32")
    assert info["sharded"] and len(info["files"]) == len(files)
    assert_same_state(model, state)


def test_sharded_index_naming_missing_shard(tmp_path, spec, state):
    files = save_checkpoint(state, spec, tmp_path / "sh", dtype="float32", max_shard_bytes=8_000_000)
    files[1].unlink()
    with pytest.raises(CheckpointError, match=f"missing: {files[1].name}"):
        load_model(tmp_path / "sh")


def test_index_disagreeing_with_shards(tmp_path, spec, state):
    save_checkpoint(state, spec, tmp_path / "sh", dtype="float32", max_shard_bytes=8_000_000)
    path = tmp_path / "sh" / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    first = sorted(index["weight_map"])[0]
    others = sorted(set(index["weight_map"].values()) - {index["weight_map"][first]})
    index["weight_map"][first] = others[0]
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="does not match its shards"):
        load_model(tmp_path / "sh")


def test_missing_tensor_is_listed(folder, state):
    tensors = dict(state)
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    del tensors["model.view_seperator"]
    rewrite(folder, tensors)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    msg = str(err.value)
    assert "2 missing" in msg.splitlines()[0]
    assert "model.layers.2.mlp.experts.5.up_proj.weight" in msg and "model.view_seperator" in msg


def test_unexpected_tensor_is_listed(folder, state):
    rewrite(folder, {**state, "model.layers.0.mlp.gate.weight": torch.zeros(8, 64), "extra.thing": torch.zeros(2)})
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    msg = str(err.value)
    assert "2 unexpected" in msg.splitlines()[0]
    assert "model.layers.0.mlp.gate.weight" in msg and "extra.thing" in msg


def test_misshaped_tensor_is_listed(folder, state):
    bad = {**state, "model.sam_model.blocks.1.attn.rel_pos_h": torch.zeros(27, 16)}
    rewrite(folder, bad)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    msg = str(err.value)
    assert "1 mis-shaped" in msg.splitlines()[0]
    assert "model.sam_model.blocks.1.attn.rel_pos_h [27, 16] (expected [127, 16])" in msg


def test_many_problems_are_truncated_with_counts(folder, state):
    # every expert keeps its gate, so the counts fit the config and the tensors are compared one by one
    tensors = {k: v for k, v in state.items() if ".experts." not in k or k.endswith("gate_proj.weight")}
    n_missing = len(state) - len(tensors)
    rewrite(folder, tensors)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    msg = str(err.value)
    assert f"{n_missing} missing" in msg
    assert f"and {n_missing - 20} more" in msg


def test_a_config_whose_counts_differ_from_the_weights_names_both(folder, state):
    rewrite(folder, {k: v for k, v in state.items() if ".experts." not in k})
    with pytest.raises(CheckpointError, match="n_routed_experts=8 but the weights hold 0 experts"):
        load_model(folder)


def test_a_deepseek_ocr2_config_claiming_more_encoder_layers_is_refused(tmp_path):
    from dsocr_core.registry import get_family

    v2 = get_family("deepseek-ocr2").preset("tiny")
    full = synthetic_state_dict(v2, dtype="float32")
    save_checkpoint(full, v2, tmp_path / "v2", dtype="float32")
    layer_1 = "model.qwen2_model.model.model.layers.1."
    rewrite(tmp_path / "v2", {k: v for k, v in full.items() if not k.startswith(layer_1)})
    with pytest.raises(CheckpointError, match="enc_layers=2 but the weights hold 1 encoder layers"):
        load_model(tmp_path / "v2")
    with pytest.raises(ValueError, match="enc_layers"):  # bounded like every other count
        v2.replace(enc_layers=10 ** 5)


def test_position_ids_is_an_allowed_extra(folder, state):
    rewrite(folder, {**state, "model.vision_model.embeddings.position_ids": torch.arange(257)[None]})
    model, _, info = load_model(folder, dtype="float32")
    assert info["ignored"] == ["model.vision_model.embeddings.position_ids"]
    assert_same_state(model, state)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_safetensors(folder, damage):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not a safetensors file at all" * 10, "truncated": data[: len(data) // 2],
                      "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="corrupt or not a safetensors file"):
        load_model(folder)


def test_foreign_config(folder):
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(SpecError, match="not a DeepSeek-OCR config"):
        load_model(folder)


def test_broken_config(folder):
    (folder / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_model(folder)


def test_folder_problems(tmp_path, folder):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="is not a folder"):
        load_model(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(folder)


def test_config_spec_mismatch_with_weights(folder, spec):
    """A config that describes another size than the weights: every differing tensor is reported."""
    other = spec.replace(num_hidden_layers=2)
    (folder / "config.json").write_text(json.dumps(other.to_config_dict()))
    with pytest.raises(CheckpointError, match="unexpected"):
        load_model(folder)


def test_save_refuses_wrong_state_and_overwrite(tmp_path, folder, spec, state):
    with pytest.raises(CheckpointError, match="missing"):
        save_checkpoint({k: v for k, v in state.items() if k != "lm_head.weight"}, spec, tmp_path / "x")
    with pytest.raises(CheckpointError, match="already holds weights"):
        save_checkpoint(state, spec, folder)
    save_checkpoint(state, spec, folder, overwrite=True)
    assert load_file(str(folder / "model.safetensors"))["lm_head.weight"].dtype == torch.bfloat16


def test_make_checkpoint_cli_round_trip(tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli_main(["make-checkpoint", "--out", str(out), "--preset", "tiny", "--seed", "11",
                     "--set", "num_hidden_layers=2", "--set", "sam_global_blocks=[1,3]"]) == 0
    assert "parameters" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model, spec, _ = load_model(out)
    assert spec == tiny_spec().replace(num_hidden_layers=2)
    ref = synthetic_model(spec, seed=11, dtype="bfloat16")
    assert_same_state(model, ref.state_dict())
    # a second run into the same folder needs --force
    assert cli_main(["make-checkpoint", "--out", str(out), "--seed", "11"]) == 2
    assert "--force" in capsys.readouterr().err
    assert cli_main(["make-checkpoint", "--out", str(out), "--seed", "12", "--force", "--shard-mb", "10"]) == 0
    model, _, info = load_model(out)
    assert info["sharded"] and not (out / "model.safetensors").exists()


def test_make_checkpoint_cli_bad_set(tmp_path, capsys):
    assert cli_main(["make-checkpoint", "--out", str(tmp_path / "b"), "--set", "nonsense"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert cli_main(["make-checkpoint", "--out", str(tmp_path / "b"), "--set", "no_such_field=3"]) == 2
    assert not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------------------ hostile configs
def _config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        cfg[key] = value
        cfg["language_config"][key] = value
    return cfg


@pytest.mark.parametrize("changes, needle", [
    ({"num_hidden_layers": 1000}, "num_hidden_layers=1000 but the weights hold 3 LM layers"),
    ({"n_routed_experts": 4000}, "n_routed_experts=4000 but the weights hold 8 experts"),
])
def test_a_config_claiming_far_more_than_the_weights_is_refused_before_building(folder, changes, needle):
    """Before: the model was built (minutes, gigabytes for 10^5 layers) before any tensor was compared."""
    import time

    (folder / "config.json").write_text(json.dumps(_config(folder, **changes)))
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert time.perf_counter() - start < 3.0  # headers read, nothing built (building 1000 layers takes ~10 s)
    assert needle in str(err.value) and "config.json" in str(err.value) and "before building" in str(err.value)


@pytest.mark.parametrize("changes, needle", [
    ({"num_hidden_layers": 100_000}, "num_hidden_layers"),
    ({"num_hidden_layers": 10**8}, "num_hidden_layers"),
    ({"n_routed_experts": 10_000_000}, "n_routed_experts"),
    ({"rms_norm_eps": "@inf@"}, "rms_norm_eps"),
    ({"rope_theta": "@nan@"}, "rope_theta"),
])
def test_configs_past_sane_bounds_are_refused_naming_file_and_field(folder, capsys, changes, needle):
    text = json.dumps(_config(folder, **changes)).replace('"@inf@"', "Infinity").replace('"@nan@"', "NaN")
    (folder / "config.json").write_text(text)
    with pytest.raises(SpecError) as err:
        load_model(folder)
    assert needle in str(err.value) and str(folder / "config.json") in str(err.value)
    assert cli_main(["analytic", "--config", str(folder)]) == 2  # before: 10^8 layers reached 10.5 GB
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("mangle, needle", [
    (lambda t: t[:-2] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "levels deep"),
    (lambda t: t.replace('"vocab_size": 129280', '"vocab_size": 1' + "0" * 5000, 1), "cannot be read"),
])
def test_unreadable_configs_name_the_file(folder, capsys, mangle, needle):
    path = folder / "config.json"
    path.write_text(mangle(path.read_text()))
    with pytest.raises(SpecError) as err:
        load_model(folder)
    assert str(path) in str(err.value) and needle in str(err.value)
    assert cli_main(["analytic", "--config", str(folder)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and needle in err and "Traceback" not in err


@pytest.mark.parametrize("shard", ["/etc/passwd", "../elsewhere/model.safetensors", "sub/model.safetensors"])
def test_a_shard_index_cannot_point_outside_the_folder(tmp_path, spec, state, shard):
    folder = tmp_path / "sharded"
    save_checkpoint(state, spec, folder, dtype="float32", max_shard_bytes=200_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = sorted(index["weight_map"])[0]
    index["weight_map"][first] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside its folder") as err:
        load_model(folder)
    assert shard in str(err.value)
