"""The verdict rules (issue 24): "no gain worth having", rows of one prompt, "to settle" with power, and
--until-confident's looks that keep their 95%. Pure, with simulations where a rule is a claim about rates."""
import math

import numpy as np
import pytest

from harness.analysis.intervals import interval, t_quantile
from harness.analysis.sequential import first_settled, look_level, spent
from harness.analysis.verdict import (INCONCLUSIVE, MIN_GAIN, NO_GAIN, PLAIN, SETTLED, SPECULATE, Evidence, decide,
                                      further_prompts, upper_bound)


def ev(speedup, se=0.05, prompts=5, config="c"):
    return Evidence(config, speedup, se, prompts)


def test_no_gain_worth_having_is_the_one_sided_bound_under_one_plus_delta():
    # the review's row: ngram:3 g=2 1.00x [0.96, 1.04] from 10 prompts, se about 0.017 on the log scale
    v = decide([ev(1.0, se=0.017, prompts=10)])
    bound = math.exp(t_quantile(0.95, 9) * 0.017)  # one-sided 95%: t(0.95, 9) = 1.833, so 1.0317
    assert v.kind == NO_GAIN and v.at_most == pytest.approx(bound) and bound == pytest.approx(1.0317, abs=1e-4)
    assert (v.lo, v.hi) == pytest.approx(interval(1.0, 0.017, 10, log=True))  # the best's own interval, as ever
    assert decide([ev(1.0, se=0.017, prompts=10)], min_gain=0.03).kind == INCONCLUSIVE  # 1.0317 >= 1.03
    # a claim about every configuration: one that may still gain 5% keeps it open
    assert decide([ev(1.0, se=0.017, prompts=10), ev(0.98, se=0.05, prompts=10, config="d")]).kind == INCONCLUSIVE


def test_speculate_needs_the_widened_lower_bound_above_one_plus_delta():
    q = t_quantile(0.975, 4)
    lo_at = 1.05 * math.exp(q * 0.05)  # the speedup whose 95% lower bound is exactly 1.05 at se 0.05, n 5
    assert decide([ev(lo_at * 1.01)]).kind == SPECULATE
    v = decide([ev(lo_at * 0.99)])  # above 1 for sure, but not surely by 5%: no claim either way
    assert v.kind == INCONCLUSIVE and v.lo > 1
    assert decide([ev(lo_at * 0.99)], min_gain=0).kind == SPECULATE
    # the verdicts exclude one another: a speculate row's upper bound lies above 1 + delta
    v = decide([ev(lo_at * 1.01)])
    assert upper_bound(v.chosen.speedup, 0.05, 5) > 1 + MIN_GAIN


def test_plain_decoding_before_no_gain():
    assert decide([ev(0.7), ev(0.8)]).kind == PLAIN
    assert decide([ev(0.7), ev(0.99, se=0.01, prompts=10)]).kind == NO_GAIN  # 0.99 not surely below 1


def test_one_prompt_rows_neither_win_nor_block():
    v = decide([Evidence("a", 1.5, 0.01, 1), Evidence("b", 1.6, 0.5, 5)])  # the review's case
    assert v.kind != SPECULATE or v.chosen.config != "a"
    assert v.kind == INCONCLUSIVE and v.chosen.config == "b"
    # a one-prompt row that would straddle 1 does not keep the others from saying plain decoding
    v = decide([ev(0.7, config="a"), ev(0.8, config="b"), Evidence("one", 1.1, 0.3, 1)])
    assert v.kind == PLAIN and v.k == 2 and "one prompt left out" in v.why
    v = decide([Evidence("a", 0.5, 0.05, 1)])
    assert v.kind == INCONCLUSIVE and "one prompt" in v.why and v.further >= 2


def test_to_settle_is_finite_at_one_and_none_only_at_the_bar():
    v = decide([ev(1.0, se=0.04, prompts=5)])
    assert v.kind == INCONCLUSIVE and v.further is not None and v.further < 50
    assert further_prompts([ev(1.05, se=0.04)]) is None  # exactly at 1 + delta: no count settles it
    assert further_prompts([ev(1.0, se=0.04)]) < further_prompts([ev(1.03, se=0.04)])  # nearer the bar: more


def _simulated_settle_rate(rows, extra, kinds, sims=2000, seed=7):
    """Draw each configuration's per-prompt log speedups (sd from its se) at n + extra prompts, decide, and
    count how often the verdict is one of kinds."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        group = []
        for r in rows:
            m = r.prompts + extra
            x = rng.normal(math.log(r.speedup), r.se * math.sqrt(r.prompts), m)
            group.append(Evidence(r.config, math.exp(x.mean()), x.std(ddof=1) / math.sqrt(m), m))
        hits += decide(group).kind in kinds
    return hits / sims


@pytest.mark.parametrize("rows,kinds", [
    ([ev(1.0, se=0.04)], (NO_GAIN, PLAIN)),
    ([ev(1.01, se=0.03, config="a"), ev(0.9, se=0.03, config="b")], (NO_GAIN, PLAIN)),
    ([ev(1.2, se=0.06, prompts=4)], (SPECULATE,)),
])
def test_to_settle_settles_at_about_the_stated_rate(rows, kinds):
    extra = further_prompts(rows)
    assert extra is not None
    rate = _simulated_settle_rate(rows, extra, kinds)
    assert 0.72 <= rate <= 0.92, (extra, rate)  # stated: 80% (the formula takes the spread as known)
    if extra > 1:
        assert _simulated_settle_rate(rows, extra // 2, kinds) < rate  # fewer prompts settle it less often


def test_spending_adds_up_to_five_percent_whatever_the_looks():
    assert spent(20, 20) == pytest.approx(0.05)
    levels = [look_level(n, n - 1 if n > 3 else 0, 20) for n in range(3, 21)]
    assert sum(1 - x for x in levels) == pytest.approx(0.05)
    assert look_level(5, 5, 20) is None  # the same evidence again is no look
    assert all(0.95 < x < 1 for x in levels)


def test_a_settled_group_keeps_its_first_verdict():
    looks = [[{"g": 1, "verdict": INCONCLUSIVE}, {"g": 2, "verdict": NO_GAIN}],
             [{"g": 1, "verdict": PLAIN}, {"g": 2, "verdict": INCONCLUSIVE}],
             [{"g": 1, "verdict": SPECULATE}]]
    assert first_settled(looks, lambda r: r["g"]) == [{"g": 1, "verdict": PLAIN}, {"g": 2, "verdict": NO_GAIN}]


def _old_rule(group):
    """The rule this replaces: 95% at every look, any gain counting as one."""
    if any(interval(r.speedup, r.se, r.prompts, 1 - 0.05 / len(group), log=True)[0] > 1 for r in group):
        return SPECULATE
    return PLAIN if all(interval(r.speedup, r.se, r.prompts, log=True)[1] < 1 for r in group) else INCONCLUSIVE


def _sequential_errors(rule, true=1.0, right=(NO_GAIN,), runs=2000, sd=0.06, seed=11):
    """Two configurations of a true speedup, a look at every n = 3...20 prompts, stopping at the first settled
    verdict: the share of runs that stop on a wrong one."""
    rng = np.random.default_rng(seed)
    wrong = 0
    for _ in range(runs):
        x = rng.normal(math.log(true), sd, (2, 20))
        for n in range(3, 21):
            group = [Evidence(str(i), math.exp(x[i, :n].mean()), x[i, :n].std(ddof=1) / math.sqrt(n), n)
                     for i in range(2)]
            kind = rule(group, n)
            if kind in SETTLED:
                wrong += kind not in right
                break
    return wrong / runs


def spending(group, n):
    return decide(group, look_level(n, n - 1 if n > 3 else 0, 20)).kind


def every_look_at_95(group, n):
    return decide(group).kind


@pytest.mark.slow  # 8,000 simulated sequences of looks: 27-32 s on the Xeon VM
def test_until_confident_keeps_its_95_percent():
    # at 1.00 only "no gain worth having" is right; the old rule (any gain counting) stopped wrong in 13%
    assert _sequential_errors(spending) < 0.06
    assert _sequential_errors(lambda g, n: _old_rule(g)) > 0.10
    # at the bar itself (1.05) every settled verdict is wrong: the hardest case for looking again and again
    assert _sequential_errors(spending, 1.05, ()) < 0.06
    assert _sequential_errors(every_look_at_95, 1.05, ()) > 0.10
