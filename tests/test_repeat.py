"""analysis.repeat: how far one machine's timed rows repeat, and the ceiling that puts on any prediction."""
import numpy as np
import pytest

from harness.analysis.repeat import repeatability


def test_two_noisy_timings_give_back_the_row_error_and_a_perfect_predictions_share():
    rng = np.random.default_rng(7)
    s, n = 0.08, 20000
    truth = rng.uniform(0.5, 1.5, n)
    a, b = truth * (1 + s * rng.standard_normal(n)), truth * (1 + s * rng.standard_normal(n))
    r = repeatability(list(b / a))
    assert r["rows"] == n and 0 < r["within"] < n
    assert r["row_error"] == pytest.approx(s, rel=0.05)
    # the ceiling: a prediction equal to the truth, judged against one timed row
    perfect = float(np.mean(np.abs(truth / a - 1) <= 0.10))
    assert r["ceiling"] == pytest.approx(perfect, abs=0.02)


def test_rows_all_or_none_within_leave_nothing_to_solve_for():
    assert repeatability([1.0, 1.05, 0.97]) == {"rows": 3, "within": 3, "row_error": None, "ceiling": None}
    assert repeatability([1.5, 0.7])["row_error"] is None
    assert repeatability([]) == {"rows": 0, "within": 0, "row_error": None, "ceiling": None}
