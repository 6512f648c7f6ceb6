"""`python -m dsocr_core analytic`: JSON shape, tables, sweeps to CSV/JSON, one-line errors with exit 2."""
import json

import pandas as pd
import pytest

from dsocr_core.cli import main

STAGE_KEYS = {"flops", "tensor_flops", "other_flops", "bytes", "weight_bytes", "activation_bytes", "kv_bytes",
              "weight_memory", "peak_activation_memory", "kv_cache_memory", "time_s", "bound"}


def run(capsys, *argv):
    code = main(["analytic", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output(capsys):
    code, out, err = run(capsys, "--crops", "2x2", "--decode-steps", "100", "--json", "--hardware", "NVIDIA H100 PCIe")
    assert code == 0 and not err
    data = json.loads(out)
    assert data["tokens"]["image_slots"] == 693 and data["tokens"]["sequence"] == 703
    assert data["tokens"]["crops"] == [2, 2]
    assert list(data["stages"]) == ["sam", "clip", "projector", "vision", "prefill", "decode", "total"]
    for values in data["stages"].values():
        assert STAGE_KEYS <= set(values)
    assert data["hardware"]["name"] == "NVIDIA H100 PCIe"
    assert data["capacity"]["pages_per_day"] > 0
    assert "modules" not in data


def test_image_and_crop_limits_pick_the_grid(capsys):
    _, out, _ = run(capsys, "--image", "1920x1080", "--json")
    assert json.loads(out)["tokens"]["crops"] == [4, 2]
    _, out, _ = run(capsys, "--image", "1920x1080", "--max-crops", "6", "--json")
    assert json.loads(out)["tokens"]["image_slots"] == 483


def test_per_module_and_table(capsys):
    code, out, _ = run(capsys, "--crops", "2x1", "--decode-steps", "3", "--per-module", "--json", "--attn", "eager",
                       "--logits", "last")
    modules = json.loads(out)["modules"]
    assert code == 0 and {m["stage"] for m in modules} == {"sam", "clip", "projector", "prefill", "decode"}
    assert any(m["module"] == "model.layers.3.mlp.experts" for m in modules)
    code, out, _ = run(capsys, "--crops", "2x2", "--per-module", "--ttft-target", "0.01", "--tpot-target", "0.0002")
    assert code == 0 and "prefill" in out and "model.sam_model.blocks.2.attn" in out and "TTFT target" in out


def test_readable_table(capsys):
    code, out, _ = run(capsys, "--mode", "base", "--text-tokens", "50", "--batch", "2", "--decode-steps", "10")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("mode base") and any(line.startswith("total") for line in lines)
    assert "pages/day" in out


@pytest.mark.parametrize("ext", ["csv", "json"])
def test_sweep_file(capsys, tmp_path, ext):
    path = tmp_path / f"out.{ext}"
    code, out, _ = run(capsys, "--crops", "1x1,2x2,3x2", "--text-tokens", "10,100,1000", "--batch", "1,8",
                       "--sweep", str(path))
    assert code == 0 and "18 points" in out
    df = pd.read_csv(path) if ext == "csv" else pd.DataFrame(json.loads(path.read_text()))
    assert len(df) == 18 and {"crops_w", "crops_h", "prefill.flops", "decode.time_s", "total.bound"} <= set(df)
    assert sorted(df.image_slots.unique()) == [273, 693, 893]


@pytest.mark.parametrize("argv,needle", [
    (["--batch", "0"], "batch"),
    (["--crops=-1x2"], "crop grid"),
    (["--image", "100x0"], "image size"),
    (["--text-tokens", "-3"], "text"),
    (["--hardware", "Voodoo 3"], "unknown hardware"),
    (["--crops", "40x40"], "past the limit"),
    (["--crops", "2x2", "--mode", "base"], "does not tile"),
    (["--text-tokens", "10,20"], "--sweep"),
    (["--attn", "xformers"], "attn"),
    (["--logits", "some"], "logits"),
    (["--crops", "2by2"], "WxH"),
    (["--crops", "2x2", "--image", "100x100"], "not both"),
    (["--min-crops", "5", "--max-crops", "3"], "min_crops"),
    (["--batch", "1,100000", "--sweep", "x.csv"], "batch"),
    (["--sweep", "out.parquet"], ".csv or .json"),
    (["--ttft-target", "-1"], "positive"),
    (["--crops"], "expected one argument"),
])
def test_impossible_input_is_one_line_exit_2(capsys, argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["analytic", *argv])
    except SystemExit as exc:  # argparse-level problems exit from the parser
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and needle in err, err
