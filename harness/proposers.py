"""Proposers: who guesses the next tokens. Two methods, as in HF's candidate generators:
propose(context, n) and accepted(context, n_accepted) to keep the proposer's state in sync."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from harness.engine import Engine
from harness.errors import HarnessError
from harness.sampling import Dist, Policy, process


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: list[Dist] = field(default_factory=list)  # the distribution each token was drawn from


class Proposer(Protocol):
    name: str

    def prefill(self, prompt: list[int], policy: Policy) -> None: ...

    def propose(self, context: list[int], n: int) -> Proposal: ...

    def accepted(self, context: list[int], n_accepted: int) -> None: ...


class DraftModelProposer:
    """A smaller model with the same tokenizer, sampling from its own processed distribution q."""

    def __init__(self, engine: Engine, name: str = "draft"):
        self.engine = engine
        self.name = name
        self.policy = Policy()
        self.rng = np.random.default_rng(0)

    def prefill(self, prompt: list[int], policy: Policy) -> None:
        """Start a generation: take its policy and seed, evaluate the prompt (all but its last token)."""
        self.policy = policy
        self.rng = np.random.default_rng([policy.seed, 1])
        self.engine.reset()
        self.engine.decode(prompt[:-1], logits="none")

    def propose(self, context: list[int], n: int) -> Proposal:
        eng = self.engine
        logits = eng.decode(context[eng.n_past:], logits="last")
        out = Proposal()
        for i in range(n):
            q = process(logits[0], self.policy)
            x = int(q.ids[0]) if self.policy.greedy else q.sample(self.rng)
            out.tokens.append(x)
            out.q.append(q)
            if i < n - 1:
                logits = eng.decode([x], logits="last")
        return out

    def accepted(self, context: list[int], n_accepted: int) -> None:
        # The cache holds the old context plus the proposals but the last; keep what the new context shares.
        self.engine.trim(min(self.engine.n_past, len(context) - 1))


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
        k = self.n
        if len(context) <= k:
            return Proposal()
        arr = np.asarray(context)
        key = arr[-k:]
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], k)
        hits = np.flatnonzero((windows == key).all(axis=1))
        if not len(hits):
            return Proposal()
        start = int(hits[-1]) + k
        toks = [int(t) for t in arr[start:start + n]]
        return Proposal(toks, [Dist.point(t) for t in toks])

    def accepted(self, context: list[int], n_accepted: int) -> None:
        pass
