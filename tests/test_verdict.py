"""The verdict rules (analysis.verdict; issue 24): the verdicts exactly where the interval lies, "no gain worth
having", rows of one prompt, a busy machine, "to settle" with power, the break-even rate. Pure, with simulations
where a rule is a claim about rates."""
import math

import numpy as np
import pytest

from harness.analysis.intervals import interval, t_quantile
from harness.analysis.verdict import (BUSY, INCONCLUSIVE, MIN_GAIN, NO_DATA, NO_GAIN, PLAIN, SPECULATE, Evidence,
                                      break_even_rate, decide, further_prompts, upper_bound)


def ev(speedup, se=0.05, prompts=5, busy=False, config="c"):
    return Evidence(config, speedup, se, prompts, busy)


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


def test_verdicts_exactly_where_the_interval_lies():
    q = t_quantile(0.975, 4)
    above = 1.05 * math.exp(q * 0.05) * 1.01  # just clear of 1 + 5% at n = 5, se 0.05
    assert decide([ev(above)]).kind == SPECULATE
    below = math.exp(-q * 0.05) * 0.99  # just clear of 1 below
    assert decide([ev(below)]).kind == PLAIN
    for x in (1.0, 1.05, math.exp(-q * 0.05) * 1.01, above / 1.02):
        v = decide([ev(x)])
        assert v.kind in (INCONCLUSIVE, NO_GAIN) and v.lo <= max(1, x) and v.hi >= 1
    v = decide([ev(below)])
    assert v.hi < 1 and (v.lo, v.hi) == pytest.approx(interval(below, 0.05, 5, log=True))


def test_speculate_is_widened_for_picking_the_best_of_several():
    q1 = t_quantile(0.975, 4)
    barely = 1.05 * math.exp(q1 * 0.05) * 1.01  # clears 1 + 5% on its own 95% interval...
    assert decide([ev(barely)]).kind == SPECULATE
    v = decide([ev(barely, config="best"), ev(0.8, config="b"), ev(0.7, config="c"), ev(0.9, config="d")])
    assert v.kind == INCONCLUSIVE and v.chosen.config == "best"  # ...not once it was picked from four
    assert decide([ev(barely)], tried=4).kind == INCONCLUSIVE  # nor once it was chosen among four elsewhere
    strong = decide([ev(1.5, config="best"), ev(0.8, config="b"), ev(0.7, config="c")])
    assert strong.kind == SPECULATE and strong.adjusted and strong.k == 3 and strong.lo > 1.05


def test_plain_needs_every_configuration_below_one():
    v = decide([ev(0.7), ev(0.8), ev(0.99, se=0.2)])
    assert v.kind == INCONCLUSIVE and v.chosen.speedup == 0.99
    assert decide([ev(0.7), ev(0.8)]).kind == PLAIN


def test_busy_one_prompt_and_no_data():
    assert decide([ev(0.5), ev(0.6, busy=True)]).kind == BUSY
    v = decide([ev(0.5, prompts=1)])
    assert v.kind == INCONCLUSIVE and "one prompt" in v.why and v.further >= 2
    assert decide([]).kind == NO_DATA and decide([ev(0.0)]).kind == NO_DATA


def test_break_even_rate():
    # a step of 3 decodes' cost with gamma 4 needs (3 - 1) / 4 = 50% acceptance
    assert break_even_rate(90, 30, 4) == pytest.approx(0.5)
    assert break_even_rate(200, 30, 4) is None  # even 100% cannot pay for it
    assert break_even_rate(20, 30, 2) == 0.0
