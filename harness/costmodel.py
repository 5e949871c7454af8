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
    alpha is estimated from every proposed position's sum min(p, q), so rejections do not bias it; after
    `probe_every` plain steps one gamma=1 step refreshes the estimate, so speculation can switch back on."""

    def __init__(self, costs: Costs, gamma_max: int, prior: float = 0.6, weight: float = 0.9, probe_every: int = 16):
        self.costs, self.gamma_max = costs, gamma_max
        self.alpha, self.weight, self.probe_every = prior, weight, probe_every
        self.plain_run = 0

    def choose(self) -> int:
        g = best_gamma(self.alpha, self.costs, self.gamma_max)
        if g == 0:
            self.plain_run += 1
            if self.plain_run >= self.probe_every:
                self.plain_run = 0
                return 1
        else:
            self.plain_run = 0
        return g

    def observe(self, alphas: list[float]) -> None:
        for a in alphas:
            self.alpha = self.weight * self.alpha + (1 - self.weight) * a
