"""The cost model for concurrent requests: a step decodes every active sequence together, so its cost is the
cost of the batch's total tokens. With n sequences and draft length gamma, plain decoding pays T_t(n) per step
for one token per sequence; speculation pays gamma draft decodes of n rows, T_d(n) each, and one verification of
n (gamma + 1) tokens, for E(alpha, gamma) tokens per sequence. Where T_t(n) already fills the machine, the
verification's extra tokens stop being nearly free and the gain shrinks."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.costmodel import expected_tokens


@dataclass(frozen=True)
class BatchCosts:
    """Decode cost (ms) against tokens in the batch: the target's with all logits, the draft's with one row of
    logits per token (one per sequence); linear between the measured sizes, proportional beyond them."""
    target_k: tuple[int, ...]
    target_ms: tuple[float, ...]
    draft_k: tuple[int, ...] = ()
    draft_ms: tuple[float, ...] = ()

    @staticmethod
    def _at(ks, ms, k: float) -> float:
        if not ks:
            return 0.0
        return float(np.interp(k, ks, ms)) if k <= ks[-1] else ms[-1] * k / ks[-1]

    def target(self, k: float) -> float:
        return self._at(self.target_k, self.target_ms, k)

    def draft(self, k: float) -> float:
        return self._at(self.draft_k, self.draft_ms, k)


def step_ms(costs: BatchCosts, n: float, gamma: int, overhead_ms: float = 0.0, share: float = 1.0) -> float:
    """One step of n sequences, a share of them proposing gamma tokens each (gamma = 0: a plain step): the draft's
    gamma decodes of n rows, then the target's verification of every sequence's block together."""
    draft = gamma * costs.draft(n) if share > 0 else 0.0
    return draft + costs.target(n * (1 + share * gamma)) + overhead_ms


def predicted_speedup(alpha: float, gamma: int, costs: BatchCosts, n: float, n_plain: float | None = None,
                      overhead_ms: float = 0.0, plain_overhead_ms: float = 0.0, share: float = 1.0) -> float:
    """Each sequence's tokens per ms, speculating against plain decoding at n sequences in flight (n_plain: the
    plain batch's own mean, where its sequences finish at other times). share: the sequences' steps that proposed
    anything (a lookup often finds nothing: those decode one token plainly, in the same batch)."""
    tokens = share * expected_tokens(alpha, gamma) + (1 - share)
    return tokens * step_ms(costs, n_plain or n, 0, plain_overhead_ms) / step_ms(costs, n, gamma, overhead_ms, share)


def from_record(rec: dict, context: float) -> BatchCosts:
    """BatchCosts from a worker's costs record (calibrate.in_situ with ks), at `context` cached tokens (linear
    between its measured contexts)."""
    xs = rec["contexts"]
    w = 0.0 if len(xs) == 1 or context <= xs[0] else 1.0 if context >= xs[-1] else (context - xs[0]) / (xs[-1] - xs[0])

    def at(rows):
        return tuple(a + w * (b - a) for a, b in zip(rows[0], rows[-1])) if rows and rows[0] else ()
    t_ks = tuple(rec.get("ks") or range(1, rec["k"] + 1))
    d_rows = rec.get("draft_ms_by_context") or []
    d_ks = tuple(rec.get("draft_ks") or range(1, rec["k"] + 1)) if d_rows else ()
    return BatchCosts(t_ks, at(rec["target_ms_by_context"]), d_ks, at(d_rows))
