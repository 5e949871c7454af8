"""The time budget (bench.budget: what is cut, in which order, down to which floor, and what a later cut gives
back). The planner is pure: a cost function stands in for the estimate."""
from dataclasses import replace

from harness.bench.budget import (MIN_CHARS, MIN_CHECK, MIN_GAMMA, MIN_PROMPTS, MIN_SUBSET, MIN_TOKENS,
                                  REALISTIC_TOKENS, Shape, fit)
from harness.plan import Params
from harness.specs import Gamma
from harness.report.sections import budget_line

DEFAULT = Params(target=["t"], draft=["d", "ngram:3"], gamma=list(range(1, 9)), temp=[0.0, 0.7], max_tokens=128,
                 replay=True, replay_gamma=8, timed_subset=3, server_check=5, paired=True, budget_min=20)
F16 = [{"target": ["t16"], "temp": [0.0]}]


def cost(p: Params, per_category: int = 10) -> float:
    """Seconds: per tenth of a category's prompts (per_category: the prompts a category has), a minute per 16
    generated tokens of each policy, half a minute per replayed gamma, a minute per timed prompt (three where every
    proposer is timed) and per prompt of the llama-server check; ten minutes per further sweep."""
    prompts = min(p.per_category or per_category, per_category)
    timed = p.timed_subset * (3 if p.timed_scope == "proposers" else 1)
    return 60 * prompts / 10 * (p.max_tokens / 16 * len(p.temp) + p.replay_gamma / 2 + timed + p.server_check) + \
        600 * len(p.also)


def test_nothing_is_cut_when_the_run_fits_and_without_a_budget():
    f = fit(replace(DEFAULT, budget_min=120), cost, Shape(10, 96, 0))
    assert f.params == replace(DEFAULT, budget_min=120) and not f.cuts and f.record()["fits"]
    assert budget_line(f.record()) == "budget 120 min (fitted to 85% of it): estimated 34.0 min as asked"
    assert budget_line(f.record(), {"total": 4200.0}).endswith("as asked; took 70.0 min before its report")
    none = fit(replace(DEFAULT, budget_min=None), cost, Shape(10, 96, 0))
    assert none.params.max_tokens == 128 and none.estimate_after_s == none.estimate_before_s
    assert budget_line(none.record()) is None


def test_the_prompts_per_category_go_first_and_only_as_far_as_needed():
    f = fit(replace(DEFAULT, budget_min=35), cost, Shape(10, 96, 0))  # 34 min; 5 prompts a category (17) fit 29.75
    assert [c.param for c in f.cuts] == ["per_category"] and f.params.per_category == MIN_PROMPTS
    assert (f.params.max_tokens, f.params.temp, f.params.replay_gamma) == (128, [0.0, 0.7], 8)
    c = f.cuts[0]
    assert (c.before, c.after, c.estimate_before_s / 60, c.estimate_after_s / 60) == (10, 5, 34, 17)
    assert c.why == "estimated 34.0 min, over 29.8 min (85% of the 35 min budget)"
    # a category of 5 prompts or fewer keeps all
    assert fit(replace(DEFAULT, budget_min=1), lambda q: cost(q, 5), Shape(5, 96, 0)).cuts[0].param != "per_category"


def test_then_the_further_sweeps_before_any_gamma_token_or_policy_naming_the_budget_that_keeps_them():
    f = fit(replace(DEFAULT, also=F16, budget_min=24), cost, Shape(10, 96, 0))  # 44 min; 27 at 5 a category; 17 without
    assert [(c.param, c.before, c.after) for c in f.cuts] == [("per_category", 10, 5),
                                                              ("also", ["target t16 temp 0.0"], [])]
    assert f.params.also == [] and (f.params.max_tokens, f.params.temp, f.params.replay_gamma) == (128, [0.0, 0.7], 8)
    assert budget_line(f.record()) == (
        "budget 24 min (fitted to 85% of it): estimated 44.0 min as asked; cut prompts per category 10 -> 5, the "
        "further sweeps (target t16 temp 0.0: --budget-min 32 keeps them): now about 17.0 min")


def test_every_cut_in_its_order_to_its_floor_the_evidence_last():
    p = replace(DEFAULT, also=F16, per_category=0, budget_min=1)
    f = fit(p, lambda q: cost(q, per_category=40), Shape(40, 96, 0))
    assert [(c.param, c.before, c.after) for c in f.cuts] == [
        ("per_category", 40, MIN_PROMPTS), ("also", ["target t16 temp 0.0"], []), ("replay_gamma", 8, MIN_GAMMA),
        ("timed_scope", "proposers", "answers"), ("timed_subset", 3, MIN_SUBSET), ("server_check", 5, MIN_CHECK),
        ("max_tokens", 128, REALISTIC_TOKENS), ("temp", [0.0, 0.7], [0.0]),
        ("max_tokens", REALISTIC_TOKENS, MIN_TOKENS)]
    # a replay predicts gammas up to replay_gamma, and only those are ever timed: the sweep follows
    assert f.params.gamma == [Gamma(n) for n in (1, 2, 3, 4)] and not f.record()["fits"]
    line = budget_line(f.record())
    assert line.startswith("budget 1 min (fitted to 85% of it): estimated 146.0 min as asked; cut prompts per "
                           "category 40 -> 5, the further sweeps (target t16 temp 0.0: --budget-min ")
    assert ("replay gamma 8 -> 4, timed subset's configurations proposers -> answers, timed subset 3 -> 1, "
            "llama-server check prompts 5 -> 2, max tokens 128 -> 64 (--budget-min ") in line
    assert ", temperatures 0.0,0.7 -> 0.0 (--budget-min " in line and ", max tokens 64 -> 32 (--budget-min " in line
    assert line.endswith(": still about 3.5 min, and nothing more can be cut: running anyway")


def test_what_a_later_cut_frees_goes_back_to_the_most_valued_earlier_cut_that_fits():
    """One policy fewer nearly halves this run: the timed subset's 3 prompts come back, the llama-server check's
    5 do not fit, nor do 128 tokens."""
    p = replace(DEFAULT, per_category=5, budget_min=6.5)  # 5.525 min planned
    f = fit(p, cost, Shape(5, 96, 0))
    assert [c.param for c in f.cuts] == ["replay_gamma", "timed_scope", "server_check", "max_tokens", "temp"]
    q = f.params
    assert (q.timed_subset, q.server_check, q.max_tokens, q.temp, q.replay_gamma) == (3, 2, 64, [0.0], 4)
    assert f.estimate_after_s == 330 and f.record()["fits"]
    # what keeps each, all else as planned: 128 tokens or both policies, 450 s
    assert [c.hint for c in f.cuts if c.hint] == ["--budget-min 9 keeps it"] * 2


def test_a_cut_that_saves_nothing_is_not_made():
    f = fit(replace(DEFAULT, budget_min=1), lambda q: cost(replace(q, replay_gamma=8)), Shape(10, 96, 0))
    assert "replay_gamma" not in [c.param for c in f.cuts] and f.params.replay_gamma == 8


def test_a_timed_sweep_loses_its_largest_gammas_and_keeps_auto():
    p = replace(DEFAULT, replay=False, timed_subset=0, server_check=0, gamma=["auto:8", 1, 2, 4, 6, 8],
                budget_min=1)
    f = fit(p, lambda q: 60 * len(q.gamma), Shape(10, 96, 0))
    assert f.params.to_dict()["gamma"] == ["auto:8", 1, 2, 4] and f.params.replay_gamma == 8
    assert [(c.param, c.before, c.after) for c in f.cuts] == [
        ("gamma", ["auto:8", 1, 2, 4, 6, 8], ["auto:8", 1, 2, 4])]
    assert "gammas auto:8,1,2,4,6,8 -> auto:8,1,2,4" in budget_line(f.record())


def test_the_prompts_length_goes_after_the_gammas_and_before_the_timed_checks_naming_the_budget_that_keeps_it():
    """Halved from the longest prompt's characters (what 0 stands for), not below MIN_CHARS."""
    def costs(q: Params) -> float:
        return cost(q, 5) + 60 * (q.prompt_chars or 6000) / 500

    p = replace(DEFAULT, per_category=5, budget_min=1)
    f = fit(p, costs, Shape(5, 96, 6000))
    made = [(c.param, c.before, c.after) for c in f.cuts]
    assert made[:3] == [("replay_gamma", 8, MIN_GAMMA), ("prompt_chars", 6000, MIN_CHARS),
                        ("timed_scope", "proposers", "answers")]
    assert f.params.prompt_chars == MIN_CHARS
    assert ", prompt length (characters) 6000 -> 2048 (--budget-min " in budget_line(f.record())
    # prompts already short are not cut
    short = fit(p, costs, Shape(5, 96, 1500))
    assert "prompt_chars" not in [c.param for c in short.cuts] and short.params.prompt_chars == 0


def test_each_prompts_own_max_tokens_is_halved_from_the_longest():
    f = fit(replace(DEFAULT, max_tokens=0, budget_min=1), lambda q: 60 * ((q.max_tokens or 256) + 40),
            Shape(10, 256, 0))
    assert [(c.param, c.before, c.after) for c in f.cuts] == [("max_tokens", 256, REALISTIC_TOKENS),
                                                              ("max_tokens", REALISTIC_TOKENS, MIN_TOKENS)]


def test_an_older_runs_cuts_read_as_they_did():
    """Before issue 53 the main sweep's sampled policy went to keep the further sweeps, and the tokens first."""
    rec = {"budget_min": 95, "planned": 0.85, "estimate_before_s": 12780.0, "estimate_after_s": 4680.0, "fits": True,
           "cuts": [{"param": "temp", "before": [0.0, 0.7], "after": [0.0], "why": "the further sweeps kept: cut to "
                     "their floors", "hint": "--budget-min 131 keeps them"},
                    {"param": "max_tokens", "before": 32, "after": 16, "why": "estimated", "hint": ""}]}
    assert budget_line(rec) == (
        "budget 95 min (fitted to 85% of it): estimated 213.0 min as asked; cut temperatures 0.0,0.7 -> 0.0 (the "
        "further sweeps kept: --budget-min 131 keeps them), max tokens 32 -> 16: now about 78.0 min")
