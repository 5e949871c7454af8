"""Proposers: who guesses the next tokens. Two methods, as in HF's candidate generators:
propose(context, n) and accepted(context, n_accepted) to keep the proposer's state in sync. What a draft is and how
it is checked (Drafting, Proposal) is harness.drafting's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from harness.drafting import Drafting, Proposal, ngram_lookup
from harness.engine import Engine
from harness.errors import HarnessError
from harness.promptcache import PromptCache, evaluate_prompt
from harness.sampling import Dist, Policy, process, top_share


P_MIN_TOP_K = 10  # llama.cpp's draft sampler keeps the top 10: p-min tests the top token's share of those


class Proposer(Protocol):
    name: str
    rng: np.random.Generator  # set by the loop for each generation (loop.streams); a lookup draws nothing

    def prefill(self, prompt: list[int], policy: Policy) -> None: ...

    def propose(self, context: list[int], n: int) -> Proposal: ...

    def accepted(self, context: list[int], n_accepted: int) -> None: ...


def draft_pick(row: np.ndarray, policy: Policy, d: Drafting, rng: np.random.Generator) -> tuple[int, Dist] | None:
    """The draft's next token and the distribution it came from, given its logits row; None where p-min stops
    drafting."""
    if d.p_min > 0 and top_share(row, P_MIN_TOP_K) < d.p_min:
        return None
    if d.verify == "exact":  # the draft's top token, as a point mass: the target samples against it
        q = Dist.point(int(np.argmax(row)))
        return int(q.ids[0]), q
    q = process(row, policy)
    return (int(q.ids[0]) if policy.greedy else q.sample(rng)), q


@dataclass
class DraftKV:
    """A draft model's cache of one sequence, for the single-sequence proposer and the batched draft alike: it holds
    the sequence's context up to `past`, then proposals but the last."""
    past: int = 0

    def catch_up(self, context: list[int]) -> list[int]:
        """The context's tokens beyond the cache (its last; two after a step that accepted every draft), which the
        caller decodes now."""
        behind = context[self.past:]
        self.past = len(context)
        return behind

    def pick(self, prop: Proposal, row: np.ndarray, policy: Policy, d: Drafting, rng: np.random.Generator,
             n: int) -> bool:
        """Add the draft's next token, from its logits row, to prop. True where the caller decodes that token for
        one more (at position past - 1): prop is still short of n and p-min did not stop it."""
        picked = draft_pick(row, policy, d, rng)
        if picked is None:
            return False
        prop.tokens.append(picked[0])
        prop.q.append(picked[1])
        if len(prop.tokens) == n:
            return False
        self.past += 1
        return True

    def accepted(self, context: list[int]) -> int:
        """After verification: the cache keeps what the new context shares with it. Returns that length, to trim
        the draft's KV to."""
        self.past = min(self.past, len(context) - 1)
        return self.past


class DraftModelProposer:
    """A smaller model with the same tokenizer, sampling from its own processed distribution q. cache: the run's
    prompt cache, through which it evaluates each prompt."""

    def __init__(self, engine: Engine, name: str = "draft", drafting: Drafting = Drafting(),
                 cache: PromptCache | None = None):
        self.engine = engine
        self.name = name
        self.drafting = drafting
        self.cache = cache
        self.policy = Policy()
        self.rng = np.random.default_rng(0)
        self.kv = DraftKV()

    def prefill(self, prompt: list[int], policy: Policy) -> None:
        """Start a generation: take its policy, evaluate the prompt (all but its last token)."""
        self.policy = policy
        self.engine.reset()
        evaluate_prompt(self.engine, prompt[:-1], self.cache)
        self.kv = DraftKV(self.engine.n_past)

    def propose(self, context: list[int], n: int) -> Proposal:
        """Up to n >= 1 drafts."""
        logits = self.engine.decode(self.kv.catch_up(context), logits="last")
        out = Proposal()
        while self.kv.pick(out, logits[0], self.policy, self.drafting, self.rng, n):
            logits = self.engine.decode(out.tokens[-1:], logits="last")
        return self.drafting.kept(out)

    def accepted(self, context: list[int], n_accepted: int) -> None:
        self.engine.trim(self.kv.accepted(context))


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and propose what followed.
    Its q is a point mass, so under sampling a token is accepted with probability p(x): still lossless."""

    def __init__(self, n: int):
        if n < 1:
            raise HarnessError(f"n-gram size must be >= 1, got {n}")
        self.n = n
        self.name = f"ngram:{n}"

    def prefill(self, prompt: list[int], policy: Policy) -> None:
        pass

    def propose(self, context: list[int], n: int) -> Proposal:
        toks = ngram_lookup(context, self.n, n)
        return Proposal(toks, [Dist.point(t) for t in toks])

    def accepted(self, context: list[int], n_accepted: int) -> None:
        pass
