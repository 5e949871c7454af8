"""The loop's overhead per step, one convention everywhere: a step that verified k logits rows (its drafts and one
more) costs k times the overhead per row, in the cost model, the replay and the adaptive controller alike."""
import pytest

from harness.analysis.predict import costs_at
from harness.analysis.replay import Step, step_ms
from harness.costmodel import AdaptiveGamma, Costs, expected_tokens, predicted_speedup
from harness.report.costs import overhead_per_row

OH = 0.7
CURVE = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, overhead_ms_per_row=OH, draft_curve=(5, 7, 8, 9))
FLAT = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, overhead_ms_per_row=OH)
FREE = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, draft_curve=(5, 7, 8, 9))


@pytest.mark.parametrize("gamma", range(5))
def test_a_step_of_k_rows_costs_k_rows_overhead_in_the_model_and_the_replay(gamma):
    rows = gamma + 1
    assert CURVE.overhead(rows) == pytest.approx(rows * OH)
    assert CURVE.step_ms(gamma) - FREE.step_ms(gamma) == pytest.approx(rows * OH)
    for s in (Step(gamma, 0, 1, gamma > 0), Step(gamma, gamma, gamma + 1)):
        assert step_ms(s, CURVE) - step_ms(s, FREE) == pytest.approx(rows * OH)
    # a step rejected at its first draft, without a draft curve: the model's step is the replay's
    assert FLAT.step_ms(gamma) == pytest.approx(step_ms(Step(gamma, 0, 1, gamma > 0), FLAT))
    assert CURVE.step_ms(0) == pytest.approx(step_ms(Step(0, 0, 1), CURVE))  # a plain decode: no draft at all


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("backlog", [0, 2])
def test_the_controllers_price_is_the_replays_step_cost(gamma, backlog):
    """probe_price is the expected step cost less the tokens it is worth: the replay's cost of the step, averaged
    over all its drafts accepted (w.p. alpha^gamma: the draft's bonus catch-up) or not, at the same backlog."""
    ctl = AdaptiveGamma(CURVE, 4)
    ctl.backlog = backlog
    a = ctl.alpha
    replayed = (a ** gamma * step_ms(Step(gamma, gamma, gamma + 1), CURVE, backlog)
                + (1 - a ** gamma) * step_ms(Step(gamma, 0, 1, True), CURVE, backlog))
    # the tokens are worth what plain decoding would pay for them, its row's overhead included
    assert ctl.probe_price(gamma) + expected_tokens(a, gamma) * (30 + OH) == pytest.approx(replayed)


def test_plain_steps_in_the_predicted_speedup_pay_one_rows_overhead():
    # half the steps propose 2 (3 rows), half decode plainly (1 row): 1.375 tokens per 0.5 x (10 + 60 + 3 x 0.7)
    # + 0.5 x (30 + 0.7) ms, against plain decoding's 30 + 0.7 ms a token
    ms = 0.5 * (2 * 5 + 60 + 3 * OH) + 0.5 * (30 + OH)
    assert predicted_speedup(0.5, 2, FLAT, share=0.5) == pytest.approx(1.375 * (30 + OH) / ms)
    # no overhead, no drafts accepted, nothing proposed: exactly plain decoding
    assert predicted_speedup(0.0, 2, FLAT, share=0.0) == pytest.approx(1.0)


def test_per_call_figures_become_per_row():
    """A sweep row's overhead per target call, over its calls' rows: 10 calls proposing 20 drafts verified 30
    rows, so 3 ms per call is 1 ms per row; the replay's costs record (from plain steps) is per row already."""
    assert overhead_per_row({"overhead_ms_per_call": 3.0, "target_calls": 10, "proposed": 20}) == pytest.approx(1.0)
    assert overhead_per_row({"overhead_ms_per_call": None, "target_calls": 10, "proposed": 20}) == 0.0
    rec = {"contexts": [100], "target_ms_by_context": [[19.0, 30.0]], "draft_ms_by_context": [[4.0, 6.0]],
           "overhead_ms": 0.5}
    c = costs_at(rec, 100, 20.0)
    assert c.overhead_ms_per_row == 0.5 and c.target_ms[0] == pytest.approx(19.5)  # a plain decode less its row


def test_two_moments_pool_their_repetitions():
    """calibrate.pooled: the two moments' repetitions together, the spread taking in the drift between them."""
    from harness.calibrate import pooled, summarized
    first = summarized({"type": "costs", "contexts": [100], "k": 2, "reps": 3,
                        "target_times_by_context": [[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]]]})
    second = summarized({"type": "costs", "contexts": [100], "k": 2, "reps": 3,
                         "target_times_by_context": [[[14.0, 15.0, 16.0], [24.0, 25.0, 26.0]]]})
    assert first["target_ms_by_context"] == [[11.0, 21.0]] and first["target_sd_by_context"] == [[1.0, 1.0]]
    both = pooled(first, second)
    assert both["reps"] == 6 and both["target_times_by_context"][0][0] == [10.0, 11.0, 12.0, 14.0, 15.0, 16.0]
    assert both["target_ms_by_context"] == [[13.0, 23.0]]  # between the two moments
    assert both["target_sd_by_context"][0][0] == pytest.approx(2.366, abs=1e-3)  # wider than either moment's 1.0


def test_the_costs_two_moments_say_how_far_the_machine_moved():
    from harness.calibrate import moved
    rec = {"reps": 4, "target_times_by_context": [[[10.0, 10.0, 12.0, 12.0], [20.0, 20.0, 18.0, 18.0]]]}
    assert moved(rec) == pytest.approx([0.2, -0.1])
    assert moved({"reps": 3, "target_ms_by_context": [[10.0]]}) is None  # measured once, before the pooling


def test_a_workers_costs_before_and_after_its_generations_are_pooled():
    """calibrate.unit_costs: the first and last costs record of a configuration pooled (in-situ: repetitions
    together; batched: the mean of the two medians); a record measured once, or a replay's, as it is."""
    from harness.calibrate import summarized, unit_costs
    once = summarized({"type": "costs", "config": "a", "contexts": [100], "k": 1, "reps": 2,
                       "target_times_by_context": [[[10.0, 12.0]]]})
    later = summarized({"type": "costs", "config": "a", "contexts": [100], "k": 1, "reps": 2,
                        "target_times_by_context": [[[14.0, 16.0]]]})
    batched = [{"type": "costs", "config": "b", "seqs": [1, 8], "plain_ms": [10.0, 40.0], "verify_ms": [20.0, 80.0],
                "draft_ms": [5.0, 20.0], "draft_catch_up_ms": [8.0, 34.0]},
               {"type": "costs", "config": "b", "seqs": [1, 8], "plain_ms": [12.0, 44.0], "verify_ms": [22.0, 90.0],
                "draft_ms": [5.0, 24.0], "draft_catch_up_ms": [8.0, 40.0]}]
    replay = {"type": "costs", "config": "c", "proposer": "d", "contexts": [100], "target_ms_by_context": [[1.0]]}
    got = unit_costs([once, {"type": "step"}, later, *batched, replay])
    assert set(got) == {"a", "b"}  # the replay's records are pooled where they are written
    assert got["a"]["reps"] == 4 and got["a"]["target_ms_by_context"] == [[13.0]]
    assert got["b"]["plain_ms"] == [11.0, 42.0] and got["b"]["verify_ms"] == [21.0, 85.0]
    assert got["b"]["draft_ms"] == [5.0, 22.0] and got["b"]["draft_catch_up_ms"] == [8.0, 37.0]
    assert unit_costs([once])["a"] is once
