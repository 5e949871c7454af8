"""Intervals (analysis.intervals), pure: coverage on synthetic traces with a known speedup, the point estimates
and the bootstrap by hand, one-prompt rows widened by the pace."""

import numpy as np
import pytest
from scipy.stats import t as student_t

from harness.analysis.intervals import Generation, Row, row_intervals, step_matrix, t_quantile

T, GAMMA = 48, 3
PLAIN_MS, DRAFT_MS, VERIFY_MS = 60.0, 20.0, 72.0


def synthetic_prompt(rng, a_mean, spread):
    """One prompt: its own acceptance probability (Beta around a_mean), a greedy speculative generation of T
    tokens at gamma 3 and its plain twin, with step times jittered."""
    conc = 1 / spread
    a = rng.beta(a_mean * conc, (1 - a_mean) * conc)
    em, acc, prop, ms = [], [], [], []
    out = 0
    while out < T:
        g = min(GAMMA, T - out - 1)
        k = 0
        while k < g and rng.random() < a:
            k += 1
        e = min(k + 1, T - out)
        em.append(e), acc.append(k), prop.append(g)
        ms.append((DRAFT_MS * g + VERIFY_MS) * rng.lognormal(0, 0.15) if g else PLAIN_MS * rng.lognormal(0, 0.1))
        out += e
    reached = [k + (k < g) for k, g in zip(acc, prop)]
    spec = step_matrix(em, ms, acc, prop, acc, reached, float(sum(ms)), spec=True)
    pms = PLAIN_MS * rng.lognormal(0, 0.1, size=T)
    return [Generation(spec, step_matrix(np.ones(T), pms, None, None, None, None, float(pms.sum()), spec=False))]


def population_speedup(a_mean, spread, n=3000):
    """Every generation has T tokens, so the pooled speedup is total plain time over total speculative time."""
    rng = np.random.default_rng(12345)
    spec = plain = 0.0
    for _ in range(n):
        (g,) = synthetic_prompt(rng, a_mean, spread)
        spec, plain = spec + g.spec[:, 1].sum(), plain + g.plain[:, 3].sum()
    return plain / spec


def test_t_quantile_matches_scipy():
    for df in (1, 2, 3, 4, 7, 30):
        for p in (0.975, 0.99375, 0.6, 0.025):
            assert t_quantile(p, df) == pytest.approx(student_t.ppf(p, df), rel=1e-6, abs=1e-9)


def coverage(n_prompts, a_mean, spread, runs=200):
    truth = population_speedup(a_mean, spread)
    rng = np.random.default_rng([n_prompts, int(a_mean * 100), int(spread * 100)])
    hits = 0
    for r in range(runs):
        row = Row([synthetic_prompt(rng, a_mean, spread) for _ in range(n_prompts)])
        iv = row_intervals(row, f"synthetic-{r}", reps=400)
        hits += iv["speedup_lo"] <= truth <= iv["speedup_hi"]
    return hits / runs


@pytest.mark.parametrize("n_prompts, a_mean, spread", [(3, 0.7, 0.15), (5, 0.7, 0.15), (10, 0.7, 0.15),
                                                       (10, 0.85, 0.3)])
def test_interval_covers_the_known_speedup_about_95_percent_of_the_time(n_prompts, a_mean, spread):
    """200 synthetic rows of prompts that differ (their acceptance drawn around a_mean): the share of intervals
    holding the population's speedup."""
    assert 0.90 <= coverage(n_prompts, a_mean, spread) <= 0.985


def test_interval_is_conservative_where_prompts_barely_differ():
    assert coverage(5, 0.5, 0.05, runs=100) >= 0.95


# Two prompts by hand. A: three speculative steps (3 of gamma 3 proposed, 2 accepted; 2 proposed, 0 accepted; a
# plain step), timed 10/20/10 ms in a generation that took 80 ms; its plain twin 5 tokens, 5/5/5/5/10 ms of 150.
# B: one step (2 of 2 accepted), 30 ms of 30; its plain twin 3 tokens, 10/10/10 ms of 45.
A_SPEC = step_matrix([3, 1, 1], [10, 20, 10], [2, 0, 0], [3, 2, 0], [2.1, 0.3, 0.0], [3, 1, 0], 80.0, spec=True)
A_PLAIN = step_matrix([1] * 5, [5, 5, 5, 5, 10], None, None, None, None, 150.0, spec=False)
B_SPEC = step_matrix([3], [30], [2], [2], [1.8], [2], 30.0, spec=True)
B_PLAIN = step_matrix([1, 1, 1], [10, 10, 10], None, None, None, None, 45.0, spec=False)


def test_step_matrix_columns_by_hand():
    # FIELDS: spec_tokens, spec_ms, plain_tokens, plain_ms, accepted, proposed, vsteps, alpha_sum, alpha_n.
    # A's times scaled 80 / 40 = 2x; vsteps is 1 where the step proposed anything.
    np.testing.assert_allclose(A_SPEC, [[3, 20, 0, 0, 2, 3, 1, 2.1, 3],
                                        [1, 40, 0, 0, 0, 2, 1, 0.3, 1],
                                        [1, 20, 0, 0, 0, 0, 0, 0.0, 0]])
    # the plain twin: 150 / 30 = 5x, only the plain columns
    np.testing.assert_allclose(A_PLAIN, [[0, 0, 1, t, 0, 0, 0, 0, 0] for t in (25, 25, 25, 25, 50)])
    # no step times at all: gen_ms shared evenly (10 / 2)
    np.testing.assert_allclose(step_matrix([1, 1], [0, 0], None, None, None, None, 10.0, spec=False)[:, 3], [5, 5])


def test_point_estimates_are_the_pooled_figures_by_hand():
    iv = row_intervals(Row([[Generation(A_SPEC, A_PLAIN)], [Generation(B_SPEC, B_PLAIN)]]), "by-hand")
    # pooled, not per prompt: spec 8 tokens in 80 + 30 = 110 ms, plain 8 tokens in 150 + 45 = 195 ms
    assert iv["speedup"] == pytest.approx(195 / 110)  # (8/110) / (8/195) = 1.7727
    assert iv["acceptance_rate"] == pytest.approx(4 / 7)  # accepted 2 + 0 + 2 of proposed 3 + 2 + 2
    assert iv["mean_accepted_len"] == pytest.approx(4 / 3)  # accepted 4 over 3 steps that proposed
    assert iv["alpha"] == pytest.approx(0.7)  # alpha sums 2.1 + 0.3 + 1.8 = 4.2 over 3 + 1 + 2 positions
    assert iv["prompts"] == 2


def test_the_bootstrap_brackets_the_estimate_and_is_seeded():
    rng = np.random.default_rng(3)
    row = Row([synthetic_prompt(rng, 0.7, 0.1) for _ in range(4)])
    iv = row_intervals(row, "row-a")
    assert iv["speedup_lo"] < iv["speedup"] < iv["speedup_hi"] and iv["prompts"] == 4
    assert 0 <= iv["acceptance_rate_lo"] < iv["acceptance_rate"] < iv["acceptance_rate_hi"] <= 1
    assert row_intervals(row, "row-a") == iv  # seeded by the row's key: a report regenerates identically


def test_one_prompt_rows_widened_by_the_pace_cover_the_known_speedup():
    """A pace that moves between a generation and its twin (lognormal, 8%) is invisible to a one-prompt row's
    bootstrap over steps: its interval covers the known speedup far less than 95% of the time; widened by the
    pace's spread (intervals.widened), about 95%. Every draft accepted, so that only the times vary."""
    from harness.analysis.intervals import widened
    pace, steps = 0.08, T // (GAMMA + 1)
    truth = (T / (steps * (DRAFT_MS * GAMMA + VERIFY_MS))) / (1 / PLAIN_MS)  # the jitter's mean is ~1 on both
    rng = np.random.default_rng(7)
    hits = {"bootstrap": 0, "widened": 0}
    trials = 300
    for i in range(trials):
        ms = (DRAFT_MS * GAMMA + VERIFY_MS) * rng.lognormal(0, 0.05, steps)
        spec = step_matrix([GAMMA + 1] * steps, ms, [GAMMA] * steps, [GAMMA] * steps, [GAMMA] * steps,
                           [GAMMA] * steps, float(ms.sum()), spec=True)
        pms = PLAIN_MS * rng.lognormal(0, 0.05, T) * np.exp(rng.normal(0, pace))
        g = Generation(spec, step_matrix(np.ones(T), pms, None, None, None, None, float(pms.sum()), spec=False))
        iv = row_intervals(Row([[g]]), f"pace/{i}", reps=400)
        for name, v in (("bootstrap", iv), ("widened", widened(iv, pace))):
            hits[name] += v["speedup_lo"] <= truth <= v["speedup_hi"]
    assert hits["bootstrap"] / trials < 0.6
    assert 0.92 <= hits["widened"] / trials <= 0.98
