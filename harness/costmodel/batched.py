"""Several sequences' step (N > 1): a step decodes every active sequence together. With n sequences and draft
length gamma, plain decoding pays P(n) per step (n sequences, one token each) for one token per sequence;
speculation pays gamma draft decodes of n rows, D(n) each, and one verification V(n) of n blocks of gamma + 1
tokens, for E(alpha, gamma) tokens per sequence. Where P(n) already fills the machine, a verification's extra
tokens stop being nearly free and the gain shrinks. The costs are measured in the worker with n sequences of
its own context (concurrency.calibrate); runs from before that priced a step by the same number of tokens in
one sequence (records.CostRecord.batch converts them).

A real step is rarely even (a draft catching up two tokens in one sequence, a request near its end drafting
fewer), and llama.cpp does not decode an uneven batch as one graph when each sequence has its own KV buffer:
`split` replays how it cuts a batch into ubatches, and `batch_ms` prices each one (price.shaped)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchCosts:
    """Decode cost (ms) against sequences in the batch: linear between the measured counts, proportional
    beyond them."""
    seqs: tuple[int, ...]
    plain_ms: tuple[float, ...]    # each sequence one token
    verify_ms: tuple[float, ...]   # each sequence a block of gamma + 1 tokens
    draft_ms: tuple[float, ...] = ()  # each sequence one token, its logits row (none for a lookup)
    block: int = 0  # the tokens per sequence verify_ms was measured with (gamma + 1)
    draft_catch_up_ms: tuple[float, ...] = ()  # the draft, each sequence two tokens (none in older runs)
    overhead_ms_per_row: float = 0.0  # the loop's own time per verified row, of every sequence (price)

    def overhead(self, rows: float) -> float:
        return rows * self.overhead_ms_per_row

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

    def ubatch(self, m: float, t: float, draft: bool = False) -> float:
        """One graph of m sequences x t tokens each: linear in t between the measured shapes (the target: plain at
        t = 1, verify at t = block; the draft: t = 1 and 2), proportional beyond. A draft measured at t = 1 only
        (older runs) takes the target's shape."""
        if draft and self.draft_catch_up_ms:
            return _line(self.draft(m), self._at(self.draft_catch_up_ms, m), 2, t)
        if self.block < 2:
            raise ValueError("BatchCosts.block (the verification's tokens per sequence) is needed to price blocks")
        p = self.plain(m)
        ms = _line(p, self.verify(m), self.block, t)
        return (self.draft(m) * ms / p if p else 0.0) if draft else ms

    def step_ms(self, gamma: int, alpha: float = 0.0, share: float = 1.0, n: float | None = None) -> float:
        """An even step of n sequences (None: the most it was measured with), a share of whose steps propose
        (gamma draft decodes, then the verification of every block together), in closed form; gamma = 0: a plain
        step. alpha is not used: the even step takes no catch-up after a step that accepted every draft
        (price.price prices the shapes a run's records show, catch-ups included). The overhead per verified
        row, as price.price charges it: n rows, and gamma more for each sequence of a step that proposes."""
        n = self.seqs[-1] if n is None else n
        if gamma == 0 or share == 0:
            return self.plain(n) + self.overhead(n)
        return gamma * self.draft(n) + share * self.verify(n) + (1 - share) * self.plain(n) + \
            self.overhead(n * (1 + share * gamma))


def _line(one: float, block: float, size: int, t: float) -> float:
    """A graph of t tokens a sequence, from its costs at t = 1 and t = size: linear between, proportional beyond."""
    return one + (block - one) * (t - 1) / (size - 1) if t <= size else block * t / size


def split(sizes: list[int], seqs: list[int] | None = None, unified: bool = False,
          n_ubatch: int = 512) -> list[tuple[int, float]]:
    """The graphs llama.cpp decodes a batch in, as (sequences, tokens each), given each sequence's tokens in
    batch order (seqs: their ids, 0, 1, ... if None). A KV buffer per sequence takes llama_batch_allocr::
    split_equal (sequential): each ubatch gathers, in batch order, sequences whose ids run consecutively
    from the first one left, and takes as many tokens from each as the shortest of them has left, at most
    n_ubatch in all. One unified buffer takes split_simple: n_ubatch tokens at a time, whoever's they are
    (priced as an even batch of the same tokens)."""
    seqs = list(range(len(sizes))) if seqs is None else list(seqs)
    live = [(s, n) for s, n in zip(seqs, sizes) if n > 0]
    if unified:
        tokens = [s for s, n in live for _ in range(n)]
        chunks = [tokens[i:i + n_ubatch] for i in range(0, len(tokens), n_ubatch)]
        return [(len(set(c)), len(c) / len(set(c))) for c in chunks]
    left, out = dict(live), []
    while any(left.values()):
        group: list[int] = []
        for s, _ in live:
            if left[s] and (not group or s == group[-1] + 1):
                group.append(s)
        t = min(min(left[s] for s in group), max(1, n_ubatch // len(group)))
        for s in group:
            left[s] -= t
        out.append((len(group), t))
    return out


def batch_ms(costs: BatchCosts, sizes: list[int], seqs: list[int] | None = None, unified: bool = False,
             draft: bool = False, n_ubatch: int = 512) -> float:
    """One llama_decode of these per-sequence blocks: the sum of its ubatches' prices."""
    return sum(costs.ubatch(m, t, draft) for m, t in split(sizes, seqs, unified, n_ubatch))
