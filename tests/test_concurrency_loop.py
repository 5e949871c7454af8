"""The slots loop (concurrency.loop): N sequences in one context, on SmolLM2 against one-at-a-time decoding, and on
scripted models against the sequential loop's own step records."""

import pytest

from harness.concurrency.loop import BatchedDraft, generate_concurrent
from harness.drafting import Drafting
from harness.loop import Request, generate
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.trace import TraceWriter
from tests.fakes import LogitsEngine
from tests.helpers import BatchedLogits


@pytest.fixture(scope="module")
def engines(smol, smol_q2k):
    from harness.engine import Engine, EngineConfig
    cfg = EngineConfig(n_ctx=3 * 256, n_seq=3, threads=2)
    t, d = Engine(smol, cfg), Engine(smol_q2k, cfg)
    yield t, d
    t.close()
    d.close()


TEXTS = ["The capital of France is", "def fib(n):\n    return", "Once upon a time", "List three colors:",
         "1, 2, 3, 4,"]


def requests(vocab, max_tokens=20):
    from harness.loop import Request
    return [Request(str(i), vocab.tokenize(x), max_tokens, "c") for i, x in enumerate(TEXTS)]


def run_batch(target, reqs, policy, n, proposer, gamma):
    from harness.concurrency.loop import generate_concurrent
    from harness.trace import TraceWriter
    tw = TraceWriter(None, keep=True)
    batch = generate_concurrent(target, reqs, policy, n, proposer, gamma, tw)
    return batch, tw.records


# 10 s each on the Xeon VM: 3 slots (refilled, uneven) in the fast tier, 1 and 2 in the slow
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3])
def test_batched_greedy_outputs_equal_each_request_decoded_alone(engines, n):
    """Five requests through n slots (finished ones refilled): plain, a batched draft and a lookup all give each
    request its own plain greedy output."""
    from harness.concurrency.loop import BatchedDraft
    from harness.loop import generate
    from harness.drafting import Drafting
    from harness.proposers import NgramProposer
    from harness.sampling import Policy
    target, draft = engines
    reqs = requests(target.vocab)
    alone = {r.prompt_id: generate(target, r, Policy())["tokens"] for r in reqs}
    for proposer in (None, BatchedDraft(draft, Drafting()), NgramProposer(2)):
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
    spec = [r for r in run_batch(target, reqs, Policy(), n, BatchedDraft(draft, Drafting()), 3)[1]
            if r["type"] == "step"]
    assert sum(s["accepted"] for s in spec) > 0 and all(s["proposed"] <= 3 for s in spec)


def test_batched_sampling_draws_each_request_from_its_own_streams(engines):
    """Under sampling the verifier runs per sequence with the request's own seeds: a request's output does not
    depend on which others share the batch (n = 1 against n = 3, with the draft's p-min and n-min in play)."""
    from harness.concurrency.loop import BatchedDraft
    from harness.drafting import Drafting
    from harness.sampling import Policy
    target, draft = engines
    reqs = requests(target.vocab, 16)
    pol = Policy(temperature=0.7, top_p=0.9, seed=3)
    outs = []
    for n in (1, 3):
        _, recs = run_batch(target, reqs, pol, n, BatchedDraft(draft, Drafting(p_min=0.2, n_min=2)), 3)
        steps = [r for r in recs if r["type"] == "step"]
        assert all(s["proposed"] == 0 or s["proposed"] >= 2 for s in steps)  # n-min drops shorter drafts
        outs.append({r["prompt_id"]: r["tokens"] for r in recs if r["type"] == "generation"})
    assert outs[0] == outs[1]


def test_a_divergence_in_a_batched_run_is_replayed_in_batches_of_the_same_sequences(engines):
    """The kernel check replays each step beside as many filler sequences as shared it: equal outputs need no
    check, and a token the target does not choose either way is still a mismatch."""
    from harness.concurrency.loop import BatchedDraft
    from harness.divergence import blocks, kernel_check
    from harness.drafting import Drafting
    from harness.sampling import Policy
    target, draft = engines
    reqs = requests(target.vocab)
    _, spec = run_batch(target, reqs, Policy(), 3, BatchedDraft(draft, Drafting()), 3)
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


# -- The two loops share their step (loop.advance), the draft's KV bookkeeping (proposers.DraftKV) and the
# gamma cap: the slots loop with one slot writes the sequential loop's step records.
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
