"""The batched cost model (costmodel.batched, price.price, records.CostRecord.batch), pure: a step priced on
memory- and compute-bound cost curves, and uneven batches, as llama.cpp cuts a batch of several sequences into
ubatches (llama_batch_allocr::split_equal with a KV buffer per sequence, split_simple with one unified buffer),
and their prices."""

import pytest

from harness.costmodel import BatchCosts, Shape, batch_ms, predicted_speedup, price, read, split
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
    ms = price(Shape((4, 2), (2, 1), (2, 1), seqs=(0, 1)), C)
    draft = C.ubatch(2, 1, True) + C.ubatch(1, 1, True) + C.ubatch(2, 1, True) + C.ubatch(1, 1, True)
    assert ms == pytest.approx(draft + C.ubatch(2, 2) + C.ubatch(1, 2))
    assert price(Shape((4, 4), (1, 1), (2, 2), seqs=(0, 1)), C, unified=True) == pytest.approx(
        3 * C.draft(2) + C.verify(2))


# -- a step priced on memory- and compute-bound cost curves
def costs(per_seq: float, fixed: float = 40.0, draft_share: float = 0.25, gamma: int = 4,
          counts=(1, 2, 4, 8, 16, 32, 64)) -> BatchCosts:
    """Reading the weights costs `fixed` ms whatever the batch (memory-bound); each token per_seq ms more."""
    return BatchCosts(counts, tuple(fixed + per_seq * m for m in counts),
                      tuple(fixed + per_seq * m * (gamma + 1) for m in counts),
                      tuple(draft_share * (fixed + per_seq * m) for m in counts))


def test_batch_costs_interpolate_between_counts_and_scale_beyond():
    c = BatchCosts((1, 4, 8), (10.0, 16.0, 20.0), (20.0, 40.0, 60.0), (2.0, 3.0, 4.0))
    assert c.plain(1) == 10 and c.plain(6) == pytest.approx(18.0) and c.plain(16) == pytest.approx(40.0)
    assert c.verify(2) == pytest.approx(26.667, abs=1e-3) and c.draft(8) == 4.0
    assert BatchCosts((1,), (5.0,), (9.0,)).draft(3) == 0.0  # a lookup has no draft cost
    # gamma 3, all proposing: three draft decodes of 4 rows, one verification of 4 blocks
    assert c.step_ms(3, n=4) == pytest.approx(3 * 3.0 + 40.0)
    assert c.step_ms(0, n=4) == 16.0 and c.step_ms(3, share=0.0, n=4) == 16.0
    assert c.step_ms(3, share=0.5, n=4) == pytest.approx(9.0 + 20.0 + 8.0)


def test_speculation_gains_while_a_step_is_memory_bound_and_loses_once_compute_fills_the_batch():
    c = costs(1.0)
    gains = [predicted_speedup(0.8, 4, c, plain_ms=c.plain(n), n=n) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert gains[0] > 1.5 and gains == sorted(gains, reverse=True) and gains[-1] < 1
    assert c.plain(8) / 8 < c.plain(1)  # and plain decoding's throughput grows with n


def test_a_lookup_that_rarely_proposes_costs_only_the_steps_that_do():
    c = costs(2.0, fixed=10.0, draft_share=0.0, gamma=3)
    assert predicted_speedup(1.0, 3, c, 0.0, c.plain(2), n=2) == pytest.approx(1.0)
    assert predicted_speedup(1.0, 3, c, 0.5, c.plain(2), n=2) > 1.0


def test_costs_records_measured_with_sequences_or_as_single_sequence_blocks():
    rec = {"type": "costs", "seqs": [1, 2, 4], "context": 128, "plain_ms": [10, 12, 15], "verify_ms": [20, 30, 50],
           "draft_ms": [3, 4, 6]}
    c = read(rec).batch(500, 3, 4)
    assert c.seqs == (1, 2, 4) and c.verify(3) == 40 and c.draft(4) == 6 and c.draft_catch_up_ms == ()
    c = read(rec | {"draft_catch_up_ms": [5, 7, 10]}).batch(500, 3, 4)
    assert c.ubatch(4, 2, draft=True) == 10 and c.ubatch(2, 1.5, draft=True) == pytest.approx(5.5)
    # a run from before: one sequence's blocks of k tokens, at two contexts, priced at 1 and N sequences
    old = {"contexts": [128, 1024], "k": 16, "ks": [1, 2, 4, 8, 16], "draft_ks": [1, 4],
           "target_ms_by_context": [[10, 12, 15, 18, 30], [20, 22, 25, 28, 40]],
           "draft_ms_by_context": [[2, 4], [4, 6]]}
    c = read(old).batch(576, 3, 4)
    assert c.seqs == (1, 4) and c.plain(1) == pytest.approx(15) and c.verify(1) == pytest.approx(20)
    assert c.verify(4) == pytest.approx(35) and c.draft(4) == pytest.approx(5)
    seq = read({"contexts": [128], "k": 4, "target_ms_by_context": [[10, 12, 14, 16]]}).batch(500, 3, 1)
    assert seq.seqs == (1,) and (seq.plain(1), seq.verify(1)) == (10, 16) and seq.draft_ms == ()


def test_a_batch_of_one_prices_as_one_sequence_and_the_overhead_is_per_verified_row():
    """price takes N as a dimension: one sequence's step costs the same from one sequence's costs (Costs) and
    from a batch of one (BatchCosts read from the same record); the overhead is per verified row in both, over
    every sequence's rows in a batch."""
    from dataclasses import replace

    from harness.costmodel import Costs, Step
    rec = {"contexts": [128], "target_ms_by_context": [[10.0, 12.0, 14.0, 16.0]], "draft_ms_by_context": [[2.0] * 4],
           "overhead_ms": 0.5}
    one, batch = read(rec).costs(128), replace(read(rec).batch(128, 3, 1), overhead_ms_per_row=0.5)
    step = Step(3, 1, 2, True).shape()
    assert price(step, one) == pytest.approx(price(step, batch)) == pytest.approx(3 * 2.0 + 16.0 + 4 * 0.5)
    two = Shape((4, 2), (1, 1), (2, 0))
    assert price(two, batch) - price(two, replace(batch, overhead_ms_per_row=0.0)) == pytest.approx(6 * 0.5)
    with pytest.raises(ValueError, match="one sequence"):
        price(two, Costs([10.0, 12.0, 14.0, 16.0], 2.0))


@pytest.mark.parametrize("n, gamma", [(1, 1), (4, 3), (8, 2)])
def test_the_even_step_in_closed_form_is_the_price_of_its_shape(n, gamma):
    """BatchCosts.step_ms, an even batch of n sequences drafting gamma each (catch-up one token, gamma - 1 fed
    back), is price() of that shape, the overhead per verified row included."""
    from dataclasses import replace
    c = replace(C, overhead_ms_per_row=0.25, block=gamma + 1)
    even = Shape((gamma + 1,) * n, (1,) * n, (gamma - 1,) * n)
    assert price(even, replace(c, draft_catch_up_ms=())) == pytest.approx(c.step_ms(gamma, n=n))
