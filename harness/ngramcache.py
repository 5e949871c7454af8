"""llama.cpp's ngram-cache speculative type's cache and draft (harness.llamangram's NgramCache is its proposer), ported
from the llama.cpp that llama-cpp-python 0.3.36 vendors: common_ngram_cache (common/ngram-cache.h),
common_ngram_cache_update and common_ngram_cache_draft (common/ngram-cache.cpp), through
common_speculative_impl_ngram_cache (common/speculative.cpp), as create_state_ngram_cache makes it: n_draft 8, no
static or dynamic cache file (llama-server's --lookup-cache-static and --lookup-cache-dynamic, which the harness
does not pass), nothing saved. The server calls it as it calls the other n-gram types (harness.llamangram's module
docstring): begin and accept do nothing, draft updates the context cache with the tokens new since the last draft,
then drafts. Pure Python; no model.
"""
from __future__ import annotations

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2  # LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, LLAMA_NGRAM_STATIC
# (min sample size, min percent) for n-grams of 1..4 tokens: a count below either skips that n-gram
LAX = ((2, 66), (2, 50), (1, 50), (1, 50))  # the context cache's (draft_min_*_lax)
STRICT = ((4, 75), (3, 66), (2, 66), (2, 66))  # the dynamic cache's (draft_min_*_strict)

# common_ngram_cache: an n-gram (a tuple of 1..4 tokens) -> {token: how often it followed}, tokens in the order they
# were first counted
Cache = dict[tuple[int, ...], dict[int, int]]


def update(cache: Cache, inp: list[int], nnew: int, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
    """common_ngram_cache_update: count, for each n in ngram_min..ngram_max, the token after each n-gram that ends
    among inp's last nnew tokens (an n-gram needs n tokens before its token: none starts before inp[0])."""
    for n in range(ngram_min, ngram_max + 1):
        for i in range(max(len(inp) - nnew, n), len(inp)):
            part = cache.setdefault(tuple(inp[i - n:i]), {})
            part[inp[i]] = part.get(inp[i], 0) + 1


def _best(part: dict[int, int], static: dict[int, int]) -> tuple[int, int, int]:
    """(token, its count, the counts' sum): the token of the largest count x (100 x its static count, 1 where the
    static cache has none), the first of equals in libstdc++'s unordered_map order, latest counted first (exact for
    every part that can pass a threshold: two tokens tied at 50%, in a part of 2 entries, 13 buckets)."""
    tok, best, best_static, total = -1, 0, 0, 0
    for t, c in reversed(part.items()):
        s = 100 * static[t] if t in static else 1
        if c * s > best * best_static:
            tok, best, best_static = t, c, s
        total += c
    return tok, best, total


def _try_primary(cache: Cache, ngrams: list, static: dict[int, int], thresholds) -> int | None:
    """try_draft over the context (or dynamic) cache: the longest n-gram first, the first that passes its
    thresholds drafts."""
    for i in range(len(ngrams) - 1, -1, -1):
        part = cache.get(ngrams[i]) if ngrams[i] is not None else None
        if part is None:
            continue
        tok, best, total = _best(part, static)
        size, percent = thresholds[i]
        if total < size or 100 * best < percent * total:
            continue
        return tok
    return None


def _try_static(static: Cache, ngram: tuple[int, ...]) -> int | None:
    """try_draft over the static cache alone, at the lax thresholds of its 2-grams."""
    part = static.get(ngram)
    if part is None:
        return None
    tok, best, total = -1, 0, 0
    for t, c in part.items():  # a strict maximum: order only breaks ties, which 66% never passes
        if c > best:
            tok, best = t, c
        total += c
    size, percent = LAX[NGRAM_STATIC - 1]
    return None if total < size or 100 * best < percent * total else tok


def draft(inp: list[int], n_draft: int, context: Cache, dynamic: Cache, static: Cache,
          ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> list[int]:
    """common_ngram_cache_draft after the tokens inp (their last the token just sampled): up to n_draft tokens, each
    from the n-grams ending at the tokens so far (inp, then what is drafted): the context cache's at the lax
    thresholds, else the dynamic cache's at the strict ones, else the static cache's 2-gram; the draft stops where
    none drafts. An n-gram that would start before inp[0] is never found (llama.cpp reads out of bounds there)."""
    out: list[int] = []
    if len(inp) < NGRAM_STATIC:
        return out
    while len(out) < n_draft:
        seq = inp + out
        ngram_static = tuple(seq[-NGRAM_STATIC:])
        part_static = static.get(ngram_static, {})
        ngrams = [tuple(seq[-n:]) if n <= len(seq) else None for n in range(ngram_min, ngram_max + 1)]
        tok = _try_primary(context, ngrams, part_static, LAX)
        if tok is None:
            tok = _try_primary(dynamic, ngrams, part_static, STRICT)
        if tok is None:
            tok = _try_static(static, ngram_static)
        if tok is None:
            break
        out.append(tok)
    return out
