"""Replay, pure: the steps of speculative decoding at any gamma from the draft's matches along plain decoding's
output, checked against the loop itself on a scripted engine; expected acceptance under sampling; llama.cpp's rule
under sampling, whose steps are greedy's (the loop samples the plain twin's draws)."""
import numpy as np
import pytest

from harness.analysis.replay import expected, greedy_steps, llama_ngram_steps, ngram_steps
from harness.costmodel import Costs, Step, price
from harness.drafting import Drafting
from harness.llamangram import proposer
from harness.loop import Request, generate
from harness.proposers import DraftModelProposer, NgramProposer
from harness.sampling import Policy
from harness.specs import parse_draft
from harness.trace import TraceWriter
from tests.fakes import EOS, FakeEngine, LogitsEngine, ScriptedProposer

PROMPT = [1, 2, 3]


def loop_steps(script, draft, gamma, max_tokens, proposer=None, prompt=PROMPT):
    target = FakeEngine(len(prompt), script)
    tw = TraceWriter(None, keep=True)
    gen = generate(target, Request("p", prompt, max_tokens), Policy(),
                   proposer or ScriptedProposer(len(prompt), draft), gamma, tw)
    return gen, [Step(r["proposed"], r["accepted"], r["emitted"], r["rejected_at"] is not None)
                 for r in tw.records if r["type"] == "step"]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("ends", ["eos", "max_tokens", "draft_eos"])
def test_greedy_replay_gives_the_loops_own_steps(gamma, ends):
    """The draft proposes draft[j] at output position j; where draft[j] == script[j] it matches. The loop's steps
    and the replay's agree exactly, end of generation and the max_tokens cap included."""
    script = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 5, 6, 7, EOS, 1, 1, 1, 1, 1, 1, 1]
    draft = [5, 6, 9, 8, 9, 10, 3, 12, 13, 14, 15, 4, 2, 6, 7, 1, 1, 1, 1, 1, 1, 1, 1]
    if ends == "draft_eos":
        draft[15] = EOS  # the draft guesses the end too
    max_tokens = 11 if ends == "max_tokens" else 20
    gen, steps = loop_steps(script, draft, gamma, max_tokens)
    n = len(gen["tokens"])
    eos = gen["stop"] == "eos"
    match = [d == t for d, t in zip(draft, script)]
    assert greedy_steps(match, n, max_tokens, gamma, eos) == steps
    assert eos == (ends != "max_tokens")


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_ngram_replay_gives_the_loops_own_steps(gamma):
    script = [4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 9, 9, 4, 5, 6, EOS, 1, 1, 1, 1, 1, 1, 1, 1]
    prop = NgramProposer(2)
    gen, steps = loop_steps(script, None, gamma, 20, proposer=prop)
    assert any(s.accepted for s in steps)
    replay = ngram_steps(PROMPT, gen["tokens"], EOS if gen["stop"] == "eos" else None, 20, gamma,
                         lambda ctx, n: prop.propose(ctx, n).tokens)
    assert replay == steps


# a pattern repeated with variations: drafts accepted, cut short and rejected; the end inside a repeated pattern
# (ngram-mod adds the cache's n-grams once 32 tokens are new)
LLAMA_SCRIPT = [*[4, 5, 6, 7, 8, 4, 5, 6, 7, 9, 4, 5, 6, 7, 8, 4, 5, 6, 9, 9] * 3, 4, 5, 6, EOS, *[1] * 12]


@pytest.mark.parametrize("draft", ["ngram-simple:size-n=2:size-m=3", "ngram-map-k:size-n=2:size-m=3",
                                   "ngram-map-k4v:size-n=1:size-m=3:min-hits=2", "ngram-mod:n-match=2:n-max=4:n-min=1"])
@pytest.mark.parametrize("max_tokens", [80, 50, 64])  # the end token reached; the cap first; the cap at the end
def test_llama_ngram_replay_gives_the_loops_own_steps(draft, max_tokens):
    """llama.cpp's n-gram types keep state across a generation's steps (what was accepted, the table): the replay
    drives a fresh proposer as the loop does and gets its steps exactly (ngram-map-k's here differ where it is
    not told what each step accepted)."""
    spec = parse_draft(draft)
    gen, steps = loop_steps(LLAMA_SCRIPT, None, spec.own_gamma, max_tokens, proposer=proposer(spec))
    assert any(s.accepted for s in steps)
    assert (gen["stop"] == "eos") == (max_tokens > 63)
    replay = llama_ngram_steps(PROMPT, gen["tokens"], EOS if gen["stop"] == "eos" else None, max_tokens, spec)
    assert replay == steps


@pytest.mark.parametrize("max_tokens", [80, 50, 64])
def test_ngram_cache_replay_gives_the_loops_own_steps(max_tokens):
    """ngram-cache counts the prompt (with the first sampled token) whole, then only each step's accepted drafts
    and sampled token: after a prompt of the pattern it drafts, and the replay gets its steps exactly; after
    PROMPT, which holds none of it, it never drafts (a step that accepts nothing counts nothing)."""
    spec, prompt = parse_draft("ngram-cache"), LLAMA_SCRIPT[:20]
    gen, steps = loop_steps(LLAMA_SCRIPT, None, 8, max_tokens, proposer=proposer(spec), prompt=prompt)
    assert any(s.accepted for s in steps) and any(s.rejected for s in steps)
    replay = llama_ngram_steps(prompt, gen["tokens"], EOS if gen["stop"] == "eos" else None, max_tokens, spec)
    assert replay == steps
    _, steps = loop_steps(LLAMA_SCRIPT, None, 8, max_tokens, proposer=proposer(spec))
    assert not any(s.proposed for s in steps)


def test_expected_steps_with_certain_acceptance_are_the_greedy_steps():
    match = [True, True, False, True, False, False, True, True, True, True, False, True]
    for gamma in (1, 2, 4):
        for eos in (False, True):
            n = len(match) - eos
            steps = greedy_steps(match, n, 40, gamma, eos)
            e = expected([float(m) for m in match], n, 40, gamma, eos)
            assert e["steps"] == pytest.approx(len(steps))
            assert e["accepted"] == pytest.approx(sum(s.accepted for s in steps))
            assert e["proposed"] == pytest.approx(sum(s.proposed for s in steps))


def test_expected_acceptance_matches_a_simulation_of_random_acceptances():
    rng = np.random.default_rng(4)
    alpha = rng.uniform(0.2, 0.95, size=40)
    costs = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, overhead_ms_per_row=0.2, draft_curve=(5, 7))
    e = expected(alpha, 40, 40, 3, False, costs)
    sims = []
    for _ in range(4000):
        steps = greedy_steps(list(rng.random(40) < alpha), 40, 40, 3, False)
        sims.append((len(steps), sum(s.accepted for s in steps), sum(price(s.shape(), costs) for s in steps)))
    mean = np.mean(sims, axis=0)
    assert e["steps"] == pytest.approx(mean[0], rel=0.01)
    assert e["accepted"] == pytest.approx(mean[1], rel=0.02)
    assert e["ms"] == pytest.approx(mean[2], rel=0.01)


def test_step_cost_known_values():
    c = Costs(target_ms=[30, 50, 60, 70], draft_ms=5, overhead_ms_per_row=0.5, draft_curve=(5, 7, 8))
    assert price(Step(0, 0, 1).shape(), c) == pytest.approx(30.5)  # a plain step
    assert price(Step(3, 1, 2).shape(), c) == pytest.approx(3 * 5 + 70 + 4 * 0.5)  # rejected at 1
    assert price(Step(3, 3, 4).shape(), c) == pytest.approx(3 * 5 + 2 + 70 + 4 * 0.5)  # all accepted: catch-up
    assert price(Step(2, 0, 1).shape(2), c) == pytest.approx(8 - 5 + 2 * 5 + 60 + 3 * 0.5)


def test_expected_steps_of_a_lookup_proposer_follow_its_own_blocks():
    """An n-gram lookup proposes what it found at the step's start (or nothing: a plain step); with certain
    acceptances the expectation is the exact replay of those proposals."""
    script = [4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 9, 9, 4, 5, 6, 8, 8]
    prop = NgramProposer(2)
    for gamma in (1, 2, 4):
        exact = ngram_steps(PROMPT, script, None, len(script), gamma, lambda c, n: prop.propose(c, n).tokens)
        blocks = []
        for j in range(len(script)):
            x = prop.propose([*PROMPT, *script[:j]], gamma).tokens
            blocks.append([float(t == script[j + i]) if j + i < len(script) else 0.0 for i, t in enumerate(x)])
        e = expected(None, len(script), len(script), gamma, False, blocks=blocks)
        assert e["steps"] == pytest.approx(len(exact))
        assert e["proposed"] == pytest.approx(sum(s.proposed for s in exact))
        assert e["accepted"] == pytest.approx(sum(s.accepted for s in exact))


# -- llama.cpp's rule under sampling, on the loop itself
def _rows(seed: int, n: int, eos_from: int) -> list[dict[int, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w = {t: float(x) for t, x in zip(range(1, 6), rng.uniform(0.1, 1.0, 5))}
        if i >= eos_from:
            w[EOS] = 0.15
        out.append(w)
    return out


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_llamacpps_rule_samples_what_the_plain_twin_sampled(gamma, seed):
    """The premise of replaying llama.cpp's rule exactly, on the loop itself: the target samples with the plain
    twin's draws, so the outputs are equal, and the steps are greedy's from where the draft's top token is the
    output's (here a draft whose top token does not depend on the context)."""
    target, draft = _rows(seed, 40, 12), _rows(seed + 100, 40, 40)
    policy, req = Policy(temperature=0.8, seed=seed), Request("p", PROMPT, 24)
    plain = generate(LogitsEngine(len(PROMPT), target), req, policy)
    tw = TraceWriter(None, keep=True)
    spec = generate(LogitsEngine(len(PROMPT), target), req, policy,
                    DraftModelProposer(LogitsEngine(len(PROMPT), draft), drafting=Drafting("exact")), gamma, tw,
                    rule="exact")
    assert spec["tokens"] == plain["tokens"] and spec["stop"] == plain["stop"]
    out, eos = plain["tokens"], plain["stop"] == "eos"
    forced = [*out, plain["stop_token"]] if eos else out
    match = [max(draft[j], key=draft[j].get) == t for j, t in enumerate(forced)]
    steps = [Step(r["proposed"], r["accepted"], r["emitted"], r["rejected_at"] is not None)
             for r in tw.records if r["type"] == "step"]
    assert greedy_steps(match, len(out), 24, gamma, eos) == steps
