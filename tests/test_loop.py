"""The loop on real llama.cpp models: lossless greedy output, coherent traces, KV rollback, N requests through N
slots against each decoded alone; on scripted models, the random streams per generation and per request in any
slot, lossless sampling through generate() (below), one slot's records against a single generation's."""
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import chisquare

import harness.loop as loop
import harness.verify as verify_mod
from harness.analysis import metrics
from harness.divergence import blocks, kernel_check
from harness.drafting import Drafting
from harness.engine import Engine, EngineConfig
from harness.errors import HarnessError
from harness.loop import Request, check_fits, generate, generate_concurrent, streams
from harness.proposers import DraftModelProposer, NgramProposer
from harness.sampling import Policy
from harness.trace import TraceWriter
from harness.verify import Verdict
from tests.fakes import EOS, V, FakeEngine, LogitsEngine, ScriptedProposer
from tests.helpers import BatchedLogits, chat_requests



def test_greedy_speculative_equals_plain_decoding_up_to_kernel_near_ties(smol_pair):
    target, draft = smol_pair
    prop = DraftModelProposer(draft)
    for req in chat_requests(target):
        bt = TraceWriter(None, keep=True)
        base = generate(target, req, Policy(), trace=bt)
        margins = [r["margin"] for r in bt.records if r["type"] == "step"]
        assert len(margins) == base["n_tokens"] or base["stop"] == "eos"
        for gamma in (1, 2, 4):
            st = TraceWriter(None, keep=True)
            spec = generate(target, req, Policy(), prop, gamma, st)
            found = kernel_check(target, req.tokens, spec["tokens"], blocks(st.records), base["tokens"])
            assert found is None or found["kind"] == "kernel near-tie", (req.prompt_id, gamma, found)
            assert "d" in spec["from_draft"]  # the draft really contributed


def test_trace_records_are_coherent_and_kv_is_rolled_back(smol_pair):
    target, draft = smol_pair
    prop = DraftModelProposer(draft)
    pol = Policy(temperature=0.8, top_p=0.9, seed=5)
    for req in chat_requests(target, 24):
        tw = TraceWriter(None, keep=True)
        gen = generate(target, req, pol, prop, 3, tw)
        steps = [r for r in tw.records if r["type"] == "step"]
        assert sum(s["emitted"] for s in steps) == gen["n_tokens"] == len(gen["tokens"])
        for s in steps:
            assert 0 <= s["accepted"] <= s["proposed"] <= 3
            assert len(s["alpha"]) == s["proposed"]
            assert all(0.0 <= a <= 1.0 + 1e-9 for a in s["alpha"])
            assert (s["rejected_at"] is None) == (s["accepted"] == s["proposed"])
        # the target's cache holds exactly the context but its last token
        assert target.n_past == len(req.tokens) + gen["n_tokens"] - 1
        assert gen["from_draft"].count("d") == sum(s["accepted"] for s in steps)


class Scripted:
    """A gamma controller that plays a fixed schedule and records what the loop tells it."""

    def __init__(self, schedule):
        self.schedule, self.calls, self.begun = list(schedule), [], 0

    def begin(self):
        self.begun += 1

    def choose(self, remaining):
        return min(self.schedule.pop(0) if self.schedule else 0, remaining - 1)

    def observe(self, alphas, proposed, draft_ms, verify_ms):
        self.calls.append((proposed, len(alphas), draft_ms, verify_ms))


def test_loop_tells_the_controller_each_step_but_each_models_warm_up(smol_pair):
    target, draft = smol_pair
    ctl = Scripted([0, 0, 2, 0, 3, 1])
    tw = TraceWriter(None, keep=True)
    generate(target, chat_requests(target, 12)[0], Policy(), DraftModelProposer(draft), ctl, tw)
    steps = [r for r in tw.records if r["type"] == "step"]
    assert ctl.begun == 1  # told that a generation starts (its draft is in sync: no catch-up owed)
    assert [r["gamma"] for r in steps[:6]] == [0, 0, 2, 0, 3, 1]
    assert [n for n, _, _, _ in ctl.calls] == [r["proposed"] for r in steps]
    # alphas only where verification reached: the accepted drafts and the first rejection
    assert [a for _, a, _, _ in ctl.calls] == [min(r["accepted"] + 1, r["proposed"]) for r in steps]
    assert ctl.calls[0][3] is None and all(v > 0 for *_, v in ctl.calls[1:])  # the target's first decode
    assert ctl.calls[2][2] is None and ctl.calls[4][2] > 0 and ctl.calls[5][2] > 0  # the draft's first run


def test_sampled_speculative_run_is_reproducible_for_a_seed(smol_pair):
    target, draft = smol_pair
    req = chat_requests(target, 16)[0]
    pol = Policy(temperature=0.9, top_k=40, seed=11)
    a = generate(target, req, pol, DraftModelProposer(draft), 2)
    b = generate(target, req, pol, DraftModelProposer(draft), 2)
    assert a["tokens"] == b["tokens"]


def test_ngram_speculation_on_a_repetitive_prompt(smol_pair):
    target, _ = smol_pair
    text = "one two three four five six seven eight. " * 4 + "one two three"
    req = Request("rep", target.vocab.tokenize(text, add_special=False), 16)
    tw = TraceWriter(None, keep=True)
    gen = generate(target, req, Policy(), NgramProposer(3), 4, tw)
    base = generate(target, req, Policy())
    assert gen["tokens"][:8] == base["tokens"][:8]
    assert sum(r["accepted"] for r in tw.records if r["type"] == "step") > 0


def test_context_limits_are_refused_up_front():
    with pytest.raises(HarnessError, match="n_ctx"):
        check_fits(500, 100, 4, 512)
    with pytest.raises(HarnessError, match="empty"):
        check_fits(0, 10, 1, 512)


def test_tiny_generated_models_run_the_loop(tiny_set):
    cfg = EngineConfig(n_ctx=256, n_batch=32)
    with Engine(tiny_set["a"], cfg) as t, Engine(tiny_set["b"], cfg) as d:
        req = Request("t", t.vocab.tokenize("hello world, the cat"), 12)
        base = generate(t, req, Policy())
        st = TraceWriter(None, keep=True)
        spec = generate(t, req, Policy(), DraftModelProposer(d), 3, st)
        found = kernel_check(t, req.tokens, spec["tokens"], blocks(st.records), base["tokens"])
        assert found is None or found["kind"] == "kernel near-tie"
        logits = t.decode([1], logits="last")
        assert np.isfinite(logits).all()


def test_an_accepted_draft_end_of_generation_counts_only_what_the_output_contains():
    """The draft proposes [5, EOS, 7, 8]; the target agrees with all four. The output is [5]: one accepted
    draft, not four (the verifier's four stay in the trace as accepted_raw), and no rejection."""
    script = [5, EOS, 7, 8, 9]
    target = FakeEngine(3, script)
    tw = TraceWriter(None, keep=True)
    gen = generate(target, Request("p", [1, 2, 3], 16), Policy(), ScriptedProposer(3, script), 4, tw)
    (step,) = [r for r in tw.records if r["type"] == "step"]
    assert gen["tokens"] == [5] and gen["stop"] == "eos" and gen["from_draft"] == "d"
    assert (step["proposed"], step["accepted"], step["accepted_raw"], step["rejected_at"]) == (4, 1, 4, None)
    row = metrics.summary(tw.records)
    assert row["accepted"] == 1 and row["acceptance_rate"] == pytest.approx(1 / 4)
    assert row["alpha"] == pytest.approx(1.0)  # the one position the output contains


def test_a_rejection_before_the_end_of_generation_is_counted_as_usual():
    script = [5, 6, EOS, 8, 9, 10, 11]
    target = FakeEngine(3, script)
    tw = TraceWriter(None, keep=True)
    gen = generate(target, Request("p", [1, 2, 3], 16), Policy(), ScriptedProposer(3, [5, 4, EOS, 8, 9, 10]), 4, tw)
    steps = [r for r in tw.records if r["type"] == "step"]
    assert gen["tokens"] == [5, 6] and gen["stop"] == "eos"
    assert (steps[0]["accepted"], steps[0]["accepted_raw"], steps[0]["rejected_at"]) == (1, 1, 1)
    assert sum(s["accepted"] for s in steps) == gen["from_draft"].count("d")


# A sampling target scripted per output position, and drafts for each position (tests.fakes.LogitsEngine)
ALPHA_TARGET = [{3: 4, 5: 3, 7: 2, 9: 1}, {2: 1, 4: 1, 6: 2}, {3: 1, 8: 1}, {1: 7, 2: 2, 3: 1}, {4: 1}]
ALPHA_DRAFTS = [5, 6, 8, 3, 4]
# p_target(draft) after T 0.5 over top_p 0.8 (of the raw softmax), by hand:
#   0: raw 0.4 0.3 0.2 0.1, top_p keeps 3 5 7, squared 16 9 4: p(5) = 9/29
#   1: raw 0.5 (6) 0.25 0.25, all kept (0.75 < 0.8), 4 1 1: p(6) = 4/6
#   2: raw 0.5 0.5, both kept: p(8) = 1/2
#   3: raw 0.7 0.2 0.1, top_p keeps 1 2 (0.9): p(3) = 0, though the raw softmax gives it 0.1
ALPHA_BY_POSITION = [9 / 29, 4 / 6, 1 / 2, 0.0]


@pytest.mark.parametrize("rule", ["exact", "leviathan"])
def test_alpha_at_each_drafted_position_is_the_targets_probability_of_the_draft(rule):
    """The exact rule accepts a draft x with probability p(x) (its alpha); so does rejection sampling for a
    point-mass draft (sum min(p, q) = p(x)). Over seeds the steps start at different positions: every drafted
    position's alpha in every step record is checked."""
    target = LogitsEngine(3, ALPHA_TARGET)
    seen = set()
    for seed in range(30):
        tw = TraceWriter(None, keep=True)
        generate(target, Request("p", [1, 2, 3], 5), Policy(temperature=0.5, top_p=0.8, seed=seed),
                 ScriptedProposer(3, ALPHA_DRAFTS), 3, tw, rule=rule)
        pos = 0
        for s in (r for r in tw.records if r["type"] == "step"):
            assert len(s["alpha"]) == s["proposed"]
            for i, a in enumerate(s["alpha"]):
                assert a == pytest.approx(ALPHA_BY_POSITION[pos + i], abs=2e-6), (seed, pos, i)
                seen.add(pos + i)
            pos += s["emitted"]
    assert seen == {0, 1, 2, 3}


# -- Random streams per generation (loop.streams): from the policy's seed, the prompt and the repeat, so that
# prompts and repeats are independent draws, a rerun reproduces them, and a speculative generation shares
# its plain twin's (the exact rule then samples what the twin sampled), in the sequential loop and in the
# slots loop alike.
PROMPT, N = [1, 2, 3], 12
POLICY = Policy(temperature=1.0, seed=7)
SPREAD = [{1: 1, 2: 1, 3: 1, 4: 1}] * (N + 4)  # four tokens alike at every position: outputs tell streams apart


def draws(policy: Policy, req: Request) -> list[list[float]]:
    return [rng.random(4).tolist() for rng in streams(policy, req)]


def plain(req: Request, policy: Policy = POLICY) -> list[int]:
    return generate(LogitsEngine(len(PROMPT), SPREAD), req, policy)["tokens"]


def test_prompts_and_repeats_get_their_own_streams_and_a_rerun_the_same():
    a, b = Request("a", PROMPT, N), Request("b", PROMPT, N)
    assert draws(POLICY, a) == draws(POLICY, Request("a", [9], 1))  # the prompt's id, not its tokens
    assert draws(POLICY, a) != draws(POLICY, b)  # two prompts of one repeat
    assert draws(POLICY, a) != draws(POLICY, replace(a, repeat=1))  # one prompt over repeats
    assert draws(POLICY, a) != draws(replace(POLICY, seed=8), a)
    target, draft = draws(POLICY, a)
    assert target != draft
    # through the loop: the same identical prompts sample differently, and a rerun samples the same again
    assert plain(a) != plain(b) and plain(a) != plain(replace(a, repeat=1))
    assert plain(a) == plain(Request("a", PROMPT, N))


def test_a_sampled_draft_is_reproducible():
    """The draft samples from its own stream, which a rerun of the same prompt and repeat reproduces."""
    def spec(req):
        prop = DraftModelProposer(LogitsEngine(len(PROMPT), SPREAD))
        return generate(LogitsEngine(len(PROMPT), SPREAD), req, POLICY, prop, 3)
    a = Request("a", PROMPT, N)
    assert spec(a)["tokens"] == spec(a)["tokens"] and spec(a)["from_draft"] == spec(a)["from_draft"]
    assert spec(a)["tokens"] != spec(replace(a, repeat=1))["tokens"]


def test_the_exact_rule_samples_what_the_plain_twin_sampled():
    """The exact rule's target samples each emitted token with the generation's stream, as plain sampling does:
    token for token the twin's output, the draft's accepted tokens included."""
    target = [{3: 3, 5: 1}] * (N + 4)  # the draft's top token 3 has p 0.75: accepted and rejected both
    for i in range(5):
        req = Request(f"p{i}", PROMPT, N)
        prop = DraftModelProposer(LogitsEngine(len(PROMPT), [{3: 1}] * (N + 4)), drafting=Drafting("exact"))
        spec = generate(LogitsEngine(len(PROMPT), target), req, POLICY, prop, 3, rule="exact")
        twin = generate(LogitsEngine(len(PROMPT), target), req, POLICY)
        assert spec["tokens"] == twin["tokens"] and "d" in spec["from_draft"]


def test_a_request_keeps_its_streams_in_another_slot():
    """Two slots, three requests: "a" is certain and its drafts always accepted, "b"'s never. Plain, "b" finishes
    first and "c" takes its slot; speculative, "a" does and "c" takes the other. "c" still samples what its plain
    twin sampled: its streams are its request's, not its slot's."""
    rows = 2 * N
    target = BatchedLogits(3, {10: [{5: 1}] * rows, 11: [{2: 1, 3: 1}] * rows, 12: [{1: 1, 2: 1, 3: 1, 4: 1}] * rows})
    draft = BatchedLogits(3, {10: [{5: 1}] * rows, 11: [{9: 1}] * rows, 12: [{9: 1}] * rows})
    reqs = [Request(x, [t, 1, 2], n) for x, t, n in (("a", 10, 6), ("b", 11, 4), ("c", 12, N))]
    out = {}
    for mode, proposer in (("baseline", None), ("speculative", DraftModelProposer(draft, drafting=Drafting("exact")))):
        tw = TraceWriter(None, keep=True)
        generate_concurrent(target, reqs, POLICY, 2, proposer, 3, tw, mode, rule="exact")
        out[mode] = {r["prompt_id"]: r for r in tw.records if r["type"] == "generation"}
    plain_c, spec_c = out["baseline"]["c"], out["speculative"]["c"]
    assert (plain_c["seq"], spec_c["seq"]) == (1, 0)
    assert spec_c["tokens"] == plain_c["tokens"] and len(set(plain_c["tokens"])) > 1
    assert out["speculative"]["a"]["steps"] == 2 and out["baseline"]["b"]["steps"] == 4


# -- Lossless sampling through generate() itself: with a sampled draft and either verification rule, each
# output position's token is distributed as the target's own (plain sampling), over many policy seeds;
# broken verifiers fail the same chi-square test. The target and the draft are scripted
# (fakes.LogitsEngine): their logits depend on the position only, so each position's distribution is
# worked out by hand.
TARGET = [{3: 4, 5: 3, 7: 2, 9: 1}, {2: 1, 4: 1, 6: 2}, {3: 1, 8: 1}]
DRAFT = [{5: 4, 9: 3, 3: 2, 11: 1}, {4: 3, 6: 1}, {8: 2, 3: 1}]
POLICY_ARGS = {"temperature": 0.5, "top_p": 0.8}
# top_p on the raw softmax, then T 0.5 (weights squared). Position 0: raw 0.4, 0.3, 0.2, 0.1; top_p keeps 3, 5, 7
# (0.9 >= 0.8); 16, 9, 4. Position 1: raw 0.5 (6), 0.25, 0.25, all kept (0.75 < 0.8); 4, 1, 1. Position 2: 1, 1.
P = [{3: 16 / 29, 5: 9 / 29, 7: 4 / 29}, {2: 1 / 6, 4: 1 / 6, 6: 4 / 6}, {3: 1 / 2, 8: 1 / 2}]
# The draft's q, processed alike: position 0 5, 9, 3 at 16, 9, 4 / 29 (9 is outside p: always rejected); position 1
# 4, 6 at 0.9, 0.1; position 2 8, 3 at 0.8, 0.2. The exact rule drafts the top tokens 5, 4, 8.
GAMMA = 2
# Enough for the weakest mutant below: resampling from p has noncentrality 1000 x 0.144 = 144 at position 0
# (it emits 3, 5, 7 w.p. 0.442, 0.482, 0.076), the coin 1000 x 0.214: p < 1e-6 all but surely.
SEEDS = 1000
PASS, FAIL = 1e-4, 1e-6


def emitted(rule: str | None) -> tuple[np.ndarray, int]:
    """[position, token] counts of the generated tokens over SEEDS policy seeds, and the drafts accepted;
    rule None: plain sampling."""
    target = LogitsEngine(len(PROMPT), TARGET)
    draft = None if rule is None else DraftModelProposer(LogitsEngine(len(PROMPT), DRAFT), drafting=Drafting(rule))
    counts, accepted = np.zeros((len(P), V)), 0
    for seed in range(SEEDS):
        gen = generate(target, Request("p", PROMPT, len(P)), Policy(**POLICY_ARGS, seed=seed), draft,
                       GAMMA if draft else 0, rule=rule or "leviathan")
        counts[np.arange(len(P)), gen["tokens"]] += 1
        accepted += gen["from_draft"].count("d")
    return counts, accepted


def pvalues(counts: np.ndarray) -> list[float]:
    """Per position, the chi-square p-value of its counts against P (0 when a token outside P's support came)."""
    out = []
    for c, p in zip(counts, P):
        ids = sorted(p)
        if c.sum() != c[ids].sum():
            out.append(0.0)
            continue
        out.append(float(chisquare(c[ids], np.array([p[i] for i in ids]) * c.sum()).pvalue))
    return out


def test_plain_sampling_draws_the_hand_worked_distribution():
    counts, _ = emitted(None)
    assert min(pvalues(counts)) > PASS


@pytest.mark.parametrize("rule", ["leviathan", "exact"])
def test_speculative_sampling_through_generate_is_lossless(rule):
    counts, accepted = emitted(rule)
    # (the exact rule draws each emitted token from the target's p with the generation's own seeded stream, one
    # draw a token as plain sampling does: here its counts come out as plain sampling's)
    assert min(pvalues(counts)) > PASS
    assert 0.2 * SEEDS < accepted < 1.5 * SEEDS  # drafts were both accepted and rejected


def always_accept(draft, *args):
    p, rng = args[-2:]
    return Verdict(len(draft), p[len(draft)].sample(rng), [])


def coin(draft, ps, rng):
    """The exact rule on a coin: accept with probability p(x), then correct with a fresh draw from p (x included)."""
    for i, x in enumerate(draft):
        if rng.random() >= ps[i].prob(int(x)):
            return Verdict(i, ps[i].sample(rng), [])
    return Verdict(len(draft), ps[len(draft)].sample(rng), [])


@pytest.mark.parametrize("rule, mutant", [("leviathan", "always_accept"), ("exact", "always_accept"),
                                          ("leviathan", "resample_from_p"), ("exact", "coin")])
def test_a_broken_verifier_fails_through_generate(rule, mutant, monkeypatch):
    if mutant == "resample_from_p":  # after a rejection, p rather than norm(max(0, p - q))
        monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    else:
        monkeypatch.setattr(loop, "verify_stochastic" if rule == "leviathan" else "verify_exact",
                            always_accept if mutant == "always_accept" else coin)
    counts, _ = emitted(rule)
    assert min(pvalues(counts)) < FAIL


# -- N sequences in one context (generate_concurrent)
TEXTS = ["The capital of France is", "def fib(n):\n    return", "Once upon a time", "List three colors:",
         "1, 2, 3, 4,"]


def batch_requests(vocab, max_tokens=20):
    return [Request(str(i), vocab.tokenize(x), max_tokens, "c") for i, x in enumerate(TEXTS)]


def run_batch(target, reqs, policy, n, proposer, gamma):
    tw = TraceWriter(None, keep=True)
    batch = generate_concurrent(target, reqs, policy, n, proposer, gamma, tw)
    return batch, tw.records


# 10 s each on the Xeon VM: 3 slots (refilled, uneven) in the fast tier, 1 and 2 in the slow
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3])
def test_batched_greedy_outputs_equal_each_request_decoded_alone(smol_slots, n):
    """Five requests through n slots (finished ones refilled): plain, a batched draft and a lookup all give each
    request its own plain greedy output."""
    target, draft = smol_slots
    reqs = batch_requests(target.vocab)
    alone = {r.prompt_id: generate(target, r, Policy())["tokens"] for r in reqs}
    for proposer in (None, DraftModelProposer(draft, drafting=Drafting()), NgramProposer(2)):
        batch, recs = run_batch(target, reqs, Policy(), n, proposer, 3)
        gens = [r for r in recs if r["type"] == "generation"]
        assert {g["prompt_id"]: g["tokens"] for g in gens} == alone
        assert batch["requests"] == 5 and batch["tokens"] == sum(len(t) for t in alone.values())
        steps = [r for r in recs if r["type"] == "step"]
        assert max(s["active"] for s in steps) == n and all(s["batch"] <= n * 4 for s in steps)
        for g in gens:  # each request's steps add up to its output
            mine = [s for s in steps if s["prompt_id"] == g["prompt_id"]]
            assert sum(s["emitted"] for s in mine) == g["n_tokens"] and len(mine) == g["steps"]
            assert g["gen_ms"] <= g["latency_ms"]
    spec = [r for r in run_batch(target, reqs, Policy(), n, DraftModelProposer(draft, drafting=Drafting()), 3)[1]
            if r["type"] == "step"]
    assert sum(s["accepted"] for s in spec) > 0 and all(s["proposed"] <= 3 for s in spec)


def test_batched_sampling_draws_each_request_from_its_own_streams(smol_slots):
    """Under sampling the verifier runs per sequence with the request's own seeds: a request's output does not
    depend on which others share the batch (n = 1 against n = 3, with the draft's p-min and n-min in play)."""
    target, draft = smol_slots
    reqs = batch_requests(target.vocab, 16)
    pol = Policy(temperature=0.7, top_p=0.9, seed=3)
    outs = []
    for n in (1, 3):
        _, recs = run_batch(target, reqs, pol, n, DraftModelProposer(draft, drafting=Drafting(p_min=0.2, n_min=2)), 3)
        steps = [r for r in recs if r["type"] == "step"]
        assert all(s["proposed"] == 0 or s["proposed"] >= 2 for s in steps)  # n-min drops shorter drafts
        outs.append({r["prompt_id"]: r["tokens"] for r in recs if r["type"] == "generation"})
    assert outs[0] == outs[1]


def test_a_divergence_in_a_batched_run_is_replayed_in_batches_of_the_same_sequences(smol_slots):
    """The kernel check replays each step beside as many filler sequences as shared it: equal outputs need no
    check, and a token the target does not choose either way is still a mismatch."""
    target, draft = smol_slots
    reqs = batch_requests(target.vocab)
    _, spec = run_batch(target, reqs, Policy(), 3, DraftModelProposer(draft, drafting=Drafting()), 3)
    _, plain = run_batch(target, reqs, Policy(), 3, None, 0)
    mine = [r for r in spec if r.get("prompt_id") == "1"]
    steps = blocks(mine)
    assert max(s[2] for s in steps) == 2  # two other sequences shared its steps
    out = mine[-1]["tokens"]
    others = [r["active"] - 1 for r in plain if r.get("prompt_id") == "1" and r["type"] == "step"]
    assert kernel_check(target, reqs[1].tokens, out, steps, out, others) is None
    forged = out[:2] + [(out[2] + 1) % target.n_vocab] + out[3:]
    found = kernel_check(target, reqs[1].tokens, forged, steps, out, others)
    assert found["kind"] == "mismatch" and found["diverged_at"] == 2 and found["plain_argmax"] == out[2]


# -- A single generation is a batch of one: generate() writes generate_concurrent's one-slot step records, less
# the fields that place a step in a batch.
SLOT_PROMPT, SLOT_N = [10, 1, 2], 9
SLOT_TARGET = [{1: 3, 2: 1}, {2: 1, 3: 1}, {4: 1}, {1: 1, 5: 2}, {3: 1}, {2: 1, 6: 1}] * 3
SLOT_DRAFT = [{1: 1}, {2: 1, 3: 2}, {4: 1}, {5: 1}, {3: 1, 2: 1}, {6: 1}] * 3
TIMES = ("draft_ms", "verify_ms", "overhead_ms")


def steps(records) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in records if r["type"] == "step"]


@pytest.mark.parametrize("policy", [Policy(), Policy(temperature=1.0, seed=5)])
@pytest.mark.parametrize("gamma", [0, 3])
def test_a_single_generation_is_a_batch_of_one(policy, gamma):
    req = Request("p", SLOT_PROMPT, SLOT_N)
    seq_tw, batch_tw = TraceWriter(None, keep=True), TraceWriter(None, keep=True)
    prop = DraftModelProposer(LogitsEngine(len(SLOT_PROMPT), SLOT_DRAFT)) if gamma else None
    mode = "speculative" if gamma else "baseline"
    gen = generate(LogitsEngine(len(SLOT_PROMPT), SLOT_TARGET), req, policy, prop, gamma, seq_tw, mode)
    draft = DraftModelProposer(BatchedLogits(len(SLOT_PROMPT), {10: SLOT_DRAFT})) if gamma else None
    target = BatchedLogits(len(SLOT_PROMPT), {10: SLOT_TARGET})
    generate_concurrent(target, [req], policy, 1, draft, gamma, batch_tw, mode)
    batched = [{k: v for k, v in r.items() if k not in ("batch_step", "seq", "active", "batch", "prompt_id",
                                                          "category")} for r in steps(batch_tw.records)]
    assert batched == steps(seq_tw.records)
    assert next(r for r in batch_tw.records if r["type"] == "generation")["tokens"] == gen["tokens"]
    assert len(gen["tokens"]) == SLOT_N and (not gamma or "d" in gen["from_draft"])


def test_the_adaptive_controller_runs_at_one_slot_and_is_refused_in_a_batch():
    """One loop: the controller a single generation takes (above) is refused with two slots, in one line."""
    ctl = Scripted([1] * 20)
    target = BatchedLogits(len(SLOT_PROMPT), {10: SLOT_TARGET})
    draft = DraftModelProposer(BatchedLogits(len(SLOT_PROMPT), {10: SLOT_DRAFT}))
    with pytest.raises(HarnessError, match="one sequence's steps"):
        generate_concurrent(target, [Request("p", SLOT_PROMPT, SLOT_N)], Policy(), 2, draft, ctl)
