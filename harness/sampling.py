"""Sampling policy -> processed distribution over token ids, applied identically to target and draft logits.

Order follows llama.cpp's default sampler chain: top_k, top_p, min_p on the raw softmax, then temperature
over the survivors. Temperature 0 is greedy (a point mass on the argmax).
The candidate set is every id whose logit is within `delta` of the max, widened until it holds what the
truncation needs, so no full-vocabulary sort is ever done.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from harness.errors import HarnessError

_START_DELTA = 6.0


@dataclass(frozen=True)
class Policy:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise HarnessError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise HarnessError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise HarnessError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise HarnessError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def label(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1:
            parts.append(f"top_p={self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"min_p={self.min_p:g}")
        return " ".join(parts)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Dist:
    """A distribution on a support: ids sorted ascending, probs summing to 1."""

    ids: np.ndarray
    probs: np.ndarray

    def prob(self, token: int) -> float:
        i = np.searchsorted(self.ids, token)
        return float(self.probs[i]) if i < len(self.ids) and self.ids[i] == token else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.ids[min(np.searchsorted(np.cumsum(self.probs), rng.random() * self.probs.sum()),
                                len(self.ids) - 1)])

    @property
    def top_prob(self) -> float:
        return float(self.probs.max())

    @staticmethod
    def point(token: int) -> "Dist":
        return Dist(np.array([token], dtype=np.int64), np.array([1.0]))


def _sorted_dist(ids: np.ndarray, probs: np.ndarray) -> Dist:
    order = np.argsort(ids)
    return Dist(ids[order].astype(np.int64), probs[order])


def top_prob(logits: np.ndarray) -> float:
    """The largest probability of the raw softmax (T=1): the model's confidence."""
    m = logits.max()
    return float(1.0 / np.exp(logits - m, dtype=np.float32).sum(dtype=np.float64))


def top_share(logits: np.ndarray, k: int) -> float:
    """The top token's probability among the k most likely (softmax at T=1 over them)."""
    top = np.partition(logits, -k)[-k:] if len(logits) > k else logits
    return float(1.0 / np.exp(top - top.max(), dtype=np.float64).sum())


def process(logits: np.ndarray, policy: Policy) -> Dist:
    if policy.greedy:
        return Dist.point(int(np.argmax(logits)))
    m = float(logits.max())
    k, top_p, min_p = policy.top_k, policy.top_p, policy.min_p
    if not k and top_p >= 1 and min_p <= 0:
        w = np.exp((logits - m) / policy.temperature, dtype=np.float64)
        return Dist(np.arange(len(logits), dtype=np.int64), w / w.sum())
    floor = m + math.log(min_p) if min_p > 0 else -math.inf  # min_p keeps exactly the ids above this logit
    # Widen the candidate set until it holds what the chain needs: with top_k, all k survivors (top_p is
    # normalised over them, so the min_p floor cannot stop the widening); without, the top_p mass of the full
    # softmax or the floor, below which min_p drops everything anyway. `lowest` (the smallest finite logit)
    # ends the widening once every finite id is in, so -inf logits (fewer finite ids than k) cost nothing.
    z = lowest = None
    delta = _START_DELTA
    while True:
        thr = m - delta if k else max(m - delta, floor)
        ids = np.flatnonzero(logits >= thr)
        if k:
            if len(ids) >= k:
                break
        elif thr == floor:
            break
        elif top_p < 1:  # top_p against the full softmax mass
            if z is None:
                z = float(np.exp(logits - m, dtype=np.float64).sum())
            if np.exp(logits[ids] - m, dtype=np.float64).sum() / z >= top_p:
                break
        if lowest is None:
            lowest = float(logits[np.isfinite(logits)].min())
        if thr <= lowest:
            break
        delta *= 2
    vals = (logits[ids] - m).astype(np.float64)  # rounded as z's terms were, so cumsum / z is consistent
    order = np.lexsort((ids, -vals))  # by logit descending, ties by id: deterministic
    ids, vals = ids[order], vals[order]
    if k:
        ids, vals = ids[:k], vals[:k]
    if top_p < 1:
        w = np.exp(vals)
        total = w.sum() if k else (z if z is not None else float(np.exp(logits - m, dtype=np.float64).sum()))
        keep = int(np.searchsorted(np.cumsum(w) / total, top_p)) + 1
        ids, vals = ids[:keep], vals[:keep]
    if min_p > 0:
        keep = logits[ids] >= floor
        ids, vals = ids[keep], vals[keep]
    w = np.exp(vals / policy.temperature)
    return _sorted_dist(ids, w / w.sum())
