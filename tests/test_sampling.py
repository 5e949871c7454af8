"""The sampling policy's processed distribution against a straightforward full-sort reference."""
import numpy as np
import pytest

from harness.errors import HarnessError
from harness.sampling import Policy, process, top_prob


def reference(logits: np.ndarray, pol: Policy) -> dict[int, float]:
    """top_k -> top_p -> min_p on the raw softmax, then temperature: the obvious O(V log V) way, in float64."""
    logits = logits.astype(np.float64)
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
    return {i: v for i, v in zip(ids.tolist(), (w / w.sum()).tolist()) if v > 0}


def assert_matches_reference(logits: np.ndarray, pol: Policy) -> None:
    d = process(logits, pol)
    ref = reference(logits, pol)
    got = dict(zip(d.ids.tolist(), d.probs.tolist()))
    assert list(d.ids) == sorted(d.ids)
    if pol.top_k or len(ref) < 1000:
        assert set(got) == set(ref)
        for k, v in ref.items():
            assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-9)
    else:  # a top_p cut deep in a flat tail of 10^5 ids: float32 sums may move it by a few ids of ~1e-6 each
        tv = 0.5 * sum(abs(got.get(i, 0.0) - ref.get(i, 0.0)) for i in set(got) | set(ref))
        assert tv < 1e-6


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
        assert_matches_reference((rng.standard_normal(5000) * scale).astype(np.float32), pol)


def lm_like_logits(rng, n=151936) -> np.ndarray:
    """A language model's shape: a long flat tail and a handful of strong candidates of varied spread."""
    x = rng.standard_normal(n) * rng.uniform(1, 3)
    top = rng.choice(n, size=rng.integers(2, 60), replace=False)
    x[top] += rng.uniform(4, 14) + rng.standard_normal(len(top)) * rng.uniform(0.3, 3)
    return x.astype(np.float32)


@pytest.mark.parametrize("top_k", [0, 40])
@pytest.mark.parametrize("top_p", [1.0, 0.95])
@pytest.mark.parametrize("min_p", [0.0, 0.05])
@pytest.mark.parametrize("temperature", [0.8, 1.5])
def test_every_combination_of_truncations_matches_reference(top_k, top_p, min_p, temperature):
    """llama.cpp's default policy (T 0.8, top_k 40, top_p 0.95, min_p 0.05) included: every on/off mix of the
    three truncations, at a real vocabulary size."""
    pol = Policy(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rng = np.random.default_rng([top_k, int(top_p * 100), int(min_p * 100), int(temperature * 10)])
    for _ in range(15):
        assert_matches_reference(lm_like_logits(rng), pol)


def test_top_p_is_normalised_over_the_top_k_even_when_min_p_keeps_fewer():
    """Fewer than k ids clear the min_p floor: top_p must still see all k survivors (the issue's example)."""
    logits = np.full(1000, -30.0, dtype=np.float32)
    logits[0], logits[1], logits[2:40] = 0.0, np.log(0.1), np.log(0.04)
    d = process(logits, Policy(temperature=1, top_k=40, top_p=0.9, min_p=0.05))
    assert list(d.ids) == [0, 1]
    assert d.probs == pytest.approx([1 / 1.1, 0.1 / 1.1])
    assert_matches_reference(logits, Policy(temperature=1, top_k=40, top_p=0.9, min_p=0.05))


def test_fewer_finite_logits_than_k_widen_once_and_keep_no_zero_probability_ids():
    import warnings
    logits = np.full(151936, -np.inf, dtype=np.float32)
    logits[[3, 70, 5000]] = [2.0, 1.0, -3.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ~124 doublings of the window ended in an overflow warning
        d = process(logits, Policy(temperature=1, top_k=40))
    assert list(d.ids) == [3, 70, 5000] and (d.probs > 0).all()
    assert_matches_reference(logits, Policy(temperature=0.7, top_k=40, top_p=0.9, min_p=0.01))


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
