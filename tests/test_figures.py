"""concurrency.figures, pure: a batched run's prediction replayed from its step records, and the prediction
counted beside the same plain work timed twice (with the report's line for it)."""
import pytest

from harness.costmodel import BatchCosts, Shape, price
from harness.concurrency.figures import _batched, _per_sequence, agreement, gap, shaped_prices
from harness.report.concurrency import agreement_line


# run 20261201-224743-vm's batched costs (code, greedy): 1, 2, 4 and 8 sequences, blocks of 4
C = BatchCosts((1, 2, 4, 8), (38.9, 64.2, 108.6, 182.8), (105.2, 188.5, 242.3, 406.0), (26.8, 59.0, 71.6, 101.6),
               block=4)


def step(batch_step, seq, pid, proposed, emitted, gamma=3, ms=(10.0, 50.0, 1.0)):
    return {"type": "step", "batch_step": batch_step, "seq": seq, "prompt_id": pid, "repeat": 0, "gamma": gamma,
            "proposed": proposed, "emitted": emitted, "draft_ms": ms[0], "verify_ms": ms[1], "overhead_ms": ms[2]}


def test_a_batched_runs_steps_are_replayed_from_its_records_and_weighted_by_the_sequences_in_them():
    recs = [step(0, 0, "a", 3, 4), step(0, 1, "b", 3, 1), step(1, 0, "a", 3, 2), step(1, 1, "b", 3, 4),
            step(2, 0, "a", 0, 1, gamma=0)]
    groups = _batched(recs)
    assert [[s["seq"] for s in g] for g in groups] == [[0, 1], [0, 1], [0]]
    first = 1.0 + price(Shape((4, 4), (1, 1), (2, 2), seqs=(0, 1)), C)
    # "a" accepted all three (4 tokens, 2 drafts fed back): its draft catches up 2; "b" rejected: 1
    second = 1.0 + price(Shape((4, 4), (2, 1), (2, 2), seqs=(0, 1)), C)
    third = 1.0 + price(Shape((1,), (0,), (0,), seqs=(0,)), C)  # a request's last token: nothing drafted
    assert _per_sequence(groups, shaped_prices(C, groups, False)) == pytest.approx((2 * first + 2 * second + third) / 5)
    assert _batched([{"type": "step", "step": 0}]) is None  # a sequential run's records


def test_the_prediction_is_counted_beside_the_same_plain_work_timed_twice():
    rows = [{"predicted": 1.05, "speedup": 1.0, "plain_step_ms": 200.0, "base_step_ms": 250.0},
            {"predicted": 0.5, "speedup": 0.6, "plain_step_ms": 210.0, "base_step_ms": 200.0},
            {"predicted": None, "speedup": 0.9, "plain_step_ms": 200.0, "base_step_ms": None}]  # no twin, no cost
    assert gap(0.5, 0.6) == pytest.approx(0.2) and gap(0.6, 0.5) == gap(0.5, 0.6)
    assert agreement(rows) == {"predicted": 1, "predicted_of": 2, "twice": 1, "twice_of": 2,
                               "twice_max": pytest.approx(0.25)}
    assert agreement([])["twice_max"] is None
    # the report's line: the floor beside the prediction, and what narrows it only where the floor moved
    line = agreement_line(rows)
    assert "in 1 of 2 row(s)" in line and "agrees within 10% in 1 of 2 (the largest gap 25%)" in line
    assert "a larger `--max-tokens` or `--repeat`" in line
    assert "--max-tokens" not in agreement_line(rows[1:])


def test_a_sequential_runs_overhead_is_read_per_verified_row():
    """The mean-step prediction of a run without batched records charges the loop's overhead per verified row,
    as the cost model does: 1 + 3 ms over 1 + 4 rows."""
    from harness.concurrency.figures import _overhead_per_row
    recs = [{"prompt_id": "a", "step": 0, "proposed": 0, "overhead_ms": 1.0},
            {"prompt_id": "a", "step": 1, "proposed": 3, "overhead_ms": 3.0}]
    assert _overhead_per_row(recs) == pytest.approx(4.0 / 5) and _overhead_per_row([]) == 0.0
