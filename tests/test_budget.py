"""The time budget (bench.budget: what is cut, in which order, down to which floor). The planner is pure: a cost
function stands in for the estimate."""
from dataclasses import replace

from harness.bench.budget import MIN_PROMPTS, fit
from harness.plan import Params
from harness.specs import Gamma
from harness.report.sections import budget_line

DEFAULT = Params(target=["t"], draft=["d", "ngram:3"], gamma=list(range(1, 9)), max_tokens=32, replay=True,
                 replay_gamma=8, timed_subset=1, paired=True, budget_min=20)


def cost(p: Params, per_category: int = 10) -> float:
    """Seconds: a minute per generated token of a prompt set, and a share per replayed gamma, timed prompt and
    prompt per category (per_category: the prompts a category has)."""
    prompts = min(p.per_category or per_category, per_category)
    return 60 * (p.max_tokens * 2 + p.replay_gamma / 2 + p.timed_subset * 3) * prompts / 10


def test_nothing_is_cut_when_the_run_fits_and_without_a_budget():
    f = fit(replace(DEFAULT, budget_min=120), cost, 10, 32)
    assert f.params == replace(DEFAULT, budget_min=120) and not f.cuts and f.record()["fits"]
    assert budget_line(f.record()) == "budget 120 min (fitted to 85% of it): estimated 71.0 min as asked"
    assert budget_line(f.record(), {"total": 4200.0}).endswith("as asked; took 70.0 min before its report")
    none = fit(replace(DEFAULT, budget_min=None), cost, 10, 32)
    assert none.params.max_tokens == 32 and none.estimate_after_s == none.estimate_before_s
    assert budget_line(none.record()) is None


def test_tokens_go_first_and_only_as_far_as_needed():
    f = fit(replace(DEFAULT, budget_min=46), cost, 10, 32)  # 71 min: 16 tokens (39 min) fit 85% of 46
    assert [c.param for c in f.cuts] == ["max_tokens"] and f.params.max_tokens == 16
    assert f.params.replay_gamma == 8 and f.params.gamma == DEFAULT.gamma
    c = f.cuts[0]
    assert (c.before, c.after, c.estimate_before_s / 60, c.estimate_after_s / 60) == (32, 16, 71, 39)
    assert c.why == "estimated 71.0 min, over 39.1 min (85% of the 46 min budget)"


def test_then_the_gammas_then_the_timed_subset_then_the_prompts_each_to_its_floor():
    p = replace(DEFAULT, max_tokens=64, timed_subset=4, per_category=0, budget_min=1)
    f = fit(p, lambda q: cost(q, per_category=40), 40, 64)
    assert [(c.param, c.before, c.after) for c in f.cuts] == [
        ("max_tokens", 64, 16), ("replay_gamma", 8, 4), ("timed_subset", 4, 1), ("per_category", 40, MIN_PROMPTS)]
    # a replay predicts gammas up to replay_gamma, and only those are ever timed: the sweep follows
    assert f.params.gamma == [Gamma(n) for n in (1, 2, 3, 4)] and not f.record()["fits"]
    assert budget_line(f.record()) == (
        "budget 1 min (fitted to 85% of it): estimated 576.0 min as asked; cut max tokens 64 -> 16, replay gamma "
        "8 -> 4, timed subset 4 -> 1, prompts per category 40 -> 10: still about 37.0 min, and nothing more can be "
        "cut: running anyway")


def test_where_the_floors_do_not_fit_the_further_sweeps_go_and_the_rest_is_planned_again():
    also = [{"target": ["t16"], "temp": [0.0]}]

    def with_also(q: Params) -> float:  # a further sweep costs as much as the main one, and 3 minutes more
        return cost(q) * (1 + len(q.also)) + 180 * len(q.also)
    f = fit(replace(DEFAULT, also=also, budget_min=50), with_also, 10, 32)  # floors 2 x 37 + 3 min; alone 71
    assert f.params.also == [] and f.params.max_tokens == 16 and f.params.replay_gamma == 8
    assert [(c.param, c.before, c.after) for c in f.cuts] == [("also", ["target t16 temp 0.0"], []),
                                                              ("max_tokens", 32, 16)]
    assert (f.estimate_before_s / 60, f.estimate_after_s / 60) == (145, 39) and f.record()["fits"]
    assert f.cuts[0].why == "cut to their floors, estimated 77.0 min, over 42.5 min (85% of the 50 min budget)"
    assert budget_line(f.record()) == (
        "budget 50 min (fitted to 85% of it): estimated 145.0 min as asked; cut the further sweeps (target t16 "
        "temp 0.0: --budget-min 91 keeps them), max tokens 32 -> 16: now about 39.0 min")
    # where they fit at their floors, they stay
    kept = fit(replace(DEFAULT, also=also, budget_min=91), with_also, 10, 32)
    assert kept.params.also == also and kept.record()["fits"]


def test_the_main_sweeps_sampled_policies_go_before_the_further_sweeps():
    """Two policies: the main sweep costs twice what its greedy part does. Where greedy alone fits beside the
    further sweep, the sampled policy goes and the further sweep (the default's F16 target) stays."""
    also = [{"target": ["t16"], "temp": [0.0]}]

    def with_also(q: Params) -> float:
        return cost(q) * len(q.temp) + cost(q) * len(q.also)
    p = replace(DEFAULT, temp=[0.0, 0.7], also=also, budget_min=95)  # floors 3 x 37 min; greedy's 2 x 39 fit 80.75
    f = fit(p, with_also, 10, 32)
    assert f.params.also == also and f.params.temp == [0.0] and f.record()["fits"]
    assert [(c.param, c.before, c.after) for c in f.cuts] == [("temp", [0.0, 0.7], [0.0]), ("max_tokens", 32, 16)]
    assert budget_line(f.record()) == (
        "budget 95 min (fitted to 85% of it): estimated 213.0 min as asked; cut temperatures 0.0,0.7 -> 0.0 (the "
        "further sweeps kept: --budget-min 131 keeps them), max tokens 32 -> 16: now about 78.0 min")
    # where greedy alone does not fit beside them either, they go and both policies stay
    f = fit(replace(p, budget_min=60), with_also, 10, 32)
    assert f.params.also == [] and f.params.temp == [0.0, 0.7] and [c.param for c in f.cuts][0] == "also"


def test_a_category_of_ten_prompts_or_fewer_keeps_all_and_a_short_run_is_not_cut():
    f = fit(replace(DEFAULT, max_tokens=12, gamma=[1, 2], replay_gamma=3, budget_min=1), cost, 10, 32)
    assert not f.cuts and f.params.per_category == 0
    assert budget_line(f.record()).endswith("as asked, and nothing can be cut: running anyway")


def test_a_timed_sweep_loses_its_largest_gammas_and_keeps_auto():
    p = replace(DEFAULT, replay=False, timed_subset=0, gamma=["auto:8", 1, 2, 4, 6, 8], budget_min=1)
    f = fit(p, lambda q: 60 * len(q.gamma), 10, 32)
    assert f.params.to_dict()["gamma"] == ["auto:8", 1, 2, 4] and f.params.replay_gamma == 8
    assert [(c.param, c.before, c.after) for c in f.cuts if c.param == "gamma"] == [
        ("gamma", ["auto:8", 1, 2, 4, 6, 8], ["auto:8", 1, 2, 4])]
    assert "gammas auto:8,1,2,4,6,8 -> auto:8,1,2,4" in budget_line(f.record())


def test_each_prompts_own_max_tokens_is_halved_from_the_longest():
    f = fit(replace(DEFAULT, max_tokens=0, budget_min=1), cost, 10, 96)
    assert (f.cuts[0].before, f.params.max_tokens) == (96, 16)
