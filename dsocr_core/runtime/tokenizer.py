"""The tokenizer: the checkpoint's own through transformers `AutoTokenizer` when the folder has one, otherwise a
clearly labelled fallback that still maps the special tokens to their official ids (BOS 0, EOS 1, pad 2,
`<image>` 128815 ... `<|Assistant|>` 128826).

Both kinds share one interface:

    tok = load_tokenizer(folder_or_None)
    tok.encode(text) -> list[int]          # no BOS/EOS added; special tokens in the text map to their ids
    tok.decode(ids, skip_special_tokens=False) -> str
    tok.is_fallback, tok.label, tok.problems

The fallback is NOT the real vocabulary: text ids it produces mean nothing to the real model. It exists so that
the token math, the preprocessing and the parity machinery run without a checkpoint (tests, random weights).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
import re
from pathlib import Path
from typing import Sequence

BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 128815

# The DeepSeek-OCR special tokens and the ids the checkpoint's own tokenizer gives them.
SPECIAL_TOKENS: dict[str, int] = {
    "<image>": 128815,
    "<|ref|>": 128816,
    "<|/ref|>": 128817,
    "<|det|>": 128818,
    "<|/det|>": 128819,
    "<|grounding|>": 128820,
    "<td>": 128821,
    "</td>": 128822,
    "<tr>": 128823,
    "</tr>": 128824,
    "<|User|>": 128825,
    "<|Assistant|>": 128826,
}
# BOS / EOS / pad as the DeepSeek LLM tokenizers spell them. The fallback reads and writes them as whole units.
CONTROL_TOKENS: dict[str, int] = {
    "<｜begin▁of▁sentence｜>": BOS_ID,
    "<｜end▁of▁sentence｜>": EOS_ID,
    "<｜▁pad▁｜>": PAD_ID,
}
LARGEST_REAL_ID = 128826  # ids above this are vocabulary padding (vocab_size 129280)

FALLBACK_BYTE_OFFSET = 3  # byte b <-> id 3 + b, so text ids lie in 3..258, far below the special ids
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class TokenizerError(ValueError):
    """A tokenizer folder that exists but cannot be loaded."""


class Tokenizer(ABC):
    """Common interface of the real (AutoTokenizer) and the fallback tokenizer."""

    is_fallback: bool = True
    label: str = ""
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID
    image_id: int = IMAGE_TOKEN_ID

    def __init__(self) -> None:
        self.problems: list[str] = []  # e.g. special tokens the loaded tokenizer maps to unofficial ids

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Text to ids, no BOS/EOS added; special tokens in the text map to their official ids."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Ids back to text."""

    def token_id(self, token: str) -> int | None:
        """Id of a special token, or None when this tokenizer does not know it."""
        ids = self.encode(token)
        return ids[0] if len(ids) == 1 else None

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.label}>"


class FallbackTokenizer(Tokenizer):
    """Deterministic, reversible stand-in: special tokens as whole units at their official ids, every other
    character as its UTF-8 bytes mapped to ids 3..258. decode(encode(text)) == text for any str."""

    is_fallback = True

    def __init__(self, reason: str = "no tokenizer in checkpoint") -> None:
        super().__init__()
        self.label = f"fallback byte tokenizer ({reason})"
        self._by_text = {**CONTROL_TOKENS, **SPECIAL_TOKENS}
        self._by_id = {i: t for t, i in self._by_text.items()}
        # longest first so that no token is cut by a shorter one sharing its start
        alternatives = sorted(self._by_text, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")")

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        for k, piece in enumerate(self._split.split(text)):
            if k % 2:  # a captured special token
                ids.append(self._by_text[piece])
            elif piece:
                ids.extend(FALLBACK_BYTE_OFFSET + b for b in piece.encode("utf-8", "surrogatepass"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf = bytearray()

        def flush() -> None:
            if buf:
                try:  # surrogatepass mirrors encode, so even lone surrogates come back
                    out.append(buf.decode("utf-8", "surrogatepass"))
                except UnicodeDecodeError:  # bytes cut mid-character (e.g. a truncated generation)
                    out.append(buf.decode("utf-8", "replace"))
                buf.clear()

        for raw in ids:
            i = int(raw)
            if FALLBACK_BYTE_OFFSET <= i < FALLBACK_BYTE_OFFSET + 256:
                buf.append(i - FALLBACK_BYTE_OFFSET)
                continue
            flush()
            if i in self._by_id:
                if not skip_special_tokens:
                    out.append(self._by_id[i])
            elif not skip_special_tokens:
                out.append(f"<|id:{i}|>")  # an id this stand-in has no text for (e.g. sampled from random weights)
        flush()
        return "".join(out)


class HFTokenizer(Tokenizer):
    """The checkpoint's tokenizer through transformers AutoTokenizer (local files only, no remote code)."""

    is_fallback = False

    def __init__(self, folder: Path, backend) -> None:
        super().__init__()
        self.folder = folder
        self.backend = backend
        self.label = f"AutoTokenizer from {folder}"
        for token, official in {**SPECIAL_TOKENS, **CONTROL_TOKENS}.items():
            got = self.token_id(token)
            if got != official:
                self.problems.append(f"{token} maps to {got if got is not None else 'several ids'}, "
                                     f"the official id is {official}")

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def has_tokenizer(folder: str | Path | None) -> bool:
    """True when the folder holds tokenizer files AutoTokenizer can read."""
    if folder is None:
        return False
    folder = Path(folder)
    return folder.is_dir() and any((folder / name).exists() for name in TOKENIZER_FILES)


def load_tokenizer(folder: str | Path | None = None) -> Tokenizer:
    """The checkpoint folder's tokenizer via AutoTokenizer when it has one, else the labelled fallback.

    A folder that holds tokenizer files which fail to load raises TokenizerError (one line): silently swapping
    in the fallback would make every text id wrong for the real model."""
    if folder is None:
        return FallbackTokenizer("no checkpoint folder given")
    folder = Path(folder)
    if not folder.is_dir():
        return FallbackTokenizer(f"no folder {folder}")
    if not has_tokenizer(folder):
        return FallbackTokenizer(f"no tokenizer in {folder}")
    try:
        from transformers import AutoTokenizer

        backend = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one readable line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(f"cannot load the tokenizer in {folder}: {first}") from exc
    return HFTokenizer(folder, backend)
