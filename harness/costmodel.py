"""Leviathan et al. (2023) cost model with measured cost curves, and the per-step gamma controller."""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.errors import HarnessError


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha): accepted drafts plus the correction/bonus."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


@dataclass(frozen=True)
class Costs:
    target_ms: list[float]   # llama_decode of k = 1.. tokens with all logits, index k-1
    draft_ms: float          # one draft decode (0 for a proposer without a model)
    overhead_ms: float = 0.0  # measured Python/verification cost per step
    draft_curve: tuple[float, ...] = ()  # draft decode of k = 1.. tokens: what catching up after plain steps costs

    def catch_up(self, n: int) -> float:
        """The draft's cost to evaluate n tokens it skipped (linear beyond the calibrated range)."""
        if not self.draft_curve:
            return n * self.draft_ms
        c = self.draft_curve
        return c[n - 1] if n <= len(c) else c[-1] * n / len(c)

    def verify(self, k: int) -> float:
        if k > len(self.target_ms):
            raise HarnessError(f"calibration covers k <= {len(self.target_ms)}, gamma needs {k}: recalibrate "
                               "with a larger --k-max")
        return self.target_ms[k - 1]

    def draft_step_ms(self, gamma: int, alpha: float) -> float:
        """gamma draft decodes; with a measured draft curve, also the extra token it evaluates when all gamma
        were accepted (the last proposal and the bonus token arrive together), which happens w.p. alpha^gamma."""
        extra = alpha ** gamma * (self.catch_up(2) - self.catch_up(1)) if self.draft_curve else 0.0
        return gamma * self.draft_ms + extra

    def step_ms(self, gamma: int, alpha: float = 0.0) -> float:
        return self.draft_step_ms(gamma, alpha) + self.verify(gamma + 1) + self.overhead_ms

    def tokens_per_ms(self, alpha: float, gamma: int) -> float:
        return expected_tokens(alpha, gamma) / self.step_ms(gamma, alpha)


def predicted_speedup(alpha: float, gamma: int, costs: Costs) -> float:
    """E(alpha, gamma) * T_target(1) / (T_draft(gamma) + T_verify(gamma+1) + overhead), with T_draft(gamma) =
    gamma * T_draft(1) (+ the bonus catch-up when a draft curve is known)."""
    return expected_tokens(alpha, gamma) * costs.target_ms[0] / costs.step_ms(gamma, alpha)


def best_gamma(alpha: float, costs: Costs, gamma_max: int) -> int:
    """0 means plain decoding is predicted to be fastest."""
    plain = 1.0 / costs.target_ms[0]
    best = max(range(1, gamma_max + 1), key=lambda g: costs.tokens_per_ms(alpha, g))
    return best if costs.tokens_per_ms(alpha, best) > plain else 0


class AdaptiveGamma:
    """Per step, the gamma in {0..gamma_max} with the most expected tokens per ms under a running alpha.

    alpha is the mean of the last `window` per-position sum min(p, q) values (every proposed position is
    measured, so rejections do not bias it), shrunk towards `prior` by `prior_weight` pseudo-observations.
    While plain decoding is predicted best, a gamma=1 probe is taken only when it is worth its price: what
    speculation could gain over the remaining tokens at an optimistic alpha (the estimate plus
    1/sqrt(observations)) must exceed what the probe costs, the draft catching up over the skipped tokens plus
    a two-token verify instead of a one-token decode. Where even a perfect draft cannot win, it never probes."""

    def __init__(self, costs: Costs, gamma_max: int, prior: float = 0.6, prior_weight: float = 2.0,
                 window: int = 64):
        self.costs, self.gamma_max = costs, gamma_max
        self.prior, self.prior_weight, self.window = prior, prior_weight, window
        self.seen: list[float] = []
        self.backlog = 0  # plain steps since the draft last ran

    @property
    def alpha(self) -> float:
        recent = self.seen[-self.window:]
        return (self.prior * self.prior_weight + sum(recent)) / (self.prior_weight + len(recent))

    def probe_worth_it(self, remaining: int) -> bool:
        c = self.costs
        n = min(len(self.seen), self.window) + self.prior_weight
        optimistic = min(1.0, self.alpha + 1 / math.sqrt(n))
        best = max(predicted_speedup(optimistic, g, c) for g in range(1, self.gamma_max + 1))
        if best <= 1:
            return False
        gain = remaining * c.target_ms[0] * (1 - 1 / best)
        cost = c.catch_up(self.backlog + 1) + c.verify(2) - c.verify(1)
        return gain > cost

    def choose(self, remaining: int = 1 << 20) -> int:
        g = best_gamma(self.alpha, self.costs, self.gamma_max)
        if g == 0 and self.probe_worth_it(remaining):
            g = 1
        self.backlog = 0 if g else self.backlog + 1
        return g

    def observe(self, alphas: list[float]) -> None:
        self.seen.extend(alphas)
