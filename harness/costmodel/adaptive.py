"""The per-step gamma controller: the cost model's best gamma at a posterior on alpha, probing when worth it."""
from __future__ import annotations

import numpy as np

from harness.costmodel.price import predicted_speedup
from harness.costmodel.sequential import Costs, beats_plain, best_speculative, expected_tokens
from harness.gamma import gamma_cap


class AdaptiveGamma:
    """Per step, the gamma in {0..gamma_max} with the most expected tokens per ms.

    alpha: a posterior on a grid over the per-position sum min(p, q) values at the positions verification reached
    (accepted ones and the first rejection: the per-position acceptance the model's E assumes), from a weak Beta
    prior (mean `prior`, `prior_weight` pseudo-observations). Alpha is not a constant of the workload: it moves
    with the text (a prompt's boilerplate, then its hard part; the next prompt). So the posterior assumes that at
    every emitted token, with probability `hazard`, alpha jumps to a fresh value from the prior (a change-point
    model): old evidence loses weight and, while the controller decodes plainly and observes nothing, the prior's
    share grows back, which keeps a probe's value alive. Without it, a posterior that once said "plain" never
    moved again.
    Costs: the calibration, scaled by what this run's own decodes took, target and draft apart, so that a
    calibration on filler text or at another context length does not set the level.
    Probes: while plain decoding is predicted best, a speculative step (the gamma predicted to lose least) is
    taken only when it is worth its price.
    Its value is what knowing alpha could gain over the remaining tokens, averaged over the posterior
    (E[max(0, 1 - 1/S(alpha))] * remaining * T_target(1), S the best predicted speedup at alpha); its price is
    the probe's expected loss against a plain step, the draft catching up over the skipped tokens included.
    Where no alpha can make speculation win, the value is zero and it never probes."""

    GRID = np.linspace(0.0, 1.0, 201)[1:-1]  # alpha values the posterior lives on
    _LOG, _LOG1M = np.log(GRID), np.log1p(-GRID)
    SCALE_PRIOR_STEPS = 4

    def __init__(self, costs: Costs, gamma_max: int, prior: float = 0.6, prior_weight: float = 2.0,
                 hazard: float = 1 / 128):
        self.calibrated, self.gamma_max, self.hazard = costs, gamma_max, hazard
        a, b = prior * prior_weight, (1 - prior) * prior_weight
        w = np.exp((a - 1) * self._LOG + (b - 1) * self._LOG1M)
        self.prior = w / w.sum()
        self.posterior = self.prior.copy()
        self.backlog = 0  # plain steps since the draft last ran
        self.spent = {"target": [0.0, 0.0], "draft": [0.0, 0.0]}  # measured, predicted ms
        self.costs = costs
        self._planned_draft = 0.0

    @property
    def alpha(self) -> float:
        return float(self.GRID @ self.posterior)

    def _age(self, tokens: int) -> None:
        """`tokens` emitted: the chance that alpha has jumped since is 1 - (1 - hazard)^tokens."""
        keep = (1 - self.hazard) ** tokens
        self.posterior = keep * self.posterior + (1 - keep) * self.prior

    def begin(self) -> None:
        """A new generation: the proposer has evaluated its prompt, so no catch-up is owed."""
        self.backlog = 0

    def _scale(self, k: str) -> float:
        """measured / predicted, shrunk towards 1 by a few steps' worth of calibration: one slow step is noise."""
        measured, predicted = self.spent[k]
        c = self.calibrated
        prior = self.SCALE_PRIOR_STEPS * (c.target_ms[0] if k == "target" else c.draft_ms)
        return (measured + prior) / (predicted + prior) if predicted + prior > 0 else 1.0

    def _scaled(self) -> Costs:
        c, t, d = self.calibrated, self._scale("target"), self._scale("draft")
        return Costs([x * t for x in c.target_ms], c.draft_ms * d, c.overhead_ms_per_row,
                     tuple(x * d for x in c.draft_curve))

    def _owed(self, c: Costs) -> float:
        """What the draft's next run costs beyond a single decode: catching up over the plain steps since the last."""
        return c.catch_up(self.backlog + 1) - c.draft_ms

    def _draft_part(self, c: Costs, g: int) -> float:
        """The draft's share of a gamma-g step: catching up over the plain steps since it last ran, then g tokens."""
        return self._owed(c) + c.draft_step_ms(g, self.alpha) if g else 0.0

    def probe_value(self, remaining: int) -> float:
        """Expected ms saved over `remaining` tokens by switching to the best gamma if alpha were known."""
        c, grid = self.costs, self.GRID
        speedup = np.max([predicted_speedup(grid, g, c) for g in range(1, self.gamma_max + 1)], axis=0)
        return remaining * c.step_ms(0) * float(self.posterior @ np.maximum(0.0, 1 - 1 / speedup))

    def probe_price(self, g: int) -> float:
        """A gamma-g step at the posterior mean against plain decoding: its cost less the tokens it is worth."""
        c = self.costs
        return self._owed(c) + c.step_ms(g, self.alpha) - expected_tokens(self.alpha, g) * c.step_ms(0)

    def choose(self, remaining: int = 1 << 20) -> int:
        """The next step's gamma, at most remaining - 1 (the target adds one token of its own)."""
        self.costs = c = self._scaled()
        a, top = self.alpha, gamma_cap(self.gamma_max, remaining)
        g = best_speculative(a, c, top)
        # predicted to lose against plain decoding, it can still pay as a probe: the least costly speculative
        # step, which also observes the most positions per ms
        if g and not beats_plain(a, g, c) and self.probe_value(remaining - 1) <= self.probe_price(g):
            g = 0
        raw = self.calibrated  # predictions in calibrated units: measured / predicted is the scale
        self._planned_draft = self._draft_part(raw, g)
        self.backlog = 0 if g else self.backlog + 1
        if not g:
            self._age(1)  # a plain step emits one token and observes nothing
        return g

    def observe(self, alphas: list[float], proposed: int, draft_ms: float | None = None,
                verify_ms: float | None = None) -> None:
        """One step's alphas at the positions verification reached (Verdict.reached), how many tokens it proposed
        and, when given, what its draft and verify decodes took: they rescale the calibration."""
        for a in alphas:  # one emitted token per position reached; a in [0, 1] weighs like a fractional Bernoulli
            self._age(1)
            p = self.posterior * np.exp(a * self._LOG + (1 - a) * self._LOG1M)
            self.posterior = p / p.sum()
        for k, measured, predicted in (("target", verify_ms, self.calibrated.verify(proposed + 1)),
                                       ("draft", draft_ms, self._planned_draft)):
            if measured is not None and predicted > 0:
                self.spent[k][0] += measured
                self.spent[k][1] += predicted
