"""Session on a tiny random checkpoint written in the official format and loaded as a user would load it."""
import json

import pytest
import torch

from dsocr_core.cli import main
from dsocr_core.runtime.flops import flops_at
from dsocr_core.model.checkpoint import save_checkpoint, synthetic_model
from dsocr_core.grounding.samples import sample_pages
from dsocr_core.runtime.session import Session
from dsocr_core.spec import tiny_spec


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    spec = tiny_spec()
    save_checkpoint(synthetic_model(spec, seed=3, dtype="float32"), spec, folder, dtype="float32")
    return folder


@pytest.fixture(scope="module")
def session(checkpoint):
    return Session.load(checkpoint=checkpoint, device="cpu", dtype="float32")


def pages():
    return {p.stem: p for p in sample_pages()}


@pytest.mark.parametrize("mode,page,prompt,n", [
    ("tiny", "card", "<image>\nFree OCR.", 12),
    ("small", "small", "<image>\n<|grounding|>OCR this image.", 30),
    ("gundam", "card", "<image>\n<|grounding|>Convert the document to markdown.", 40),
    ("gundam", "landscape", "<image>\nParse the figure.", 25),
])
def test_separated_equals_one_shot(session, mode, page, prompt, n):
    inputs = session.prepare(pages()[page], prompt, mode=mode)
    one = session.generate_one_shot(inputs, max_new_tokens=n)
    sep = session.generate_separated(inputs, max_new_tokens=n, reference=one)
    assert sep.generated_ids == one.generated_ids
    assert len(one.generated_ids[0]) == n  # random weights never emit EOS this early
    v = sep.verification
    assert v["passed"] and v["tokens_equal_one_shot"] and v["first_divergence"] is None
    assert v["image_args_in_decode"] == 0 and v["vision_calls_in_decode"] == 0
    assert v["kv_length"] == inputs.seq_len + n - 1 == v["kv_length_expected"]
    assert one.timings["vision_calls"].get("decode", 0) == 0  # one-shot passes images each step, vision runs once
    assert sep.timings["sam"] > 0 and sep.timings["clip"] > 0 and sep.timings["prefill"] > 0


def test_ngram_ban_is_active_and_shared(session):
    """Random weights loop; the n-gram ban must change the output, identically in both paths."""
    inputs = session.prepare(pages()["card"], "<image>\nFree OCR.", mode="tiny")
    free = session.generate_one_shot(inputs, max_new_tokens=60, no_repeat_ngram_size=0)
    banned = session.generate_one_shot(inputs, max_new_tokens=60, no_repeat_ngram_size=3)
    assert free.generated_ids != banned.generated_ids
    sep = session.generate_separated(inputs, max_new_tokens=60, no_repeat_ngram_size=3, reference=banned)
    assert sep.verification["tokens_equal_one_shot"]
    row = banned.generated_ids[0]
    trigrams = [tuple(row[i:i + 3]) for i in range(len(row) - 2)]
    assert len(trigrams) == len(set(trigrams))


def test_redecode_first_token_keeps_tokens(session):
    inputs = session.prepare(pages()["card"], "<image>\nFree OCR.", mode="tiny")
    one = session.generate_one_shot(inputs, max_new_tokens=15)
    sep = session.generate_separated(inputs, max_new_tokens=15, first_token="redecode", reference=one)
    assert sep.verification["kv_length_ok"]
    assert sep.verification["decode_steps"] == 15  # last prompt token re-decoded, then 14 more
    assert sep.generated_ids == one.generated_ids


def test_batch_two_rows_finish_at_different_steps(checkpoint):
    session = Session.load(checkpoint=checkpoint, device="cpu", dtype="float32")
    prompts = ["<image>\nFree OCR.", "<image>\nFree OCX."]  # same length, different content
    inputs = session.prepare([pages()["card"]], prompts, mode="tiny")
    assert inputs.batch == 2
    free = session.generate_one_shot(inputs, max_new_tokens=30)
    a, b = free.generated_ids
    # make a token that row 0 emits early (and row 1 later or never) the EOS, so rows stop at different steps
    eos = next(t for t in a[1:20] if t not in a[: a.index(t)] and (t not in b or b.index(t) != a.index(t)))
    session.spec = session.spec.replace(eos_token_id=eos)
    one = session.generate_one_shot(inputs, max_new_tokens=30)
    sep = session.generate_separated(inputs, max_new_tokens=30, reference=one)
    assert sep.generated_ids == one.generated_ids
    lengths = [len(r) for r in one.generated_ids]
    assert lengths[0] == a.index(eos) + 1 and one.generated_ids[0][-1] == eos
    assert lengths[0] != lengths[1]
    assert sep.verification["passed"]


def test_flops_are_counted_per_stage(session):
    inputs = session.prepare(pages()["card"], "<image>\nFree OCR.", mode="gundam")
    flops = session.count_stage_flops(inputs, logits="last", decode_steps=2)
    assert all(flops[s]["flops"] > 0 for s in ("sam", "clip", "projector", "prefill", "decode"))
    assert "model.sam_model.blocks.1.attn" in flops["sam"]["modules"]
    experts = flops_at(flops["prefill"]["modules"], "model.layers.2.mlp.experts")
    leaves = {k: v for k, v in flops["prefill"]["modules"].items()
              if k.startswith("model.layers.2.mlp.experts.") and k.endswith("_proj")}
    assert experts == sum(leaves.values()) > 0
    # the second decode step attends one more position than the first
    first, second = flops["decode"]["per_step"]
    assert second > first


def test_session_labels_synthetic_and_fallback():
    s = Session.load(synthetic="tiny", device="cpu", dtype="float32")
    d = s.describe()
    assert d["synthetic"] and d["fallback_tokenizer"] and d["cpu_fallback"]
    assert "random" in d["detail"]


def test_generate_cli_json(checkpoint, capsys):
    code = main(["generate", "--checkpoint", str(checkpoint), "--image", str(pages()["card"]), "--mode", "tiny",
                 "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    sep = out["paths"]["separated"]
    assert sep["verification"]["passed"]
    assert out["input_ids"][0][0] == 0 and len(sep["generated_ids"][0]) == 8
    assert out["flops"]["sam"]["flops"] > 0 and "nsys profile" in out["nsys_command"]


@pytest.mark.parametrize("args,needle", [
    (["--checkpoint", "/nonexistent/ckpt"], "nonexistent"),
    (["--synthetic", "tiny", "--image", "/nonexistent.png"], "image not found"),
    (["--synthetic", "tiny", "--prompt", "Free OCR."], "<image>"),
])
def test_generate_cli_errors(args, needle, capsys):
    code = main(["generate", *args, "--device", "cpu", "--max-new-tokens", "2"])
    assert code == 2
    assert needle in capsys.readouterr().err


def test_generate_cli_corrupt_image(tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    code = main(["generate", "--synthetic", "tiny", "--image", str(bad), "--device", "cpu"])
    assert code == 2 and "error:" in capsys.readouterr().err


def test_trace_written(checkpoint, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    code = main(["generate", "--checkpoint", str(checkpoint), "--image", str(pages()["card"]), "--mode", "tiny",
                 "--max-new-tokens", "3", "--device", "cpu", "--dtype", "float32", "--no-flops",
                 "--trace", str(trace)])
    assert code == 0 and trace.exists()
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("aten::" in str(e.get("name", "")) for e in events)
    assert str(trace) not in capsys.readouterr().out.split("nsys profile")[1]


@pytest.mark.gpu
def test_gpu_full_spec_parity_and_verification():
    s = Session.load(synthetic="full", device="cuda", dtype="bfloat16", attn="sdpa")
    inputs = s.prepare(sample_pages()[0], mode="gundam")
    one = s.generate_one_shot(inputs, max_new_tokens=32)
    sep = s.generate_separated(inputs, max_new_tokens=32, reference=one)
    assert sep.verification["passed"], sep.verification
    assert sep.verification["decode_memory_ok"] is True
    assert torch.cuda.is_available()
