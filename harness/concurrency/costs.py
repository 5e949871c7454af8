"""The cost model for concurrent requests: a step decodes every active sequence together. With n sequences and
draft length gamma, plain decoding pays P(n) per step (n sequences, one token each) for one token per sequence;
speculation pays gamma draft decodes of n rows, D(n) each, and one verification V(n) of n blocks of gamma + 1
tokens, for E(alpha, gamma) tokens per sequence. Where P(n) already fills the machine, a verification's extra
tokens stop being nearly free and the gain shrinks. The costs are measured in the worker with n sequences of
its own context (concurrency.calibrate); runs from before that priced a step by the same number of tokens in
one sequence (their records hold block sizes, ks)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.costmodel import expected_tokens


@dataclass(frozen=True)
class BatchCosts:
    """Decode cost (ms) against sequences in the batch: linear between the measured counts, proportional
    beyond them."""
    seqs: tuple[int, ...]
    plain_ms: tuple[float, ...]    # each sequence one token
    verify_ms: tuple[float, ...]   # each sequence a block of gamma + 1 tokens
    draft_ms: tuple[float, ...] = ()  # each sequence one token, its logits row (none for a lookup)

    def _at(self, ys: tuple[float, ...], n: float) -> float:
        if not ys:
            return 0.0
        return float(np.interp(n, self.seqs, ys)) if n <= self.seqs[-1] else ys[-1] * n / self.seqs[-1]

    def plain(self, n: float) -> float:
        return self._at(self.plain_ms, n)

    def verify(self, n: float) -> float:
        return self._at(self.verify_ms, n)

    def draft(self, n: float) -> float:
        return self._at(self.draft_ms, n)


def step_ms(costs: BatchCosts, n: float, gamma: int, overhead_ms: float = 0.0, share: float = 1.0) -> float:
    """One speculative step of n sequences, a share of whose steps propose (gamma draft decodes, then the
    verification of every block together); gamma = 0: a plain step."""
    if gamma == 0 or share == 0:
        return costs.plain(n) + overhead_ms
    return gamma * costs.draft(n) + share * costs.verify(n) + (1 - share) * costs.plain(n) + overhead_ms


def predicted_speedup(alpha: float, gamma: int, costs: BatchCosts, n: float, plain_step_ms: float,
                      overhead_ms: float = 0.0, share: float = 1.0) -> float:
    """Each sequence's tokens per ms speculating at n sequences in flight, against plain decoding's measured step
    (plain_step_ms: one token per sequence, as the plain twins ran it). share: the steps that proposed anything."""
    tokens = share * expected_tokens(alpha, gamma) + (1 - share)
    return tokens * plain_step_ms / step_ms(costs, n, gamma, overhead_ms, share)


def from_record(rec: dict, context: float, gamma: int, parallel: int) -> BatchCosts:
    """BatchCosts from a worker's costs record: measured with several sequences (concurrency.calibrate), or, from
    a sequential worker or a run from before that, single-sequence blocks of k tokens (the same tokens in one
    sequence: at 1 and at `parallel` sequences), interpolated to `context` cached tokens."""
    if "seqs" in rec:
        return BatchCosts(tuple(rec["seqs"]), tuple(rec["plain_ms"]), tuple(rec["verify_ms"]),
                          tuple(rec.get("draft_ms") or ()))
    xs = rec["contexts"]
    w = 0.0 if len(xs) == 1 or context <= xs[0] else 1.0 if context >= xs[-1] else (context - xs[0]) / (xs[-1] - xs[0])

    def curve(rows, ks):
        ys = [a + w * (b - a) for a, b in zip(rows[0], rows[-1])] if rows and rows[0] else []
        return (lambda k: float(np.interp(k, ks, ys)) if k <= ks[-1] else ys[-1] * k / ks[-1]) if ys else None
    t = curve(rec["target_ms_by_context"], rec.get("ks") or list(range(1, rec["k"] + 1)))
    d = curve(rec.get("draft_ms_by_context") or [], rec.get("draft_ks") or list(range(1, rec["k"] + 1)))
    seqs = tuple(sorted({1, parallel}))
    return BatchCosts(seqs, tuple(t(m) for m in seqs), tuple(t(m * (gamma + 1)) for m in seqs),
                      tuple(d(m) for m in seqs) if d else ())
