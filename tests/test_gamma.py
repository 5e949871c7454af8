"""gamma.gamma_cap, the one cap on a step's drafts: the replay, the loop and the adaptive controller cap a
step's drafts alike at the end of a generation."""
import pytest

from harness.analysis.replay import Step, expected, greedy_steps
from harness.costmodel import AdaptiveGamma, Costs
from harness.gamma import gamma_cap
from harness.loop import Request, generate
from harness.sampling import Policy
from harness.trace import TraceWriter
from tests.fakes import FakeEngine, ScriptedProposer


PROMPT, N = [10, 1, 2], 9


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
