"""Typed specs, parsed once where the plan is expanded (or a record is read): what drafts (no draft, an n-gram
lookup, a draft model) and how far (a fixed gamma, or adaptive up to a longest draft). Each writes itself as the
string plan.json and the traces have always held, so runs recorded before these types read back the same.
Further kinds (llama.cpp's other speculative types) are further DraftSpec subclasses with a parse rule here."""
from __future__ import annotations

from dataclasses import dataclass

from harness.errors import HarnessError

NONE = "none"  # the plain baseline's draft, as records name it


class DraftSpec:
    """What proposes the drafts. `model` is the draft model's reference (a name or a path) and `ngram` the lookup's
    n, each None for the other kinds."""
    model: str | None = None
    ngram: int | None = None

    @property
    def plain(self) -> bool:
        return False


@dataclass(frozen=True)
class NoDraft(DraftSpec):
    """The plain baseline: nothing is drafted."""

    @property
    def plain(self) -> bool:
        return True

    def __str__(self) -> str:
        return NONE


@dataclass(frozen=True)
class NGram(DraftSpec):
    """Prompt lookup: drafts copied from the context's latest earlier occurrence of its last n-gram."""
    ngram: int = 3

    def __str__(self) -> str:
        return f"ngram:{self.ngram}"


@dataclass(frozen=True)
class DraftModel(DraftSpec):
    """A draft model, by catalogue name or GGUF path."""
    model: str = ""

    def __str__(self) -> str:
        return self.model


def parse_draft(text) -> DraftSpec:
    """'none', 'ngram' / 'ngram:N', or a model's name or path; a spec already parsed passes through."""
    if isinstance(text, DraftSpec):
        return text
    if not isinstance(text, str) or not text.strip():
        raise HarnessError(f"--draft: cannot read {text!r} (a model name or path, ngram:N, or none)")
    if text == NONE:
        return NoDraft()
    if text.startswith("ngram"):
        _, _, n = text.partition(":")
        try:
            size = int(n or 3)
        except ValueError:
            size = 0
        if size < 1:
            raise HarnessError(f"bad n-gram proposer '{text}': use ngram:N, with an n-gram size N >= 1")
        return NGram(size)
    return DraftModel(text)


@dataclass(frozen=True)
class Gamma:
    """A draft length: fixed at n, or adaptive (chosen per step in 0..n by the cost model). n is None for an
    adaptive gamma given as plain 'auto', which takes the sweep's largest fixed gamma (8 without one)."""
    n: int | None
    adaptive: bool = False

    def __str__(self) -> str:
        return ("auto" + (f":{self.n}" if self.n is not None else "")) if self.adaptive else str(self.n)

    def json(self) -> int | str:
        """As plan.json's params hold it: an int, or 'auto' / 'auto:N'."""
        return str(self) if self.adaptive else self.n

    def resolved(self, fixed: list[int]) -> Gamma:
        return self if self.n is not None else Gamma(max(fixed, default=8), True)


def parse_gamma(x) -> Gamma:
    """An int >= 1, or 'auto' / 'auto:N' (adaptive up to N >= 1)."""
    if isinstance(x, Gamma):
        return x
    if isinstance(x, str) and x.strip().startswith("auto"):
        _, _, n = x.strip().partition(":")
        if n and (not n.isdigit() or int(n) < 1):
            raise HarnessError(f"--gamma {x}: use auto or auto:N with N >= 1 (the longest draft)")
        return Gamma(int(n) if n else None, True)
    try:
        if isinstance(x, (bool, float)):
            raise ValueError
        g = int(x)
    except (TypeError, ValueError):
        raise HarnessError(f"--gamma: cannot read {x!r} (an integer >= 1, auto or auto:N)") from None
    if g < 1:
        raise HarnessError(f"--gamma values must be >= 1, got {g}")
    return Gamma(g)
