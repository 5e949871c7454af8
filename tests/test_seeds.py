"""Random streams per generation (loop.streams): from the policy's seed, the prompt and the repeat, so that prompts
and repeats are independent draws, a rerun reproduces them, and a speculative generation shares its plain twin's
(the exact rule then samples what the twin sampled), in the sequential loop and in the slots loop alike."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from harness.concurrency.loop import BatchedDraft, generate_concurrent
from harness.loop import Request, generate, streams
from harness.drafting import Drafting
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.trace import TraceWriter
from tests.fakes import FakeVocab, LogitsEngine, logits_row

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


class BatchedLogits:
    """A sampling model over sequences (LogitsEngine's, batched): a sequence whose prompt starts with token t has
    the logits rows[t][i] at its output position i."""

    def __init__(self, prompt_len: int, rows: dict[int, list[dict[int, float]]]):
        self.prompt_len, self.vocab, self.cfg = prompt_len, FakeVocab(), SimpleNamespace(n_batch=64)
        self.rows = {t: np.stack([logits_row(w) for w in ws]) for t, ws in rows.items()}
        self.first: dict[int, int] = {}

    def decode_rows(self, rows):
        self.first |= {seq: tok for seq, pos, tok, _ in rows if pos == 0}
        out = [self.rows[self.first[seq]][pos + 1 - self.prompt_len] for seq, pos, _, want in rows if want]
        return np.stack(out) if out else None

    def reset(self):
        self.first = {}

    def seq_trim(self, seq, n):
        pass

    def perf_reset(self):
        pass

    def perf(self):
        return {"eval_ms": 0.0, "n_eval": 0}


def test_a_request_keeps_its_streams_in_another_slot():
    """Two slots, three requests: "a" is certain and its drafts always accepted, "b"'s never. Plain, "b" finishes
    first and "c" takes its slot; speculative, "a" does and "c" takes the other. "c" still samples what its plain
    twin sampled: its streams are its request's, not its slot's."""
    rows = 2 * N
    target = BatchedLogits(3, {10: [{5: 1}] * rows, 11: [{2: 1, 3: 1}] * rows, 12: [{1: 1, 2: 1, 3: 1, 4: 1}] * rows})
    draft = BatchedLogits(3, {10: [{5: 1}] * rows, 11: [{9: 1}] * rows, 12: [{9: 1}] * rows})
    reqs = [Request(x, [t, 1, 2], n) for x, t, n in (("a", 10, 6), ("b", 11, 4), ("c", 12, N))]
    out = {}
    for mode, proposer in (("baseline", None), ("speculative", BatchedDraft(draft, Drafting("exact")))):
        tw = TraceWriter(None, keep=True)
        generate_concurrent(target, reqs, POLICY, 2, proposer, 3, tw, mode, rule="exact")
        out[mode] = {r["prompt_id"]: r for r in tw.records if r["type"] == "generation"}
    plain_c, spec_c = out["baseline"]["c"], out["speculative"]["c"]
    assert (plain_c["seq"], spec_c["seq"]) == (1, 0)
    assert spec_c["tokens"] == plain_c["tokens"] and len(set(plain_c["tokens"])) > 1
    assert out["speculative"]["a"]["steps"] == 2 and out["baseline"]["b"]["steps"] == 4
