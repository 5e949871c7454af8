"""The time estimate's terms, from given figures (no model is loaded: the probes and the prompts' lengths are
passed in, as bench passes the ones it measured on the idle machine)."""
from dataclasses import replace

import pytest

from harness.bench.estimate import (CHOOSE_S, REPORT_S, WORKER_S, Ledger, Weights, batched_ms, batched_step_costs,
                                    check_ms, evidence_parts, in_situ_ms, remaining_parts, replay_ms, subset_ms,
                                    unit_ms)
from harness.bench.probe import MODEL_S, Figures, Probe
from harness.instance import Instance
from harness.plan import Params
from harness.sampling import Policy
from harness.specs import DraftModel, LlamaNgram, NGram, NoDraft
from harness.prompts import Prompt

T, T2, D = "target-model", "other-target", "draft-model"
GREEDY = Policy()
SAMPLED = Policy(temperature=0.7, top_p=0.9)
# ms, keyed (model, threads, ngl): a prompt token, one decode (neither growing with the context), a further token
# of a block (so a block of k costs 30 + 10 (k - 1) for the target, 10 + 2 (k - 1) for the draft)
PROBES = {(T, 2, 0): Probe(5.0, 0.0, 30.0, 0.0, 10.0), (T2, 2, 0): Probe(5.0, 0.0, 30.0, 0.0, 10.0),
          (D, 2, 0): Probe(2.0, 0.0, 10.0, 0.0, 2.0)}
BASE, SBASE = Instance(T, NoDraft(), 0, GREEDY, 0, 0, 2), Instance(T, NoDraft(), 0, SAMPLED, 0, 0, 2)
SPEC = Instance(T, DraftModel(D), 1, GREEDY, 0, 0, 2)
PARAMS = Params(target=[T], draft=["none", D], max_tokens=32, paired=True, replay_gamma=8)


def prompts(per_category: int, cats=("code", "creative")) -> list[Prompt]:
    # each its own text: an estimate keeps a prompt's length by its digest
    return [Prompt(f"{c}-{i}", c, text=f"{c}-{i} " + "x" * 400, max_tokens=64) for c in cats
            for i in range(per_category)]


def figures(ps: list[Prompt]) -> Figures:
    """Every prompt 100 tokens long under either target."""
    return Figures(dict(PROBES), {(t, p.digest): 100 for t in (T, T2) for p in ps})


# By hand, a greedy gamma-1 unit with its paired twin on 2 prompts of 100 tokens, 32 tokens out each, in round 0:
#   generations: gamma 1 at alpha 0.6 is a draft decode (10) and a verify of 2 (40) for 1.6 tokens, 31.25 ms a
#   token, and the twin's plain 30 ms: 64 x 61.25                                         = 3920
#   prompts: the target's twice (the speculative generation and its twin), the draft's once:
#   2 x 100 x (5 x 2 + 2)                                                                 = 2400
#   the decode costs measured before the generations and after them (calibrate.in_situ), at contexts 100 and
#   132: each context evaluated, then 3 blocks of k = 1..2 at each: target 232 x 5 + 2 x 3 x (30 + 40), draft
#   232 x 2 + 2 x 3 x (10 + 12), twice                                                    = 2 x 2176
COSTS_MS = 2 * 2176
SPEC_MS = 3920 + 2400 + COSTS_MS
# a gamma-3 unit on one of those prompts, its prompts restored: 32 tokens at 90 ms a step (3 draft decodes, a
# verify of 4) for 2.176 tokens, and the twin's 30 ms: 32 x 71.36; the decode costs measured twice at contexts
# 100 and 132 for k = 1..4: target 232 x 5 + 2 x 3 x 180, draft 232 x 2 + 2 x 3 x 52
EXTRA_MS = 32 * (90 / 2.176 + 30) + 2 * (1160 + 1080 + 464 + 312)
# with the prompt cache those contexts start from a prompt's cached 99 tokens (calibrate.fill): 1 + 33 tokens
# evaluated, not 232, by both models (5 and 2 ms a token), twice
FILLED_MS = 2 * (232 - 34) * (5 + 2)
# the plain baseline on the same prompts: 64 x 30 decodes and 2 x 100 x 5 of prompts
BASE_MS = 64 * 30 + 1000


def test_blocks_cost_what_each_size_was_timed_at_and_loads_what_the_probe_took():
    """A 3-token block dearer than a 4-token one (as the Xeon VM's Q4_K_M); beyond the sizes timed, the step, or
    a prompt token's cost where that is less (large batches run at the prompt's rate)."""
    p = Probe(20.0, 0.0, 30.0, 0.02, 10.0, (20.0, 35.0, 30.0), 2.0)
    assert p.blocks(6, 500) == pytest.approx([40, 60, 75, 70, 80, 90])
    cheap = replace(p, prompt_ms=5.0, prompt_growth=0.002)  # a prompt token 5 + 0.002 x 500.5 = 6 ms
    assert cheap.blocks(32, 500)[3:6] == pytest.approx([70, 76.001, 82.002])
    assert cheap.blocks(32, 500)[-1] == pytest.approx(70 + 28 * 6.001)
    # a probe that timed no block sizes (from before they were) keeps the straight line through 1 and 8 tokens
    assert replace(cheap, block_extra_ms=()).blocks(3, 500) == pytest.approx([40, 50, 60])
    ledger = Ledger(cached=False)
    ledger.load(p, PROBES[(D, 2, 0)])
    assert ledger.load_ms == pytest.approx((WORKER_S + 2.0 + MODEL_S) * 1000)


def test_a_unit_by_hand_and_its_load():
    ps = prompts(1)
    ledger = Ledger(cached=False)
    assert unit_ms(SPEC, 0, ps, PARAMS, None, figures(ps), ledger) == pytest.approx(SPEC_MS)
    assert ledger.load_ms == pytest.approx((WORKER_S + 2 * MODEL_S) * 1000)  # the worker, the target, the draft
    # a later round measures no costs; a repeat evaluates each prompt again
    assert unit_ms(SPEC, 1, ps, PARAMS, None, figures(ps), ledger) == pytest.approx(SPEC_MS - COSTS_MS)
    assert unit_ms(SPEC, 1, ps, replace(PARAMS, repeat=2), None, figures(ps), ledger) == \
        pytest.approx(2 * (SPEC_MS - COSTS_MS))


def test_a_llama_ngram_unit_is_priced_as_plain_and_times_its_long_blocks_at_a_few_sizes():
    """ngram-mod drafts up to its n-max of 64 only on a hit, on most steps nothing: its generations are priced as
    plain decoding (with gamma 64 at alpha 0.6 every step was a verify of 65 for 2.5 tokens, 268 ms a token). Its
    decode costs time 11 block sizes (calibrate.block_sizes), not 65."""
    ps = prompts(1)
    mod = Instance(T, LlamaNgram.make("ngram-mod"), 64, GREEDY, 0, 0, 2)
    gens = 64 * (30 + 30) + 2 * 2 * 500  # 2 x 32 tokens at 30 ms and the twin's 30; each prompt twice
    assert unit_ms(mod, 1, ps, PARAMS, None, figures(ps), Ledger(cached=False)) == pytest.approx(gens)
    # before the generations and after them, at contexts 100 and 132: each evaluated, then 3 blocks of each of
    # k = 1..8, 16, 32, 65 at 30 + 10 (k - 1) ms
    blocks = 3 * (11 * 30 + 10 * (36 + 16 + 32 + 65 - 11))
    assert in_situ_ms(PROBES[(T, 2, 0)], (100, 132), 65) == pytest.approx(232 * 5 + 2 * blocks)
    assert unit_ms(mod, 0, ps, PARAMS, None, figures(ps), Ledger(cached=False)) == \
        pytest.approx(gens + 2 * (232 * 5 + 2 * blocks))


def test_with_the_prompt_cache_each_model_evaluates_each_prompt_once_a_run():
    ps = prompts(1)
    todo = [(BASE, 0, ps), (SPEC, 0, ps)]
    without = remaining_parts(todo, [BASE, SPEC], {}, ps, PARAMS, None, {}, figures(ps))
    cached = remaining_parts(todo, [BASE, SPEC], {}, ps, replace(PARAMS, prompt_cache=True), None, {}, figures(ps))
    # without: every use evaluates its prompt; the drift check runs the baseline once more. The plain baseline's
    # unit is the evidence, the speculative one a unit
    assert without == pytest.approx({"evidence": BASE_MS / 1000, "units": SPEC_MS / 1000,
                                     "drift check": BASE_MS / 1000,
                                     "worker starts and model loads": 3 * WORKER_S + 4 * MODEL_S,
                                     "reports": REPORT_S})
    # with: the baseline evaluates the target's prompts (1000 ms), which its speculative unit, twin and drift
    # check restore; the draft evaluates its own once (400 ms); the decode costs start from cached prompts
    assert cached == pytest.approx({"evidence": BASE_MS / 1000, "units": (SPEC_MS - 2000 - FILLED_MS) / 1000,
                                    "drift check": 1.92, "worker starts and model loads": 3 * WORKER_S + 4 * MODEL_S,
                                    "reports": REPORT_S})
    # the evidence split: the baseline's 2 prompts of 100 tokens at 5 ms, its 64 tokens at 30
    for got in (evidence_parts(todo, PARAMS, None, figures(ps)),
                evidence_parts(todo, replace(PARAMS, prompt_cache=True), None, figures(ps))):
        assert got == pytest.approx({"prompt evaluation": 1.0, "generation": 1.92})


def test_progress_weighs_each_prompt_by_its_estimated_time_in_the_runs_order():
    """A sweep's long prompts come last: the first unit to meet one evaluates it, the next restores it."""
    ps = prompts(1)
    fig = figures(ps)
    fig.lengths[(T, ps[1].digest)] = 1000
    w = Weights(replace(PARAMS, prompt_cache=True), fig)
    # the baseline: 32 plain decodes of 30 ms and the prompt at 5 ms a token, 100 and 1000 tokens
    assert w.unit(BASE, ps) == pytest.approx([960 + 500, 960 + 5000])
    # then gamma 1: the target's prompts restored, the draft's evaluated (2 ms a token); 32 tokens at 31.25 ms
    # and the twin's 30 (see SPEC_MS)
    assert w.unit(SPEC, ps) == pytest.approx([1960 + 200, 1960 + 2000])
    # the greedy replay through the draft: its prompts restored, 32 decodes of 10 ms each; ngram proposers free
    assert w.replay(BASE, ps, [DraftModel(D), NGram(3)]) == pytest.approx([320, 320])
    # summed they are the generations of unit_ms, which adds the decode costs measured before and after
    fresh = Weights(PARAMS, fig)
    assert sum(fresh.unit(SPEC, ps)) == pytest.approx(
        unit_ms(SPEC, 1, ps, PARAMS, None, fig, Ledger(cached=False)))


def test_a_drafts_prompt_states_are_shared_across_targets_and_policies():
    ps = prompts(1)
    fig, ledger = figures(ps), Ledger(cached=True)
    for inst in (SPEC, replace(SPEC, target=T2), replace(SPEC, policy=SAMPLED)):
        cfg = inst.draft_engine_config(PARAMS.n_ctx)
        assert ledger.prompts_ms(fig, D, cfg, inst.target, ps) == (400 if inst is SPEC else 0)
    # each target's own
    assert ledger.prompts_ms(fig, T2, SPEC.engine_config(2048), T2, ps) == 1000
    # a batched unit (--parallel) goes without the cache: every use
    assert ledger.prompts_ms(fig, D, SPEC.draft_engine_config(2048), T, ps, uses=2, cacheable=False) == 800


def test_replay_by_hand_greedy_and_sampled():
    ps = prompts(1)
    ledger = Ledger(cached=False)
    # greedy, 2 prompts, k = 1..9 at contexts 100 and 132: the target's measured costs 232 x 5 + 6 x 630; the
    # draft's 232 x 2 + 6 x 162, both twice (before the prompts and after); its prompts 400 and its 64 decodes
    # along the output 640
    greedy = 2 * (4940 + 1436) + 400 + 640
    assert replay_ms(BASE, ps, [D], PARAMS, figures(ps), ledger) == pytest.approx(greedy)
    # sampling: the target's teacher-forced pass (prompts 1000; each output of 32 rows with all their logits, a
    # block: 30 + 31 x 10), the draft's (400; 10 + 31 x 2 each)
    sampled = 2 * (4940 + 1436) + (1000 + 2 * 340) + (400 + 2 * 72)
    assert replay_ms(SBASE, ps, [D], PARAMS, figures(ps), ledger) == pytest.approx(sampled)
    # llama.cpp's rule swept: the draft also decodes along the output a token at a time, from its prompt again
    exact = replace(PARAMS, verify=["leviathan", "exact"])
    assert replay_ms(SBASE, ps, [D], exact, figures(ps), ledger) == pytest.approx(sampled + 400 + 640)
    assert ledger.load_ms == pytest.approx(3 * (WORKER_S + 2 * MODEL_S) * 1000)
    # with the prompt cache each model evaluates each prompt once: the draft in the first replay, the target in
    # its first pass
    ledger = Ledger(cached=True)
    assert replay_ms(BASE, ps, [D], PARAMS, figures(ps), ledger) == pytest.approx(greedy)
    assert replay_ms(SBASE, ps, [D], PARAMS, figures(ps), ledger) == pytest.approx(sampled - 400)
    assert replay_ms(SBASE, ps, [D], exact, figures(ps), ledger) == pytest.approx(sampled + 640 - 1000 - 400)


def test_timed_subset_is_gamma_one_and_the_predicted_best_gamma_on_each_categorys_first_prompts():
    insts = [BASE] + [replace(SPEC, gamma=g) for g in (1, 2, 4)]
    ps = prompts(10)
    firsts = [ps[0], ps[10]]  # code-0, creative-0
    p = replace(PARAMS, timed_subset=1)

    def by_hand(units, fig, cached=False):
        ledger = Ledger(cached)
        return sum(unit_ms(replace(SPEC, gamma=g), 0, on, p, None, fig, ledger) for g, on in units)
    # at alpha 0.6 gamma 1 is predicted best (31.25 ms a token against 35.7 at gamma 2): one unit on both
    # categories' first prompts, and one category's own best gamma allowed for: gamma 3 on code-0 alone
    ledger = Ledger(cached=False)
    assert subset_ms(insts, ps, p, None, figures(ps), ledger) == pytest.approx(SPEC_MS + EXTRA_MS + 2400 / 2)
    assert ledger.load_ms == pytest.approx(2 * (WORKER_S + 2 * MODEL_S) * 1000)
    # with the cache the target evaluates each prompt once, not again for the twin, nor for the second unit; both
    # units' decode costs start from cached prompts
    assert subset_ms(insts, ps, replace(p, prompt_cache=True), None, figures(ps), Ledger(cached=True)) == \
        pytest.approx(SPEC_MS - 1000 + EXTRA_MS - 2 * FILLED_MS)
    # a target whose blocks cost little more than a decode (100 + 5 (k - 1) ms): gamma 2 is predicted best (66.3
    # ms a token against 71.9 at gamma 1), a unit of its own beside gamma 1's, and the allowance at gamma 4
    fig = figures(ps)
    fig.probes[(T, 2, 0)] = Probe(5.0, 0.0, 100.0, 0.0, 5.0)
    ledger = Ledger(cached=False)
    assert subset_ms(insts, ps, p, None, fig, ledger) == pytest.approx(
        by_hand([(2, firsts), (1, firsts), (4, [ps[0]])], fig))
    assert ledger.load_ms == pytest.approx(3 * (WORKER_S + 2 * MODEL_S) * 1000)


def test_a_timed_subset_of_the_answers_prices_one_configuration_per_baseline():
    """timed_scope answers: each answer's configuration alone, priced as the draft model's (the likeliest and
    dearest answer: before the lookup and llama.cpp's types) at its predicted best gamma on both categories'
    first prompts, and at two above on one category's; no gamma-1 check, no unit per proposer."""
    insts = [BASE] + [Instance(T, NGram(3), 1, GREEDY, 0, 0, 2)] + [replace(SPEC, gamma=g) for g in (1, 2, 4)] + \
        [Instance(T, LlamaNgram.make("ngram-mod", n_max=16), 16, GREEDY, 0, 0, 2)]
    ps = prompts(10)
    p = replace(PARAMS, timed_subset=1, timed_scope="answers")
    fig = figures(ps)
    fig.probes[(T, 2, 0)] = Probe(5.0, 0.0, 100.0, 0.0, 5.0)  # gamma 2 predicted best, as above
    ledger = Ledger(cached=False)
    by_hand = sum(unit_ms(replace(SPEC, gamma=g), 0, on, p, None, fig, ledger) for g, on in
                  ((2, [ps[0], ps[10]]), (4, [ps[0]])))
    assert subset_ms(insts, ps, p, None, fig, Ledger(cached=False)) == pytest.approx(by_hand)
    assert subset_ms(insts, ps, replace(p, timed_scope="proposers"), None, fig, Ledger(cached=False)) > 2 * by_hand
    # without a draft model, the lookup's; without either, llama.cpp's type's
    assert subset_ms([BASE, insts[1], insts[-1]], ps, p, None, fig, Ledger(cached=False)) > 0
    assert subset_ms([BASE, insts[-1]], ps, p, None, fig, Ledger(cached=False)) == \
        pytest.approx(unit_ms(insts[-1], 0, [ps[0], ps[10]], p, None, fig, Ledger(cached=False)))


def test_the_timed_subset_times_one_of_llamas_ngram_types_per_baseline_and_policy():
    """bench.subset.choose times the best predicted of a group's n-gram types alone, at its own gamma: sized two
    ways, one unit on each category's first prompt."""
    ps = prompts(10)
    p = replace(PARAMS, timed_subset=1)
    mods = [Instance(T, LlamaNgram.make("ngram-mod", n_max=n), n, GREEDY, 0, 0, 2) for n in (16, 32)]
    one = unit_ms(mods[-1], 0, [ps[0], ps[10]], p, None, figures(ps), Ledger(cached=False))
    assert subset_ms([BASE, *mods], ps, p, None, figures(ps), Ledger(cached=False)) == pytest.approx(one)


def test_the_parts_add_up_for_a_replayed_run_with_a_timed_subset():
    ps = prompts(1)
    p = replace(PARAMS, replay=True, timed_subset=1, prompt_cache=True)
    insts = [BASE, SPEC]
    parts = remaining_parts([(BASE, 0, ps)], insts, {}, ps, p, None, {}, figures(ps))
    ledger = Ledger(cached=True)
    fig = figures(ps)
    by_hand = [unit_ms(BASE, 0, ps, p, None, fig, ledger), replay_ms(BASE, ps, [D], p, fig, ledger),
               subset_ms(insts, ps, p, None, fig, ledger)]
    assert list(parts) == ["evidence", "units", "replay", "timed subset", "worker starts and model loads",
                           "reports"]
    assert list(parts.values()) == pytest.approx([by_hand[0] / 1000, 0, by_hand[1] / 1000,
                                                  by_hand[2] / 1000 + CHOOSE_S, ledger.load_ms / 1000, REPORT_S])
    # no drift check beside a timed subset (its baselines ran on every prompt); the subset restores every prompt:
    # the target's evaluated by the baseline, the draft's by the replay
    assert parts["evidence"] == pytest.approx(BASE_MS / 1000)
    assert parts["replay"] == pytest.approx((2 * (4940 + 1436) + 400 + 640 - FILLED_MS) / 1000)
    assert parts["timed subset"] == pytest.approx((SPEC_MS - 2400 + EXTRA_MS - 2 * FILLED_MS) / 1000 + CHOOSE_S)


def test_several_targets_add_their_fidelity_by_hand():
    """On each category's first prompt (2 here, 100 tokens each), 32 tokens out: the reference evaluates each
    prompt twice (its greedy teacher output, then the teacher-forced pass) and generates 2 + 1 times; the other
    target evaluates each once and generates once (its timed run); each teacher-forces the 32 output tokens, a
    block of 32 rows with their logits (30 + 31 x 10)."""
    ps = prompts(2)
    p = replace(PARAMS, target=[T, T2])
    parts = remaining_parts([], [], {}, ps, p, None, {"timed": True}, figures(ps))
    ref = 2 * 2 * 100 * 5 + 2 * 340 + 3 * 32 * 30
    other = 2 * 100 * 5 + 2 * 340 + 1 * 32 * 30
    assert parts["fidelity"] * 1000 == pytest.approx(ref + other)
    assert "fidelity" not in remaining_parts([], [], {}, ps, PARAMS, None, {"timed": True}, figures(ps))


def test_a_batched_unit_prices_its_batched_calibration():
    """concurrency.calibrate.batched_costs for N = 2, blocks of 3, by hand: 2 sequences of 128 tokens evaluated
    (2 x 128 x 5), then 3 decodes of 1 x 1, 1 x 3, 2 x 1 and 2 x 3 tokens (30 + 50 + 40 + 80); the draft's of
    1 x 1, 1 x 2, 2 x 1 and 2 x 2 (its catch-up: 30 + 40 + 40 + 60)."""
    p = Probe(5.0, 0.0, 30.0, 0.0, 10.0)
    assert batched_ms(p, 2, 3, target=True) == pytest.approx(1280 + 3 * 200)
    assert batched_ms(p, 2, 3, target=False) == pytest.approx(1280 + 3 * 170)


def test_requests_decoded_together_share_each_steps_time():
    """N = 2, gamma 1, by hand: a step's 2 sequences priced as one block of 2 (30 + 10 = 40 ms) plain, a block of
    4 (60) verifying, the draft's 2 decodes as one block of 2 (10 + 2 = 12); the plain baseline's 4 prompts x 32
    tokens then cost 40 / 2 = 20 ms a token rather than 30 one sequence at a time. With one prompt per category
    no two decode together."""
    c = batched_step_costs(replace(SPEC, parallel=2), 2, 100, figures(prompts(2)))
    assert (c.plain(2), c.verify(2), c.draft(2)) == pytest.approx((40, 60, 12))
    assert c.step_ms(0) == pytest.approx(40) and c.step_ms(1) == pytest.approx(12 + 60)  # a step of both
    for ps, saved in ((prompts(2), 4 * 32 * (30 - 20)), (prompts(1), 0)):
        one, two = (unit_ms(replace(BASE, parallel=n), 0, ps, PARAMS, None, figures(ps), Ledger(cached=False))
                    for n in (1, 2))
        assert one - two == pytest.approx(saved)


def test_the_llama_server_check_by_hand():
    """What the budget keeps of the check: per target, one bottom line's (the mean over its policies) on the first
    prompts of every category, POOLED_MIN at least (here both prompts of each of 2 categories: 4 of 100 tokens, 32
    out): a speculative server and its plain twin, each a server start (worker and model load) evaluating the
    prompts and decoding 32 tokens each at the plain pace."""
    ps = prompts(2)
    p = replace(PARAMS, server_check=1)
    parts = remaining_parts([], [BASE, SBASE, SPEC], {}, ps, p, None, {"timed": True}, figures(ps))
    one = 2 * (4 * (100 * 5 + 32 * 30) + (WORKER_S + MODEL_S) * 1000)
    assert list(parts)[-3:] == ["llama-server check", "worker starts and model loads", "reports"]
    assert parts["llama-server check"] * 1000 == pytest.approx(one)
    other = replace(BASE, target=T2)
    two = remaining_parts([], [BASE, SBASE, other], {}, ps, p, None, {"timed": True}, figures(ps))
    assert two["llama-server check"] * 1000 == pytest.approx(2 * one)
    assert "llama-server check" not in remaining_parts([], [BASE], {}, ps, PARAMS, None, {"timed": True},
                                                       figures(ps))


def test_one_check_by_hand():
    """Two prompts of 100 tokens, 32 out each: both servers start (worker and model load), evaluate and generate
    them at the plain pace."""
    got = check_ms(BASE, [(100, 32), (100, 32)], PARAMS, figures([]))
    assert got == pytest.approx(2 * (2 * (100 * 5 + 32 * 30) + (WORKER_S + MODEL_S) * 1000))
