"""Cost model, break-even and the adaptive gamma controller: pure functions."""
import pytest

from harness.costmodel import AdaptiveGamma, Costs, best_gamma, expected_tokens, predicted_speedup
from harness.errors import HarnessError
from harness.verdict import break_even_rate, decide


def test_expected_tokens_matches_the_series():
    for a in (0.0, 0.3, 0.8, 0.99):
        for g in (1, 2, 4, 8):
            assert expected_tokens(a, g) == pytest.approx(sum(a**i for i in range(g + 1)))
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.5, 0) == 1


# decode cost of k tokens on the 2-core CPU, shaped like ../shared/MODELS.md: verification is compute-bound
CPU = Costs(target_ms=[34, 59, 80, 97, 120, 140, 170, 212, 240], draft_ms=20)
# a GPU-like curve: a block of 8 costs little more than one token
GPU = Costs(target_ms=[10, 10.5, 11, 11.5, 12, 12.5, 13, 13.5, 14], draft_ms=2)


def test_predicted_speedup_cpu_loses_gpu_wins():
    assert predicted_speedup(0.83, 3, CPU) < 1
    assert predicted_speedup(0.83, 3, GPU) > 1.5
    assert best_gamma(0.83, CPU, 8) == 0
    assert best_gamma(0.83, GPU, 8) >= 4
    assert best_gamma(0.1, GPU, 8) <= 1


def test_verify_beyond_the_calibration_is_refused():
    with pytest.raises(HarnessError, match="k-max"):
        CPU.verify(12)


def test_adaptive_gamma_never_probes_where_even_a_perfect_draft_loses():
    hopeless = Costs(target_ms=[30, 90, 120, 150, 180], draft_ms=40)
    assert predicted_speedup(1.0, 1, hopeless) < 1
    ctl = AdaptiveGamma(hopeless, 4, prior=0.9)
    assert [ctl.choose(64) for _ in range(64)] == [0] * 64


# a machine where a good draft wins and a poor one loses
MARGINAL = Costs(target_ms=[70, 100, 115, 130, 150], draft_ms=20)


def test_adaptive_gamma_probes_while_worth_it_and_switches_back_on():
    assert best_gamma(0.5, MARGINAL, 4) == 0 and best_gamma(0.9, MARGINAL, 4) > 0
    ctl = AdaptiveGamma(MARGINAL, 4, prior=0.5)
    assert ctl.choose(64) == 1  # a cheap early probe: the draft is in sync
    ctl.observe([1.0])
    for _ in range(8):
        g = ctl.choose(60)
        ctl.observe([1.0] * g)
    assert ctl.alpha > 0.8 and ctl.choose(50) >= 1  # high alpha switches speculation on
    ctl = AdaptiveGamma(MARGINAL, 4, prior=0.5)
    ctl.choose(64)
    for _ in range(12):
        ctl.observe([0.0])
    picks = [ctl.choose(8) for _ in range(20)]
    assert picks.count(1) == 0  # low alpha and few tokens left: probing is not worth its cost
    assert CPU.catch_up(4) == 80 and Costs([1], 2.0, draft_curve=(2.0, 3.0)).catch_up(4) == 6.0


def test_adaptive_gamma_speculates_on_a_gpu_like_curve():
    ctl = AdaptiveGamma(GPU, 6, prior=0.9)
    g = ctl.choose()
    assert g >= 4
    for _ in range(60):
        ctl.observe([0.0] * g)
    assert ctl.choose(8) <= 1


def test_adaptive_gamma_learns_from_one_probe():
    ctl = AdaptiveGamma(GPU, 6, prior=0.2)
    assert ctl.choose() <= 1
    ctl.observe([0.95])
    for _ in range(3):
        ctl.observe([0.95] * 4)
    assert ctl.alpha > 0.8 and ctl.choose() >= 4


def test_break_even_rate():
    # a step of 3 decodes' cost with gamma 4 needs (3 - 1) / 4 = 50% acceptance
    assert break_even_rate(90, 30, 4) == pytest.approx(0.5)
    assert break_even_rate(200, 30, 4) is None  # even 100% cannot pay for it
    assert break_even_rate(20, 30, 2) == 0.0
    assert decide(0.05, 0.04) == "speculate" and decide(0.03, 0.04) == "plain decoding"


def test_draft_step_counts_the_bonus_catch_up_when_all_are_accepted():
    c = Costs(target_ms=[10, 15, 18], draft_ms=2.0, draft_curve=(2.0, 3.0))
    assert c.draft_step_ms(2, 1.0) == 5.0  # two drafts, plus one more token to evaluate w.p. alpha^2
    assert c.draft_step_ms(2, 0.0) == 4.0
    assert c.step_ms(2, 0.5) == 4.0 + 0.25 + 18
    assert Costs([10, 15, 18], 2.0).draft_step_ms(2, 1.0) == 4.0  # without a curve: gamma * T_draft(1)
