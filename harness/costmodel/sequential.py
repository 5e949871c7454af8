"""One sequence's step (N = 1): Leviathan et al. (2023) with measured cost curves."""
from __future__ import annotations

from dataclasses import dataclass, replace

from harness.errors import HarnessError
from harness.gamma import require_fits_batch


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

    def ubatch(self, m: int, t: int, draft: bool = False) -> float:
        """One graph of one sequence and t tokens (price.price's unit): the draft catching up, the target
        verifying."""
        if m != 1:
            raise ValueError("one sequence's costs (Costs) price one sequence: BatchCosts prices several")
        return self.catch_up(t) if draft else self.verify(t)

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

    def step_ms(self, gamma: int, alpha: float = 0.0, share: float = 1.0) -> float:
        """A step proposing gamma drafts (0: a plain decode) after a step that proposed too: price.price of its
        shapes (every draft accepted, w.p. alpha^gamma, or not) weighed by their chances, in closed form (alpha
        may be an array); share: the fraction of steps that proposed anything (a lookup often finds nothing:
        those steps decode one token plainly)."""
        ms = self.draft_step_ms(gamma, alpha) + self.verify(gamma + 1) + self.overhead(gamma + 1)
        return ms if share == 1.0 else share * ms + (1 - share) * self.step_ms(0)

    def tokens_per_ms(self, alpha: float, gamma: int) -> float:
        return expected_tokens(alpha, gamma) / self.step_ms(gamma, alpha)

    def levelled(self, plain_ms: float | None) -> Costs:
        """One decode at plain_ms a step (the loop's overhead of its one row included: it is taken off), where a
        pace was measured on the real prompts; the blocks and the draft as they were."""
        if not plain_ms:
            return self
        return replace(self, target_ms=[max(plain_ms - self.overhead(1), 1e-6), *self.target_ms[1:]])


def best_speculative(alpha: float, costs: Costs, gamma_max: int) -> int:
    """The gamma in 1..gamma_max with the most expected tokens per ms, win or lose (0 when gamma_max < 1)."""
    return max(range(1, gamma_max + 1), key=lambda g: costs.tokens_per_ms(alpha, g), default=0)


def beats_plain(alpha: float, gamma: int, costs: Costs) -> bool:
    return costs.tokens_per_ms(alpha, gamma) > 1.0 / costs.step_ms(0)


def best_gamma(alpha: float, costs: Costs, gamma_max: int) -> int:
    """0 means plain decoding is predicted to be fastest."""
    g = best_speculative(alpha, costs, gamma_max)
    return g if g and beats_plain(alpha, g, costs) else 0
