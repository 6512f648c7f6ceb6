"""MoE routing for the time model: how many distinct routed experts a call of T tokens touches.

Uniform routing (the default, labelled "assumed" wherever a prediction is shown) takes each token to pick its k
of E experts uniformly and independently: E x (1 - (1 - k/E)^T) (analytic/lm.py expected_experts). Real routers
are not uniform: synthetic weights, for one, send a batch of tokens to far fewer experts (docs/accuracy.md). A
`Routing` holds what a measured run observed: per tokens-per-call, the mean distinct experts per MoE layer and
call (recorded by measure/routing_record.py). Between observed token counts the ratio observed / uniform is
interpolated in log(tokens); outside the observed range the routing says nothing, so uniform routing is used
there (a decode-only profile, 1-64 tokens per call, must not set the experts a 700-token prefill reaches); the
result stays within [k, E]. Where the records hold each layer-call's loads (the rows each touched expert got,
largest first; runs measured since 2026-11-27), a Routing also keeps, per token count, their mean shape: each
rank's share of the call's k x T rows. A grouped GEMM's time follows those rows, not only how many experts hold
them (fast/plan.py prices each group in whole tiles); `rows_by_rank` gives them for a call of T tokens.

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
    # per token count, each rank's mean share of the call's k x T rows, largest first (E values summing to 1), or
    # None where the records held no loads; None for the whole table when none did
    shapes: tuple[tuple[float, ...] | None, ...] | None = None

    def __post_init__(self):
        if not self.tokens or len({len(self.tokens), len(self.observed), len(self.samples)}) != 1:
            raise RoutingError("a routing table needs as many tokens, distinct and samples entries, at least one")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:])) or self.tokens[0] < 1:
            raise RoutingError(f"routing tokens must be increasing whole counts >= 1, got {list(self.tokens)}")
        for t, d in zip(self.tokens, self.observed):
            if not (min(self.k, self.experts) <= d <= min(self.experts, self.k * t) + 1e-9):
                raise RoutingError(f"{d} distinct experts for {t:g} tokens is impossible with k={self.k} of "
                                   f"E={self.experts}")
        if self.shapes is not None:
            if len(self.shapes) != len(self.tokens):
                raise RoutingError("a routing table needs one loads entry (or none) per token count")
            for t, shape in zip(self.tokens, self.shapes):
                if shape is not None and (len(shape) != self.experts or min(shape) < 0
                                          or abs(sum(shape) - 1.0) > 1e-3):
                    raise RoutingError(f"the loads at {t:g} tokens must be {self.experts} shares >= 0 summing to 1")

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

    def rows_by_rank(self, n_experts: int, k: int, tokens):
        """Rows each rank of expert gets in a call of `tokens` tokens, largest first: [..., E] (numpy over sweep
        points), from the loads recorded at the nearest token count (in log tokens) inside the observed range; NaN
        where there are none (outside the range, or no loads recorded). None when the routing holds no loads."""
        if self.shapes is None or not any(sh is not None for sh in self.shapes):
            return None
        if (n_experts, k) != (self.experts, self.k):
            raise SpecError(f"the routing profile ({self.source}) is for k={self.k} of E={self.experts} experts; "
                            f"the model picks k={k} of E={n_experts}")
        have = [i for i, sh in enumerate(self.shapes) if sh is not None]
        known_t = np.log(np.asarray([self.tokens[i] for i in have], dtype=float))
        table = np.asarray([self.shapes[i] for i in have], dtype=float)  # [recorded, E]
        tokens = np.asarray(tokens, dtype=float)
        nearest = np.abs(np.log(np.maximum(tokens, 1.0))[..., None] - known_t).argmin(-1)
        inside = (tokens >= self.tokens[0]) & (tokens <= self.tokens[-1])
        rows = table[nearest] * (k * tokens)[..., None]
        return np.where(inside[..., None], rows, np.nan)

    def label(self) -> str:
        return (f"observed ({self.source}; {self.tokens[0]:g}-{self.tokens[-1]:g} tokens per call, uniform "
                "outside)")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "experts": self.experts, "k": self.k,
                "source": self.source,
                "calls": [{"tokens": t, "distinct": d, "samples": n,
                           **({} if sh is None else {"loads": [round(x, 6) for x in sh]})}
                          for t, d, n, sh in zip(self.tokens, self.observed, self.samples,
                                                 self.shapes or (None,) * len(self.tokens))]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def load_shape(loads: Iterable[float], experts: int) -> tuple[float, ...]:
    """One layer-call's loads (rows per touched expert) as each rank's share of the rows, largest first, E values."""
    rows = sorted((float(x) for x in loads), reverse=True)[:experts]
    total = sum(rows)
    return tuple([x / total for x in rows] + [0.0] * (experts - len(rows))) if total > 0 else (1.0 / experts,) * experts


def routing_from_calls(calls: Iterable[tuple], experts: int, k: int, source: str) -> Routing | None:
    """A Routing from layer-calls (tokens, distinct experts[, loads]): the mean distinct experts per token count,
    and the mean load shape where every call of that count recorded its loads. None when there is none."""
    by_tokens: dict[float, list[tuple]] = {}
    for c in calls:
        if c[0] >= 1:
            by_tokens.setdefault(float(c[0]), []).append(c)
    if not by_tokens:
        return None
    ts = sorted(by_tokens)
    shapes = []
    for t in ts:
        group = by_tokens[t]
        full = all(len(c) > 2 and c[2] for c in group)
        shapes.append(tuple(np.mean([load_shape(c[2], experts) for c in group], axis=0).tolist()) if full else None)
    return Routing(experts, k, tuple(ts), tuple(float(np.mean([c[1] for c in by_tokens[t]])) for t in ts),
                   tuple(len(by_tokens[t]) for t in ts), source,
                   tuple(shapes) if any(sh is not None for sh in shapes) else None)


def calls_of_record(record: Mapping[str, Any]) -> list[tuple]:
    """Layer-calls of one stored routing record (measure/routing_record.py): (tokens, distinct) or, where the record
    holds them, (tokens, distinct, loads). {"tokens": T, "distinct": [per layer], "loads": [[...] per layer]} for a
    prefill, {"tokens": B, "distinct": [[per layer] per step], "loads": [[[...] per layer] per step]} for decode
    steps; records made before loads were recorded have none."""
    t = float(record["tokens"])
    distinct = record["distinct"]
    loads = record.get("loads")
    out = []
    for i, v in enumerate(distinct):
        if isinstance(v, list):
            step = loads[i] if loads is not None else [None] * len(v)
            out += [(t, float(x)) if ld is None else (t, float(x), ld) for x, ld in zip(v, step)]
        else:
            out.append((t, float(v)) if loads is None else (t, float(v), loads[i]))
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
        if not isinstance(c, Mapping) or not ({"tokens", "distinct", "samples"} <= set(c)
                                              <= {"tokens", "distinct", "samples", "loads"}):
            raise bad(f"calls[{i}] must have tokens, distinct and samples (and optionally loads), nothing else")
        for name in ("tokens", "distinct", "samples"):
            v = c[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise bad(f"calls[{i}].{name} must be a finite number >= 0, got {v!r}")
        shape = c.get("loads")
        if shape is not None:
            if not isinstance(shape, list) or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                  or not math.isfinite(x) for x in shape):
                raise bad(f"calls[{i}].loads must be a list of numbers")
            shape = tuple(float(x) for x in shape)
        rows.append((float(c["tokens"]), float(c["distinct"]), int(c["samples"]), shape))
    shapes = tuple(r[3] for r in rows)
    try:
        return Routing(data["experts"], data["k"], tuple(r[0] for r in rows), tuple(r[1] for r in rows),
                       tuple(r[2] for r in rows), data["source"],
                       shapes if any(sh is not None for sh in shapes) else None)
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
    table = pd.DataFrame({"tokens per call": t.astype(int), "observed distinct experts": routing.observed,
                          "uniform (assumed)": uniform, "observed / uniform": np.asarray(routing.observed) / uniform,
                          "layer-calls": routing.samples})
    if routing.shapes is not None:  # how unevenly the rows spread (the grouped GEMMs' tiles follow it)
        table["largest expert's share of the rows"] = [np.nan if sh is None else sh[0] for sh in routing.shapes]
        table["uniform share (assumed)"] = 1.0 / np.maximum(uniform, 1.0)
    return table
