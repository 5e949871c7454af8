"""Proposers: who guesses the next tokens. A sequence's proposer has two methods, as in HF's candidate generators:
propose(context, n) and accepted(context, n_accepted) to keep its state in sync; the loop drives a SlotProposer,
the same over the sequences of a batch (a draft model drafting for all of them in one decode per position). What a
draft is and how it is checked (Drafting, Proposal) is harness.drafting's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from harness.drafting import Drafting, Proposal, ngram_lookup
from harness.engine import Engine
from harness.errors import HarnessError
from harness.promptcache import PromptCache, evaluate_prompt
from harness.sampling import Dist, Policy, process, top_share


P_MIN_TOP_K = 10  # llama.cpp's draft sampler keeps the top 10: p-min tests the top token's share of those


class Proposer(Protocol):
    """A proposer of one sequence: a lookup, llama.cpp's n-gram types (llamangram), a test's script. The loop runs
    one per slot (EachSequence)."""
    name: str

    def prefill(self, prompt: list[int], policy: Policy) -> None: ...

    def propose(self, context: list[int], n: int) -> Proposal: ...

    def accepted(self, context: list[int], n_accepted: int) -> None: ...


class SlotProposer:
    """What the loop drives: a proposer over the sequences of a batch (loop.Seq: its `seq`, context `ctx` and
    draft stream `draft_rng`), one sequence being a batch of one."""
    name = "proposer"

    def reset(self) -> None:
        """A new batch: every sequence's state goes."""

    def start(self, s, policy: Policy) -> None:
        """Sequence s begins its generation: s.ctx is its prompt."""

    def draft(self, seqs: list, gammas: list[int]) -> list[Proposal]:
        """Up to gammas[i] drafts for seqs[i] (none where 0)."""
        raise NotImplementedError

    def accepted(self, s, n_accepted: int) -> None:
        """After verification: s.ctx holds the accepted drafts and the target's token."""

    def ended(self, s, n_accepted: int) -> None:
        """The step that ended s's generation at an end-of-generation token accepted n_accepted drafts."""


class EachSequence(SlotProposer):
    """Sequence-level Proposers, one per slot from `make`, each with its own state as llama-server's slots have
    theirs; a slot's state outlives its request, as a server's does (llamangram)."""

    def __init__(self, make: Callable[[], Proposer]):
        self.make = make
        self.one: dict[int, Proposer] = {0: make()}
        self.name = self.one[0].name

    def _of(self, s) -> Proposer:
        if s.seq not in self.one:
            self.one[s.seq] = self.make()
        return self.one[s.seq]

    def start(self, s, policy: Policy) -> None:
        self._of(s).prefill(s.ctx, policy)

    def draft(self, seqs: list, gammas: list[int]) -> list[Proposal]:
        return [self._of(s).propose(s.ctx, g) if g > 0 else Proposal() for s, g in zip(seqs, gammas)]

    def accepted(self, s, n_accepted: int) -> None:
        self._of(s).accepted(s.ctx, n_accepted)

    def ended(self, s, n_accepted: int) -> None:
        if hasattr(self._of(s), "ended"):  # llama-server reports an ending step's acceptance too (llamangram)
            self._of(s).ended(n_accepted)


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
    """A draft model's cache of one sequence: it holds the sequence's context up to `past`, then proposals but the
    last."""
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


class DraftModelProposer(SlotProposer):
    """A smaller model with the same tokenizer, sampling from its own processed distribution q, over the batch's
    sequences in its own context: each draft position one decode for every sequence still drafting. cache: the
    run's prompt cache, through which it evaluates each prompt."""

    def __init__(self, engine: Engine, name: str = "draft", drafting: Drafting = Drafting(),
                 cache: PromptCache | None = None):
        self.engine, self.name, self.drafting, self.cache = engine, name, drafting, cache
        self.policy = Policy()
        self.kv: dict[int, DraftKV] = {}  # per sequence

    def reset(self) -> None:
        self.engine.reset()
        self.kv = {}

    def start(self, s, policy: Policy) -> None:
        """Take the policy, evaluate s's prompt (all but its last token) into the draft's sequence s.seq."""
        self.policy = policy
        self.engine.seq_trim(s.seq, 0)
        evaluate_prompt(self.engine, s.ctx[:-1], self.cache, s.seq)
        self.kv[s.seq] = DraftKV(len(s.ctx) - 1)

    def draft(self, seqs: list, gammas: list[int]) -> list[Proposal]:
        out = [Proposal() for _ in seqs]
        live = [i for i, g in enumerate(gammas) if g > 0]
        rows = []
        for i in live:
            kv = self.kv[seqs[i].seq]
            at = kv.past
            behind = kv.catch_up(seqs[i].ctx)
            rows += [(seqs[i].seq, at + j, t, j == len(behind) - 1) for j, t in enumerate(behind)]
        logits = self.engine.decode_rows(rows) if rows else None
        while live:
            nxt, feed = [], []
            for r, i in enumerate(live):
                s = seqs[i]
                kv = self.kv[s.seq]
                if kv.pick(out[i], logits[r], self.policy, self.drafting, s.draft_rng, gammas[i]):
                    nxt.append(i)
                    feed.append((s.seq, kv.past - 1, out[i].tokens[-1], True))
            live = nxt
            logits = self.engine.decode_rows(feed) if feed else None
        return [self.drafting.kept(p) for p in out]

    def accepted(self, s, n_accepted: int) -> None:
        self.engine.seq_trim(s.seq, self.kv[s.seq].accepted(s.ctx))


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
