"""The verifier, tested statistically: emitted tokens must be distributed as the target's p."""
import zlib

import numpy as np
import pytest
from scipy.stats import chisquare

from harness.sampling import Dist
from harness.verify import Verdict, overlap, residual, verify_exact, verify_greedy, verify_stochastic

DRAWS = 200_000
V = 8


def dist(weights) -> Dist:
    w = np.asarray(weights, dtype=float)
    ids = np.flatnonzero(w > 0)
    return Dist(ids, w[ids] / w[ids].sum())


PAIRS = {
    "disjoint": ([1, 2, 3, 0, 0, 0, 0, 0], [0, 0, 0, 0, 2, 1, 1, 1]),
    "q_much_larger_on_some": ([4, 3, 1, 1, 1, 1, 1, 1], [1, 1, 30, 30, 1, 1, 1, 1]),
    "top_p_truncated_p": ([5, 3, 2, 0, 0, 0, 0, 0], [2, 2, 2, 2, 1, 1, 1, 1]),
    "q_equals_p": ([3, 1, 4, 1, 5, 9, 2, 6], [3, 1, 4, 1, 5, 9, 2, 6]),
    "ngram_point_mass_q": ([2, 5, 1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0, 0, 0]),  # what NgramProposer proposes
}


def emitted_first_tokens(p: Dist, q: Dist, verifier, seed: int) -> np.ndarray:
    """gamma = 1: the first emitted token is the accepted draft token or the correction."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(V)
    p_bonus = dist([1] * V)
    for _ in range(DRAWS):
        x = q.sample(rng)
        v = verifier(np.array([x]), [q], [p, p_bonus], rng)
        counts[x if v.accepted else v.token] += 1
    return counts


def chi2_pvalue(counts: np.ndarray, p: Dist) -> float:
    expected = np.zeros(V)
    expected[p.ids] = p.probs * counts.sum()
    support = expected > 0
    if counts[~support].sum() > 0:
        return 0.0
    return float(chisquare(counts[support], expected[support]).pvalue)


@pytest.mark.parametrize("case", PAIRS)
def test_stochastic_verifier_emits_target_distribution(case):
    p, q = (dist(w) for w in PAIRS[case])
    counts = emitted_first_tokens(p, q, verify_stochastic, seed=zlib.crc32(case.encode()))  # fixed: reproducible
    assert chi2_pvalue(counts, p) > 0.01


def always_accept(draft, q, p, rng):
    return Verdict(len(draft), p[len(draft)].sample(rng), [])


def test_negative_control_always_accepting_verifier_fails():
    p, q = (dist(w) for w in PAIRS["q_much_larger_on_some"])
    counts = emitted_first_tokens(p, q, always_accept, seed=7)
    assert chi2_pvalue(counts, p) < 1e-6


def test_overlap_and_residual():
    p, q = dist([1, 1, 0, 0]), dist([0, 1, 1, 0])
    assert overlap(p, q) == pytest.approx(0.5)
    r = residual(p, q)
    assert list(r.ids) == [0] and r.probs[0] == pytest.approx(1.0)
    assert overlap(p, p) == pytest.approx(1.0)
    assert residual(p, p) is p


def test_greedy_all_accepted_gives_bonus():
    v = verify_greedy(np.array([5, 6, 7]), np.array([5, 6, 7, 9]))
    assert (v.accepted, v.token) == (3, 9)
    assert v.alpha == [1.0, 1.0, 1.0]


def test_greedy_rejects_at_first_position():
    v = verify_greedy(np.array([5, 6, 7]), np.array([4, 6, 7, 9]))
    assert (v.accepted, v.token) == (0, 4)
    assert v.alpha == [0.0, 1.0, 1.0]


def test_greedy_rejection_in_the_middle():
    v = verify_greedy(np.array([5, 6, 7, 8]), np.array([5, 6, 1, 8, 2]))
    assert (v.accepted, v.token) == (2, 1)


def test_stochastic_all_accepted_when_p_equals_q_point_masses():
    pt = Dist.point(3)
    v = verify_stochastic(np.array([3, 3]), [pt, pt], [pt, pt, Dist.point(4)], np.random.default_rng(0))
    assert (v.accepted, v.token, v.alpha) == (2, 4, [1.0, 1.0])


# gamma 2 and 3: each position has its own p and q, and the bonus position its own p
BLOCKS = {
    2: ([[4, 3, 1, 1, 1, 1, 1, 1], [0, 1, 5, 2, 0, 1, 1, 0], [1, 1, 1, 1, 6, 0, 0, 3]],
        [[1, 1, 30, 30, 1, 1, 1, 1], [2, 2, 2, 2, 1, 1, 1, 1]]),
    3: ([[2, 5, 1, 1, 0, 0, 1, 0], [5, 3, 2, 0, 0, 0, 0, 0], [3, 1, 4, 1, 5, 9, 2, 6], [0, 0, 0, 1, 1, 1, 1, 9]],
        [[1, 2, 1, 1, 1, 1, 1, 1], [2, 2, 2, 2, 1, 1, 1, 1], [3, 1, 4, 1, 5, 9, 2, 6]]),
}
BLOCK_DRAWS = 100_000


def emitted_by_position(gamma: int, seed: int) -> list[np.ndarray]:
    """Counts of the token emitted at each output position of a step, over the steps that reached it."""
    ps, qs = ([dist(w) for w in ws] for ws in BLOCKS[gamma])
    rng = np.random.default_rng(seed)
    counts = [np.zeros(V) for _ in range(gamma + 1)]
    for _ in range(BLOCK_DRAWS):
        draft = np.array([q.sample(rng) for q in qs])
        v = verify_stochastic(draft, qs, ps, rng)
        for i, tok in enumerate([*draft[:v.accepted], v.token]):
            counts[i][tok] += 1
    return counts


@pytest.mark.parametrize("gamma", [2, 3])
def test_stochastic_verifier_emits_each_positions_p_in_longer_blocks(gamma):
    counts = emitted_by_position(gamma, seed=gamma)
    ps = [dist(w) for w in BLOCKS[gamma][0]]
    assert counts[gamma].sum() > 1000  # the bonus position is reached often enough to be tested
    for c, p in zip(counts, ps):
        assert chi2_pvalue(c, p) > 0.001


def test_negative_control_resampling_from_p_instead_of_the_residual_fails(monkeypatch):
    """A plausible bug: after a rejection, sample from p rather than norm(max(0, p - q))."""
    import harness.verify as verify_mod
    monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    counts = emitted_by_position(2, seed=2)
    ps = [dist(w) for w in BLOCKS[2][0]]
    assert min(chi2_pvalue(c, p) for c, p in zip(counts, ps)) < 1e-6


# llama.cpp's rule ("exact"): the draft proposes its top token; the target samples and keeps it while they agree
def exact_emitted(ps: list[Dist], qs: list[Dist], seed: int, verifier=verify_exact) -> tuple[list[np.ndarray], int]:
    """Counts of the token emitted at each output position of a step with top-1 drafts; and the accepted count."""
    rng = np.random.default_rng(seed)
    draft = np.array([int(q.ids[np.argmax(q.probs)]) for q in qs])
    counts, accepted = [np.zeros(V) for _ in range(len(qs) + 1)], 0
    for _ in range(BLOCK_DRAWS):
        v = verifier(draft, ps, rng)
        accepted += v.accepted
        for i, tok in enumerate([*draft[:v.accepted], v.token]):
            counts[i][tok] += 1
    return counts, accepted


@pytest.mark.parametrize("case", PAIRS)
def test_exact_rule_emits_target_distribution(case):
    p, q = (dist(w) for w in PAIRS[case])
    counts, accepted = exact_emitted([p, dist([1] * V)], [q], seed=zlib.crc32(case.encode()))
    assert chi2_pvalue(counts[0], p) > 0.01
    x = int(q.ids[np.argmax(q.probs)])
    # a position is accepted with probability p(draft's top token): the binomial's 5-sigma band
    assert abs(accepted / BLOCK_DRAWS - p.prob(x)) < 5 * np.sqrt(p.prob(x) * (1 - p.prob(x)) / BLOCK_DRAWS) + 1e-9


@pytest.mark.parametrize("gamma", [2, 3])
def test_exact_rule_emits_each_positions_p_in_longer_blocks(gamma):
    ps, qs = ([dist(w) for w in ws] for ws in BLOCKS[gamma])
    counts, _ = exact_emitted(ps, qs, seed=10 + gamma)
    for c, p in zip(counts, ps):
        if c.sum() > 200:  # positions the top-1 drafts reach often enough to test
            assert chi2_pvalue(c, p) > 0.001
    assert counts[1].sum() > 200


def test_exact_and_leviathan_acceptance_differ_as_the_issue_says():
    """p = q = [0.5, 0.5]: exact accepts 0.5, leviathan 1.0; p = [0.9, 0.1], q = [0.6, 0.4]: 0.9 against 0.7."""
    rng = np.random.default_rng(0)
    for pw, qw, exact, lev in (([1, 1], [1, 1], 0.5, 1.0), ([9, 1], [6, 4], 0.9, 0.7)):
        p, q = dist(pw + [0] * (V - 2)), dist(qw + [0] * (V - 2))
        assert verify_exact(np.array([0]), [p, p], rng).alpha == pytest.approx([exact])
        assert overlap(p, q) == pytest.approx(lev)


def test_negative_control_exact_rule_that_keeps_the_draft_on_a_coin_fails():
    """A plausible bug: accept with probability p(x), then correct with a fresh draw from p (x included)."""
    def coin(draft, ps, rng):
        for i, x in enumerate(draft):
            if rng.random() >= ps[i].prob(int(x)):
                return Verdict(i, ps[i].sample(rng), [])
        return Verdict(len(draft), ps[len(draft)].sample(rng), [])
    p, q = (dist(w) for w in PAIRS["q_much_larger_on_some"])
    counts, _ = exact_emitted([p, dist([1] * V)], [q], seed=7, verifier=coin)
    assert chi2_pvalue(counts[0], p) < 1e-6
