"""Proposers: who guesses the next tokens. Two methods, as in HF's candidate generators:
propose(context, n) and accepted(context, n_accepted) to keep the proposer's state in sync."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from harness.engine import Engine
from harness.errors import HarnessError
from harness.promptcache import PromptCache, evaluate_prompt
from harness.sampling import Dist, Policy, process, top_share


RULES = ("leviathan", "exact")
P_MIN_TOP_K = 10  # llama.cpp's draft sampler keeps the top 10: p-min tests the top token's share of those


@dataclass(frozen=True)
class Drafting:
    """How drafts are made and checked. verify: "leviathan" (rejection sampling against the draft's q) or
    "exact" (llama.cpp's: the draft proposes its top token, the target samples and keeps it while they agree;
    the same as leviathan under greedy decoding). p_min: drafting stops once the draft's top probability falls
    below it (llama.cpp's --spec-draft-p-min); n_min: a draft shorter than it is dropped, that step decodes
    plainly (llama-server's speculative.n_min)."""
    verify: str = "leviathan"
    p_min: float = 0.0
    n_min: int = 0

    def __post_init__(self):
        if self.verify not in RULES:
            raise HarnessError(f"unknown verification rule '{self.verify}' (known: {', '.join(RULES)})")
        if not 0.0 <= self.p_min <= 1.0:
            raise HarnessError(f"--draft-p-min must be in [0, 1], got {self.p_min:g}")
        if self.n_min < 0:
            raise HarnessError(f"--draft-n-min must be >= 0, got {self.n_min}")

    def label(self, draft: str, also: str = "") -> str:
        """The draft with how it drafts where that is not the default (and `also`: its cache types), as the
        report's tables name it."""
        extra = [x for x in ("exact" if self.verify == "exact" else "", f"p-min {self.p_min:g}" if self.p_min else "",
                             f"n-min {self.n_min}" if self.n_min else "", also) if x]
        return draft + (f" ({', '.join(extra)})" if extra else "")

    def kept(self, prop: Proposal) -> Proposal:
        """The proposal, or none where it is shorter than n_min."""
        return prop if len(prop.tokens) >= self.n_min else Proposal()


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: list[Dist] = field(default_factory=list)  # the distribution each token was drawn from


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
