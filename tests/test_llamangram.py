"""harness.llamangram: llama.cpp's ngram-simple, ngram-map-k(4v) and ngram-mod as proposers, against hand-worked
token sequences (what each drafts after a given history, its drops and resets, its state across steps and
prompts); their specs (parse and str), the plan's expansion and checks, llama-server's flags for them. The slow
tier runs them end to end on SmolLM2, and against llama.cpp's own common_speculative_* built from the sources
(ngram-cache too: its hand-worked tests are test_ngramcache's)."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.llamangram import MOD_MUL, MOD_SIZE, NgramMapK, NgramMod, NgramSimple, proposer
from harness.loop import Request, generate
from harness.llamangram import NgramCache
from harness.instance import Instance
from harness.plan import expand, make_params
from harness.howto import howto
from harness.sampling import Policy
from harness.specs import LlamaNgram, NGram, parse_draft
from tests.fakes import FakeEngine

T = "smollm2-135m-instruct-q4_1"
DATA = Path(__file__).parent / "data"


# -- specs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, canonical", [
    ("ngram-mod", "ngram-mod"),
    ("ngram-mod:n-match=24:n-max=64:n-min=48", "ngram-mod"),  # every flag at its default: the bare type
    ("ngram-mod:n_min=4:n_max=16", "ngram-mod:n-max=16:n-min=4"),  # underscores, any order: arg.cpp's order
    ("ngram-simple:size-n=3:size-m=8", "ngram-simple:size-n=3:size-m=8"),
    ("ngram-map-k:size-m=12", "ngram-map-k:size-m=12"),
    ("ngram-map-k4v:min-hits=2", "ngram-map-k4v:min-hits=2"),
])
def test_a_spec_writes_itself_canonically_and_reads_back(text, canonical):
    d = parse_draft(text)
    assert isinstance(d, LlamaNgram) and str(d) == canonical and parse_draft(str(d)) == d
    assert d.ngram is None and d.model is None and d.model_free and not d.plain


def test_defaults_and_the_longest_draft_are_llama_cpps():
    assert parse_draft("ngram-mod").values == {"n-match": 24, "n-max": 64, "n-min": 48}
    for kind in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        assert parse_draft(kind).values == {"size-n": 12, "size-m": 48, "min-hits": 1}
    assert parse_draft("ngram-mod:n-max=16").own_gamma == 16 and parse_draft("ngram-simple:size-m=5").own_gamma == 5
    assert LlamaNgram.make("ngram-mod", n_max=16) == parse_draft("ngram-mod:n-max=16")
    # the harness's own lookup stays what it was
    assert parse_draft("ngram:2") == NGram(2) and parse_draft("ngram") == NGram(3) and NGram(2).own_gamma is None


# -- ngram-mod ---------------------------------------------------------------------------------------------------


def drafted(p, context, n=64):
    return p.propose(context, n).tokens


def test_mod_adds_the_prompts_ngrams_and_follows_the_table():
    m = NgramMod(n_match=2, n_max=4, n_min=1)
    m.prefill([1, 2, 3, 4, 5, 1, 2], Policy())
    # begin adds the n-grams at 0..4, each with the token after it: (1,2)->3 (2,3)->4 (3,4)->5 (4,5)->1 (5,1)->2
    assert m.used == 5 and m.i_last == 5
    # the hash: res = res * 6364136223846793005 + token (mod 2^64), % 4M
    assert m.entries[((1 * MOD_MUL + 2) % 2**64) % MOD_SIZE] == 3
    assert drafted(m, [1, 2, 3, 4, 5, 1, 2]) == []  # the loop's first step: the server has sampled nothing yet
    # the cache [1 2 3 4 5 1 2] and the token just sampled, 3: (2,3)->4 (3,4)->5 (4,5)->1 (5,1)->2, n-max 4
    assert drafted(m, [1, 2, 3, 4, 5, 1, 2, 3]) == [4, 5, 1, 2]
    assert m.n_draft_last == 4
    assert drafted(m, [1, 2, 3, 4, 5, 1, 2, 3], n=2) == [4, 5] and m.n_draft_last == 4  # cut, as the server's n_max


def test_mod_drops_a_draft_that_stops_short_of_n_min():
    def mod(n_min):
        m = NgramMod(n_match=2, n_max=5, n_min=n_min)
        m.prefill([7, 1, 2, 3, 9, 9], Policy())  # adds (7,1)->2 (1,2)->3 (2,3)->9 (3,9)->9; not the last, (9,9)
        return drafted(m, [7, 1, 2, 3, 9, 9, 4, 1, 2])  # the cache ...4 1, sampled 2: 3 9 9, then (9,9) is empty
    assert mod(3) == [3, 9, 9] and mod(0) == [3, 9, 9]
    assert mod(4) == []  # shorter than n-min: dropped whole


def test_mod_adds_generated_ngrams_in_chunks_of_more_than_32():
    m = NgramMod(n_match=1, n_max=3, n_min=0)
    m.prefill([100], Policy())
    assert m.used == 0 and m.i_last == 0
    assert drafted(m, [*range(100, 132), 101]) == [] and m.used == 0  # 32 tokens in the cache: none added yet
    # 33 in the cache: those at 0..31 added, (100)->101 ... (131)->132, not the last
    assert drafted(m, [*range(100, 133), 101]) == [102, 103, 104]
    assert m.used == 32 and m.i_last == 32


def test_mod_empties_the_table_after_five_low_acceptances_in_a_row():
    m = NgramMod(n_match=1, n_max=4, n_min=0)
    m.prefill([1, 2, 3, 4, 5], Policy())  # (1)->2 (2)->3 (3)->4 (4)->5
    ctx = [1, 2, 3, 4, 5, 1]
    for i in range(4):
        assert drafted(m, ctx) == [2, 3, 4, 5]
        m.accepted(ctx, 0)  # 0/4, under 25%
        assert m.n_low == i + 1
    drafted(m, ctx)
    m.accepted(ctx, 1)  # 1/4: not under 25%, the streak ends
    assert m.n_low == 0 and m.used == 4
    for _ in range(5):
        drafted(m, ctx)
        m.accepted(ctx, 0)
    assert m.n_low == 0 and m.used == 0 and m.i_last == 0 and not (m.entries != -1).any()
    assert drafted(m, ctx) == []


def test_mod_empties_the_table_when_a_prompt_fills_more_than_a_quarter():
    m = NgramMod(n_match=1, n_max=4, n_min=0, size=8)
    m.prefill([1, 2, 3], Policy())  # 2 of 8 used: 25%, not above
    assert m.used == 2
    m.prefill([1, 2, 3, 4], Policy())  # 3 of 8
    assert m.used == 0 and m.i_last == 3  # emptied; where the prompt was added up to is kept


def test_mod_keeps_its_table_and_streak_across_prompts():
    m = NgramMod(n_match=2, n_max=3, n_min=1)
    m.prefill([5, 6, 7, 8, 9, 9], Policy())
    ctx = [5, 6, 7, 8, 9, 9, 5]
    assert drafted(m, [*ctx, 6]) == [7, 8, 9]
    m.accepted([*ctx, 6, 1], 0)
    m.prefill([1, 2, 3], Policy())  # another request to the same server
    assert m.n_low == 1  # begin() leaves the streak
    assert drafted(m, [1, 2, 3, 4, 5, 6]) == [7, 8, 9]  # from the first prompt's n-grams


def test_only_a_step_that_drafted_reports_its_acceptance():
    m = NgramMod(n_match=1, n_max=4, n_min=0)
    m.prefill([1, 2, 3], Policy())
    assert drafted(m, [1, 2, 3]) == []  # the first step
    ctx = [1, 2, 3, 1]
    assert drafted(m, ctx) == [2, 3] and m.n_draft_last == 2
    m.accepted(ctx, 0)
    m.accepted([*ctx, 9], 0)  # a step that proposed nothing (the loop reports every step; the server those that
    assert m.n_low == 1  # drafted)


# -- ngram-simple ------------------------------------------------------------------------------------------------


def simple(size_n, size_m, cached, sampled):
    return NgramSimple(size_n, size_m).draft(cached, sampled)


def test_simple_drafts_what_followed_the_latest_match():
    # key: the cache's last size_n - 1 tokens and the sampled one, [1, 2]; found at 1; size_m 3 tokens after it
    assert simple(2, 3, [9, 1, 2, 3, 4, 7, 1], 2) == [3, 4, 7]
    assert simple(2, 3, [9, 1, 2, 3, 1, 2, 8, 8, 1], 2) == [8, 8, 1]  # the latest of two matches
    assert simple(2, 3, [9, 1, 2, 3, 4, 7], 2) == []  # cache not longer than size_n + size_m + 1


def test_simple_never_searches_position_0_and_drops_a_draft_shorter_than_size_n():
    assert simple(2, 3, [1, 2, 3, 4, 5, 6, 1], 2) == []  # the only match is at position 0
    assert simple(3, 3, [7, 7, 7, 1, 2, 3, 4, 1, 2], 3) == [4, 1, 2]
    assert simple(3, 2, [7, 7, 7, 1, 2, 3, 4, 1, 2], 3) == []  # size-m below size-n: never drafts
    assert simple(2, 4, [8, 8, 8, 8, 8, 1, 2, 5, 1], 2) == [5, 1]  # two follow: as many as size_n, kept


# -- ngram-map-k, ngram-map-k4v ----------------------------------------------------------------------------------


def test_map_k_drafts_after_the_key_and_caps_by_the_last_acceptance():
    m = NgramMapK(size_n=2, size_m=3)
    prompt = [9, 1, 2, 3, 4, 5, 6, 7]
    m.prefill(prompt, Policy())
    ctx = [*prompt, 8, 1, 2]  # the cache ...8 1, sampled 2: key [1, 2], found at 1 (searched from 2 down to 1)
    assert drafted(m, ctx) == [3, 4, 5]
    assert [k["key_idx"] for k in m.keys] == [1] and m.keys[0]["key_num"] == 1
    m.accepted(ctx, 1)
    assert m.keys[0]["values"][0][2] == 1
    ctx = [*ctx, 3, 9, 1, 2]  # found again (key_map now holds it): its next draft is as long as the last accepted
    assert drafted(m, ctx) == [3] and m.keys[0]["key_num"] == 2
    m.accepted(ctx, 0)
    assert drafted(m, [*ctx, 7, 1, 2]) == []  # 0 accepted: this key never drafts again


def test_map_k_never_finds_position_0():
    m = NgramMapK(size_n=2, size_m=3)
    m.prefill([1, 2, 3, 4, 5, 6, 7, 8], Policy())
    assert drafted(m, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]) == []


@pytest.mark.parametrize("after, draft", [([3, 4, 3], [3]),  # [3] twice, [4] once: 2 >= 2 x 1, drafted
                                          ([3, 4, 5], [])])  # once each: none clearly the most frequent
def test_map_k4v_drafts_the_clearly_most_frequent_value(after, draft):
    m = NgramMapK(size_n=2, size_m=1, key_only=False)
    # key [1, 2] at 1, 4, 7, followed by `after`; found at 7 (searched from 12 - 4 = 8 down)
    prompt = [9, 1, 2, after[0], 1, 2, after[1], 1, 2, after[2], 8, 8]
    m.prefill(prompt, Policy())
    assert drafted(m, [*prompt, 7, 1, 2]) == draft  # what followed the match at 7


def test_map_k4v_needs_min_hits_of_the_key():
    m = NgramMapK(size_n=2, size_m=1, min_hits=2, key_only=False)
    prompt = [9, 1, 2, 3, 1, 2, 3, 8, 8]
    m.prefill(prompt, Policy())
    assert drafted(m, [*prompt, 1, 2]) == []  # its first hit
    assert drafted(m, [*prompt, 1, 2]) == [3]  # its second


def test_map_keeps_its_keys_across_prompts_but_those_a_shorter_prompt_cuts():
    m = NgramMapK(size_n=2, size_m=3)
    prompt = [9, 1, 2, 3, 4, 5, 6, 7]
    m.prefill(prompt, Policy())
    drafted(m, [*prompt, 8, 1, 2])
    assert len(m.keys) == 1 and m.key_map.any()
    m.prefill([*prompt, 8, 1, 2, 3, 4], Policy())  # longer than all seen so far: nothing is cleared
    assert len(m.keys) == 1 and m.size_last_begin == 13
    m.prefill([5, 5, 5, 5, 5, 5], Policy())  # shorter: positions from 6 - 2 - 3 = 1 on are cleared
    assert m.keys == [] and not m.key_map.any() and m.key_map_last_idx == 0


# -- in the loop -------------------------------------------------------------------------------------------------


def test_in_the_loop_greedy_output_is_plain_and_the_state_sees_the_last_step():
    # the target's greedy choices: 0 ends the generation, 15 is what it says past the end (in a draft's block)
    script = [3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 0] + [15] * 8
    prompt = [1, 2, 3, 4, 5, 1, 2]
    m = NgramMod(n_match=2, n_max=4, n_min=1)

    class Trace:
        records = []
        write = records.append
    spec = generate(FakeEngine(len(prompt), script), Request("p", prompt, 20), Policy(), m, m.n_max, Trace())
    plain = generate(FakeEngine(len(prompt), script), Request("p", prompt, 20), Policy())
    assert spec["tokens"] == plain["tokens"] == script[:11]
    steps = [(r["proposed"], r["accepted"]) for r in Trace.records if r["type"] == "step"]
    assert steps == [(0, 0), (4, 4), (4, 4), (4, 0)]  # the first step drafts nothing; the last ends on 0
    assert m.n_low == 1  # the last step's 0 of 4 reached the state (LlamaNgramProposer.ended), as in the server


# -- plan, howto ---------------------------------------------------------------------------------------------------


def test_the_plan_gives_a_type_its_own_longest_draft_and_no_draft_model_settings():
    p = make_params({}, {"target": T, "draft": "ngram-mod:n-max=16,ngram:2,ngram-simple:size-n=3:size-m=6",
                         "gamma": "2,4", "draft_p_min": "0.5", "cache_type_k_draft": "q8_0"})
    by = {}
    for i in expand(p):
        by.setdefault(str(i.draft), []).append(i)
    assert sorted(i.gamma for i in by["ngram:2"]) == [2, 4]
    for name, g in (("ngram-mod:n-max=16", 16), ("ngram-simple:size-n=3:size-m=6", 6)):
        (i,) = by[name]  # one configuration, whatever the sweep's gammas
        assert (i.gamma, i.adaptive, i.p_min, i.n_min, i.cache_k_draft) == (g, False, 0.0, 0, "f16")
        assert Instance.from_dict(i.to_dict()).id == i.id and i.to_dict()["draft"] == name
    assert p.to_dict()["draft"] == ["ngram-mod:n-max=16", "ngram:2", "ngram-simple:size-n=3:size-m=6"]


@pytest.mark.parametrize("overrides, words", [
    ({"parallel": "2"}, ["ngram-mod", "--parallel 2"]),
    ({"draft": "ngram-mod:n-max=600"}, ["600", "at most 511"]),
])
def test_the_plan_refuses_what_the_port_does_not_do(overrides, words):
    with pytest.raises(HarnessError) as e:
        make_params({}, {"target": T, "draft": "ngram-mod"} | overrides)
    for w in words:
        assert w in str(e.value), str(e.value)


def server_flags() -> set[str]:
    """The flags llama-server takes, from the parser's list (tests/test_howto.py writes it from arg.cpp)."""
    rows = ((f, set(tools.split(","))) for f, _, tools in
            (line.partition("\t") for line in (DATA / "llama_cpp_0.3.36_flags.txt").read_text().splitlines()))
    return {f for f, tags in rows if tags & {"common", "server"} and "-server" not in tags}


@pytest.mark.parametrize("text, flags", [
    ("ngram-mod", "--spec-type ngram-mod --spec-ngram-mod-n-match 24 --spec-ngram-mod-n-max 64 "
                  "--spec-ngram-mod-n-min 48"),
    ("ngram-simple:size-n=3:size-m=8", "--spec-type ngram-simple --spec-ngram-simple-size-n 3 "
                                       "--spec-ngram-simple-size-m 8 --spec-ngram-simple-min-hits 1"),
    ("ngram-map-k", "--spec-type ngram-map-k --spec-ngram-map-k-size-n 12 --spec-ngram-map-k-size-m 48 "
                    "--spec-ngram-map-k-min-hits 1"),
    ("ngram-map-k4v:min-hits=2", "--spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 12 "
                                 "--spec-ngram-map-k4v-size-m 48 --spec-ngram-map-k4v-min-hits 2"),
    ("ngram-cache", "--spec-type ngram-cache"),  # no flags: it drafts up to 8 tokens
])
def test_howto_gives_llama_servers_flags_for_the_type(text, flags):
    d = parse_draft(text)
    h = howto(Instance("/m/t.gguf", d, d.own_gamma, Policy(), 0, 0, 0), 2048)
    assert h.server == f"llama-server -m /m/t.gguf -ngl 0 -c 2048 -np 1 {flags} --temp 0"
    assert h.speculative_simple is None and h.python is None
    known = server_flags()
    assert all(f in known for f in h.server.split() if f.startswith("-")), h.server
    assert ("state from request to request" in h.note) == (d.kind != "ngram-simple")


def test_proposer_builds_each_type_from_its_spec():
    for text, cls in (("ngram-mod:n-max=8", NgramMod), ("ngram-simple", NgramSimple), ("ngram-map-k", NgramMapK),
                      ("ngram-map-k4v", NgramMapK), ("ngram-cache", NgramCache)):
        p = proposer(parse_draft(text))
        assert type(p) is cls and p.name == text
    assert proposer(parse_draft("ngram-map-k4v")).key_only is False


def test_run_refuses_a_gamma_for_a_type_that_sets_its_own():
    from harness.runner import plan_one
    with pytest.raises(HarnessError) as e:
        plan_one(target=T, draft="ngram-mod", gamma=3)
    assert "ngram-mod drafts up to its own 64 tokens" in str(e.value) and "n-max" in str(e.value)
    inst, _ = plan_one(target=T, draft="ngram-simple:size-m=6")
    assert inst.gamma == 6 and str(inst.draft) == "ngram-simple:size-m=6"


# -- slow: end to end on SmolLM2, and against llama.cpp's own code ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["ngram-mod", "ngram-mod:n-match=3:n-min=1", "ngram-simple:size-n=2:size-m=4",
                                   "ngram-map-k:size-n=2:size-m=4", "ngram-map-k4v:size-n=2:size-m=4", "ngram-cache"])
def test_run_end_to_end_greedy_outputs_equal_plain(smol, draft):
    from tests.helpers import harness
    prompt = "Repeat this list three times, one item a line: apple, banana, cherry, date, elderberry, fig, grape."
    if draft == "ngram-cache":  # it counts its output only where it accepted: a prompt the output copies
        prompt = ("Copy this sentence exactly, twice: The quick brown fox jumps over the lazy dog near the old "
                  "river bank.")
    r = harness("run", T, "--draft", draft, "--prompt", prompt, "--max-tokens", "96", "--baseline")
    assert r.returncode == 0, r.stderr
    summary = r.stdout.rstrip("\n").rsplit("\n", 1)[1]
    assert "outputs equal" in summary and f"draft {draft} gamma" in summary, summary
    if draft != "ngram-mod":  # at its defaults (n-match 24, n-min 48) it drafts nothing in 96 tokens
        assert " proposed 0 " not in summary, summary


def native_build() -> Path | None:
    """`make native`'s build folder, with llama.cpp's common library: HARNESS_NATIVE_BIN's, else the cache's."""
    given = os.environ.get("HARNESS_NATIVE_BIN")
    dirs = [Path(given).parent / "build"] if given else sorted(
        (Path.home() / ".cache/harness/native").glob("*/build"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((d for d in dirs if (d / "common/libllama-common.a").exists()), None)


class Scripted(FakeEngine):
    """A greedy target: its choice at output position i is script[i]; eog: its end-of-generation test (token 0)."""

    def __init__(self, prompt_len, script, eog=None):
        super().__init__(prompt_len, script)
        if eog is not None:
            self.vocab.is_eog = eog

    def decode(self, tokens, logits="last"):
        self.ctx += list(tokens)
        if logits == "none":
            return None
        rows = range(len(self.ctx) - len(tokens), len(self.ctx)) if logits == "all" else [len(self.ctx) - 1]
        out = np.zeros((len(rows), max(self.script) + 1), dtype=np.float32)
        for i, r in enumerate(rows):
            out[i, self.script[r + 1 - self.prompt_len]] = 10.0
        return out


def _text(rng, n, vocab, pool):
    out = []
    while len(out) < n:  # runs copied from earlier text, or fresh tokens
        if pool and rng.random() < 0.7:
            src = pool + out
            a = rng.randrange(len(src))
            out += src[a:a + rng.randint(2, 12)]
        else:
            out += [rng.randint(1, vocab) for _ in range(rng.randint(1, 4))]
    return out[:n]


def _case(rng, kind=None):
    """A type (`kind`, else one of the others at random) with random flags and up to 5 requests to one server:
    prompts, max tokens, plain greedy outputs (some ended by token 0), extended by a token nothing drafts (what the
    target says past the end)."""
    kind = kind or rng.choice(["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v"])
    if kind == "ngram-cache":
        spec = LlamaNgram.make(kind)
    elif kind == "ngram-mod":
        n_max = rng.randint(1, 10)
        spec = LlamaNgram.make(kind, n_match=rng.randint(1, 5), n_max=n_max, n_min=rng.randint(0, n_max + 1))
    else:
        spec = LlamaNgram.make(kind, size_n=rng.randint(1, 4), size_m=rng.randint(1, 8), min_hits=rng.randint(1, 3))
    vocab, reqs, pool = rng.choice([3, 5, 8, 20]), [], []
    for _ in range(rng.randint(1, 5)):
        prompt = _text(rng, rng.randint(1, 120), vocab, pool if rng.random() < 0.5 else [])
        n_predict = rng.randint(1, 150)
        out = _text(rng, n_predict + rng.randint(0, 3), vocab, prompt + pool)
        if rng.random() < 0.4:
            out = out[:rng.randint(0, n_predict - 1)] + [0]
        reqs.append((n_predict, prompt, out + [999] * 1200))
        pool += prompt + out[:n_predict]
    return spec, reqs


@pytest.mark.slow
@pytest.mark.parametrize("kind", [None, "ngram-cache"])  # None: the other types, at random
def test_drafted_and_accepted_equal_llama_cpps_own_code(tmp_path, kind):
    """llama.cpp's common_speculative_init/begin/draft/accept (the calls llama-server makes), compiled from the
    vendored sources against `make native`'s libraries (tests/data/llamangram_driver.cpp), and the harness loop
    with the port, along the same plain outputs of up to 5 requests to one server: per request, the tokens drafted,
    the tokens accepted and the steps that drafted are the same in 200 random cases."""
    build, cxx = native_build(), shutil.which("c++") or shutil.which("g++")
    if build is None or cxx is None:
        pytest.skip("needs `make native`'s build folder and a C++ compiler")
    src = next((build.parent.parent / "src").glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if src is None:
        pytest.skip("needs the llama.cpp sources `make native` built from")
    driver = tmp_path / "driver"
    libs = ["common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a", "ggml/src/libggml.a",
            "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a"]
    subprocess.run([cxx, "-O1", "-std=c++17", *(f"-I{src / d}" for d in ("common", "include", "ggml/include")),
                    str(DATA / "llamangram_driver.cpp"), "-o", str(driver), *(str(build / lib) for lib in libs),
                    "-lpthread", "-ldl", "-fopenmp"], check=True, capture_output=True)
    rng, differ = random.Random(0), []
    for c in range(200):
        spec, reqs = _case(rng, kind)
        lines = [spec.kind + "".join(f" {k}={v}" for k, v in spec.params)]
        for n_predict, prompt, out in reqs:
            lines += [f"{n_predict} 0", " ".join(map(str, prompt)), " ".join(map(str, out))]
        r = subprocess.run([str(driver)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        theirs = [tuple(map(int, x.split())) for x in r.stdout.splitlines() if x.strip()]
        p, ours = proposer(spec), []
        for i, (n_predict, prompt, out) in enumerate(reqs):
            class Trace:
                records = []
                write = records.append
            gen = generate(Scripted(len(prompt), out), Request(f"p{i}", prompt, n_predict), Policy(), p,
                           spec.own_gamma, Trace())
            assert gen["tokens"] == out[:len(gen["tokens"])]
            steps = [x for x in Trace.records if x["type"] == "step" and x["proposed"]]
            ours.append((sum(x["proposed"] for x in steps), sum(x["accepted_raw"] for x in steps), len(steps)))
        if ours != theirs:
            differ.append((c, str(spec), ours, theirs))
    assert differ == []


@pytest.mark.slow
@pytest.mark.parametrize("text", ["ngram-mod:n-match=4:n-min=2", "ngram-simple:size-n=3:size-m=8",
                                  "ngram-map-k:size-n=3:size-m=8", "ngram-cache"])
def test_drafted_and_accepted_equal_llama_servers_along_its_own_outputs(smol, tmp_path, text):
    """The real llama-server (`make native`'s), greedy, one server per type over 6 prompts in order, cache_prompt
    off; then the harness loop with the port teacher-forced along the server's own outputs (the two engines'
    greedy outputs part at kernel near-ties, and a port's state follows its outputs): per prompt, the tokens
    proposed and accepted equal the server's timings draft_n and draft_n_accepted."""
    from harness.crosscheck.binary import native_candidates
    from harness.crosscheck.server import Server, free_port
    from harness.engine import Engine, EngineConfig
    from harness.prompts import load
    binary = next((b for b in native_candidates() if b.is_file() and os.access(b, os.X_OK)), None)
    if binary is None:
        pytest.skip("needs `make native`'s llama-server")
    e = Engine(smol, EngineConfig(n_ctx=512))
    try:
        vocab = e.vocab
        reqs = [(p.id, vocab.tokenize(p.render(vocab)), p.max_tokens) for p in load(per_category=1)]
        eog = [t for t in range(8) if vocab.is_eog(t)]
    finally:
        e.close()
    spec = parse_draft(text)
    flags = [x for k, v in spec.params for x in (f"--spec-{spec.kind}-{k}", str(v))]
    args = ["-m", str(smol), "-c", "4096", "-np", "1", "-ngl", "0", "--temp", "0", "--spec-type", spec.kind, *flags]
    with Server(binary, args, free_port(), tmp_path / f"{spec.kind}.log", "speculative") as srv:
        srv.start(120)
        answers = [srv.complete({"prompt": toks, "n_predict": mt, "cache_prompt": False, "return_tokens": True,
                                 "samplers": ["top_k"], "top_k": 1}, pid, 600) for pid, toks, mt in reqs]
    p, ours, theirs = proposer(spec), [], []
    for (pid, toks, mt), a in zip(reqs, answers):
        out, stop = list(a["tokens"]), [eog[0]]
        if a.get("stop_type") == "eos" and out and out[-1] in eog:
            stop = [out.pop()]
        recs = []

        class Trace:
            write = recs.append
        script = out + stop + [max(out + stop) + 1] * (spec.own_gamma + 2)  # past the end: nothing drafts it
        gen = generate(Scripted(len(toks), script, lambda t: t in eog), Request(pid, toks, mt), Policy(), p,
                       spec.own_gamma, Trace())
        assert gen["tokens"] == out
        steps = [x for x in recs if x["type"] == "step"]
        ours.append((pid, sum(x["proposed"] for x in steps), sum(x["accepted_raw"] for x in steps)))
        theirs.append((pid, a["timings"].get("draft_n", 0), a["timings"].get("draft_n_accepted", 0)))  # absent: 0
    assert ours == theirs, text
    assert sum(x[1] for x in ours) > 0, text

