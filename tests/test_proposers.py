"""proposers.py: the n-gram lookup proposes what followed."""
import pytest

from harness.errors import HarnessError
from harness.proposers import NgramProposer


def test_ngram_proposer_looks_up_what_followed():
    p = NgramProposer(2)
    prop = p.propose([5, 6, 7, 8, 9, 5, 6], 3)
    assert prop.tokens == [7, 8, 9]
    assert all(list(q.ids) == [t] and q.probs[0] == 1.0 for q, t in zip(prop.q, prop.tokens))
    assert p.propose([1, 2, 3], 3).tokens == []
    with pytest.raises(HarnessError, match="n-gram size"):
        NgramProposer(0)
