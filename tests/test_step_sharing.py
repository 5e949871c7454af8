"""The two loops share their step (loop.advance), the draft's KV bookkeeping (proposers.DraftKV) and the gamma cap
(gamma.gamma_cap): the slots loop with one slot writes the sequential loop's step records, and the replay, the
loops and the adaptive controller cap a step's drafts alike at the end of a generation."""
import pytest

from harness.analysis.replay import Step, expected, greedy_steps
from harness.concurrency.loop import BatchedDraft, generate_concurrent
from harness.costmodel import AdaptiveGamma, Costs
from harness.gamma import gamma_cap
from harness.loop import Request, generate
from harness.drafting import Drafting
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.trace import TraceWriter
from tests.fakes import FakeEngine, LogitsEngine, ScriptedProposer
from tests.test_seeds import BatchedLogits

PROMPT, N = [10, 1, 2], 9
TARGET = [{1: 3, 2: 1}, {2: 1, 3: 1}, {4: 1}, {1: 1, 5: 2}, {3: 1}, {2: 1, 6: 1}] * 3
DRAFT = [{1: 1}, {2: 1, 3: 2}, {4: 1}, {5: 1}, {3: 1, 2: 1}, {6: 1}] * 3
TIMES = ("draft_ms", "verify_ms", "overhead_ms")


def steps(records) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in records if r["type"] == "step"]


@pytest.mark.parametrize("policy", [Policy(), Policy(temperature=1.0, seed=5)])
@pytest.mark.parametrize("gamma", [0, 3])
def test_one_slot_writes_the_sequential_loops_steps(policy, gamma):
    req = Request("p", PROMPT, N)
    seq_tw, batch_tw = TraceWriter(None, keep=True), TraceWriter(None, keep=True)
    prop = DraftModelProposer(LogitsEngine(len(PROMPT), DRAFT)) if gamma else None
    mode = "speculative" if gamma else "baseline"
    gen = generate(LogitsEngine(len(PROMPT), TARGET), req, policy, prop, gamma, seq_tw, mode)
    draft = BatchedDraft(BatchedLogits(len(PROMPT), {10: DRAFT}), Drafting()) if gamma else None
    generate_concurrent(BatchedLogits(len(PROMPT), {10: TARGET}), [req], policy, 1, draft, gamma, batch_tw, mode)
    batched = [{k: v for k, v in r.items() if k not in ("batch_step", "seq", "active", "batch", "prompt_id",
                                                          "category")} for r in steps(batch_tw.records)]
    assert batched == steps(seq_tw.records)
    assert next(r for r in batch_tw.records if r["type"] == "generation")["tokens"] == gen["tokens"]
    assert len(gen["tokens"]) == N and (not gamma or "d" in gen["from_draft"])


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7])
@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_the_loop_the_replay_and_the_controller_cap_gamma_alike_at_the_end(gamma, max_tokens):
    """Every draft accepted, so the end of the generation is where the cap bites: the loop's gammas are the cap's,
    and the replay (exact and expected) proposes what the loop proposed."""
    script = list(range(1, 15))
    tw = TraceWriter(None, keep=True)
    gen = generate(FakeEngine(len(PROMPT), script), Request("p", PROMPT, max_tokens), Policy(),
                   ScriptedProposer(len(PROMPT), script), gamma, tw)
    recs = [r for r in tw.records if r["type"] == "step"]
    done = [sum(r["emitted"] for r in recs[:i]) for i in range(len(recs))]
    assert [r["gamma"] for r in recs] == [gamma_cap(gamma, max_tokens - j) for j in done]
    assert recs[-1]["gamma"] == min(gamma, max_tokens - 1 - done[-1]) and gen["n_tokens"] == max_tokens
    loop = [Step(r["proposed"], r["accepted"], r["emitted"], r["rejected_at"] is not None) for r in recs]
    assert greedy_steps([True] * max_tokens, max_tokens, max_tokens, gamma, False) == loop
    exp = expected([1.0] * max_tokens, max_tokens, max_tokens, gamma, False)
    assert exp["proposed"] == sum(r["proposed"] for r in recs) and exp["steps"] == len(recs)
    ctl = AdaptiveGamma(Costs(target_ms=[10.0, 10.5, 11.0, 11.5, 12.0], draft_ms=1.0), gamma_max=gamma, prior=0.99)
    assert [ctl.choose(max_tokens - j) for j in done] == [r["gamma"] for r in recs]
