"""report.costs: a sweep row's overhead per target call, as the cost model's overhead per verified row."""
import pytest

from harness.costmodel import read
from harness.report.costs import overhead_per_row


def test_per_call_figures_become_per_row():
    """A sweep row's overhead per target call, over its calls' rows: 10 calls proposing 20 drafts verified 30
    rows, so 3 ms per call is 1 ms per row; the replay's costs record (from plain steps) is per row already."""
    assert overhead_per_row({"overhead_ms_per_call": 3.0, "target_calls": 10, "proposed": 20}) == pytest.approx(1.0)
    assert overhead_per_row({"overhead_ms_per_call": None, "target_calls": 10, "proposed": 20}) == 0.0
    rec = {"contexts": [100], "target_ms_by_context": [[19.0, 30.0]], "draft_ms_by_context": [[4.0, 6.0]],
           "overhead_ms": 0.5}
    c = read(rec).costs(100).levelled(20.0)
    assert c.overhead_ms_per_row == 0.5 and c.target_ms[0] == pytest.approx(19.5)  # a plain decode less its row
