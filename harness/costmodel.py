"""Leviathan et al. (2023) cost model with measured cost curves, and the per-step gamma controller."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.errors import HarnessError
from harness.gamma import gamma_cap, require_fits_batch


def at_context(contexts: list[float], rows: list[list[float]], context: float) -> list[float]:
    """Costs measured at `contexts` cached tokens (a row of ms by k each), at `context`: linear between the first
    and the last, the nearest outside them. Every reader of a costs record interpolates here."""
    if not rows or not rows[0]:
        return []
    xs = contexts
    if len(xs) == 1 or context <= xs[0]:
        return list(rows[0])
    if context >= xs[-1]:
        return list(rows[-1])
    w = (context - xs[0]) / (xs[-1] - xs[0])
    return [a + w * (b - a) for a, b in zip(rows[0], rows[-1])]


def record_curves(rec: dict, context: float) -> tuple[list[float], list[float]]:
    """(the target's ms by k, the draft's ms by k; empty without a draft model) of a sequential costs record (a
    worker's, the replay's) at `context`. The one reader of their formats: a record from before two contexts were
    measured holds one context's target_ms and draft_ms."""
    if "target_ms" in rec:
        return list(rec["target_ms"]), list(rec.get("draft_ms") or [])
    return (at_context(rec["contexts"], rec["target_ms_by_context"], context),
            at_context(rec["contexts"], rec.get("draft_ms_by_context") or [], context))


def expected_tokens(alpha, gamma: int):
    """E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha): accepted drafts plus the correction/bonus.
    Summed as the series, so alpha = 1 and numpy arrays of alpha need no special case."""
    return sum(alpha ** i for i in range(max(gamma, 0) + 1))


@dataclass(frozen=True)
class Costs:
    target_ms: list[float]   # llama_decode of k = 1.. tokens with all logits, index k-1
    draft_ms: float          # one draft decode (0 for a proposer without a model)
    overhead_ms_per_row: float = 0.0  # the loop's Python/verification cost per verified logits row
    draft_curve: tuple[float, ...] = ()  # draft decode of k = 1.. tokens: what catching up after plain steps costs

    def catch_up(self, n: int) -> float:
        """The draft's cost to evaluate n tokens it skipped (linear beyond the calibrated range)."""
        if not self.draft_curve:
            return n * self.draft_ms
        c = self.draft_curve
        return c[n - 1] if n <= len(c) else c[-1] * n / len(c)

    def verify(self, k: int) -> float:
        if k > len(self.target_ms):
            require_fits_batch(k - 1)
            raise HarnessError(f"calibration covers k <= {len(self.target_ms)}, gamma needs {k}: recalibrate "
                               f"with --k-max {k}")
        return self.target_ms[k - 1]

    def draft_step_ms(self, gamma: int, alpha: float) -> float:
        """gamma draft decodes; with a measured draft curve, also the extra token it evaluates when all gamma
        were accepted (the last proposal and the bonus token arrive together), which happens w.p. alpha^gamma."""
        extra = alpha ** gamma * (self.catch_up(2) - self.catch_up(1)) if self.draft_curve and gamma else 0.0
        return gamma * self.draft_ms + extra

    def overhead(self, rows: int) -> float:
        """The loop's own cost of a step that verified `rows` logits rows (its drafts and one more): it grows with
        the rows, each checked and sampled in Python (docs/findings/harness-self-prediction.md). Every price of a
        step calls this, so that the model, the replay and the adaptive controller charge a step alike."""
        return rows * self.overhead_ms_per_row

    def step_ms(self, gamma: int, alpha: float = 0.0) -> float:
        """A step proposing gamma drafts (0: a plain decode)."""
        return self.draft_step_ms(gamma, alpha) + self.verify(gamma + 1) + self.overhead(gamma + 1)

    def tokens_per_ms(self, alpha: float, gamma: int) -> float:
        return expected_tokens(alpha, gamma) / self.step_ms(gamma, alpha)


def predicted_speedup(alpha: float, gamma: int, costs: Costs, share: float = 1.0) -> float:
    """E(alpha, gamma) * (T_target(1) + overhead(1 row)) / (T_draft(gamma) + T_verify(gamma+1) + overhead(gamma+1
    rows)): plain decoding pays its row's overhead too. With
    T_draft(gamma) = gamma * T_draft(1) (+ the bonus catch-up when a draft curve is known). share: the fraction of
    steps that proposed anything (a lookup proposer often finds nothing: those steps decode one token plainly)."""
    tokens = share * expected_tokens(alpha, gamma) + (1 - share)
    ms = share * costs.step_ms(gamma, alpha) + (1 - share) * costs.step_ms(0)
    return tokens * costs.step_ms(0) / ms


def best_speculative(alpha: float, costs: Costs, gamma_max: int) -> int:
    """The gamma in 1..gamma_max with the most expected tokens per ms, win or lose (0 when gamma_max < 1)."""
    return max(range(1, gamma_max + 1), key=lambda g: costs.tokens_per_ms(alpha, g), default=0)


def beats_plain(alpha: float, gamma: int, costs: Costs) -> bool:
    return costs.tokens_per_ms(alpha, gamma) > 1.0 / costs.step_ms(0)


def best_gamma(alpha: float, costs: Costs, gamma_max: int) -> int:
    """0 means plain decoding is predicted to be fastest."""
    g = best_speculative(alpha, costs, gamma_max)
    return g if g and beats_plain(alpha, g, costs) else 0


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
