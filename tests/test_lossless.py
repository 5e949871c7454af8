"""Lossless sampling through generate() itself: with a sampled draft and either verification rule, each output
position's token is distributed as the target's own (plain sampling), over many policy seeds; broken verifiers
fail the same chi-square test. The target and the draft are scripted (fakes.LogitsEngine): their logits depend on
the position only, so each position's distribution is worked out by hand."""
import numpy as np
import pytest
from scipy.stats import chisquare

import harness.loop as loop
import harness.verify as verify_mod
from harness.loop import Request, generate
from harness.drafting import Drafting
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.verify import Verdict
from tests.fakes import V, LogitsEngine

PROMPT = [1, 2, 3]
TARGET = [{3: 4, 5: 3, 7: 2, 9: 1}, {2: 1, 4: 1, 6: 2}, {3: 1, 8: 1}]
DRAFT = [{5: 4, 9: 3, 3: 2, 11: 1}, {4: 3, 6: 1}, {8: 2, 3: 1}]
POLICY = {"temperature": 0.5, "top_p": 0.8}
# top_p on the raw softmax, then T 0.5 (weights squared). Position 0: raw 0.4, 0.3, 0.2, 0.1; top_p keeps 3, 5, 7
# (0.9 >= 0.8); 16, 9, 4. Position 1: raw 0.5 (6), 0.25, 0.25, all kept (0.75 < 0.8); 4, 1, 1. Position 2: 1, 1.
P = [{3: 16 / 29, 5: 9 / 29, 7: 4 / 29}, {2: 1 / 6, 4: 1 / 6, 6: 4 / 6}, {3: 1 / 2, 8: 1 / 2}]
# The draft's q, processed alike: position 0 5, 9, 3 at 16, 9, 4 / 29 (9 is outside p: always rejected); position 1
# 4, 6 at 0.9, 0.1; position 2 8, 3 at 0.8, 0.2. The exact rule drafts the top tokens 5, 4, 8.
GAMMA = 2
# Enough for the weakest mutant below: resampling from p has noncentrality 1000 x 0.144 = 144 at position 0
# (it emits 3, 5, 7 w.p. 0.442, 0.482, 0.076), the coin 1000 x 0.214: p < 1e-6 all but surely.
SEEDS = 1000
PASS, FAIL = 1e-4, 1e-6


def emitted(rule: str | None) -> tuple[np.ndarray, int]:
    """[position, token] counts of the generated tokens over SEEDS policy seeds, and the drafts accepted;
    rule None: plain sampling."""
    target = LogitsEngine(len(PROMPT), TARGET)
    draft = None if rule is None else DraftModelProposer(LogitsEngine(len(PROMPT), DRAFT), drafting=Drafting(rule))
    counts, accepted = np.zeros((len(P), V)), 0
    for seed in range(SEEDS):
        gen = generate(target, Request("p", PROMPT, len(P)), Policy(**POLICY, seed=seed), draft,
                       GAMMA if draft else 0, rule=rule or "leviathan")
        counts[np.arange(len(P)), gen["tokens"]] += 1
        accepted += gen["from_draft"].count("d")
    return counts, accepted


def pvalues(counts: np.ndarray) -> list[float]:
    """Per position, the chi-square p-value of its counts against P (0 when a token outside P's support came)."""
    out = []
    for c, p in zip(counts, P):
        ids = sorted(p)
        if c.sum() != c[ids].sum():
            out.append(0.0)
            continue
        out.append(float(chisquare(c[ids], np.array([p[i] for i in ids]) * c.sum()).pvalue))
    return out


def test_plain_sampling_draws_the_hand_worked_distribution():
    counts, _ = emitted(None)
    assert min(pvalues(counts)) > PASS


@pytest.mark.parametrize("rule", ["leviathan", "exact"])
def test_speculative_sampling_through_generate_is_lossless(rule):
    counts, accepted = emitted(rule)
    # (the exact rule draws each emitted token from the target's p with the generation's own seeded stream, one
    # draw a token as plain sampling does: here its counts come out as plain sampling's)
    assert min(pvalues(counts)) > PASS
    assert 0.2 * SEEDS < accepted < 1.5 * SEEDS  # drafts were both accepted and rejected


def always_accept(draft, *args):
    p, rng = args[-2:]
    return Verdict(len(draft), p[len(draft)].sample(rng), [])


def coin(draft, ps, rng):
    """The exact rule on a coin: accept with probability p(x), then correct with a fresh draw from p (x included)."""
    for i, x in enumerate(draft):
        if rng.random() >= ps[i].prob(int(x)):
            return Verdict(i, ps[i].sample(rng), [])
    return Verdict(len(draft), ps[len(draft)].sample(rng), [])


@pytest.mark.parametrize("rule, mutant", [("leviathan", "always_accept"), ("exact", "always_accept"),
                                          ("leviathan", "resample_from_p"), ("exact", "coin")])
def test_a_broken_verifier_fails_through_generate(rule, mutant, monkeypatch):
    if mutant == "resample_from_p":  # after a rejection, p rather than norm(max(0, p - q))
        monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    else:
        monkeypatch.setattr(loop, "verify_stochastic" if rule == "leviathan" else "verify_exact",
                            always_accept if mutant == "always_accept" else coin)
    counts, _ = emitted(rule)
    assert min(pvalues(counts)) < FAIL
