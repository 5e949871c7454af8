"""Leviathan et al. (2023) cost model with measured cost curves, and the per-step gamma controller."""
from __future__ import annotations

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

    def verify(self, k: int) -> float:
        if k > len(self.target_ms):
            raise HarnessError(f"calibration covers k <= {len(self.target_ms)}, gamma needs {k}: recalibrate "
                               "with a larger --k-max")
        return self.target_ms[k - 1]

    def step_ms(self, gamma: int) -> float:
        return gamma * self.draft_ms + self.verify(gamma + 1) + self.overhead_ms

    def tokens_per_ms(self, alpha: float, gamma: int) -> float:
        return expected_tokens(alpha, gamma) / self.step_ms(gamma)


def predicted_speedup(alpha: float, gamma: int, costs: Costs) -> float:
    """E(alpha, gamma) * T_target(1) / (gamma * T_draft(1) + T_verify(gamma+1) + overhead)."""
    return expected_tokens(alpha, gamma) * costs.target_ms[0] / costs.step_ms(gamma)


def best_gamma(alpha: float, costs: Costs, gamma_max: int) -> int:
    """0 means plain decoding is predicted to be fastest."""
    plain = 1.0 / costs.target_ms[0]
    best = max(range(1, gamma_max + 1), key=lambda g: costs.tokens_per_ms(alpha, g))
    return best if costs.tokens_per_ms(alpha, best) > plain else 0


class AdaptiveGamma:
    """Per step, the gamma in {0..gamma_max} with the most expected tokens per ms under a running alpha.

    alpha is the mean of the last `window` per-position sum min(p, q) values (rejections do not bias it: every
    proposed position is measured), shrunk towards `prior` by `prior_weight` pseudo-observations so that one
    probe is enough to move it. While plain decoding is predicted best, a gamma=1 probe refreshes the estimate
    after `probe_every` plain steps, and the interval doubles after each probe that leaves speculation off:
    each probe costs a draft catch-up over the skipped tokens, so a workload where speculation loses pays less
    and less for the chance to switch it back on."""

    def __init__(self, costs: Costs, gamma_max: int, prior: float = 0.6, prior_weight: float = 2.0,
                 window: int = 64, probe_every: int = 8):
        self.costs, self.gamma_max = costs, gamma_max
        self.prior, self.prior_weight, self.window = prior, prior_weight, window
        self.seen: list[float] = []
        self.probe_every = self.interval = probe_every
        self.plain_run = 0

    @property
    def alpha(self) -> float:
        recent = self.seen[-self.window:]
        return (self.prior * self.prior_weight + sum(recent)) / (self.prior_weight + len(recent))

    def choose(self) -> int:
        g = best_gamma(self.alpha, self.costs, self.gamma_max)
        if g:
            self.plain_run, self.interval = 0, self.probe_every
            return g
        self.plain_run += 1
        if self.plain_run >= self.interval:
            self.plain_run, self.interval = 0, self.interval * 2
            return 1
        return 0

    def observe(self, alphas: list[float]) -> None:
        self.seen.extend(alphas)
