"""Grounding outputs compared: the first divergence of two texts or id lists, per-output summaries, one-to-one
block matching by IoU, and the one-shot / separated / vendor detection comparison."""
from __future__ import annotations

import dataclasses
import difflib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from ..runtime.tokens import first_difference
from .parse import PAGE_SPLIT, Block, ParseResult, iou, parse


# ============================================================================================== comparison
@dataclass
class Divergence:
    """Where two sequences first differ. a / b are the items there (None past the end of the shorter)."""

    index: int
    a: Any
    b: Any
    line: int | None = None  # 1-based, text only
    column: int | None = None  # 1-based, text only
    context_a: Any = None  # the neighbourhood of `index` in each sequence
    context_b: Any = None


def first_divergence(a: Sequence, b: Sequence, context: int = 20) -> Divergence | None:
    """First position where two token-id lists (or two strings) differ; None when they are equal."""
    if isinstance(a, str) != isinstance(b, str):
        raise TypeError("compare two strings or two id sequences")
    a = a if isinstance(a, str) else [int(x) for x in a]
    b = b if isinstance(b, str) else [int(x) for x in b]
    i = first_difference(a, b)
    if i is None:
        return None
    lo = max(0, i - context)
    d = Divergence(i, a[i] if i < len(a) else None, b[i] if i < len(b) else None,
                   context_a=a[lo:i + context], context_b=b[lo:i + context])
    if isinstance(a, str):
        d.line = a.count("\n", 0, i) + 1
        d.column = i - (a.rfind("\n", 0, i) + 1) + 1
    return d


@dataclass
class OutputSummary:
    name: str
    blocks: int
    pages: int
    labels: dict[str, int]
    problems: int
    problem_kinds: dict[str, int]
    characters: int


@dataclass
class BlockMatch:
    a: int  # block index in the reference output
    b: int  # block index in the other output
    iou: float
    label_a: str
    label_b: str
    same_label: bool
    content_equal: bool  # equal after collapsing whitespace
    content_ratio: float  # difflib similarity 0..1


@dataclass
class PairComparison:
    reference: str
    other: str
    n_reference: int
    n_other: int
    matches: list[BlockMatch]
    unmatched_reference: list[int]
    unmatched_other: list[int]
    precision: float  # matches / blocks of `other` (1 when both are empty, 0 when only `other` is empty)
    recall: float  # matches / blocks of `reference`
    f1: float
    mean_iou: float | None  # over matches (IoU >= threshold); None without matches
    label_agreement: float | None  # share of matches with the same label
    content_exact: float | None  # share of matches with equal content
    content_mean_ratio: float | None
    labels: dict[str, list[int]]  # label -> [count in reference, count in other]
    identical_text: bool
    text_divergence: Divergence | None
    side_by_side: list[dict]  # the first K blocks of each, position by position


@dataclass
class DetectionComparison:
    """Two or three outputs of one page compared: one-shot, separated, optionally a vendor reference."""

    iou_threshold: float
    outputs: list[OutputSummary]
    pairs: list[PairComparison]
    token_divergence: Divergence | None = None  # of the first two outputs' generated ids, when given

    @property
    def identical(self) -> bool:
        return all(p.identical_text for p in self.pairs)

    def pair(self, reference: str, other: str) -> PairComparison:
        for p in self.pairs:
            if (p.reference, p.other) == (reference, other):
                return p
        raise KeyError(f"no comparison of {reference!r} with {other!r}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["identical"] = self.identical
        return json.loads(json.dumps(d, default=list))

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


def _norm_text(s: str) -> str:
    return " ".join(s.split())


def _ratio(a: str, b: str) -> float:
    if a == b:
        return 1.0
    m = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return m.ratio() if len(a) + len(b) <= 8000 else m.quick_ratio()


def match_blocks(ref: Sequence[Block], other: Sequence[Block], threshold: float = 0.5) -> list[tuple[int, int, float]]:
    """Optimal one-to-one matching of blocks by IoU of their enclosing boxes (same page only). Returns
    (position in ref, position in other, IoU) for pairs with IoU >= threshold."""
    if not ref or not other:
        return []
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    def boxes(blocks: Sequence[Block]):
        arr = np.array([b.bbox if b.bbox is not None else (0, 0, 0, 0) for b in blocks], dtype=float)
        has = np.array([b.bbox is not None for b in blocks])
        return arr, has, np.array([b.page for b in blocks])

    (ra, rh, rp), (oa, oh, op) = boxes(ref), boxes(other)
    ix = np.clip(np.minimum(ra[:, None, 2], oa[None, :, 2]) - np.maximum(ra[:, None, 0], oa[None, :, 0]), 0, None)
    iy = np.clip(np.minimum(ra[:, None, 3], oa[None, :, 3]) - np.maximum(ra[:, None, 1], oa[None, :, 1]), 0, None)
    inter = ix * iy
    area_r = (ra[:, 2] - ra[:, 0]) * (ra[:, 3] - ra[:, 1])
    area_o = (oa[:, 2] - oa[:, 0]) * (oa[:, 3] - oa[:, 1])
    union = area_r[:, None] + area_o[None, :] - inter
    same = (ra[:, None, :] == oa[None, :, :]).all(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(union > 0, inter / np.where(union > 0, union, 1), same.astype(float))  # == iou()
    m = np.where(rh[:, None] & oh[None, :] & (rp[:, None] == op[None, :]), m, 0.0)
    m = np.where(m >= threshold, m, 0.0)
    rows, cols = linear_sum_assignment(m, maximize=True)
    return [(int(i), int(j), float(m[i, j])) for i, j in zip(rows, cols) if m[i, j] >= threshold and m[i, j] > 0]


def _side_by_side(ref: ParseResult, other: ParseResult, k: int) -> list[dict]:
    rows = []
    for i in range(min(k, max(len(ref.blocks), len(other.blocks)))):
        a = ref.blocks[i] if i < len(ref.blocks) else None
        b = other.blocks[i] if i < len(other.blocks) else None
        row = {"index": i, "reference": a.to_dict() if a else None, "other": b.to_dict() if b else None,
               "same_label": bool(a and b and a.label == b.label),
               "same_boxes": bool(a and b and a.boxes == b.boxes),
               "same_content": bool(a and b and a.content == b.content),
               "iou": iou(a.bbox, b.bbox) if a and b else None, "content_diff": None}
        if a and b and a.content != b.content:
            row["content_diff"] = "\n".join(difflib.ndiff(a.content.splitlines() or [""],
                                                          b.content.splitlines() or [""]))
        rows.append(row)
    return rows


def compare_pair(ref: str | ParseResult, other: str | ParseResult, ref_name: str = "a", other_name: str = "b",
                 iou_threshold: float = 0.5, k: int = 10) -> PairComparison:
    ref_text = ref if isinstance(ref, str) else PAGE_SPLIT.join(ref.pages)
    other_text = other if isinstance(other, str) else PAGE_SPLIT.join(other.pages)
    pr = parse(ref) if isinstance(ref, str) else ref
    po = parse(other) if isinstance(other, str) else other
    matches = []
    for i, j, v in match_blocks(pr.blocks, po.blocks, iou_threshold):
        a, b = pr.blocks[i], po.blocks[j]
        ca, cb = _norm_text(a.content), _norm_text(b.content)
        matches.append(BlockMatch(a.index, b.index, v, a.label, b.label, a.label == b.label, ca == cb, _ratio(ca, cb)))
    matches.sort(key=lambda m: m.a)
    na, nb, nm = len(pr.blocks), len(po.blocks), len(matches)
    precision = nm / nb if nb else (1.0 if na == 0 else 0.0)
    recall = nm / na if na else (1.0 if nb == 0 else 0.0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    mean = (lambda xs: sum(xs) / len(xs) if xs else None)
    la, lb = pr.labels(), po.labels()
    return PairComparison(
        ref_name, other_name, na, nb, matches,
        sorted(set(b.index for b in pr.blocks) - {m.a for m in matches}),
        sorted(set(b.index for b in po.blocks) - {m.b for m in matches}),
        precision, recall, f1, mean([m.iou for m in matches]),
        mean([float(m.same_label) for m in matches]), mean([float(m.content_equal) for m in matches]),
        mean([m.content_ratio for m in matches]),
        {lab: [la.get(lab, 0), lb.get(lab, 0)] for lab in sorted(set(la) | set(lb))},
        ref_text == other_text, first_divergence(ref_text, other_text), _side_by_side(pr, po, k))


def compare_outputs(one_shot: str | ParseResult, separated: str | ParseResult,
                    vendor: str | ParseResult | None = None, names: Sequence[str] = ("one-shot", "separated", "vendor"),
                    ids_a: Sequence[int] | None = None, ids_b: Sequence[int] | None = None,
                    iou_threshold: float = 0.5, k: int = 10) -> DetectionComparison:
    """Compare the outputs of one page. Pairs: (one-shot, separated) and, with a vendor text, (vendor, one-shot)
    and (vendor, separated); the first of a pair is the reference (recall is over its blocks). ids_a / ids_b are
    the generated token ids of the first two, for the first diverging token."""
    texts = [one_shot, separated] + ([vendor] if vendor is not None else [])
    names = list(names)[:len(texts)]
    if len(names) < len(texts) or len(set(names)) != len(names):
        raise ValueError(f"need {len(texts)} distinct names, got {names}")
    parsed = [parse(t) if isinstance(t, str) else t for t in texts]
    raw = [t if isinstance(t, str) else PAGE_SPLIT.join(t.pages) for t in texts]
    outputs = [OutputSummary(n, len(p.blocks), len(p.pages), p.labels(), len(p.problems),
                             dict(Counter(q.kind for q in p.problems)), len(r))
               for n, p, r in zip(names, parsed, raw)]
    order = [(0, 1)] + ([(2, 0), (2, 1)] if vendor is not None else [])
    pairs = [compare_pair(parsed[i], parsed[j], names[i], names[j], iou_threshold, k) for i, j in order]
    tokens = first_divergence(list(ids_a), list(ids_b)) if ids_a is not None and ids_b is not None else None
    return DetectionComparison(iou_threshold, outputs, pairs, tokens)
