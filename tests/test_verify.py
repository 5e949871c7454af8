"""The verifier, tested statistically: emitted tokens must be distributed as the target's p, and plausible bugs
(the mutants at the end) must fail the same test."""
import zlib

import numpy as np
import pytest
from scipy.stats import chi2, chisquare, ncx2

import harness.verify as verify_mod
from harness.sampling import Dist
from harness.verify import Verdict, overlap, residual, verify_exact, verify_greedy, verify_stochastic

# Draws per case: what every mutant below needs to fail at p < FAIL on every case it changes, with a wide margin
# (test_the_draws_let_every_mutant_fail works it out from the exact distributions). They were 200_000 and
# 100_000: 50 times what that power needs.
DRAWS = 4_000        # gamma 1, rejection sampling (the residual mutant on top_p_truncated_p needs the most)
BLOCK_DRAWS = 2_500  # gamma 2 and 3; the exact rule
PASS, FAIL = 1e-4, 1e-6  # the correct verifier's p-value (fixed seeds) stays above PASS; a mutant's falls below FAIL
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


def emitted_first_tokens(p: Dist, q: Dist, verifier, seed: int, draws: int = DRAWS) -> np.ndarray:
    """gamma = 1: the first emitted token is the accepted draft token or the correction."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(V)
    p_bonus = dist([1] * V)
    for _ in range(draws):
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
    assert chi2_pvalue(counts, p) > PASS


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


def emitted_by_position(gamma: int, seed: int, verifier=verify_stochastic) -> list[np.ndarray]:
    """Counts of the token emitted at each output position of a step, over the steps that reached it."""
    ps, qs = ([dist(w) for w in ws] for ws in BLOCKS[gamma])
    rng = np.random.default_rng(seed)
    counts = [np.zeros(V) for _ in range(gamma + 1)]
    for _ in range(BLOCK_DRAWS):
        draft = np.array([q.sample(rng) for q in qs])
        v = verifier(draft, qs, ps, rng)
        for i, tok in enumerate([*draft[:v.accepted], v.token]):
            counts[i][tok] += 1
    return counts


@pytest.mark.parametrize("gamma", [2, 3])
def test_stochastic_verifier_emits_each_positions_p_in_longer_blocks(gamma):
    counts = emitted_by_position(gamma, seed=gamma)
    ps = [dist(w) for w in BLOCKS[gamma][0]]
    for c, p, reach in zip(counts, ps, reached(BLOCKS[gamma], "leviathan")):
        assert BLOCK_DRAWS * reach * p.probs.min() >= 5  # every position reached often enough to be tested
        assert chi2_pvalue(c, p) > PASS


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
    assert chi2_pvalue(counts[0], p) > PASS
    x = int(q.ids[np.argmax(q.probs)])
    # a position is accepted with probability p(draft's top token): the binomial's 5-sigma band
    assert abs(accepted / BLOCK_DRAWS - p.prob(x)) < 5 * np.sqrt(p.prob(x) * (1 - p.prob(x)) / BLOCK_DRAWS) + 1e-9


@pytest.mark.parametrize("gamma", [2, 3])
def test_exact_rule_emits_each_positions_p_in_longer_blocks(gamma):
    ps, qs = ([dist(w) for w in ws] for ws in BLOCKS[gamma])
    counts, _ = exact_emitted(ps, qs, seed=10 + gamma)
    tested = 0
    for c, p, reach in zip(counts, ps, reached(BLOCKS[gamma], "exact")):
        if BLOCK_DRAWS * reach * p.probs.min() >= 5:  # positions the top-1 drafts reach often enough to test
            assert chi2_pvalue(c, p) > PASS
            tested += 1
    assert tested >= 2  # at gamma 2 the second draft has p = 0: the bonus is never reached


def test_exact_and_leviathan_acceptance_differ_as_the_issue_says():
    """p = q = [0.5, 0.5]: exact accepts 0.5, leviathan 1.0; p = [0.9, 0.1], q = [0.6, 0.4]: 0.9 against 0.7."""
    rng = np.random.default_rng(0)
    for pw, qw, exact, lev in (([1, 1], [1, 1], 0.5, 1.0), ([9, 1], [6, 4], 0.9, 0.7)):
        p, q = dist(pw + [0] * (V - 2)), dist(qw + [0] * (V - 2))
        assert verify_exact(np.array([0]), [p, p], rng).alpha == pytest.approx([exact])
        assert overlap(p, q) == pytest.approx(lev)


# -- mutants: plausible bugs, and by hand what each emits, to size the draws --------------------------------------
def always_accept(draft, q, p, rng):
    return Verdict(len(draft), p[len(draft)].sample(rng), [])


def bonus_from_last_draft_p(draft, q, p, rng):
    """Off by one: after gamma acceptances the bonus is drawn from the last drafted position's p."""
    return verify_stochastic(draft, q, [*p[:-1], p[-2]], rng)


def coin(draft, ps, rng):
    """The exact rule on a coin: accept with probability p(x), then correct with a fresh draw from p (x included)."""
    for i, x in enumerate(draft):
        if rng.random() >= ps[i].prob(int(x)):
            return Verdict(i, ps[i].sample(rng), [])
    return Verdict(len(draft), ps[len(draft)].sample(rng), [])


def exact_bonus_from_last_draft_p(draft, ps, rng):
    return verify_exact(draft, [*ps[:-1], ps[-2]], rng)


# rule -> mutant -> its verifier; "resample_from_p" is the real one with the residual replaced by p
MUTANTS = {"leviathan": {"always_accept": always_accept, "resample_from_p": verify_stochastic,
                         "bonus_from_last_draft_p": bonus_from_last_draft_p},
           "exact": {"coin": coin, "bonus_from_last_draft_p": exact_bonus_from_last_draft_p}}


def dense(d: Dist) -> np.ndarray:
    out = np.zeros(V)
    out[d.ids] = d.probs
    return out


def reached(block, rule: str) -> list[float]:
    """Per output position of a step (the drafts', then the bonus), the chance that a correct verifier reaches it:
    the product of the earlier positions' acceptance, sum min(p, q) or, for top-1 drafts, p(x)."""
    (pws, qws), out = block, [1.0]
    for pw, qw in zip(pws, qws):
        p, q = dense(dist(pw)), dense(dist(qw))
        out.append(out[-1] * (p[np.argmax(q)] if rule == "exact" else np.minimum(p, q).sum()))
    return out


def mutant_emits(rule: str, mutant: str, block) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Per output position: (p, what the mutant emits there, the chance it reaches the position), worked out:
    at a drafted position the token kept or the correction, and the chance of going on."""
    pws, qws = block
    out, reach = [], 1.0
    for pw, qw in zip(pws, qws):
        p, q = dense(dist(pw)), dense(dist(qw))
        x = int(np.argmax(q))  # the exact rule's draft
        kept = np.minimum(p, q) if rule == "leviathan" else p[x] * np.eye(V)[x]
        emits, go_on = p, kept.sum()  # a correct position: kept, else the residual: p
        if mutant == "always_accept":
            emits, go_on = q, 1.0  # the draft's own token, always
        elif mutant in ("resample_from_p", "coin"):
            emits = kept + (1 - kept.sum()) * p  # the correction drawn from p, the rejected token included
        out.append((p, emits, reach))
        reach *= go_on
    bonus = pws[-2] if mutant == "bonus_from_last_draft_p" else pws[-1]
    out.append((dense(dist(pws[-1])), dense(dist(bonus)), reach))
    return out


def mutant_cases():
    """(rule, mutant, case, block, draws, positions the test counts): the gamma-1 tables count the first token only."""
    uniform = [1] * V
    for case, (pw, qw) in PAIRS.items():
        for rule, mutant in (("leviathan", "always_accept"), ("leviathan", "resample_from_p"), ("exact", "coin")):
            yield rule, mutant, case, ([pw, uniform], [qw]), DRAWS if rule == "leviathan" else BLOCK_DRAWS, 1
    for gamma, block in BLOCKS.items():
        for rule, mutants in MUTANTS.items():
            for mutant in mutants:
                yield rule, mutant, f"gamma-{gamma}", block, BLOCK_DRAWS, gamma + 1


# where a mutant emits exactly p at every position a step can reach: nothing to detect
HARMLESS = {("leviathan", "always_accept", "q_equals_p"),  # q is p
            ("leviathan", "resample_from_p", "disjoint"),  # the residual of a disjoint q is p itself
            ("leviathan", "resample_from_p", "q_equals_p"),  # never rejects
            ("exact", "coin", "disjoint"),  # p(x) = 0: never kept, so always the fresh draw from p
            ("exact", "bonus_from_last_draft_p", "gamma-2")}  # the second draft has p = 0: no bonus ever
POWER = 120  # noncentrality at which a mutant's chi-square stays under the p = FAIL critical value w.p. < 1e-6


def power(p: np.ndarray, emits: np.ndarray, visits: float) -> float:
    """The mutant's pull at one position: the chi-square's noncentrality visits * sum((emits - p)^2 / p) over p's
    support; inf where emits puts enough mass outside it for 30 draws to land there (then the p-value is 0
    unless none does: e^-30)."""
    s = p > 0
    if visits * emits[~s].sum() >= 30:
        return np.inf
    return float(visits * ((emits[s] - p[s]) ** 2 / p[s]).sum())


def test_the_draws_let_every_mutant_fail():
    """Every mutant, on every case of its table, at the draws the tables use: its strongest position pulls the
    chi-square past POWER, unless it emits p wherever a step can go (HARMLESS)."""
    for dof in range(1, V):  # POWER suffices at any support of the V = 8 tokens
        assert ncx2.cdf(chi2.isf(FAIL, dof), dof, POWER) < 1e-6
    harmless = set()
    for rule, mutant, case, block, draws, counted in mutant_cases():
        positions = mutant_emits(rule, mutant, block)[:counted]
        if all(r == 0 or np.allclose(e, p) for p, e, r in positions):
            harmless.add((rule, mutant, case))
            continue
        assert max(power(p, e, draws * r) for p, e, r in positions) >= POWER, (rule, mutant, case)
    assert harmless == HARMLESS


@pytest.mark.parametrize("rule, mutant, case", [c[:3] for c in mutant_cases() if c[:3] not in HARMLESS])
def test_every_mutant_fails_on_every_case_it_changes(rule, mutant, case, monkeypatch):
    if mutant == "resample_from_p":  # after a rejection, p rather than norm(max(0, p - q))
        monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    verifier = MUTANTS[rule][mutant]
    seed = zlib.crc32(f"{rule}-{mutant}-{case}".encode())
    if case in PAIRS:  # the first emitted token, as the gamma-1 tests count it
        p, q = (dist(w) for w in PAIRS[case])
        ps = [p]
        counts = ([emitted_first_tokens(p, q, verifier, seed)] if rule == "leviathan" else
                  exact_emitted([p, dist([1] * V)], [q], seed, verifier)[0][:1])
    else:  # every position of the step, as the block tests count them
        gamma = int(case.split("-")[1])
        ps, qs = ([dist(w) for w in ws] for ws in BLOCKS[gamma])
        counts = (emitted_by_position(gamma, seed, verifier) if rule == "leviathan" else
                  exact_emitted(ps, qs, seed, verifier)[0])
    assert min(chi2_pvalue(c, p) for c, p in zip(counts, ps) if c.sum()) < FAIL
