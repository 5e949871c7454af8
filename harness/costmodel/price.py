"""What a step costs, by its shape: the one place the replay, the adaptive controller, predict, concurrency and
the estimate price a step. A step's shape: for each sequence in the batch (N of them; the sequential loop's is
a batch of one), the tokens the draft catches up on, the drafts fed back to it, and the block the target
verifies. The overhead is the loop's own time, charged per verified row of every sequence in the step: the loop
checks and samples each row in Python, so its time grows with the rows (docs/findings/harness-self-prediction.md);
Costs.overhead and BatchCosts.overhead both charge it so."""
from __future__ import annotations

from dataclasses import dataclass

from harness.costmodel.batched import split
from harness.costmodel.sequential import expected_tokens


@dataclass(frozen=True)
class Step:
    """One sequence's step as the loop ran it, or as the replay runs it."""
    proposed: int
    accepted: int
    emitted: int
    rejected: bool = False  # a draft was rejected (as the loop's rejected_at says)

    @property
    def all_accepted(self) -> bool:
        return self.proposed > 0 and self.accepted == self.proposed

    def shape(self, backlog: int = 0) -> Shape:
        """As the replay prices it: the draft catches up over `backlog` plain steps before it proposes, and pays
        for the bonus token in the step that accepted every draft."""
        drafting = self.proposed > 0
        return Shape((self.proposed + 1,), (backlog + 1 if drafting else 0,), (max(self.proposed - 1, 0),),
                     (self.all_accepted,))


def batch_ms(costs, sizes: list[int], seqs: list[int] | None = None, unified: bool = False, draft: bool = False,
             n_ubatch: int = 512) -> float:
    """One llama_decode of these per-sequence blocks: the sum of its ubatches' prices."""
    return sum(costs.ubatch(m, t, draft) for m, t in split(sizes, seqs, unified, n_ubatch))


@dataclass(frozen=True)
class Shape:
    """A step of N sequences (the sequential loop's: N = 1), per sequence in batch order: the block the target
    verifies (1 + proposed), the tokens the draft catches up on before its first proposal (0: not drafting),
    the drafts fed back to it after that, and whether its last proposal and the bonus token arrive together
    (every draft accepted: one token more for the draft, charged to this step; a caller that knows the next
    step's catch-up charges it there instead)."""
    blocks: tuple[int, ...]
    catch_up: tuple[int, ...]
    fed: tuple[int, ...]
    bonus: tuple[bool, ...] = ()
    seqs: tuple[int, ...] | None = None  # the sequences' ids (0, 1, ... if None): llama.cpp splits by them


def price(shape: Shape, costs, unified: bool = False, n_ubatch: int = 512) -> float:
    """What a step of this shape costs: the draft's catch-up decode and one decode per further draft position of
    the sequences fed that far, the target's verification of every block, each decode priced as llama.cpp
    splits it (batched.split); then the loop's overhead, per verified row of every sequence (costs.overhead).
    costs: sequential.Costs (N = 1; which may hold arrays, draws of them) or batched.BatchCosts."""
    seqs = list(shape.seqs) if shape.seqs is not None else None
    further = ([int(f >= k) for f in shape.fed] for k in range(1, max(shape.fed, default=0) + 1))
    drafts = [list(shape.catch_up), *further]
    ms = sum(batch_ms(costs, d, seqs, unified, True, n_ubatch) for d in drafts)
    for b in shape.bonus:
        if b:
            ms += costs.ubatch(1, 2, True) - costs.ubatch(1, 1, True)
    rows = sum(shape.blocks)
    return ms + batch_ms(costs, list(shape.blocks), seqs, unified, False, n_ubatch) + costs.overhead(rows)


def predicted_speedup(alpha, gamma: int, costs, share: float = 1.0, plain_ms: float | None = None,
                      spec_ms: float | None = None, **at) -> float:
    """E(alpha, gamma) * plain step / speculative step (Leviathan et al.), mixed with plain steps in the share of
    steps that proposed nothing: a plain step as costs price it (sequential.Costs: plain decoding pays its row's
    overhead too) unless measured (plain_ms: one token per sequence, as the plain twins ran it); the speculative
    step as costs price it at alpha unless the caller priced its real shapes (spec_ms). at: where BatchCosts
    prices it (n sequences, overhead_ms)."""
    tokens = share * expected_tokens(alpha, gamma) + (1 - share)
    plain = costs.step_ms(0, **at) if plain_ms is None else plain_ms
    return tokens * plain / (spec_ms or costs.step_ms(gamma, alpha, share, **at))
