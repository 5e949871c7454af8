"""The one reader of decode-cost records, in every format the harness has written: every other module reads
costs through `read` (a worker's or the replay's record) or `calibrated` (the run's calibration files).

The formats, newest first:
- sequential (calibrate.in_situ: a worker's, the replay's): "contexts" and, per role, "<role>_ms_by_context"
  (one sequence decoding k = 1.. tokens; the target with all logits, the draft with the last row's), with
  spreads and repetitions; since block sizes are timed sparsely, "ks" names those timed, the medians still at
  every k. Older: one context only ("target_ms", "draft_ms"); or medians at the "ks" ("draft_ks") alone.
- batched (concurrency.calibrate): "seqs", "plain_ms", "verify_ms", "draft_ms", "block"; older runs lack the
  draft's two-token decodes ("draft_catch_up_ms").
- a calibration file (calibrate.calibrate, one model): "contexts", "ms_by_context" (all logits) and
  "ms_last_by_context" (the last row's, how a draft decodes; older calibrations lack it: their all-logits
  times stand in)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from harness.costmodel.batched import BatchCosts
from harness.costmodel.sequential import Costs


def at_context(contexts: list[float], rows: list[list[float]], context: float) -> list[float]:
    """Costs measured at `contexts` cached tokens (a row of ms by k each), at `context`: linear between the first
    and the last, the nearest outside them."""
    if not rows or not rows[0]:
        return []
    xs = contexts
    if len(xs) == 1 or context <= xs[0]:
        return list(rows[0])
    if context >= xs[-1]:
        return list(rows[-1])
    w = (context - xs[0]) / (xs[-1] - xs[0])
    return [a + w * (b - a) for a, b in zip(rows[0], rows[-1])]


@dataclass(frozen=True)
class Curve:
    """One model's ms of decoding k tokens in one sequence, a row per measured context; ks: the k of each
    column (None: 1, 2, ...)."""
    contexts: list[float]
    rows: list[list[float]]
    ks: list[int] | None = None

    def at(self, context: float) -> list[float]:
        return at_context(self.contexts, self.rows, context)

    def by_k(self, context: float):
        """k -> ms at `context`: linear between the measured k, proportional beyond the last."""
        ys = self.at(context)
        ks = self.ks or list(range(1, len(ys) + 1))
        return lambda k: float(np.interp(k, ks, ys)) if k <= ks[-1] else ys[-1] * k / ks[-1]


def _curve(contexts, rows, ks=None) -> Curve | None:
    """None where nothing was measured; ks kept only where the rows hold one median per k of them (a record
    whose medians were read at every k holds more)."""
    if not rows or not rows[0]:
        return None
    return Curve(list(contexts), rows, ks if ks and len(rows[0]) == len(ks) else None)


@dataclass(frozen=True)
class CostRecord:
    """What a record measured: one sequence's curves (target, draft: None for a lookup), or several sequences'
    batches (batched); the loop's overhead per verified row where the record timed it."""
    target: Curve | None = None
    draft: Curve | None = None
    batched: BatchCosts | None = None
    overhead_ms_per_row: float = 0.0

    @property
    def contexts(self) -> int:
        """How many contexts the record measured at (1: no interpolation between them)."""
        return len(self.target.contexts) if self.target else 1

    def costs(self, context: float, overhead_ms_per_row: float | None = None) -> Costs:
        """One sequence's costs at `context` cached tokens; the record's overhead unless given."""
        if self.target is None:
            raise ValueError("a batched costs record prices batches (CostRecord.batch), not one sequence")
        t, d = self.target.at(context), self.draft.at(context) if self.draft else []
        oh = self.overhead_ms_per_row if overhead_ms_per_row is None else overhead_ms_per_row
        return Costs(t, d[0] if d else 0.0, oh, draft_curve=tuple(d))

    def batch(self, context: float, gamma: int, parallel: int) -> BatchCosts:
        """Several sequences' costs: as measured, or, from a sequential record, the same tokens in one sequence
        (priced at 1 and `parallel` sequences, blocks of gamma + 1) at `context` cached tokens."""
        if self.batched is not None:
            return self.batched if self.batched.block else replace(self.batched, block=gamma + 1)
        t = self.target.by_k(context)
        d = self.draft.by_k(context) if self.draft else None
        seqs = tuple(sorted({1, parallel}))
        return BatchCosts(seqs, tuple(t(m) for m in seqs), tuple(t(m * (gamma + 1)) for m in seqs),
                          tuple(d(m) for m in seqs) if d else (), gamma + 1)


def read(rec: dict) -> CostRecord:
    """A worker's or the replay's costs record, of any format."""
    if "seqs" in rec:
        return CostRecord(batched=BatchCosts(tuple(rec["seqs"]), tuple(rec["plain_ms"]), tuple(rec["verify_ms"]),
                                             tuple(rec.get("draft_ms") or ()), rec.get("block", 0),
                                             tuple(rec.get("draft_catch_up_ms") or ())))
    oh = rec.get("overhead_ms", 0.0)
    if "target_ms" in rec:  # one context
        return CostRecord(_curve([0], [list(rec["target_ms"])], rec.get("ks")),
                          _curve([0], [list(rec.get("draft_ms") or [])], rec.get("draft_ks")), None, oh)
    return CostRecord(_curve(rec["contexts"], rec["target_ms_by_context"], rec.get("ks")),
                      _curve(rec["contexts"], rec.get("draft_ms_by_context") or [], rec.get("draft_ks")), None, oh)


def calibrated(target: dict, draft: dict | None) -> CostRecord:
    """The calibration files of a target and of a draft model (None: a proposer without a model)."""
    last = "ms_last_by_context" if draft and "ms_last_by_context" in draft else "ms_by_context"
    return CostRecord(_curve(target["contexts"], target["ms_by_context"]),
                      _curve(draft["contexts"], draft[last]) if draft else None)


def with_unit_costs(rec: dict, unit: dict) -> dict:
    """A replay costs record priced instead with a timed configuration's own decode costs (measured in its worker
    before and after its generations: calibrate.unit_costs), at its own contexts; the loop's per-row overhead and
    a lookup's time stay the replay's (the harness's Python, which the worker does not time apart)."""
    return {k: v for k, v in rec.items() if not k.endswith(("_times_by_context", "_sd_by_context"))} | \
        {k: v for k, v in unit.items() if k in ("contexts", "reps") or k.endswith(("_ms_by_context", "_sd_by_context"))}
