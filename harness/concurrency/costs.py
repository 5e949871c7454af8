"""The cost model for concurrent requests: a step decodes every active sequence together. With n sequences and
draft length gamma, plain decoding pays P(n) per step (n sequences, one token each) for one token per sequence;
speculation pays gamma draft decodes of n rows, D(n) each, and one verification V(n) of n blocks of gamma + 1
tokens, for E(alpha, gamma) tokens per sequence. Where P(n) already fills the machine, a verification's extra
tokens stop being nearly free and the gain shrinks. The costs are measured in the worker with n sequences of
its own context (concurrency.calibrate); runs from before that priced a step by the same number of tokens in
one sequence (their records hold block sizes, ks).

A real step is rarely even (a draft catching up two tokens in one sequence, a request near its end drafting
fewer), and llama.cpp does not decode an uneven batch as one graph when each sequence has its own KV buffer:
`split` replays how it cuts a batch into ubatches, and `batch_ms` prices each one."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.costmodel import expected_tokens, record_curves


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


def shaped_step_ms(costs: BatchCosts, seqs: list[int], blocks: list[int], catch_up: list[int], fed: list[int],
                   unified: bool = False, n_ubatch: int = 512) -> float:
    """A batched speculative step as it ran, per sequence in batch order: the draft's catch-up (the tokens its
    cache lacks, 0 for a sequence not drafting), then one decode per further draft position of the sequences
    fed that far (fed: drafts fed back), then the target's verification of each block (1 + proposed)."""
    drafts = [catch_up, *([int(f >= k) for f in fed] for k in range(1, max(fed, default=0) + 1))]
    return (sum(batch_ms(costs, d, seqs, unified, True, n_ubatch) for d in drafts)
            + batch_ms(costs, blocks, seqs, unified, False, n_ubatch))


def step_ms(costs: BatchCosts, n: float, gamma: int, overhead_ms: float = 0.0, share: float = 1.0) -> float:
    """One speculative step of n sequences, a share of whose steps propose (gamma draft decodes, then the
    verification of every block together); gamma = 0: a plain step."""
    if gamma == 0 or share == 0:
        return costs.plain(n) + overhead_ms
    return gamma * costs.draft(n) + share * costs.verify(n) + (1 - share) * costs.plain(n) + overhead_ms


def predicted_speedup(alpha: float, gamma: int, costs: BatchCosts, n: float, plain_step_ms: float,
                      overhead_ms: float = 0.0, share: float = 1.0, spec_step_ms: float | None = None) -> float:
    """Each sequence's tokens per ms speculating at n sequences in flight, against plain decoding's measured step
    (plain_step_ms: one token per sequence, as the plain twins ran it). share: the steps that proposed anything.
    spec_step_ms: the speculative step's price where the caller priced its real shapes (shaped_step_ms)."""
    tokens = share * expected_tokens(alpha, gamma) + (1 - share)
    return tokens * plain_step_ms / (spec_step_ms or step_ms(costs, n, gamma, overhead_ms, share))


def from_record(rec: dict, context: float, gamma: int, parallel: int) -> BatchCosts:
    """BatchCosts from a worker's costs record: measured with several sequences (concurrency.calibrate), or, from
    a sequential worker or a run from before that, single-sequence blocks of k tokens (the same tokens in one
    sequence: at 1 and at `parallel` sequences), interpolated to `context` cached tokens."""
    if "seqs" in rec:
        return BatchCosts(tuple(rec["seqs"]), tuple(rec["plain_ms"]), tuple(rec["verify_ms"]),
                          tuple(rec.get("draft_ms") or ()), rec.get("block", gamma + 1),
                          tuple(rec.get("draft_catch_up_ms") or ()))
    target, draft = record_curves(rec, context)

    def curve(ys, ks):
        return (lambda k: float(np.interp(k, ks, ys)) if k <= ks[-1] else ys[-1] * k / ks[-1]) if ys else None
    t = curve(target, rec.get("ks") or list(range(1, len(target) + 1)))
    d = curve(draft, rec.get("draft_ks") or list(range(1, len(draft) + 1)))
    seqs = tuple(sorted({1, parallel}))
    return BatchCosts(seqs, tuple(t(m) for m in seqs), tuple(t(m * (gamma + 1)) for m in seqs),
                      tuple(d(m) for m in seqs) if d else (), gamma + 1)
