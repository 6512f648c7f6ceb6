import json

import pytest

from dsocr_core.runtime.tokenizer import (
    CONTROL_TOKENS,
    IMAGE_TOKEN_ID,
    SPECIAL_TOKENS,
    FallbackTokenizer,
    TokenizerError,
    load_tokenizer,
)

OFFICIAL = {
    "<image>": 128815, "<|ref|>": 128816, "<|/ref|>": 128817, "<|det|>": 128818, "<|/det|>": 128819,
    "<|grounding|>": 128820, "<td>": 128821, "</td>": 128822, "<tr>": 128823, "</tr>": 128824,
    "<|User|>": 128825, "<|Assistant|>": 128826,
}


def test_special_table_is_official():
    assert SPECIAL_TOKENS == OFFICIAL
    assert IMAGE_TOKEN_ID == 128815


def test_fallback_without_folder_is_labelled(tmp_path):
    for folder in (None, tmp_path, tmp_path / "missing"):
        tok = load_tokenizer(folder)
        assert tok.is_fallback
        assert tok.label.startswith("fallback byte tokenizer")
        assert not tok.problems


@pytest.mark.parametrize("token,tid", sorted(OFFICIAL.items()))
def test_fallback_special_ids(token, tid):
    tok = FallbackTokenizer()
    assert tok.encode(token) == [tid]
    assert tok.decode([tid]) == token
    assert tok.decode([tid], skip_special_tokens=True) == ""


@pytest.mark.parametrize("text", [
    "", "a", "<image>\n<|grounding|>Convert the document to markdown.",
    "<|ref|>title<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\n# Überschrift — 表格 🙂",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    "<|ref<|/ref|>|> half tags <| |> <im age> <td", "\x00\x01\ufeff\U0010ffff", "lone \ud800 surrogate",
])
def test_fallback_round_trip(text):
    tok = FallbackTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < 128815 or i in OFFICIAL.values() for i in ids)
    assert tok.encode(text) == ids  # deterministic


def test_fallback_ids_ranges():
    tok = FallbackTokenizer()
    ids = tok.encode("ÿ plain text \u2603")
    assert ids and all(3 <= i <= 258 for i in ids)
    assert tok.encode("x<|grounding|>y") == [3 + ord("x"), 128820, 3 + ord("y")]


def test_fallback_decode_control_and_unknown_ids():
    tok = FallbackTokenizer()
    assert tok.decode([0, 3 + ord("a"), 1]) == "<｜begin▁of▁sentence｜>a<｜end▁of▁sentence｜>"
    assert tok.decode([0, 3 + ord("a"), 1], skip_special_tokens=True) == "a"
    assert tok.decode([50000]) == "<|id:50000|>"
    assert tok.decode([50000], skip_special_tokens=True) == ""
    # bytes cut in the middle of a character never raise
    cut = tok.encode("é")[:1]
    assert tok.decode(cut) == "\ufffd"
    for text, tid in CONTROL_TOKENS.items():
        assert tok.encode(text) == [tid]


def _tiny_tokenizer_folder(path, with_specials=True):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 3, "hello": 4, "world": 5, "Convert": 6, ".": 7}
    controls = list(CONTROL_TOKENS)
    for text, tid in CONTROL_TOKENS.items():
        vocab[text] = tid
    specials = list(OFFICIAL) if with_specials else []
    for s in specials:
        vocab[s] = OFFICIAL[s]
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in controls + specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=controls[0], eos_token=controls[1],
                                   pad_token=controls[2], unk_token="<unk>")
    fast.save_pretrained(str(path))
    return path


def test_autotokenizer_path(tmp_path):
    folder = _tiny_tokenizer_folder(tmp_path / "ckpt")
    assert (folder / "tokenizer.json").exists()
    tok = load_tokenizer(folder)
    assert not tok.is_fallback
    assert tok.label == f"AutoTokenizer from {folder}"
    assert tok.problems == []
    ids = tok.encode("hello <|ref|>world<|/ref|><|det|> <td>")
    assert ids == [4, 128816, 5, 128817, 128818, 128821]
    assert 0 not in ids  # no BOS added
    for token, tid in OFFICIAL.items():
        assert tok.encode(token) == [tid]
    assert tok.token_id("<|grounding|>") == 128820
    text = tok.decode([4, 128816, 5, 128817])
    assert "<|ref|>" in text and "hello" in text
    assert "<|ref|>" not in tok.decode([4, 128816, 5, 128817], skip_special_tokens=True)


def test_autotokenizer_reports_missing_specials(tmp_path):
    folder = _tiny_tokenizer_folder(tmp_path / "ckpt", with_specials=False)
    tok = load_tokenizer(folder)
    assert not tok.is_fallback
    assert any("<|grounding|>" in p for p in tok.problems)


def test_broken_tokenizer_folder_raises_one_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{ not json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(tmp_path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)
