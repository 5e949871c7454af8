"""Typed specs, parsed once where the plan is expanded (or a record is read): what drafts (no draft, an n-gram
lookup, a draft model) and how far (a fixed gamma, or adaptive up to a longest draft). Each writes itself as the
string plan.json and the traces have always held, so runs recorded before these types read back the same.
llama.cpp's model-free types, which the harness ports (harness.llamangram, harness.ngramcache), are LlamaNgram;
further kinds are further DraftSpec subclasses with a parse rule here. llama.cpp's types that only llama-server runs
here (ServerType: its drafting heads) and its comma lists of types (Combined, written with '+') are server_only: the
plan refuses them outside --engine server."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

NONE = "none"  # the plain baseline's draft, as records name it


class DraftSpec:
    """What proposes the drafts. `model` is the draft model's reference (a name or a path), `ngram` the lookup's
    n and `head` a drafting head's GGUF (ServerType), each None for the other kinds."""
    model: str | None = None
    ngram: int | None = None
    head: str | None = None

    @property
    def plain(self) -> bool:
        return False

    @property
    def model_free(self) -> bool:
        """A proposer with no model: no KV cache of its own, no probabilities for p-min to test, no n-min of the
        draft model's kind (the harness's lookup, llama.cpp's n-gram types)."""
        return not self.plain and self.model is None

    @property
    def own_gamma(self) -> int | None:
        """The longest draft where the proposer sets it itself (llama.cpp's n-gram types: their n-max or size-m),
        which a sweep's gammas do not replace; None where the gamma is the sweep's."""
        return None

    @property
    def server_type(self) -> str | None:
        """llama-server's --spec-type for this proposer; None where it has none (the harness's own lookup)."""
        return None

    @property
    def server_only(self) -> bool:
        """Measured in llama-server only (--engine server): the harness's loop does not run it."""
        return False

    def longest(self, gamma: int) -> int:
        """The longest draft a step verifies at the sweep's gamma."""
        return self.own_gamma or gamma


@dataclass(frozen=True)
class NoDraft(DraftSpec):
    """The plain baseline: nothing is drafted."""

    @property
    def plain(self) -> bool:
        return True

    @property
    def server_type(self) -> str:
        return NONE

    def __str__(self) -> str:
        return NONE


@dataclass(frozen=True)
class NGram(DraftSpec):
    """Prompt lookup, llama-cpp-python's kind (LlamaPromptLookupDecoding): drafts copied from the context's latest
    earlier occurrence of its last n-gram. Not llama.cpp's ngram-simple, which LlamaNgram ports."""
    ngram: int = 3

    def __str__(self) -> str:
        return f"ngram:{self.ngram}"


@dataclass(frozen=True)
class DraftModel(DraftSpec):
    """A draft model, by catalogue name or GGUF path."""
    model: str = ""

    @property
    def server_type(self) -> str:
        return "draft-simple"

    def __str__(self) -> str:
        return self.model


# llama.cpp's model-free types the harness ports (harness.llamangram, harness.ngramcache): each flag
# (--spec-<type>-<flag>) with its default (common/common.h) and arg.cpp's lowest value, in arg.cpp's order. The
# largest value: arg.cpp's 1024. ngram-cache has none.
LLAMA_NGRAM = {
    "ngram-simple": (("size-n", 12, 1), ("size-m", 48, 1), ("min-hits", 1, 1)),
    "ngram-map-k": (("size-n", 12, 1), ("size-m", 48, 1), ("min-hits", 1, 1)),
    "ngram-map-k4v": (("size-n", 12, 1), ("size-m", 48, 1), ("min-hits", 1, 1)),
    "ngram-mod": (("n-match", 24, 1), ("n-max", 64, 0), ("n-min", 48, 0)),
    "ngram-cache": (),
}
NGRAM_CACHE_DRAFT = 8  # ngram-cache's longest draft: speculative.cpp's create_state_ngram_cache fixes it
# llama.cpp's types the harness's loop does not run (ServerType), measured in llama-server: a head drafts for its
# target through the draft context
HEADS = ("draft-mtp", "draft-eagle3", "draft-dflash")
# common_speculative_init's order of preference: a step drafts with the first type that finds a draft
PRIORITY = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple", *HEADS)


@dataclass(frozen=True)
class LlamaNgram(DraftSpec):
    """One of llama.cpp's model-free speculative types (llama-server's --spec-type), as the harness ports them:
    `kind` as llama.cpp names it, `params` every flag's value (defaults filled in) in arg.cpp's order. Written
    'ngram-mod', 'ngram-mod:n-max=16:n-min=4': the kind, then each flag away from its default, ':'-separated;
    'ngram-cache' has no flags and drafts up to 8 tokens."""
    kind: str = "ngram-mod"
    params: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        defaults = {k: d for k, d, _ in LLAMA_NGRAM[self.kind]}
        return self.kind + "".join(f":{k}={v}" for k, v in self.params if v != defaults[k])

    @property
    def values(self) -> dict[str, int]:
        return dict(self.params)

    @property
    def server_type(self) -> str:
        return self.kind

    @property
    def own_gamma(self) -> int:
        if self.kind == "ngram-cache":
            return NGRAM_CACHE_DRAFT
        return self.values["n-max" if self.kind == "ngram-mod" else "size-m"]

    @classmethod
    def make(cls, kind: str, **given: int) -> LlamaNgram:
        """The spec of `kind` with these flags (underscores for hyphens), the rest at llama.cpp's defaults."""
        return _llama_ngram(kind, {k.replace("_", "-"): v for k, v in given.items()}, kind)


@dataclass(frozen=True)
class ServerType(DraftSpec):
    """One of llama.cpp's types that only llama-server runs here, a drafting head at the sweep's gamma (n-max):
    draft-mtp (the target's own MTP layers, or `head`, a sidecar GGUF carrying them), draft-eagle3 and draft-dflash
    (`head`: an EAGLE-3 or DFlash GGUF). Written 'draft-mtp', 'draft-eagle3:PATH'. bench.prepare checks the files
    carry the heads before anything runs."""
    kind: str = "draft-mtp"
    head: str | None = None

    def __str__(self) -> str:
        return self.kind + (f":{self.head}" if self.head else "")

    @property
    def server_type(self) -> str:
        return self.kind

    @property
    def server_only(self) -> bool:
        return True

    @property
    def model_free(self) -> bool:
        return False


@dataclass(frozen=True)
class Combined(DraftSpec):
    """llama-server's comma list of types (--spec-type ngram-mod,draft-simple): at each step the first type in
    llama.cpp's order of preference (PRIORITY: the n-gram types, then the draft model) that finds a draft drafts.
    Written with '+' ('ngram-mod:n-max=8+MODEL'), parts in that order; at most one part drafts with a model."""
    parts: tuple[DraftSpec, ...] = ()

    def __str__(self) -> str:
        return "+".join(map(str, self.parts))

    @property
    def server_type(self) -> str:
        return ",".join(p.server_type for p in self.parts)

    @property
    def server_only(self) -> bool:
        return True

    @property
    def model(self) -> str | None:  # the draft-simple part's model: aligned, probed and sized as a draft model's
        return next((p.model for p in self.parts if p.model), None)

    @property
    def model_free(self) -> bool:
        return all(p.model_free for p in self.parts)

    @property
    def own_gamma(self) -> int | None:
        own = [p.own_gamma for p in self.parts]
        return None if None in own else max(own)

    def longest(self, gamma: int) -> int:
        return max(p.longest(gamma) for p in self.parts)


def _parse_server_type(text: str) -> ServerType:
    kind, _, head = text.partition(":")
    if kind in ("draft-eagle3", "draft-dflash") and not head:
        raise HarnessError(f"--draft {kind}: name its head, {kind}:PATH.gguf")
    return ServerType(kind, head or None)


def _names_type(piece: str) -> bool:
    """A '+' list's piece that starts one of the spec kinds (a llama.cpp type, the lookup, none), not a path."""
    head = piece.split(":")[0]
    return head in LLAMA_NGRAM or head in HEADS or head in (NONE, "ngram", "draft-simple", "draft-dspark")


def _is_file(piece: str) -> bool:
    head, colon, rest = piece.partition(":")
    path = rest if colon and head in HEADS else piece  # a head's file after its type
    try:
        return Path(path).expanduser().is_file()
    except (OSError, ValueError):
        return False


def _path_end(pieces: list[str], i: int) -> int:
    """Where the part starting at pieces[i] ends: a type without a file is one piece; a path (a model's, a head's)
    runs over the '+' its name holds: to the longest run naming a file on disk, else to the first piece ending in
    .gguf before another type."""
    if _names_type(pieces[i]) and not (pieces[i].split(":")[0] in HEADS and ":" in pieces[i]):
        return i + 1
    for j in range(len(pieces), i + 1, -1):
        if _is_file("+".join(pieces[i:j])):
            return j
    for j in range(i + 1, len(pieces) + 1):
        if j > i + 1 and _names_type(pieces[j - 1]):
            break
        if "+".join(pieces[i:j]).endswith(".gguf"):
            return j
    return i + 1


def split_plus(text: str) -> list[str]:
    """A '+' list's parts; a path keeps the '+' in its name (c++-draft.gguf, smol+q2.gguf), so a text that is one
    path is one part."""
    pieces, parts, i = text.split("+"), [], 0
    while i < len(pieces):
        j = _path_end(pieces, i)
        parts.append("+".join(pieces[i:j]))
        i = j
    return parts


def _parse_combined(text: str, texts: list[str]) -> Combined:
    if "" in (t.strip() for t in texts):
        raise HarnessError(f"--draft {text}: a combination has an empty part; join llama.cpp's types with '+', "
                           "each named (e.g. ngram-mod+MODEL.gguf)")
    parts = [parse_draft(x) for x in texts]
    if sum(isinstance(p, DraftModel) for p in parts) > 1:
        raise HarnessError(f"--draft {text}: one draft model at most in a combination (llama-server has one draft "
                           "context); a path holding '+' is read whole when the file exists or ends in .gguf")
    for part in parts:
        if part.server_type is None or part.plain or isinstance(part, Combined):
            raise HarnessError(f"--draft {text}: {part} cannot be part of a combination, which takes llama.cpp's "
                               f"types ({', '.join(PRIORITY)}; a draft model by name or path for draft-simple)")
    kinds = [p.server_type for p in parts]
    if len(set(kinds)) < len(kinds):
        raise HarnessError(f"--draft {text}: each llama.cpp type once in a combination")
    if sum(not p.model_free for p in parts) > 1:
        raise HarnessError(f"--draft {text}: llama-server has one draft context, so at most one of draft-simple's "
                           "model and the drafting heads in a combination")
    return Combined(tuple(sorted(parts, key=lambda p: PRIORITY.index(p.server_type))))


def _llama_ngram(kind: str, given: dict, text: str) -> LlamaNgram:
    flags = LLAMA_NGRAM[kind]
    unknown = set(given) - {k for k, _, _ in flags}
    if unknown:
        raise HarnessError(f"--draft {text}: {kind} has no flag {sorted(unknown)[0]} (its flags: "
                           f"{', '.join(k for k, _, _ in flags)})")
    params = []
    for k, default, low in flags:
        v = given.get(k, default)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 1024:
            raise HarnessError(f"--draft {text}: {kind}'s {k} must be an integer from {low} to 1024, got {v!r}")
        params.append((k, v))
    if kind == "ngram-mod" and dict(params)["n-max"] == 0:
        raise HarnessError(f"--draft {text}: ngram-mod with n-max 0 never drafts")
    return LlamaNgram(kind, tuple(params))


def _parse_llama(text: str) -> LlamaNgram:
    kind, *parts = text.split(":")
    if parts and not LLAMA_NGRAM[kind]:
        raise HarnessError(f"--draft {text}: {kind} takes no flags here (llama.cpp drafts up to "
                           f"{NGRAM_CACHE_DRAFT} tokens with it)")
    given: dict[str, int] = {}
    for part in parts:
        k, eq, v = part.partition("=")
        k = k.strip().replace("_", "-")
        if not eq or not k or k in given:
            raise HarnessError(f"--draft {text}: write {kind}'s flags once each as flag=N, ':'-separated "
                               f"(e.g. {kind}:{LLAMA_NGRAM[kind][0][0]}=N)")
        try:
            given[k] = int(v)
        except ValueError:
            raise HarnessError(f"--draft {text}: {kind}'s {k} must be an integer, got {v!r}") from None
    return _llama_ngram(kind, given, text)


def parse_draft(text) -> DraftSpec:
    """'none', 'ngram' / 'ngram:N' (the harness's prompt lookup), one of llama.cpp's n-gram types ('ngram-mod',
    'ngram-simple:size-n=3:size-m=8', 'ngram-cache', ...: LlamaNgram), a type only llama-server runs ('draft-mtp',
    'draft-eagle3:PATH': ServerType), a '+' list of llama.cpp types (Combined), or a model's name or path; a spec
    already parsed passes through."""
    if isinstance(text, DraftSpec):
        return text
    if not isinstance(text, str) or not text.strip():
        raise HarnessError(f"--draft: cannot read {text!r} (a model name or path, ngram:N, ngram-mod, or none)")
    if text == NONE:
        return NoDraft()
    if "+" in text and len(texts := split_plus(text)) > 1:
        return _parse_combined(text, texts)
    head = text.split(":")[0]
    if head in LLAMA_NGRAM:
        return _parse_llama(text)
    if head in HEADS:
        return _parse_server_type(text)
    if head in ("draft-simple", "draft-dspark"):  # llama.cpp's names; other draft-* names may be models
        raise HarnessError(f"--draft {text}: no type {head} here (llama-server's drafting heads: {', '.join(HEADS)};"
                           " a draft model by name or path for draft-simple)")
    if "=" in head and ":" not in text:  # a flag cut off its type by a comma list
        raise HarnessError(f"--draft {text}: separate an n-gram type's flags with ':', not ',' "
                           "(e.g. ngram-mod:n-max=16:n-min=4)")
    if head.startswith("ngram-") and "/" not in text and not text.endswith(".gguf"):
        raise HarnessError(f"--draft {text}: no n-gram type {head} (llama.cpp's, ported: {', '.join(LLAMA_NGRAM)}; "
                           "the harness's prompt lookup: ngram:N)")
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
