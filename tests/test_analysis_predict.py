"""The replay's predictions against what they stand for (analysis.predict), pure: the plain twin costs the plain
time measured (its end-of-generation decode counted once), llama.cpp's rule under sampling is predicted from its
matches, the decode costs' own spread widens the predicted intervals by what it implies, a timed configuration's
own costs replace the replay's, and the bound a prediction's own costs allow."""
import math

import polars as pl
import pytest

from harness.analysis.intervals import interval
from harness.analysis.predict import generation, plain_decode_ms, predictions
from harness.costmodel import read
from harness.specs import parse_draft
from tests.conftest import D
from tests.fakes import EOS

N, P, T1, T2, D1, D2, OH = 10, 20.0, 19.0, 30.0, 4.0, 6.0, 0.5  # P: plain ms per decode
STEP = D1 + T2 + 2 * OH  # a step proposing one draft, rejected: its draft, a block of 2, their rows' overhead


def records(policy="greedy", spread=None, **rep) -> list[dict]:
    """One prompt whose output ended at the end-of-generation token after N tokens, one draft "d", its costs."""
    common = {"config": "b", "policy": policy, "category": "code", "prompt_id": "p1", "repeat": 0}
    costs = {"type": "costs", "config": "b", "policy": policy, "proposer": "d", "contexts": [100], "k": 4,
             "target_ms_by_context": [[T1, T2, 38.0, 45.0]], "draft_ms_by_context": [[D1, D2, 8.0, 10.0]],
             "overhead_ms": OH}
    if spread is not None:  # the block of 2 only
        costs |= {"reps": 3, "target_sd_by_context": [[0.0, spread, 0.0, 0.0]], "draft_sd_by_context": [[0.0] * 4]}
    return [{"type": "replay_prompt", **common, "prompt_tokens": list(range(1, 91)), "tokens": [5] * N,
             "stop_token": EOS, "max_tokens": 64},
            {"type": "replay", **common, "proposer": "d", **(rep or {"match": [0] * (N + 1)})}, costs]


def row(rows: list[dict], gamma=1, verify="leviathan") -> dict:
    return next(r for r in rows if r["gamma"] == gamma and not r["adaptive"] and r["verify"] == verify)


def test_the_plain_twin_takes_the_measured_plain_time():
    """Plain decoding measured N tokens and an end in N + 1 decodes: one decode costs that time over N + 1, and the
    predicted twin takes that time. Per token instead, the twin cost (N + 1) / N more and the speedup with it."""
    gens = pl.DataFrame([{"config": "b", "category": "code", "gen_ms": (N + 1) * P, "steps": N + 1, "n_tokens": N}])
    plain = plain_decode_ms(gens)
    assert plain == {("b", "code"): pytest.approx(P)}
    recs = records()
    g, _ = generation(recs[0], recs[1], 1, read(recs[2]).costs(100).levelled(plain[("b", "code")]), exact=True)
    assert g.plain[:, 3].sum() == pytest.approx((N + 1) * P)
    # zero acceptance: N + 1 steps of one rejected draft each (the last one meets the end), N tokens either way
    assert row(predictions(recs, plain, 1))["speedup"] == pytest.approx(P / STEP)


def test_the_costs_spread_widens_the_interval_by_what_it_implies():
    """The block of 2 measured with a spread: each step's time moves with it, so the log speedup's spread from the
    costs is the median's standard error over a step's time, added to the bootstrap's in quadrature."""
    plain = {("b", "code"): P}
    without, zero, s = (row(predictions(records(spread=x), plain, 1)) for x in (None, 0.0, 1.5))
    assert without == zero  # no spread measured, or none there: the bootstrap's interval alone
    se_cost = math.sqrt(math.pi / 2 / 3) * 1.5 / STEP
    assert s["speedup"] == without["speedup"]
    assert s["speedup_se"] ** 2 - without["speedup_se"] ** 2 == pytest.approx(se_cost ** 2, rel=0.01)
    assert (s["speedup_lo"], s["speedup_hi"]) == pytest.approx(interval(s["speedup"], s["speedup_se"], 1, log=True))
    assert s["speedup_lo"] < without["speedup_lo"] and s["speedup_hi"] > without["speedup_hi"]


def test_llamacpps_rule_under_sampling_is_predicted_from_its_matches():
    """Under sampling with llama.cpp's rule kept as matches, the steps are greedy's from the same matches (kind
    exact); a run that kept only p of the draft's top token is still predicted from it (kind expected)."""
    match = [1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1]
    plain = {("b", "code"): P}
    kw = {"alpha": [0.5] * (N + 1), "alpha_exact": [0.6] * (N + 1)}
    sampled = predictions(records("T=0.8", **kw, match_exact=match), plain, 2)
    greedy = predictions(records(match=match), plain, 2)
    for gamma in (1, 2):
        x, g = row(sampled, gamma, "exact"), row(greedy, gamma)
        assert x["kind"] == "exact" and row(sampled, gamma)["kind"] == "expected"
        assert (x["speedup"], x["acceptance_rate"]) == (g["speedup"], g["acceptance_rate"])
    old = predictions(records("T=0.8", **kw), plain, 2)
    assert {r["kind"] for r in old} == {"expected"} and {r["verify"] for r in old} == {"leviathan", "exact"}


def test_a_timed_configurations_own_costs_replace_the_replays():
    from harness.costmodel import with_unit_costs
    rec = {"type": "costs", "config": "b", "proposer": D, "contexts": [20, 900], "reps": 6, "overhead_ms": 0.3,
           "target_ms_by_context": [[1, 2], [3, 4]], "target_sd_by_context": [[0.1, 0.1], [0.1, 0.1]],
           "target_times_by_context": [[[1], [2]], [[3], [4]]], "draft_ms_by_context": [[0.5, 0.7], [0.6, 0.8]],
           "draft_sd_by_context": [[0.01, 0.01], [0.01, 0.01]]}
    unit = {"type": "costs", "config": "g1", "contexts": [40], "reps": 3, "target_ms_by_context": [[1.1, 1.9]],
            "target_sd_by_context": [[0.2, 0.2]], "target_times_by_context": [[[1.1], [1.9]]],
            "draft_ms_by_context": [[0.4, 0.6]], "draft_sd_by_context": [[0.02, 0.02]]}
    got = with_unit_costs(rec, unit)
    assert got == {"type": "costs", "config": "b", "proposer": D, "contexts": [40], "reps": 3, "overhead_ms": 0.3,
                   "target_ms_by_context": [[1.1, 1.9]], "target_sd_by_context": [[0.2, 0.2]],
                   "draft_ms_by_context": [[0.4, 0.6]], "draft_sd_by_context": [[0.02, 0.02]]}
    # a lookup's worker times the target only: its lookup time stays the replay's, with no spread either way
    lookup = {k: v for k, v in rec.items() if not k.startswith("draft_sd")} | {"proposer": "ngram:2"}
    bare = {k: v for k, v in unit.items() if not k.startswith("draft")}
    got = with_unit_costs(lookup, bare)
    assert got["draft_ms_by_context"] == rec["draft_ms_by_context"] and "draft_sd_by_context" not in got
    assert got["target_ms_by_context"] == [[1.1, 1.9]] and got["contexts"] == [40]


@pytest.mark.parametrize("gamma, verify, draft, bound", [
    (1, [10.0, 19.0], 4.5, 2 * 10 / (19 + 4.5)),                                 # 0.851: the trust issue's run
    (3, [10.0, 19.0, 24.0, 28.0], 4.5, max(2 * 10 / 23.5, 3 * 10 / 33, 4 * 10 / 41.5)),  # 0.964 at gamma 3
    (8, [10.0] + [10.5 + 0.5 * k for k in range(1, 9)], 1.0,
     9 * 10 / (14.5 + 8 * 1.0)),                                                    # 4.0 at gamma 8
])
def test_the_bound_by_hand(gamma, verify, draft, bound):
    from harness.analysis.predict import speedup_bound
    from harness.costmodel import Costs
    assert speedup_bound(Costs(verify, draft), gamma) == pytest.approx(bound)


@pytest.mark.parametrize("policy", ["greedy", "T=0.8"])
def test_llamas_ngram_types_are_predicted_from_the_prompts_tokens_alone(policy):
    """No replay record: the steps of llama.cpp's n-gram type along the output (analysis.replay.llama_ngram_steps),
    at its own gamma only, exact under any policy, priced by the replay's costs."""
    from harness.analysis.replay import llama_ngram_steps
    from harness.costmodel import Step, price
    name, out = "ngram-simple:size-n=2:size-m=3", [4, 5, 6, 7] * 6 + [4, 5, 9]
    common = {"config": "b", "policy": policy, "category": "code", "prompt_id": "p1", "repeat": 0}
    costs = {"type": "costs", "config": "b", "policy": policy, "proposer": name, "contexts": [100], "k": 4,
             "target_ms_by_context": [[T1, T2, 38.0, 45.0]], "draft_ms_by_context": [[0.1] * 4], "overhead_ms": OH}
    prompt = {"type": "replay_prompt", **common, "prompt_tokens": [1, 2, 3], "tokens": out, "stop_token": EOS,
              "max_tokens": 64}
    rows = predictions([prompt, costs], {("b", "code"): P}, 8)
    (r,) = rows
    assert (r["proposer"], r["gamma"], r["adaptive"], r["kind"], r["verify"]) == (name, 3, False, "exact", "leviathan")
    steps = llama_ngram_steps([1, 2, 3], out, EOS, 64, parse_draft(name))
    c = read(costs).costs(100).levelled(P)
    assert r["speedup"] == pytest.approx((len(out) + 1) * P / sum(price(s.shape(), c) for s in steps))
    assert r["acceptance_rate"] == pytest.approx(sum(s.accepted for s in steps) / sum(s.proposed for s in steps))
    assert r["proposed"] == sum(s.proposed for s in steps) and any(s.accepted for s in steps)
    assert Step(3, 3, 4) in steps
