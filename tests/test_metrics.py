import math
import statistics

import numpy as np
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


STEPS = pl.DataFrame([
    # gamma 3: rejected at 1; all accepted; rejected at 0; a plain step (not a verification step)
    {"g": "a", "proposed": 3, "accepted": 1, "rejected_at": 1, "target_conf": [0.99, 0.6, 0.3, 0.2]},
    {"g": "a", "proposed": 3, "accepted": 3, "rejected_at": None, "target_conf": [0.97, 0.96, 0.85, 0.4]},
    {"g": "a", "proposed": 3, "accepted": 0, "rejected_at": 0, "target_conf": [0.45, 0.9, 0.9, 0.9]},
    {"g": "a", "proposed": 0, "accepted": 0, "rejected_at": None, "target_conf": [0.5]},
])


def test_per_position_acceptance_given_reached():
    got = {r["pos"]: (r["accept_prob"], r["tested"]) for r in metrics.per_position(STEPS, ["g"]).iter_rows(named=True)}
    # position 1 reached by all three steps, accepted by two; 2 reached by two, accepted by one; 3 by one, accepted
    assert got == {1: (pytest.approx(2 / 3), 3), 2: (0.5, 2), 3: (1.0, 1)}


def test_rejection_histogram():
    got = {r["rejected_at"]: r["steps"] for r in metrics.rejection_histogram(STEPS, ["g"]).iter_rows(named=True)}
    assert got == {"0": 1, "1": 1, "none": 1}


def test_acceptance_by_target_confidence_over_positions_reached():
    rows = metrics.by_confidence(STEPS, ["g"]).iter_rows(named=True)
    got = {r["target_conf"]: (r["accept_prob"], r["tested"]) for r in rows}
    # reached: (0.99 acc, 0.6 rej), (0.97, 0.96, 0.85 acc), (0.45 rej)
    assert got == {">=0.95": (1.0, 3), "0.5-0.8": (0.0, 1), "0.8-0.95": (1.0, 1), "<0.5": (0.0, 1)}


def test_timing_floor_sets_the_plain_steps_of_speculative_generations_beside_their_twins():
    def step(prompt, mode, proposed, ms, repeat=0):
        return {"config": "g1", "category": "code", "prompt_id": prompt, "repeat": repeat, "mode": mode,
                "proposed": proposed, "verify_ms": ms}
    spec = [step("a", "speculative", 0, 40.0)] * 4 + [step("a", "speculative", 2, 90.0)] \
        + [step("b", "speculative", 0, 40.0)] * 3  # too few plain steps to time: left out
    twins = [step("a", "baseline", 0, 44.0)] * 5 + [step("b", "baseline", 0, 40.0)] * 5 \
        + [step("a", "baseline", 0, 10.0, repeat=1)] * 5  # another repeat's twin: not this generation's
    fl = metrics.timing_floor(pl.DataFrame(spec), pl.DataFrame(twins))
    assert fl.select("prompt_id", "plain_steps").rows() == [("a", 4)]
    assert fl["ratio"].to_list() == [pytest.approx(1.1)]
    assert metrics.timing_floor(pl.DataFrame(spec), pl.DataFrame()).is_empty()


def test_pace_spread_recovers_the_pace_beyond_the_decodes_own_scatter():
    """Per generation, the twin's 16 decodes and the speculative generation's 8 plain ones, each scattered by
    10% around the generation's pace, the twin's pace moved by 6% (log scale): the spread is told apart."""
    rng = np.random.default_rng(3)
    spec, twins = [], []
    def steps(p, mode, n, pace):
        return [{"config": "g1", "category": "c", "prompt_id": f"p{p}", "repeat": 0, "mode": mode, "proposed": 0,
                 "verify_ms": 40.0 * pace * x} for x in rng.lognormal(0, 0.10, n)]
    for p in range(200):
        spec += steps(p, "speculative", 8, 1.0)
        twins += steps(p, "baseline", 16, math.exp(rng.normal(0, 0.06)))
    fl = metrics.timing_floor(pl.DataFrame(spec), pl.DataFrame(twins))
    raw = float((fl["ratio"].log() ** 2).mean() ** 0.5)
    assert metrics.pace_spread(fl) == pytest.approx(0.06, abs=0.01)
    assert raw > metrics.pace_spread(fl) + 0.01  # the scatter of 8 and 16 decodes adds about 4% to the 6%
    assert metrics.pace_spread(fl.head(0)) == 0.0


def test_classify_takes_the_kind_from_the_recorded_check():
    ev = {"diverged_at": 1, "kind": "kernel near-tie", "margin": 0.05}
    assert metrics.classify([1, 2], [1, 2], None)["kind"] == "equal"
    assert metrics.classify([1, 2], [1, 3], ev) == {"equal": False, "diverged_at": 1, "margin": 0.05,
                                                    "kind": "kernel near-tie"}
    assert metrics.classify([1, 2], [1, 3], None)["kind"] == "unchecked"
    assert metrics.classify([7, 2], [1, 3], ev)["kind"] == "unchecked"  # a check of another position
