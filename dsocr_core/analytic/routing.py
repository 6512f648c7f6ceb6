"""MoE routing for the time model: how many distinct routed experts a call of T tokens touches.

Uniform routing (the default, labelled "assumed" wherever a prediction is shown) takes each token to pick its k
of E experts uniformly and independently: E x (1 - (1 - k/E)^T) (analytic/lm.py expected_experts). Real routers
are not uniform: synthetic weights, for one, send a batch of tokens to far fewer experts (docs/accuracy.md). A
`Routing` holds what a measured run observed: per tokens-per-call, the mean distinct experts per MoE layer and
call (recorded by measure/routing_record.py). Between observed token counts the ratio observed / uniform is
interpolated in log(tokens); outside the observed range the routing says nothing, so uniform routing is used
there (a decode-only profile, 1-64 tokens per call, must not set the experts a 700-token prefill reaches); the
result stays within [k, E].

A routing profile is that table in a JSON file (`format` "dsocr-routing-profile", version 1), saved from a run
(`python -m dsocr_core runs RUN --save-routing FILE`, or the MFU page) and chosen for what-if predictions (the
sidebar, `analytic --routing FILE`). Loading is strict: a problem names the file and the field.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ..spec import SpecError
from .lm import expected_experts

FORMAT = "dsocr-routing-profile"
FORMAT_VERSION = 1
MAX_BYTES = 4 << 20


class RoutingError(SpecError):
    """A routing profile that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True, eq=False)
class Routing:
    experts: int  # E, routed experts per MoE layer
    k: int  # experts each token picks
    tokens: tuple[float, ...]  # tokens per call, increasing
    observed: tuple[float, ...]  # mean distinct experts per layer and call at those token counts
    samples: tuple[int, ...]  # layer-calls behind each mean
    source: str  # where it was observed: "run 1a2b3c4d (name)"

    def __post_init__(self):
        if not self.tokens or len({len(self.tokens), len(self.observed), len(self.samples)}) != 1:
            raise RoutingError("a routing table needs as many tokens, distinct and samples entries, at least one")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:])) or self.tokens[0] < 1:
            raise RoutingError(f"routing tokens must be increasing whole counts >= 1, got {list(self.tokens)}")
        for t, d in zip(self.tokens, self.observed):
            if not (min(self.k, self.experts) <= d <= min(self.experts, self.k * t) + 1e-9):
                raise RoutingError(f"{d} distinct experts for {t:g} tokens is impossible with k={self.k} of "
                                   f"E={self.experts}")

    def ratios(self) -> np.ndarray:
        """Observed / uniform at each observed token count."""
        t = np.asarray(self.tokens, dtype=float)
        return np.asarray(self.observed, dtype=float) / expected_experts(self.experts, self.k, t)

    def touched(self, n_experts: int, k: int, tokens):
        """Distinct experts a call of `tokens` tokens touches (numpy over sweep points)."""
        if (n_experts, k) != (self.experts, self.k):
            raise SpecError(f"the routing profile ({self.source}) is for k={self.k} of E={self.experts} experts; "
                            f"the model picks k={k} of E={n_experts}")
        tokens = np.asarray(tokens, dtype=float)
        uniform = expected_experts(n_experts, k, tokens)
        inside = (tokens >= self.tokens[0]) & (tokens <= self.tokens[-1])
        ratio = np.where(inside, np.interp(np.log(np.maximum(tokens, 1.0)), np.log(np.asarray(self.tokens)),
                                           self.ratios()), 1.0)
        low = np.where(tokens > 0, float(min(k, n_experts)), 0.0)
        return np.clip(ratio * uniform, low, np.minimum(float(n_experts), k * tokens))

    def label(self) -> str:
        return (f"observed ({self.source}; {self.tokens[0]:g}-{self.tokens[-1]:g} tokens per call, uniform "
                "outside)")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "experts": self.experts, "k": self.k,
                "source": self.source,
                "calls": [{"tokens": t, "distinct": d, "samples": n}
                          for t, d, n in zip(self.tokens, self.observed, self.samples)]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def routing_from_calls(calls: Iterable[tuple[float, float]], experts: int, k: int, source: str) -> Routing | None:
    """A Routing from (tokens, distinct experts) of individual layer-calls: the mean per token count. None when
    there is none."""
    by_tokens: dict[float, list[float]] = {}
    for t, d in calls:
        if t >= 1:
            by_tokens.setdefault(float(t), []).append(float(d))
    if not by_tokens:
        return None
    ts = sorted(by_tokens)
    return Routing(experts, k, tuple(ts), tuple(float(np.mean(by_tokens[t])) for t in ts),
                   tuple(len(by_tokens[t]) for t in ts), source)


def calls_of_record(record: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(tokens, distinct) layer-calls of one stored routing record (measure/routing_record.py): {"tokens": T,
    "distinct": [per layer]} for a prefill, {"tokens": B, "distinct": [[per layer] per step]} for decode steps."""
    t = float(record["tokens"])
    out = []
    for v in record["distinct"]:
        out += [(t, float(x)) for x in (v if isinstance(v, list) else [v])]
    return out


def routing_from_dict(data: Any, where: str = "routing profile") -> Routing:
    def bad(msg: str):
        return RoutingError(f"{where}: {msg}")

    if not isinstance(data, Mapping):
        raise bad("not a JSON object")
    if data.get("format") != FORMAT:
        raise bad(f"format must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("format_version") != FORMAT_VERSION:
        raise bad(f"format_version must be {FORMAT_VERSION}, got {data.get('format_version')!r}")
    unknown = set(data) - {"format", "format_version", "experts", "k", "source", "calls"}
    if unknown:
        raise bad(f"unknown fields {sorted(unknown)}")
    for name in ("experts", "k"):
        if not isinstance(data.get(name), int) or isinstance(data.get(name), bool) or data[name] < 1:
            raise bad(f"{name} must be a whole number >= 1, got {data.get(name)!r}")
    if not isinstance(data.get("source"), str):
        raise bad("source must be a string")
    calls = data.get("calls")
    if not isinstance(calls, list) or not calls:
        raise bad("calls must be a non-empty list")
    rows = []
    for i, c in enumerate(calls):
        if not isinstance(c, Mapping) or set(c) != {"tokens", "distinct", "samples"}:
            raise bad(f"calls[{i}] must have exactly tokens, distinct and samples")
        for name in ("tokens", "distinct", "samples"):
            v = c[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise bad(f"calls[{i}].{name} must be a finite number >= 0, got {v!r}")
        rows.append((float(c["tokens"]), float(c["distinct"]), int(c["samples"])))
    try:
        return Routing(data["experts"], data["k"], tuple(r[0] for r in rows), tuple(r[1] for r in rows),
                       tuple(r[2] for r in rows), data["source"])
    except RoutingError as exc:
        raise bad(str(exc)) from None


def load_routing(path: str | Path) -> Routing:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise RoutingError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a routing profile")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RoutingError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RoutingError(f"{path}: not a JSON routing profile ({exc})") from None
    return routing_from_dict(data, str(path))


def routing_table(routing: Routing):
    """Observed beside uniform, per token count: what the MFU page shows."""
    import pandas as pd

    t = np.asarray(routing.tokens)
    uniform = expected_experts(routing.experts, routing.k, t)
    return pd.DataFrame({"tokens per call": t.astype(int), "observed distinct experts": routing.observed,
                         "uniform (assumed)": uniform, "observed / uniform": np.asarray(routing.observed) / uniform,
                         "layer-calls": routing.samples})
