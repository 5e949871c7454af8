"""What a step costs, by its shape: the one place the replay, the adaptive controller, predict, concurrency and
the estimate price a step. A step's shape: for each sequence in the batch (N of them; the sequential loop's is
a batch of one), the tokens the draft catches up on, the drafts fed back to it, and the block the target
verifies. The overhead is the loop's own time: Costs.overhead, per verified row."""
from __future__ import annotations

from dataclasses import dataclass

from harness.costmodel.batched import BatchCosts, split
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


def price(step: Step, costs, backlog: int = 0) -> float:
    """A step of one sequence: the draft's proposals (after catching up over `backlog` plain steps; one more
    token when all were accepted), the verification block, and the overhead of verifying its rows (Costs.overhead).
    Linear in the costs (sequential.Costs), which may be arrays (draws of them)."""
    rows, draft = step.proposed + 1, 0.0
    if step.proposed:
        draft = costs.catch_up(backlog + 1) - costs.draft_ms + step.proposed * costs.draft_ms
        if step.all_accepted:
            draft += costs.catch_up(2) - costs.catch_up(1)
    return draft + costs.verify(rows) + costs.overhead(rows)


def batch_ms(costs: BatchCosts, sizes: list[int], seqs: list[int] | None = None, unified: bool = False,
             draft: bool = False, n_ubatch: int = 512) -> float:
    """One llama_decode of these per-sequence blocks: the sum of its ubatches' prices."""
    return sum(costs.ubatch(m, t, draft) for m, t in split(sizes, seqs, unified, n_ubatch))


def shaped(costs: BatchCosts, seqs: list[int], blocks: list[int], catch_up: list[int], fed: list[int],
           unified: bool = False, n_ubatch: int = 512) -> float:
    """A step of several sequences as it ran, per sequence in batch order: the draft's catch-up (the tokens its
    cache lacks, 0 for a sequence not drafting), then one decode per further draft position of the sequences
    fed that far (fed: drafts fed back), then the target's verification of each block (1 + proposed). The
    loop's overhead is the caller's: the records time it per step."""
    drafts = [catch_up, *([int(f >= k) for f in fed] for k in range(1, max(fed, default=0) + 1))]
    return (sum(batch_ms(costs, d, seqs, unified, True, n_ubatch) for d in drafts)
            + batch_ms(costs, blocks, seqs, unified, False, n_ubatch))


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
