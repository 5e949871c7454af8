"""The sampling policy's processed distribution against a straightforward full-sort reference."""
import numpy as np
import pytest

from harness.errors import HarnessError
from harness.sampling import Policy, process, top_prob


def reference(logits: np.ndarray, pol: Policy) -> dict[int, float]:
    """top_k -> top_p -> min_p on the raw softmax, then temperature: the obvious O(V log V) way."""
    order = np.lexsort((np.arange(len(logits)), -logits))
    ids = order[: pol.top_k] if pol.top_k else order
    p = np.exp(logits[ids] - logits.max())
    total = p.sum() if pol.top_k else np.exp(logits - logits.max()).sum()
    if pol.top_p < 1:
        keep = int(np.searchsorted(np.cumsum(p) / total, pol.top_p)) + 1
        ids = ids[:keep]
    if pol.min_p > 0:
        ids = ids[logits[ids] >= logits.max() + np.log(pol.min_p)]
    w = np.exp((logits[ids] - logits.max()) / pol.temperature)
    return dict(zip(ids.tolist(), (w / w.sum()).tolist()))


@pytest.mark.parametrize("pol", [
    Policy(temperature=0.7),
    Policy(temperature=1.0, top_k=40),
    Policy(temperature=0.8, top_p=0.9),
    Policy(temperature=1.3, top_p=0.5, min_p=0.05),
    Policy(temperature=0.5, top_k=100, top_p=0.95),
    Policy(temperature=1.0, min_p=0.1),
])
def test_process_matches_reference(pol):
    rng = np.random.default_rng(1)
    for scale in (0.5, 3.0, 10.0):
        logits = (rng.standard_normal(5000) * scale).astype(np.float32)
        d = process(logits, pol)
        ref = reference(logits, pol)
        assert set(d.ids.tolist()) == set(ref)
        got = dict(zip(d.ids.tolist(), d.probs.tolist()))
        for k, v in ref.items():
            assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-9)
        assert list(d.ids) == sorted(d.ids)


def test_greedy_is_a_point_mass_on_argmax():
    logits = np.array([0.1, 2.0, 1.9, -1.0], dtype=np.float32)
    d = process(logits, Policy())
    assert list(d.ids) == [1] and d.probs[0] == 1.0


def test_top_prob_is_softmax_max():
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert top_prob(logits) == pytest.approx(np.exp(3) / np.exp([1, 2, 3]).sum(), rel=1e-6)


@pytest.mark.parametrize("kw, word", [
    ({"temperature": -0.1}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"min_p": -0.1}, "min_p"), ({"min_p": 1.1}, "min_p")])
def test_bad_policy_values_are_refused(kw, word):
    with pytest.raises(HarnessError, match=word):
        Policy(**kw)


def test_label_states_the_whole_policy():
    assert Policy().label == "greedy"
    assert Policy(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05).label == "T=0.7 top_k=40 top_p=0.9 min_p=0.05"
