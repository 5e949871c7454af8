"""Uneven batches: how llama.cpp cuts a batch of several sequences into ubatches (llama_batch_allocr::split_equal
with a KV buffer per sequence, split_simple with one unified buffer), their prices, a batched run's prediction
replayed from its step records (all pure), and --kv-unified swept as a plan setting."""
from dataclasses import replace

import pytest

from harness.concurrency.costs import BatchCosts, batch_ms, shaped_step_ms, split
from harness.concurrency.figures import _batched, _per_sequence, agreement, gap, shaped_prices
from harness.errors import HarnessError
from harness.plan import Instance, Params, expand, make_params
from harness.sampling import Policy
from harness.specs import DraftModel
from harness.report.howto import howto
from harness.report.concurrency import agreement_line
from tests.conftest import PROMPT_FILE
from tests.helpers import harness, one_line_error

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"
GREEDY = Policy()
# run 20261201-224743-vm's batched costs (code, greedy): 1, 2, 4 and 8 sequences, blocks of 4
C = BatchCosts((1, 2, 4, 8), (38.9, 64.2, 108.6, 182.8), (105.2, 188.5, 242.3, 406.0), (26.8, 59.0, 71.6, 101.6),
               block=4)


@pytest.mark.parametrize("sizes, seqs, ubatches", [
    ([4, 4, 4, 4], None, [(4, 4)]),                           # even: one graph
    ([4, 4, 4, 3], None, [(4, 3), (3, 1)]),                   # a request near its end drafted one fewer
    ([1] * 7 + [2], None, [(8, 1), (1, 1)]),                  # the draft catching up two tokens in one sequence
    ([2] + [1] * 7, None, [(8, 1), (1, 1)]),
    ([4, 1, 4, 4], None, [(4, 1), (1, 3), (2, 3)]),           # a lookup proposed nothing: 0 and 2 are not adjacent
    ([1] * 8, [0, 1, 2, 4, 5, 6, 7, 3], [(4, 1), (4, 1)]),    # slots refilled out of order: 0-3, then 4-7
    ([4, 0, 4], [0, 1, 2], [(1, 4), (1, 4)]),                 # a sequence with no rows breaks the run of ids
    ([2, 2], [5, 6], [(2, 2)]),
])
def test_a_kv_buffer_per_sequence_splits_into_equal_shares_of_consecutive_sequences(sizes, seqs, ubatches):
    assert split(sizes, seqs) == ubatches
    assert sum(m * t for m, t in ubatches) == sum(sizes)


def test_ubatch_size_caps_the_tokens_per_share_and_a_unified_buffer_takes_tokens_in_order():
    assert split([4] * 4, n_ubatch=8) == [(4, 2), (4, 2)]
    assert split([4, 4, 4, 3], unified=True) == [(4, 3.75)]
    assert split([1] * 8, [0, 1, 2, 4, 5, 6, 7, 3], unified=True) == [(8, 1.0)]
    assert split([4, 4, 4], unified=True, n_ubatch=8) == [(2, 4.0), (1, 4.0)]


def test_a_ubatch_is_priced_linearly_in_tokens_between_plain_and_verify():
    assert C.ubatch(8, 1) == pytest.approx(182.8) and C.ubatch(8, 4) == pytest.approx(406.0)
    assert C.ubatch(8, 2.5) == pytest.approx((182.8 + 406.0) / 2) and C.ubatch(8, 8) == pytest.approx(812.0)
    assert C.ubatch(3, 1) == pytest.approx(C.plain(3))
    # the draft was measured one token per sequence: its blocks take the target's shape
    assert C.ubatch(8, 4, draft=True) == pytest.approx(101.6 * 406.0 / 182.8)
    assert BatchCosts((1,), (5.0,), (9.0,), block=4).ubatch(1, 2, draft=True) == 0.0  # a lookup
    with pytest.raises(ValueError):
        BatchCosts((1,), (5.0,), (9.0,)).ubatch(1, 2)


def test_a_draft_measured_at_two_tokens_a_sequence_takes_its_own_shape():
    # the 0.5B draft at 8 sequences on the slower Xeon VM: two tokens each cost 1.70x one, the target's 1.17x
    from dataclasses import replace
    c = replace(C, draft_catch_up_ms=(45.0, 90.0, 120.0, 172.7))
    assert c.ubatch(8, 1, True) == pytest.approx(101.6) and c.ubatch(8, 2, True) == pytest.approx(172.7)
    assert c.ubatch(8, 1.5, True) == pytest.approx((101.6 + 172.7) / 2) and c.ubatch(8, 4, True) == pytest.approx(345.4)
    assert c.ubatch(8, 1.5, True) > C.ubatch(8, 1.5, True)  # borrowing the target's shape priced it lower
    assert c.ubatch(8, 2) == C.ubatch(8, 2)  # the target's own blocks are unchanged
    # a unified draft catching up two tokens in half its sequences: one graph, on the draft's line
    assert batch_ms(c, [2, 1] * 4, unified=True, draft=True) == pytest.approx(c.ubatch(8, 1.5, True))


def test_an_uneven_batch_costs_more_with_a_buffer_per_sequence_than_unified():
    even, longer, shorter = [1] * 8, [1] * 7 + [2], [4] * 7 + [3]
    assert batch_ms(C, even) == pytest.approx(182.8)
    assert batch_ms(C, longer) == pytest.approx(182.8 + 38.9)  # a second graph of one sequence
    assert batch_ms(C, shorter) == pytest.approx(C.ubatch(8, 3) + C.plain(7))
    assert batch_ms(C, longer) / batch_ms(C, even) > 1.2 > batch_ms(C, longer, unified=True) / batch_ms(C, even)
    assert batch_ms(C, shorter, unified=True) < batch_ms(C, [4] * 8) < batch_ms(C, shorter)


def test_a_step_prices_the_catch_up_each_draft_position_and_the_verification():
    # two sequences, gamma 3: the first caught up two tokens and drafted 3 (fed back 2), the second caught up one
    # and drafted 1 (its draft stopped early: fed back 1)
    ms = shaped_step_ms(C, [0, 1], [4, 2], [2, 1], [2, 1])
    draft = C.ubatch(2, 1, True) + C.ubatch(1, 1, True) + C.ubatch(2, 1, True) + C.ubatch(1, 1, True)
    assert ms == pytest.approx(draft + C.ubatch(2, 2) + C.ubatch(1, 2))
    assert shaped_step_ms(C, [0, 1], [4, 4], [1, 1], [2, 2], unified=True) == pytest.approx(
        3 * C.draft(2) + C.verify(2))


def step(batch_step, seq, pid, proposed, emitted, gamma=3, ms=(10.0, 50.0, 1.0)):
    return {"type": "step", "batch_step": batch_step, "seq": seq, "prompt_id": pid, "repeat": 0, "gamma": gamma,
            "proposed": proposed, "emitted": emitted, "draft_ms": ms[0], "verify_ms": ms[1], "overhead_ms": ms[2]}


def test_a_batched_runs_steps_are_replayed_from_its_records_and_weighted_by_the_sequences_in_them():
    recs = [step(0, 0, "a", 3, 4), step(0, 1, "b", 3, 1), step(1, 0, "a", 3, 2), step(1, 1, "b", 3, 4),
            step(2, 0, "a", 0, 1, gamma=0)]
    groups = _batched(recs)
    assert [[s["seq"] for s in g] for g in groups] == [[0, 1], [0, 1], [0]]
    first = 1.0 + shaped_step_ms(C, [0, 1], [4, 4], [1, 1], [2, 2])
    # "a" accepted all three (4 tokens, 2 drafts fed back): its draft catches up 2; "b" rejected: 1
    second = 1.0 + shaped_step_ms(C, [0, 1], [4, 4], [2, 1], [2, 2])
    third = 1.0 + shaped_step_ms(C, [0], [1], [0], [0])  # a request's last token: nothing drafted
    assert _per_sequence(groups, shaped_prices(C, groups, False)) == pytest.approx((2 * first + 2 * second + third) / 5)
    assert _batched([{"type": "step", "step": 0}]) is None  # a sequential run's records


def test_kv_unified_is_swept_labelled_and_reaches_both_engines():
    insts = expand(make_params({}, {"target": T, "draft": D, "gamma": "2", "parallel": "1,4", "kv_unified": "off,on"}))
    assert sorted({(i.parallel, i.kv_unified, i.setup) for i in insts}) == [
        (1, False, ""), (4, False, "parallel 4"), (4, True, "parallel 4, unified KV")]  # one sequence: one buffer
    four = next(i for i in insts if i.kv_unified and not i.baseline)
    assert four.plain().kv_unified and four.engine_config(4096).kv_unified
    one = Instance(T, DraftModel(D), 2, GREEDY, 0, 0, 0)
    assert four.draft_engine_config(4096).kv_unified and not one.engine_config(4096).kv_unified
    # off is the default, and stays out of the id: runs from before keep theirs
    assert replace(one, parallel=4).id == replace(one, parallel=4, kv_unified=False).id
    assert Params().kv_unified == ["off"]
    assert " -np 4 -kvu " in howto(four, 4096, catalog={}).server  # llama-server's flag
    with pytest.raises(HarnessError) as e:
        make_params({}, {"target": T, "kv_unified": "maybe"})
    assert "--kv-unified takes on, off" in str(e.value)


def test_kv_unified_through_the_command_line_dry_run(tmp_path, smol, smol_q2k):
    args = ("bench", "--target", T, "--draft", D, "--gamma", "2", "--parallel", "1,2", "--prompts", PROMPT_FILE,
            "--max-tokens", "8", "--dry-run", "--allow-busy", "--out", tmp_path / "r")  # a dry run times nothing
    r = harness(*args, "--kv-unified", "off,on")
    # parallel 1: baseline and draft; parallel 2: both with a KV buffer per sequence, and both unified
    assert r.returncode == 0 and "6 configurations x" in r.stderr, r.stderr
    one_line_error(harness(*args, "--kv-unified", "yes"), "--kv-unified takes on, off")


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
