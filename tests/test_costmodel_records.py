"""costmodel.records: every format of decode-cost record the harness has written, read by one reader into the
same costs."""
import pytest

from harness.costmodel import calibrated, read

NOW = {"type": "costs", "contexts": [128, 1024], "k": 3, "overhead_ms": 0.5,
       "target_ms_by_context": [[10.0, 16.0, 20.0], [14.0, 24.0, 32.0]],
       "draft_ms_by_context": [[2.0, 3.0, 3.5], [4.0, 5.0, 5.5]]}


def test_a_sequential_record_reads_at_its_context_with_its_overhead():
    c = read(NOW).costs(576)
    assert c.target_ms == pytest.approx([12.0, 20.0, 26.0]) and c.draft_curve == pytest.approx((3.0, 4.0, 4.5))
    assert c.draft_ms == pytest.approx(3.0) and c.overhead_ms_per_row == 0.5
    assert read(NOW).costs(576, 0.2).overhead_ms_per_row == 0.2 and read(NOW).contexts == 2
    assert read(NOW).costs(4096).target_ms == [14.0, 24.0, 32.0]  # held beyond the last context


def test_older_sequential_formats_read_as_the_current_one():
    one = read({"type": "costs", "target_ms": [10.0, 16.0], "draft_ms": [2.0, 3.0]})  # one context only
    assert one.contexts == 1 and one.costs(999).target_ms == [10.0, 16.0] and one.costs(5).draft_ms == 2.0
    lookup = read({"contexts": [128], "target_ms_by_context": [[10.0, 16.0]]})  # no draft model
    assert lookup.costs(128).draft_ms == 0.0 and lookup.costs(128).draft_curve == ()


def test_sparse_block_sizes_are_read_where_the_medians_sit_at_them():
    """Medians at the timed ks only (an older record) are interpolated between them; medians already read at
    every k (calibrate.summarized since ks were sparse) are not read at the ks a second time."""
    sparse = {"contexts": [128], "ks": [1, 2, 4], "target_ms_by_context": [[10.0, 12.0, 16.0]]}
    assert read(sparse).batch(128, 2, 1).verify(1) == pytest.approx(14.0)  # k = 3, halfway between 2 and 4
    dense = {"contexts": [128], "ks": [1, 2, 4], "target_ms_by_context": [[10.0, 12.0, 13.0, 16.0]]}
    assert read(dense).batch(128, 2, 1).verify(1) == pytest.approx(13.0)


def test_a_batched_record_prices_batches_not_one_sequence():
    rec = {"type": "costs", "seqs": [1, 2], "plain_ms": [10, 12], "verify_ms": [20, 30], "draft_ms": [3, 4]}
    b = read(rec).batch(128, 3, 2)
    assert b.block == 4 and b.verify(2) == 30 and read(rec | {"block": 3}).batch(128, 5, 2).block == 3
    with pytest.raises(ValueError, match="batch"):
        read(rec).costs(128)


def test_calibration_files_read_the_drafts_last_row_times_or_all_logits_in_older_ones():
    t = {"contexts": [128, 1024], "ms_by_context": NOW["target_ms_by_context"]}
    d = {"contexts": [128, 1024], "ms_by_context": [[9.0, 9.0, 9.0]] * 2, "ms_last_by_context": [[2.0, 3.0, 4.0]] * 2}
    assert calibrated(t, d).costs(128).draft_curve == (2.0, 3.0, 4.0)
    assert calibrated(t, {k: v for k, v in d.items() if k != "ms_last_by_context"}).costs(128).draft_ms == 9.0
    assert calibrated(t, None).costs(576).target_ms == pytest.approx([12.0, 20.0, 26.0])
