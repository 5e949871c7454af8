"""plan.make_params and plan.check: a parameter set that cannot run is refused in one line before anything starts
(issue 43's bad-input sweep). One row per case: the profile, the command line's overrides, the words of the error."""
from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.plan import make_params

T = "smollm2-135m-instruct-q4_1"
NAN, INF = float("nan"), float("inf")

REFUSED = {
    # every float option, non-finite, from the command line or a profile (nan passes any range check)
    "budget-min-nan": ({}, {"budget_min": NAN}, ["--budget-min", "finite", "nan"]),
    "budget-min-inf": ({}, {"budget_min": INF}, ["--budget-min", "finite"]),
    "min-gain-nan": ({}, {"min_gain": NAN}, ["--min-gain", "finite"]),
    "busy-threshold-inf-in-profile": ({"busy_threshold": INF}, {}, ["--busy-threshold", "finite"]),
    "temp-list-inf": ({}, {"temp": "0,inf"}, ["--temp", "finite", "inf"]),
    "min-p-nan": ({}, {"min_p": "nan"}, ["--min-p", "finite"]),
    "draft-p-min-nan-in-profile": ({"draft_p_min": [NAN]}, {}, ["--draft-p-min", "finite"]),
    # --replay-gamma means nothing without --replay, as --timed-subset does not
    "replay-gamma-without-replay": ({}, {"replay_gamma": 4}, ["--replay-gamma", "give --replay"]),
    "replay-gamma-replay-off-on-command-line": ({"replay": True, "replay_gamma": 4}, {"replay": False},
                                                ["--replay-gamma", "give --replay"]),
    # a negative seed failed in every worker, and the run exited 0
    "seed-negative": ({}, {"seed": -1}, ["--seed", ">= 0", "-1"]),
    # max tokens alone beyond the context: the dry run estimated hundreds of minutes
    "max-tokens-beyond-n-ctx": ({}, {"max_tokens": 100000}, ["--max-tokens 100000", "--n-ctx 2048"]),
    "max-tokens-equal-n-ctx": ({}, {"max_tokens": 512, "n_ctx": 512}, ["--max-tokens 512", "--n-ctx 512"]),
    "threads-beyond-cores": ({}, {"threads": "100000"}, ["--threads 100000", "logical cores"]),
}


@pytest.mark.parametrize("profile, overrides, words", list(REFUSED.values()), ids=list(REFUSED))
def test_a_parameter_set_that_cannot_run_is_refused_in_one_line(profile, overrides, words):
    with pytest.raises(HarnessError) as e:
        make_params({"target": [T], **profile}, overrides)
    for w in words:
        assert w in str(e.value), str(e.value)


ACCEPTED = {
    "replay-gamma-with-replay": ({}, {"replay": True, "replay_gamma": 4}),
    "replay-off-keeps-default-replay-gamma": ({"replay": True, "replay_gamma": 8}, {"replay": False}),
    "max-tokens-just-under-n-ctx": ({}, {"max_tokens": 511, "n_ctx": 512}),
    "budget-min-finite": ({}, {"budget_min": 20.0}),
}


@pytest.mark.parametrize("profile, overrides", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_the_values_beside_them_still_run(profile, overrides):
    make_params({"target": [T], **profile}, overrides)


@pytest.mark.parametrize("key, given", [("categories", "code,code"), ("categories", ["code", "chat", "code"]),
                                        ("prompts", "a.jsonl,a.jsonl")])
def test_a_category_or_prompt_file_given_twice_is_one(key, given):
    p = make_params({}, {"target": T, key: given})
    assert getattr(p, key) == list(dict.fromkeys(x for x in (given.split(",") if isinstance(given, str) else given)))
