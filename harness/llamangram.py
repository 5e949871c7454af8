"""llama.cpp's model-free speculative types as harness proposers, ported from the llama.cpp that llama-cpp-python
0.3.36 vendors: ngram-simple, ngram-map-k (and ngram-map-k4v, the same code), ngram-mod; ngram-cache in
harness.ngramcache. Same parameters and defaults (specs.LLAMA_NGRAM: common/common.h, common/arg.cpp), the same
begin/draft/accept, the same state across steps and across the generations one proposer serves, as one llama-server
keeps it for its lifetime (a bench worker serves one configuration's prompts: one server per configuration). Pure
Python and numpy; no model.

How llama-server calls a type (tools/server/server-context.cpp), which LlamaNgramProposer does around the loop:
- begin(prompt) once the prompt is evaluated (common_speculative_begin, the slot's prompt tokens);
- draft(cached, id_last): `cached` the tokens in the target's cache, `id_last` the token just sampled and not yet
  decoded; the draft is cut to the step's cap (common_speculative_draft: dp.n_max, n_remaining - 1 as the loop's
  gamma_cap). The server first drafts once it has sampled a token from the prompt: the loop's first step, which
  decodes the prompt's last token, proposes nothing here;
- accept(n_accepted) after a non-empty draft only (common_speculative_accept), on a generation's last step too.
"""
from __future__ import annotations

import numpy as np

from harness.drafting import Proposal
from harness.sampling import Dist, Policy
from harness import ngramcache
from harness.specs import NGRAM_CACHE_DRAFT, LlamaNgram

MASK64 = (1 << 64) - 1
MOD_MUL = 6364136223846793005  # common_ngram_mod::idx: res = res * MOD_MUL + token (mod 2^64), then % size
MOD_SIZE = 4 * 1024 * 1024  # common_speculative_impl_ngram_mod's table
MOD_EMPTY = -1  # common_ngram_mod::EMPTY
MOD_FULL = 0.25  # begin() empties the table once more than this share of it is used
MOD_CHUNK = 32  # draft_one() adds the cache's new n-grams once more than this many tokens are new
MOD_LOW, MOD_STREAK = 0.25, 5  # accept(): this many drafts in a row accepted under this share empty the table
MAP_LCG = 2654435761  # ngram-map.cpp's LCG_FACTOR: hash = hash * MAP_LCG + token (mod 2^32)
MAP_HASH = 262144  # COMMON_NGRAM_HASH_MAP_SIZE: key_map's entries
MAP_VALUES = 4  # COMMON_NGRAM_MAX_VALUES
MAP_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT


def proposer(spec: LlamaNgram) -> LlamaNgramProposer:
    """The proposer of a parsed spec (pair.open_pair's)."""
    v = spec.values
    if spec.kind == "ngram-cache":
        return NgramCache()
    if spec.kind == "ngram-mod":
        return NgramMod(v["n-match"], v["n-max"], v["n-min"])
    if spec.kind == "ngram-simple":
        return NgramSimple(v["size-n"], v["size-m"], v["min-hits"])
    return NgramMapK(v["size-n"], v["size-m"], v["min-hits"], key_only=spec.kind == "ngram-map-k")


def _matches(arr: np.ndarray, key, lo: int, hi: int) -> np.ndarray:
    """Every j in [lo, hi] at which arr[j:j + len(key)] is key, ascending."""
    if hi < lo:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(arr[lo:hi + len(key)], len(key))
    return lo + np.flatnonzero((windows == np.asarray(key)).all(axis=1))


def _last_match(arr: np.ndarray, key, lo: int, hi: int) -> int:
    """The largest such j, searched downwards as ngram-map.cpp does; 0 (no match) where there is none."""
    hits = _matches(arr, key, lo, hi)
    return int(hits[-1]) if len(hits) else 0


class LlamaNgramProposer:
    """The server's calls around a type's begin/draft/accept (the module's docstring). Subclasses port one type."""
    name = "llama-ngram"

    def __init__(self, spec: LlamaNgram):
        self.name = str(spec)
        self.prompt_len = 0
        self.pending = False  # the last proposal was not empty: its acceptance goes to accept()

    def prefill(self, prompt: list[int], policy: Policy) -> None:
        self.prompt_len, self.pending = len(prompt), False
        self.begin(list(prompt))

    def propose(self, context: list[int], n: int) -> Proposal:
        self.pending = False
        if len(context) <= self.prompt_len or n < 1:
            return Proposal()  # the server has sampled nothing from the prompt yet
        toks = [int(t) for t in self.draft(list(context[:-1]), int(context[-1]))[:n]]
        self.pending = bool(toks)
        return Proposal(toks, [Dist.point(t) for t in toks])

    def accepted(self, context: list[int], n_accepted: int) -> None:
        if self.pending:
            self.pending = False
            self.accept(n_accepted)

    def ended(self, n_accepted: int) -> None:
        """The step that ended the generation (an end-of-generation token) accepted n_accepted drafts: the server
        reports it too (before it stops), to state that outlives the generation."""
        self.accepted([], n_accepted)

    def begin(self, prompt: list[int]) -> None:
        pass

    def draft(self, cached: list[int], id_last: int) -> list[int]:
        raise NotImplementedError

    def accept(self, n_accepted: int) -> None:
        pass


class NgramSimple(LlamaNgramProposer):
    """llama.cpp's ngram-simple: common_ngram_simple_draft (common/ngram-map.cpp), through
    common_speculative_impl_ngram_simple (common/speculative.cpp), which keeps no state (begin and accept do
    nothing). The key is the cache's last size_n - 1 tokens and id_last; its latest occurrence in the cache at a
    position from 1 (position 0 is never searched) gives up to size_m of the tokens after it, none where fewer
    than size_n follow. min_hits is a flag of the type that its code does not read."""

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1):
        super().__init__(LlamaNgram.make("ngram-simple", size_n=size_n, size_m=size_m, min_hits=min_hits))
        self.size_n, self.size_m = size_n, size_m

    def draft(self, cached: list[int], id_last: int) -> list[int]:
        cur, n, m = len(cached), self.size_n, self.size_m
        if cur <= n + m + 1:
            return []
        key = [*cached[cur - n + 1:], id_last]
        match = _last_match(np.asarray(cached), key, 1, cur - n - 1)
        if match == 0:
            return []
        copy = min(m, cur - (match + n))
        return [] if copy < n else cached[match + n:match + n + copy]


class NgramMapK(LlamaNgramProposer):
    """llama.cpp's ngram-map-k (key_only) and ngram-map-k4v: common_ngram_map_begin, common_ngram_map_draft and
    common_ngram_map_accept (common/ngram-map.cpp), through common_speculative_impl_ngram_map_k. State: the keys
    met (their first position, hits and up to 4 values: the m-grams that followed, each with its count and the
    accepted length of its last draft, which caps its next), key_map (an n-gram's hash to a position, the first
    stored wins) and the positions searched so far, all kept across generations (begin() clears only positions
    at or beyond where a shorter new prompt ends). ngram-map-k drafts the size_m tokens after the key's match,
    capped by the last accepted length (min_hits unread); ngram-map-k4v needs min_hits hits of the key and a
    value at least twice as frequent as the others together."""

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, key_only: bool = True):
        kind = "ngram-map-k" if key_only else "ngram-map-k4v"
        super().__init__(LlamaNgram.make(kind, size_n=size_n, size_m=size_m, min_hits=min_hits))
        self.n, self.m, self.min_hits, self.key_only = size_n, size_m, min_hits, key_only
        self.keys: list[dict] = []  # key_idx, stat_idx, key_num, values: [[value_idx, value_num, n_accepted] x 4]
        self.size_last_begin = self.idx_last_check = self.key_map_last_idx = 0
        self.last_created, self.last_key, self.last_value = False, 0, 0
        self.key_map = np.zeros(MAP_HASH, dtype=np.uint32)

    def _hashes(self, arr: np.ndarray, js: np.ndarray) -> np.ndarray:
        """common_ngram_map_hash of the n-grams at positions js, % the key_map's size."""
        h = np.zeros(len(js), dtype=np.uint64)
        for k in range(self.n):  # h < 2^32 and MAP_LCG < 2^32: the product fits 64 bits before the mask
            h = (h * np.uint64(MAP_LCG) + arr[js + k].astype(np.uint64)) & np.uint64(0xFFFFFFFF)
        return (h % np.uint64(MAP_HASH)).astype(np.int64)

    def _store(self, arr: np.ndarray, hi: int, lo: int) -> None:
        """key_map[hash] = j for j from hi down to lo where that entry is still empty (the first stored wins)."""
        if hi < lo:
            return
        js = np.arange(hi, lo - 1, -1, dtype=np.int64)
        h, first = np.unique(self._hashes(arr, js), return_index=True)
        empty = self.key_map[h] == 0
        self.key_map[h[empty]] = js[first[empty]]

    def begin(self, prompt: list[int]) -> None:
        size = len(prompt)
        cleanup = self.size_last_begin
        if cleanup > size:
            cleanup = size - self.n - self.m if size > self.n + self.m else 0
        if size < self.idx_last_check:
            km = self.key_map
            km[(km != 0) & (km >= cleanup)] = 0
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            for i in range(len(self.keys) - 1, -1, -1):
                key = self.keys[i]
                if key["key_idx"] >= cleanup:
                    del self.keys[i]
                    continue
                if self.key_only:
                    continue
                vals = key["values"]
                for j in range(MAP_VALUES - 1, -1, -1):
                    if vals[j][0] != 0 and vals[j][0] >= cleanup:
                        vals[j:MAP_VALUES - 1] = [list(v) for v in vals[j + 1:]]
                        vals[MAP_VALUES - 1] = [0, 0, vals[MAP_VALUES - 1][2]]  # n_accepted stays
                if vals[0][0] == 0:
                    del self.keys[i]
        self.idx_last_check = self.size_last_begin = size

    def draft(self, cached: list[int], id_last: int) -> list[int]:
        self.last_created, self.last_key, self.last_value = False, 0, 0
        inp, cur, n, m = cached, len(cached), self.n, self.m
        if cur < 2 * n + m:
            return []
        self.idx_last_check = cur
        key = [*inp[cur - n + 1:], id_last]
        arr = np.asarray(inp, dtype=np.int64)
        begin, last = self.size_last_begin, self.key_map_last_idx
        match = 0
        at = int(self.key_map[self._hashes(np.asarray(key, dtype=np.int64), np.zeros(1, dtype=np.int64))[0]])
        if at != 0 and at < cur - n - m - 1 and inp[at:at + n] == key:
            match = at
        if match == 0 and begin > n + m + 1:
            match = _last_match(arr, key, last + 1, begin - n - m - 1)
        if match == 0:
            match = _last_match(arr, key, max(begin, last) + 1, cur - n - m - 1)
        if begin > n + m + 1:
            self._store(arr, begin - n - m - 1, last + 1)
        self._store(arr, cur - n - m - 1, max(begin, last) + 1)
        self.key_map_last_idx = max(cur - n - m - 1, last)
        if match == 0:
            return []
        offset = next((i for i, k in enumerate(self.keys) if inp[k["key_idx"]:k["key_idx"] + n] == key),
                      len(self.keys))
        if offset == len(self.keys):
            self.keys.append({"key_idx": match, "stat_idx": 0, "key_num": 0,
                              "values": [[0, 0, m] for _ in range(MAP_VALUES)]})
        k = self.keys[offset]
        k["key_num"] = min(k["key_num"] + 1, MAP_COUNT)
        if self.key_only:
            return self._drafted(inp, match, offset, 0)
        if k["key_num"] < self.min_hits:
            return []
        vals = k["values"]
        for i in _matches(arr, key, k["stat_idx"], match):  # the values after each occurrence up to this one
            i = int(i)
            found = -1
            for v in range(MAP_VALUES):
                at = vals[v][0]
                if at == 0:
                    vals[v] = [i + n, 0, m]
                    found = v
                    break
                if inp[i + n:i + n + m] == inp[at:at + m]:
                    found = v
                    break
            if found >= 0:
                vals[found][1] = min(vals[found][1] + 1, MAP_COUNT)
        k["stat_idx"] = match
        best, top = 0, 0
        for v in range(MAP_VALUES):
            if vals[v][1] > top:
                best, top = v, vals[v][1]
        rest = sum(vals[v][1] for v in range(MAP_VALUES) if v != best)
        if rest > 0 and top < 2 * rest:
            return []  # no value clearly the most frequent
        return self._drafted(inp, match, offset, best)

    def _drafted(self, inp: list[int], match: int, offset: int, value: int) -> list[int]:
        self.last_created, self.last_key, self.last_value = True, offset, value
        n_draft = min(self.m, self.keys[offset]["values"][value][2])
        return inp[match + self.n:match + self.n + max(n_draft, 0)]

    def accept(self, n_accepted: int) -> None:
        if self.last_created:
            self.keys[self.last_key]["values"][self.last_value][2] = n_accepted


class NgramMod(LlamaNgramProposer):
    """llama.cpp's ngram-mod: common_speculative_impl_ngram_mod's begin, draft_one and accept (common/
    speculative.cpp) over common_ngram_mod (common/ngram-mod.cpp): a table of 4M entries, indexed by each
    n_match-gram's hash (res = res * 6364136223846793005 + token mod 2^64, % size), holding the token that last
    followed it. begin() adds the prompt's n-grams (but the last) and empties the table where more than 25% of it
    is used; a draft first adds the cache's new n-grams in chunks (once more than 32 tokens are new), then follows
    the table from the cache's last n_match - 1 tokens and id_last for up to n_max tokens, and drops a draft that
    stops short of n_min. Five drafts in a row accepted under 25% (of the draft before the step's cap cut it)
    empty the table. The table and that streak are kept across generations: begin() resets only how far the cache
    was added and the last draft's length. size: the table's entries (llama.cpp's 4M; smaller in tests)."""

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48, size: int = MOD_SIZE):
        super().__init__(LlamaNgram.make("ngram-mod", n_match=n_match, n_max=n_max, n_min=n_min))
        self.n, self.n_max, self.n_min = n_match, n_max, n_min
        self.entries = np.full(size, MOD_EMPTY, dtype=np.int32)
        self.used = 0
        self.i_last = self.n_draft_last = self.n_low = 0
        self.top = pow(MOD_MUL, n_match - 1, 1 << 64)  # what the oldest token of a window weighs in its hash

    def reset(self) -> None:
        self.entries.fill(MOD_EMPTY)
        self.used = 0

    def _add(self, toks: list[int], lo: int, hi: int) -> None:
        """common_ngram_mod::add of the n-grams at positions lo..hi-1 of toks, in order: each entry holds the token
        that followed its last n-gram; an entry empty before counts once in `used`."""
        if hi <= lo:
            return
        arr = np.asarray(toks[lo:hi + self.n], dtype=np.int64).astype(np.uint64)
        h = np.zeros(hi - lo, dtype=np.uint64)
        for k in range(self.n):  # uint64 arithmetic wraps: mod 2^64
            h = h * np.uint64(MOD_MUL) + arr[k:k + hi - lo]
        idx = (h % np.uint64(len(self.entries))).astype(np.int64)[::-1]
        vals = np.asarray(toks[lo + self.n:hi + self.n], dtype=np.int32)[::-1]
        idx, last = np.unique(idx, return_index=True)  # reversed: the first is the last added
        self.used += int(np.count_nonzero(self.entries[idx] == MOD_EMPTY))
        self.entries[idx] = vals[last]

    def _hash(self, toks: list[int]) -> int:
        res = 0
        for t in toks:
            res = (res * MOD_MUL + t) & MASK64
        return res

    def begin(self, prompt: list[int]) -> None:
        self.i_last = self.n_draft_last = 0
        if len(prompt) < self.n:
            return
        self._add(prompt, 0, len(prompt) - self.n)
        self.i_last = len(prompt) - self.n
        if self.used / len(self.entries) > MOD_FULL:
            self.reset()

    def draft(self, cached: list[int], id_last: int) -> list[int]:
        self.n_draft_last = 0
        cur, n = len(cached), self.n
        if cur < n:
            return []
        if self.i_last + MOD_CHUNK < cur:
            self._add(cached, self.i_last, cur - n)
            self.i_last = cur - n
        seq = [*cached[cur - n + 1:], id_last]
        h, size, out = self._hash(seq), len(self.entries), []
        for i in range(self.n_max):
            tok = int(self.entries[h % size])
            if tok == MOD_EMPTY:
                if i < self.n_min:
                    return []
                break
            out.append(tok)
            seq.append(tok)
            h = ((h - seq[i] * self.top) * MOD_MUL + tok) & MASK64  # the window one token on
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < MOD_LOW:
                self.n_low += 1
                if self.n_low >= MOD_STREAK:
                    self.reset()
                    self.n_low = self.i_last = 0
            else:
                self.n_low = 0


class NgramCache(LlamaNgramProposer):
    """llama.cpp's ngram-cache: common_speculative_impl_ngram_cache's draft_one (begin and accept do nothing). State:
    the context cache and cache_size, how many of the server's tokens it has counted, kept across generations (one
    server's lifetime). A draft first counts the tokens from cache_size on (the cached ones and the token just
    sampled) as one sequence of their own, so no counted n-gram spans two updates: the prompt with the first
    sampled token at the first draft, then each step's accepted drafts and its sampled token (a step that accepted
    none counts nothing); a later request counts only its prompt's tokens beyond the earlier requests' cache_size.
    It then drafts up to n_draft (8) tokens; the dynamic and static caches stay empty."""

    def __init__(self, n_draft: int = NGRAM_CACHE_DRAFT):
        super().__init__(LlamaNgram.make("ngram-cache"))
        self.n_draft = n_draft
        self.cache_size = 0
        self.context: ngramcache.Cache = {}
        self.dynamic: ngramcache.Cache = {}
        self.static: ngramcache.Cache = {}

    def draft(self, cached: list[int], id_last: int) -> list[int]:
        if self.cache_size < len(cached) + 1:
            new = [*cached[self.cache_size:], id_last]
            ngramcache.update(self.context, new, len(new))
            self.cache_size = len(cached) + 1
        return ngramcache.draft([*cached, id_last], self.n_draft, self.context, self.dynamic, self.static)
