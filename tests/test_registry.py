"""The model-family registry is the one place stage and mode lists are written: the guards below fail when a module
spells one out again, and the CLI, the store and the tables take their names from it."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from dsocr_core import registry
from dsocr_core.cli import UserError, add_mode_options, family_from_args, resolve_mode

ROOT = Path(__file__).resolve().parents[1]
# a literal list of two or more stage names or of v1 modes, e.g. ("sam", "clip", ...) or ["tiny", "small", ...]
STAGE_LIST = re.compile(r"""[(\[{]\s*["'](sam|clip|encoder)["']\s*(:\s*["'][^"']*["']\s*)?,"""
                        r"""\s*["'](clip|encoder|projector)["']""")
MODE_LIST = re.compile(r"""["']tiny["']\s*,\s*["']small["']\s*,\s*["']base["']""")


def _sources():
    for folder in ("dsocr_core", "ui", "pages", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "registry.py":
                yield path
    yield ROOT / "app.py"


def test_no_module_but_the_registry_lists_stages_or_modes():
    found = []
    for path in _sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if STAGE_LIST.search(line) or MODE_LIST.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "stage or mode lists outside dsocr_core/registry.py:\n" + "\n".join(found)


def test_the_guard_sees_a_written_out_list():
    assert STAGE_LIST.search('STAGES = ("sam", "clip", "projector")')
    assert STAGE_LIST.search('{"sam": "SAM", "clip": "CLIP"}')
    assert MODE_LIST.search('choices=["tiny", "small", "base", "large"]')
    assert not STAGE_LIST.search('stage("sam")')


def test_stage_names_and_labels_cover_both_families_in_display_order():
    assert registry.stage_names() == ("sam", "clip", "encoder", "projector", "vision", "prefill", "decode")
    labels = registry.stage_labels()
    assert labels["clip"] == "CLIP" and labels["encoder"] == "encoder" and labels["prefill"] == "LM prefill"
    assert registry.get_family("deepseek-ocr").stage_names == ("sam", "clip", "projector", "prefill", "decode")
    assert registry.get_family("deepseek-ocr2").stage_names == ("sam", "encoder", "projector", "prefill", "decode")
    assert registry.native_modes() == ("tiny", "small", "base", "large")
    assert registry.native_modes("deepseek-ocr2") == ()


def test_store_page_table_and_operator_stages_come_from_the_registry():
    from dsocr_core.measure import operators
    from dsocr_core.results import dataset_stats, page_costs, schema

    assert schema.STAGES == (*registry.stage_names(), "decode_step")
    assert dataset_stats.STAGES == registry.stage_names()
    assert operators.STAGES == ("preprocess", *registry.vision_stage_names(), *registry.LM_STAGES)
    assert {"clip_s", "encoder_s"} <= set(page_costs.METRICS)


def _mode_args(*argv, model=None, checkpoint=None):
    p = argparse.ArgumentParser()
    add_mode_options(p)
    args = p.parse_args(list(argv))
    args.model, args.checkpoint = model, checkpoint
    return args


def test_mode_defaults_follow_the_model():
    v1, v2 = registry.get_family("deepseek-ocr"), registry.get_family("deepseek-ocr2")
    assert resolve_mode(_mode_args(), v1) == ("gundam", 2, 9)
    assert resolve_mode(_mode_args(), v2) == ("dynamic", 2, 6)
    assert resolve_mode(_mode_args("--mode", "base", "--max-crops", "4"), v1) == ("base", 2, 4)
    with pytest.raises(UserError, match="not a DeepSeek-OCR 2 mode; choose one of dynamic"):
        resolve_mode(_mode_args("--mode", "gundam"), v2)


def test_the_family_is_known_before_weights_load(tmp_path):
    assert family_from_args(_mode_args(model="deepseek-ocr2")).name == "deepseek-ocr2"
    assert family_from_args(_mode_args()).name == "deepseek-ocr"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekOCR2ForCausalLM"]}))
    assert family_from_args(_mode_args(checkpoint=tmp_path)).name == "deepseek-ocr2"
    with pytest.raises(UserError, match="has no config.json"):
        family_from_args(_mode_args(checkpoint=tmp_path / "missing"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not readable JSON"):
        family_from_args(_mode_args(checkpoint=tmp_path))


def test_measure_refuses_a_mode_of_the_other_model(capsys):
    from dsocr_core.cli import main

    assert main(["measure", "--synthetic", "tiny", "--model", "deepseek-ocr2", "--modes", "gundam",
                 "--device", "cpu"]) == 2
    assert "unknown DeepSeek-OCR 2 mode(s) gundam; choose from dynamic" in capsys.readouterr().err
