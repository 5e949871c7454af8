"""Concurrent requests: N sequences in one context. The batched cost model (pure) first, then the batched loop
on SmolLM2 against one-at-a-time decoding, the plan's refusals, and a bench run end to end."""
import json
import re
from dataclasses import replace

import pytest

from harness.concurrency.costs import BatchCosts, from_record, predicted_speedup, step_ms
from harness.errors import HarnessError
from harness.plan import Instance, Params, check, expand
from harness.sampling import Policy
from harness.specs import DraftModel
from tests.conftest import PROMPT_FILE
from tests.helpers import diagnostics_md, harness, md_table, one_line_error

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}


def costs(per_seq: float, fixed: float = 40.0, draft_share: float = 0.25, gamma: int = 4,
          counts=(1, 2, 4, 8, 16, 32, 64)) -> BatchCosts:
    """Reading the weights costs `fixed` ms whatever the batch (memory-bound); each token per_seq ms more."""
    return BatchCosts(counts, tuple(fixed + per_seq * m for m in counts),
                      tuple(fixed + per_seq * m * (gamma + 1) for m in counts),
                      tuple(draft_share * (fixed + per_seq * m) for m in counts))


def test_batch_costs_interpolate_between_counts_and_scale_beyond():
    c = BatchCosts((1, 4, 8), (10.0, 16.0, 20.0), (20.0, 40.0, 60.0), (2.0, 3.0, 4.0))
    assert c.plain(1) == 10 and c.plain(6) == pytest.approx(18.0) and c.plain(16) == pytest.approx(40.0)
    assert c.verify(2) == pytest.approx(26.667, abs=1e-3) and c.draft(8) == 4.0
    assert BatchCosts((1,), (5.0,), (9.0,)).draft(3) == 0.0  # a lookup has no draft cost
    # gamma 3, all proposing: three draft decodes of 4 rows, one verification of 4 blocks
    assert step_ms(c, 4, 3, overhead_ms=1.0) == pytest.approx(3 * 3.0 + 40.0 + 1.0)
    assert step_ms(c, 4, 0) == 16.0 and step_ms(c, 4, 3, share=0.0) == 16.0
    assert step_ms(c, 4, 3, share=0.5) == pytest.approx(9.0 + 20.0 + 8.0)


def test_speculation_gains_while_a_step_is_memory_bound_and_loses_once_compute_fills_the_batch():
    c = costs(1.0)
    gains = [predicted_speedup(0.8, 4, c, n, c.plain(n)) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert gains[0] > 1.5 and gains == sorted(gains, reverse=True) and gains[-1] < 1
    assert c.plain(8) / 8 < c.plain(1)  # and plain decoding's throughput grows with n


def test_a_lookup_that_rarely_proposes_costs_only_the_steps_that_do():
    c = costs(2.0, fixed=10.0, draft_share=0.0, gamma=3)
    assert predicted_speedup(1.0, 3, c, 2, c.plain(2), share=0.0) == pytest.approx(1.0)
    assert predicted_speedup(1.0, 3, c, 2, c.plain(2), share=0.5) > 1.0


def test_costs_records_measured_with_sequences_or_as_single_sequence_blocks():
    rec = {"type": "costs", "seqs": [1, 2, 4], "context": 128, "plain_ms": [10, 12, 15], "verify_ms": [20, 30, 50],
           "draft_ms": [3, 4, 6]}
    c = from_record(rec, 500, 3, 4)
    assert c.seqs == (1, 2, 4) and c.verify(3) == 40 and c.draft(4) == 6 and c.draft_catch_up_ms == ()
    c = from_record(rec | {"draft_catch_up_ms": [5, 7, 10]}, 500, 3, 4)
    assert c.ubatch(4, 2, draft=True) == 10 and c.ubatch(2, 1.5, draft=True) == pytest.approx(5.5)
    # a run from before: one sequence's blocks of k tokens, at two contexts, priced at 1 and N sequences
    old = {"contexts": [128, 1024], "k": 16, "ks": [1, 2, 4, 8, 16], "draft_ks": [1, 4],
           "target_ms_by_context": [[10, 12, 15, 18, 30], [20, 22, 25, 28, 40]],
           "draft_ms_by_context": [[2, 4], [4, 6]]}
    c = from_record(old, 576, 3, 4)
    assert c.seqs == (1, 4) and c.plain(1) == pytest.approx(15) and c.verify(1) == pytest.approx(20)
    assert c.verify(4) == pytest.approx(35) and c.draft(4) == pytest.approx(5)
    seq = from_record({"contexts": [128], "k": 4, "target_ms_by_context": [[10, 12, 14, 16]]}, 500, 3, 1)
    assert seq.seqs == (1,) and (seq.plain(1), seq.verify(1)) == (10, 16) and seq.draft_ms == ()


def test_batched_costs_are_measured_with_real_sequences(engines):
    from harness.concurrency.calibrate import batched_costs, sequence_counts
    assert sequence_counts(8) == [1, 2, 4, 8] and sequence_counts(6) == [1, 2, 4, 6] and sequence_counts(1) == [1]
    target, draft = engines
    rec = batched_costs(target, draft, target.vocab.tokenize("The quick brown fox jumps over the lazy dog."), 3, 2,
                        context=32, reps=1)
    assert rec["seqs"] == [1, 2, 3] and rec["context"] == 32
    assert all(len(rec[k]) == 3 and all(x > 0 for x in rec[k])
               for k in ("plain_ms", "verify_ms", "draft_ms", "draft_catch_up_ms"))


def test_parallel_is_swept_labelled_and_keeps_single_sequence_ids():
    p = Params(target=[T], draft=[D], gamma=[2], parallel=[1, 4])
    check(p)
    insts = expand(p)
    assert sorted({(i.parallel, i.setup) for i in insts}) == [(1, ""), (4, "parallel 4")]
    one = Instance(T, DraftModel(D), 2, Policy(**GREEDY), 0, 0, 0)
    assert one.id == replace(one, parallel=1).id  # runs from before --parallel keep theirs
    four = next(i for i in insts if i.parallel == 4 and not i.baseline)
    assert four.plain().parallel == 4
    assert four.engine_config(4096).n_seq == 4 and four.draft_engine_config(4096).n_seq == 4


@pytest.mark.parametrize("params, words", [
    (dict(parallel=[0]), ("--parallel", ">= 1")),
    (dict(parallel=[-2, 2]), ("--parallel", ">= 1")),
    (dict(parallel=[2], gamma=["auto"]), ("auto", "fixed gammas")),
    (dict(parallel=[1, 2], replay=True), ("--replay",)),
    (dict(parallel=[2], until_confident=True), ("--until-confident",)),
    (dict(parallel=[64], gamma=[8]), ("576 tokens per step", "batch size 512")),
])
def test_plan_refuses_what_concurrent_decoding_cannot_run(params, words):
    with pytest.raises(HarnessError) as e:
        check(Params(target=[T], **params))
    assert all(w in str(e.value) for w in words)


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


def test_a_too_small_context_for_n_sequences_is_refused_in_one_line(tmp_path, smol, smol_q2k):
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "3", "--parallel", "1,8", "--categories", "grounded",
                "--per-category", "2", "--max-tokens", "16", "--n-ctx", "1024", "--out", str(tmp_path))
    one_line_error(r, "--parallel 8", "--n-ctx is 1024", "raise --n-ctx to")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    one_line_error(harness("bench", "--target", T, "--parallel", "0", "--out", str(tmp_path)), "--parallel", ">= 1")


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("parallel")
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "2", "--temp", "0,0.7", "--parallel", "1,2,4",
                "--prompts", str(PROMPT_FILE), "--per-category", "3", "--max-tokens", "12", "--paired",
                "--n-ctx", "2048", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    return run, (out / f"{run.name}.md").read_text()


@pytest.mark.slow  # a concurrent sweep of its own: about a minute on 2 cores
def test_bench_reports_verdicts_throughput_latency_and_kv_per_n(parallel_run):
    run, md = parallel_run
    verdicts = md_table(md, "## Verdict per category")
    assert {(r["setup"], r["category"], r["policy"]) for r in verdicts} == {
        (s, c, p) for s in ("", "parallel 2", "parallel 4") for c in ("code", "chat") for p in ("greedy", "T=0.7")}
    assert all("[" in r["speedup [95% CI]"] for r in verdicts)
    rows = md_table(md, "## Concurrent requests")
    assert sorted({r["N"] for r in rows}) == ["1", "2", "4"] and all(r["gamma"] == "2" for r in rows)
    assert all(float(r["spec tok/s (total)"]) > 0 and float(r["plain tok/s (total)"]) > 0 for r in rows)
    assert all(r["predicted"].endswith("x") for r in rows)
    assert re.search(r"Predicted within 10% of the measured speedup in \d+ of 12 row\(s\)\. The same plain work "
                     r"timed twice .* agrees within 10% in \d+ of 12 \(the largest gap \d+%\)", diagnostics_md(run))
    assert "Predicted within 10%" not in md  # a check of the harness's own, in the diagnostics
    n2 = next(r for r in rows if r["N"] == "2")
    assert float(n2["per sequence"]) < float(n2["spec tok/s (total)"])  # two sequences share each step
    assert "the category has 3 prompt(s), so at most 3 ran at once" in md  # N = 4 > 3 prompts: ran what there is
    kv = md_table(md, "KV cache per N")
    used = {r["N"]: int(r["cells in use (peak)"]) for r in kv if r["draft"] == D}
    assert used["1"] < used["2"] < used["4"]  # more sequences hold more cells at once
    assert len({r["KV allocated"] for r in kv if r["draft"] == D}) == 1  # n_ctx, shared among them
    assert (run / "plots" / "concurrency.png").exists()
    assert harness("report", str(run), "--check").returncode == 0


@pytest.mark.slow  # a concurrent sweep of its own: about a minute on 2 cores
def test_bench_traces_hold_each_batch_and_greedy_outputs_stay_lossless(parallel_run):
    run, md = parallel_run
    recs = [json.loads(x) for f in (run / "traces").glob("*.jsonl") for x in f.read_text().splitlines()]
    batches = [r for r in recs if r["type"] == "batch"]
    assert {b["parallel"] for b in batches} == {2, 4} and all(b["slots_used"] <= b["parallel"] for b in batches)
    assert all(b["requests"] == 3 and b["peak_positions"] > 0 and b["decode_ms"] <= b["wall_ms"] for b in batches)
    eq = md_table(diagnostics_md(run), "## Output equivalence (greedy)")
    assert eq and all(r["mismatches"] == "0" for r in eq)


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
