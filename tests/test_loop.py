"""The speculative loop on real llama.cpp models: lossless greedy output, coherent traces, KV rollback."""
import numpy as np
import pytest

from harness.analysis import metrics
from harness.divergence import blocks, kernel_check
from harness.engine import Engine, EngineConfig
from harness.errors import HarnessError
from harness.loop import Request, check_fits, generate
from harness.proposers import DraftModelProposer, NgramProposer
from harness.sampling import Policy
from harness.trace import TraceWriter
from tests.fakes import EOS, FakeEngine, LogitsEngine, ScriptedProposer
from tests.helpers import engine_pair

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
]
CFG = EngineConfig(n_ctx=512, n_batch=64)


@pytest.fixture(scope="module")
def engines(smol, smol_q2k):
    with engine_pair(smol, smol_q2k, CFG) as pair:
        yield pair


def requests(engine, n_tokens=32):
    out = []
    for i, text in enumerate(PROMPTS):
        toks = engine.vocab.tokenize(engine.vocab.apply_chat_template([{"role": "user", "content": text}]))
        out.append(Request(f"p{i}", toks, n_tokens))
    return out


def test_greedy_speculative_equals_plain_decoding_up_to_kernel_near_ties(engines):
    target, draft = engines
    prop = DraftModelProposer(draft)
    for req in requests(target):
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


def test_trace_records_are_coherent_and_kv_is_rolled_back(engines):
    target, draft = engines
    prop = DraftModelProposer(draft)
    pol = Policy(temperature=0.8, top_p=0.9, seed=5)
    for req in requests(target, 24):
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


def test_loop_tells_the_controller_each_step_but_each_models_warm_up(engines):
    target, draft = engines
    ctl = Scripted([0, 0, 2, 0, 3, 1])
    tw = TraceWriter(None, keep=True)
    generate(target, requests(target, 12)[0], Policy(), DraftModelProposer(draft), ctl, tw)
    steps = [r for r in tw.records if r["type"] == "step"]
    assert ctl.begun == 1  # told that a generation starts (its draft is in sync: no catch-up owed)
    assert [r["gamma"] for r in steps[:6]] == [0, 0, 2, 0, 3, 1]
    assert [n for n, _, _, _ in ctl.calls] == [r["proposed"] for r in steps]
    # alphas only where verification reached: the accepted drafts and the first rejection
    assert [a for _, a, _, _ in ctl.calls] == [min(r["accepted"] + 1, r["proposed"]) for r in steps]
    assert ctl.calls[0][3] is None and all(v > 0 for *_, v in ctl.calls[1:])  # the target's first decode
    assert ctl.calls[2][2] is None and ctl.calls[4][2] > 0 and ctl.calls[5][2] > 0  # the draft's first run


def test_sampled_speculative_run_is_reproducible_for_a_seed(engines):
    target, draft = engines
    req = requests(target, 16)[0]
    pol = Policy(temperature=0.9, top_k=40, seed=11)
    a = generate(target, req, pol, DraftModelProposer(draft), 2)
    b = generate(target, req, pol, DraftModelProposer(draft), 2)
    assert a["tokens"] == b["tokens"]


def test_ngram_proposer_looks_up_what_followed():
    p = NgramProposer(2)
    prop = p.propose([5, 6, 7, 8, 9, 5, 6], 3)
    assert prop.tokens == [7, 8, 9]
    assert all(list(q.ids) == [t] and q.probs[0] == 1.0 for q, t in zip(prop.q, prop.tokens))
    assert p.propose([1, 2, 3], 3).tokens == []
    with pytest.raises(HarnessError, match="n-gram size"):
        NgramProposer(0)


def test_ngram_speculation_on_a_repetitive_prompt(engines):
    target, _ = engines
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


def test_costs_measured_in_the_worker(engines):
    """calibrate.in_situ: the target's blocks with all logits, the draft's with the last row's only."""
    from harness.calibrate import in_situ
    target, draft = engines
    tokens = requests(target)[0].tokens
    rec = in_situ(target, draft, tokens, k_max=3, contexts=(16, 48), reps=2)
    assert rec["type"] == "costs" and rec["contexts"] == [16, 48] and rec["k"] == 3
    for role in ("target_ms_by_context", "draft_ms_by_context"):  # k = 1..3 after each context
        assert [len(x) for x in rec[role]] == [3, 3] and all(v > 0 for x in rec[role] for v in x)
    room = min(target.n_ctx, draft.n_ctx) - 3 - 2  # a context that does not fit is replaced by the largest that does
    assert in_situ(target, None, tokens, k_max=3, contexts=(10 ** 6,), reps=1)["contexts"] == [room]
    assert target.n_past == 0 and draft.n_past == 0  # both left empty for the generations


def test_costs_start_from_the_prompts_cached_state(engines, tmp_path):
    """calibrate.in_situ with the run's prompt cache: each context starts from the longest prompt that fits, as
    the loop evaluates it (all but its last token), which the generation then restores."""
    from harness.calibrate import in_situ
    from harness.promptcache import PromptCache
    target, draft = engines
    reqs = requests(target)
    cache = PromptCache(tmp_path)
    starts = [r.tokens[:-1] for r in reqs]
    short, long = sorted(len(x) for x in starts)[0], max(len(x) for x in starts)
    text = [t for r in reqs for t in r.tokens]
    rec = in_situ(target, draft, text, k_max=3, contexts=(short, long + 20), reps=1, cache=cache, prefixes=starts)
    assert rec["contexts"] == [short, long + 20] and all(v > 0 for x in rec["target_ms_by_context"] for v in x)
    assert cache.counts() == {"restored": 0, "evaluated": 4, "rejected": 0, "unsaved": 0}  # 2 prompts x 2 models
    assert target.n_past == 0 and draft.n_past == 0
    # measured again (after the generations): every start restored
    in_situ(target, draft, text, k_max=3, contexts=(short, long + 20), reps=1, cache=cache, prefixes=starts)
    assert cache.counts()["restored"] == 4
    # the generation of the longest prompt restores what the costs evaluated
    gen = generate(target, max(reqs, key=lambda r: len(r.tokens)), Policy(), DraftModelProposer(draft, cache=cache),
                   2, cache=cache)
    assert gen["prompt_cached"] and cache.counts()["restored"] == 6 and cache.counts()["evaluated"] == 4
