"""harness.ngramcache: llama.cpp's ngram-cache as a proposer, against hand-worked token sequences: what the cache
counts, the draft's thresholds and order (the longest n-gram first; the context cache, then the dynamic, then the
static), the cap of 8, the state across steps and prompts; in the loop, greedy output equal to plain. (Its spec:
test_specs; against llama.cpp's own code and llama-server: test_llamangram's slow tier.)"""
from __future__ import annotations

import pytest

from harness.llamangram import proposer
from harness.loop import Request, generate
from harness.llamangram import NgramCache
from harness.ngramcache import draft, update
from harness.sampling import Policy
from harness.specs import LlamaNgram, parse_draft
from tests.fakes import FakeEngine


def test_update_counts_each_ngram_of_1_to_4_tokens_and_the_token_after_it():
    c = {}
    update(c, [1, 2, 3, 1, 2], 5)
    assert c == {(1,): {2: 2}, (2,): {3: 1}, (3,): {1: 1},
                 (1, 2): {3: 1}, (2, 3): {1: 1}, (3, 1): {2: 1},
                 (1, 2, 3): {1: 1}, (2, 3, 1): {2: 1},
                 (1, 2, 3, 1): {2: 1}}
    update(c, [1, 2, 3, 1, 2, 3], 1)  # only what ends at the one new token
    assert c[(2,)] == {3: 2} and c[(1, 2)] == {3: 2} and c[(3, 1, 2)] == {3: 1} and c[(2, 3, 1, 2)] == {3: 1}
    assert c[(1,)] == {2: 2}


def one(context, inp=(9, 5), dynamic=None, static=None, n_draft=1):
    return draft(list(inp), n_draft, context, dynamic or {}, static or {})


@pytest.mark.parametrize("part, out", [
    ({7: 2}, [7]),  # 2 of 2: confident
    ({7: 1}, []),  # a sample of 1: under the 1-gram's 2
    ({7: 2, 8: 1}, [7]),  # 67%: not under 66%
    ({7: 3, 8: 2}, []),  # 60%: under 66%
])
def test_a_1gram_drafts_with_a_sample_of_2_and_66_percent(part, out):
    assert one({(5,): part}) == out


def test_longer_ngrams_first_and_each_at_its_own_thresholds():
    assert one({(5,): {7: 5}, (4, 9, 5): {8: 1}}, inp=(4, 9, 5)) == [8]  # a 3-gram's 1 of 1 passes, first
    assert one({(5,): {7: 5}, (9, 5): {8: 1}}) == [7]  # a 2-gram needs a sample of 2: the 1-gram drafts
    assert one({(5,): {7: 5}, (9, 5): {8: 1, 6: 2}}) == [6]  # 67% of 3 is not under 50%
    assert one({(9, 5): {8: 1, 6: 1}}) == [6]  # 50% passes: of two tied, the later counted (libstdc++'s order)
    assert one({(9, 5): {8: 1, 6: 1, 4: 1}}) == []  # 33%


def test_the_dynamic_cache_is_strict_and_the_static_one_validates():
    assert one({}, dynamic={(5,): {7: 3}}) == [] and one({}, dynamic={(5,): {7: 4}}) == [7]  # a sample of 4
    assert one({}, static={(9, 5): {7: 2}}) == [7]  # the static cache's 2-gram alone, last
    assert one({(5,): {7: 1}}, dynamic={(5,): {8: 4}}) == [8]  # the context cache's miss falls to the dynamic
    # a tie in the context cache, broken by the static cache's count (x 100) for the token
    assert one({(9, 5): {7: 1, 8: 1}}) == [8] and one({(9, 5): {7: 1, 8: 1}}, static={(9, 5): {7: 1}}) == [7]


def test_a_draft_follows_its_own_tokens_and_stops_at_n_draft_or_a_miss():
    cyc = {(1,): {1: 5}}
    assert draft([2, 1], 8, cyc, {}, {}) == [1] * 8 and draft([2, 1], 3, cyc, {}, {}) == [1] * 3
    assert draft([9, 5], 8, {(5,): {7: 2}, (7,): {5: 2}, (5, 7, 5): {3: 1}}, {}, {}) == [7, 5, 3]  # (3,): none
    assert draft([5], 8, {(5,): {7: 2}}, {}, {}) == []  # fewer than 2 tokens: none


PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def test_the_first_draft_counts_the_prompt_and_the_sampled_token():
    p = NgramCache()
    p.prefill(PROMPT, Policy())
    assert p.propose(PROMPT, 20).tokens == [] and p.context == {}  # the loop's first step: nothing sampled yet
    # the cache and the sampled 3 counted whole: (3, 1, 2, 3) -> 1, (1, 2, 3, 1) -> 2, ... up to 8 tokens
    assert p.propose([*PROMPT, 3], 20).tokens == [1, 2, 3, 1, 2, 3, 1, 2]
    assert p.cache_size == 9 and p.context[(2, 3)] == {1: 2} and p.context[(3,)] == {1: 2}
    assert p.propose([*PROMPT, 3], 2).tokens == [1, 2]  # cut, as the server's n_max


def test_later_tokens_are_counted_per_step_never_across_two_updates():
    p = NgramCache()
    p.prefill(PROMPT, Policy())
    p.propose([*PROMPT, 3], 20)
    p.accepted([], 0)
    before = {k: dict(v) for k, v in p.context.items()}
    assert p.propose([*PROMPT, 3, 9], 20).tokens == []  # a step that accepted none: [9] alone, nothing counted
    assert p.context == before and p.cache_size == 10
    # two accepted (7, 7) and 8 sampled: [7, 7, 8] counted alone, so (9,) -> 7 is never counted
    p.propose([*PROMPT, 3, 9, 7, 7, 8], 20)
    assert p.context[(7,)] == {7: 1, 8: 1} and p.context[(7, 7)] == {8: 1} and (9,) not in p.context
    assert p.cache_size == 13


def test_the_cache_is_kept_across_prompts_and_a_short_prompt_adds_nothing():
    p = NgramCache()
    p.prefill(PROMPT, Policy())
    p.propose([*PROMPT, 3], 20)
    p.prefill([1, 2], Policy())  # another request to the same server: begin does nothing
    assert p.propose([1, 2, 3], 20).tokens == [1, 2, 3, 1, 2, 3, 1, 2]  # the first prompt's counts
    assert p.cache_size == 9
    p.prefill([5, 5, 5, 5, 5, 5, 5, 5, 5, 6], Policy())
    p.propose([5] * 9 + [6, 6], 20)  # counts only what lies past the 9 counted before: [6, 6]
    assert p.context[(6,)] == {6: 1} and (5,) not in p.context and p.cache_size == 11


def test_spec_and_proposer():
    d = parse_draft("ngram-cache")
    assert d == LlamaNgram.make("ngram-cache") and str(d) == "ngram-cache" and d.own_gamma == 8
    assert d.model_free and not d.server_only and d.server_type == "ngram-cache"
    p = proposer(d)
    assert type(p) is NgramCache and p.name == "ngram-cache" and p.n_draft == 8


def test_in_the_loop_greedy_output_is_plain():
    script = [3, 1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 3, 0] + [15] * 10
    prompt = PROMPT

    class Trace:
        records = []
        write = records.append
    spec = generate(FakeEngine(len(prompt), script), Request("p", prompt, 30), Policy(), NgramCache(), 8, Trace())
    plain = generate(FakeEngine(len(prompt), script), Request("p", prompt, 30), Policy())
    assert spec["tokens"] == plain["tokens"] == script[:13]
    steps = [(r["proposed"], r["accepted"]) for r in Trace.records if r["type"] == "step"]
    assert steps[0] == (0, 0) and steps[1] == (8, 5)  # 1 2 3 1 2 | 4: rejected at the sixth
    assert sum(a for _, a in steps) > 5
