"""Decode costs of batches of several sequences, measured in a worker's own contexts: what the batched cost model
(concurrency.costs) prices a step with. A block of k tokens in one sequence costs less than k sequences of one
token each (their attention runs over k contexts, and llama.cpp splits a batch into equal shares of its
sequences), so the sequences are real: each holds `context` tokens of the prompts' text."""
from __future__ import annotations

import statistics
import time

from harness.engine import Engine


def sequence_counts(n: int) -> list[int]:
    """1, 2, 4, ... below n, and n."""
    return sorted({1, n, *(2 ** i for i in range(1, n.bit_length()) if 2 ** i < n)})


def _prefill(e: Engine, text: list[int], n: int) -> None:
    e.reset()
    for s in range(n):
        e.prefill(text, s)


def _time(e: Engine, context: int, block: list[int], counts: list[int], reps: int) -> list[float]:
    """Median ms of one decode of m sequences x block (all logits), for each m, interleaved within each
    repetition; each sequence rolled back to `context` tokens after it."""
    times: dict[int, list[float]] = {m: [] for m in counts}
    for _ in range(reps):
        for m in counts:
            rows = [(s, context + i, t, True) for s in range(m) for i, t in enumerate(block)]
            t0 = time.perf_counter()
            e.decode_rows(rows)
            times[m].append((time.perf_counter() - t0) * 1000)
            for s in range(m):
                e.seq_trim(s, context)
    return [round(statistics.median(times[m]), 3) for m in counts]


def batched_costs(target: Engine, draft: Engine | None, text: list[int], n_seq: int, gamma: int,
                  context: int = 128, reps: int = 3) -> dict:
    """{"type": "costs", "seqs", "context", "plain_ms", "verify_ms", "draft_ms", "draft_catch_up_ms"}: the target
    decoding m sequences of one token and of gamma + 1 tokens each, the draft m sequences of one token and of two
    (its catch-up after a step that accepted every draft), m = 1, 2, 4, ... n_seq. The draft's second token costs
    it relatively more than a verification's tokens cost the target, so its blocks are measured, not borrowed."""
    counts = sequence_counts(n_seq)
    engines = [e for e in (target, draft) if e is not None]
    ctx = max(1, min(context, min(e.n_ctx for e in engines) - gamma - 2))
    filler = (text * (ctx // max(len(text), 1) + 2))[:ctx + gamma + 1]
    out = {"type": "costs", "seqs": counts, "context": ctx, "block": gamma + 1}
    _prefill(target, filler[:ctx], n_seq)
    out["plain_ms"] = _time(target, ctx, filler[ctx:ctx + 1], counts, reps)
    out["verify_ms"] = _time(target, ctx, filler[ctx:ctx + gamma + 1], counts, reps)
    target.reset()
    if draft is not None:
        _prefill(draft, filler[:ctx], n_seq)
        out["draft_ms"] = _time(draft, ctx, filler[ctx:ctx + 1], counts, reps)
        out["draft_catch_up_ms"] = _time(draft, ctx, filler[ctx:ctx + 2], counts, reps)
        draft.reset()
    return out
