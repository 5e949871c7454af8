import statistics

import polars as pl
import pytest

from harness.analysis import metrics


def test_three_acceptance_figures_from_steps_and_alpha_only_where_verification_reached():
    steps = pl.DataFrame([
        # rejected at position 1 of 4: positions 2..4 sat on a prefix the output never contains
        {"g": "a", "proposed": 4, "accepted": 1, "rejected_at": 1, "emitted": 2, "alpha": [1.0, 0.0, 1.0, 1.0],
         "draft_ms": 4.0, "verify_ms": 10.0, "overhead_ms": 0.5},
        {"g": "a", "proposed": 4, "accepted": 4, "rejected_at": None, "emitted": 5, "alpha": [1.0, 1.0, 1.0, 1.0],
         "draft_ms": 4.0, "verify_ms": 10.0, "overhead_ms": 0.5},
        {"g": "a", "proposed": 0, "accepted": 0, "rejected_at": None, "emitted": 1, "alpha": [],
         "draft_ms": 0.0, "verify_ms": 5.0, "overhead_ms": 0.1},
    ])
    row = metrics.acceptance(steps, ["g"]).row(0, named=True)
    assert row["acceptance_rate"] == pytest.approx(5 / 8)
    assert row["mean_accepted_len"] == pytest.approx(5 / 2)
    assert row["alpha"] == pytest.approx(5 / 6)  # 1, 0 | 1, 1, 1, 1
    assert row["tokens_per_call"] == pytest.approx(8 / 3)
    # standard error of the mean of (2, 5, 1), relative to it
    assert row["tokens_per_call_rse"] == pytest.approx(statistics.stdev([2, 5, 1]) / 3 ** 0.5 / (8 / 3))
