"""Verification as pure functions over arrays: greedy; Leviathan et al. (2023) rejection sampling; and llama.cpp's
sample-and-compare ("exact": the draft proposes its top token, the target samples its own, drafts are kept while
the two agree). All three emit tokens distributed as the target's p."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.sampling import Dist


@dataclass(frozen=True)
class Verdict:
    accepted: int          # draft tokens accepted (0..gamma)
    token: int             # the correction (after a rejection) or bonus (all accepted) token
    alpha: list[float]     # per proposed position: sum_x min(p(x), q(x))


def overlap(p: Dist, q: Dist) -> float:
    """sum_x min(p(x), q(x)) over the union of supports."""
    common, ip, iq = np.intersect1d(p.ids, q.ids, assume_unique=True, return_indices=True)
    return float(np.minimum(p.probs[ip], q.probs[iq]).sum()) if len(common) else 0.0


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p - q)); p itself when the difference vanishes (p == q up to rounding)."""
    _, ip, iq = np.intersect1d(p.ids, q.ids, assume_unique=True, return_indices=True)
    r = p.probs.copy()
    r[ip] = np.maximum(0.0, p.probs[ip] - q.probs[iq])
    s = r.sum()
    if s <= 1e-12:
        return p
    keep = r > 0
    return Dist(p.ids[keep], r[keep] / s)


def verify_greedy(draft: np.ndarray, target_argmax: np.ndarray) -> Verdict:
    """target_argmax has gamma+1 entries: the target's choice after each prefix of the block."""
    g = len(draft)
    match = draft == target_argmax[:g]
    n = g if match.all() else int(np.argmin(match))
    return Verdict(n, int(target_argmax[n]), [float(x) for x in match])


def verify_stochastic(draft: np.ndarray, q: list[Dist], p: list[Dist], rng: np.random.Generator) -> Verdict:
    """Accept x_i with probability min(1, p(x_i)/q(x_i)); at the first rejection sample norm(max(0, p - q));
    after gamma acceptances sample the bonus from p[gamma]. The emitted tokens are distributed as p."""
    g = len(draft)
    alpha = [overlap(p[i], q[i]) for i in range(g)]
    for i in range(g):
        x = int(draft[i])
        px, qx = p[i].prob(x), q[i].prob(x)
        if rng.random() * qx < px:  # u < p/q without dividing; always true when p >= q
            continue
        return Verdict(i, residual(p[i], q[i]).sample(rng), alpha)
    return Verdict(g, p[g].sample(rng), alpha)


def verify_exact(draft: np.ndarray, p: list[Dist], rng: np.random.Generator) -> Verdict:
    """llama.cpp's rule: at each drafted position the target samples y ~ p; the draft is kept while y equals it,
    and the first y that differs is the correction; after gamma agreements y ~ p[gamma] is the bonus. A position
    is accepted with probability p(x): the overlap of p with a point mass at the draft's token (alpha)."""
    g = len(draft)
    alpha = [p[i].prob(int(draft[i])) for i in range(g)]
    for i in range(g):
        y = p[i].sample(rng)
        if y != int(draft[i]):
            return Verdict(i, y, alpha)
    return Verdict(g, p[g].sample(rng), alpha)
