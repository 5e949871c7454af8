"""Drafts as values, with no model: how they are made and checked (Drafting), a draft (Proposal) and an n-gram lookup's
search (ngram_lookup). The plan, the pure analysis and the proposers share them."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.errors import HarnessError
from harness.sampling import Dist

RULES = ("leviathan", "exact")


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


def ngram_lookup(context: list[int], size: int, n: int) -> list[int]:
    """Prompt lookup: the latest earlier occurrence of the context's last `size` tokens, and up to n tokens of what
    followed it (none where it has no earlier occurrence)."""
    if len(context) <= size:
        return []
    arr = np.asarray(context)
    key = arr[-size:]
    windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], size)
    hits = np.flatnonzero((windows == key).all(axis=1))
    if not len(hits):
        return []
    start = int(hits[-1]) + size
    return [int(t) for t in arr[start:start + n]]
