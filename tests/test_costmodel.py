"""Cost model and the adaptive gamma controller: pure functions; the loop's overhead per verified row, one
convention in the model, the replay and the controller; a calibration read at any context."""
import numpy as np
import pytest

from harness.costmodel import AdaptiveGamma, Costs, Step, best_gamma, expected_tokens, predicted_speedup, price
from harness.errors import HarnessError


def test_expected_tokens_known_values():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(0.8, 1) == pytest.approx(1.8)
    assert expected_tokens(0.9, 3) == pytest.approx((1 - 0.9**4) / (1 - 0.9))  # the closed form
    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.5, 0) == 1
    np.testing.assert_allclose(expected_tokens(np.array([0.5, 0.8]), 2), [1.75, 2.44])


# decode cost of k tokens on the 2-core CPU, shaped like ../shared/MODELS.md: verification is compute-bound
CPU = Costs(target_ms=[34, 59, 80, 97, 120, 140, 170, 212, 240], draft_ms=20)
# a GPU-like curve: a block of 8 costs little more than one token
GPU = Costs(target_ms=[10, 10.5, 11, 11.5, 12, 12.5, 13, 13.5, 14], draft_ms=2, draft_curve=(2.0, 2.1, 2.2, 2.3))


def test_predicted_speedup_by_hand():
    """alpha 0.5, gamma 2: E[tokens] = (1 - 0.5^3) / (1 - 0.5) = 1.75 (Leviathan et al.); plain decode 10 ms,
    a draft decode 2 ms, verifying 3 tokens 14 ms."""
    c = Costs(target_ms=[10, 12, 14], draft_ms=2)
    assert predicted_speedup(0.5, 2, c) == pytest.approx(0.972222, rel=1e-6)  # 1.75 x 10 / (2 x 2 + 14)
    c1 = Costs(target_ms=[10, 12, 14], draft_ms=2, overhead_ms_per_row=1)
    # plain decoding pays its row too: 1.75 x (10 + 1) / (4 + 14 + 3 rows x 1)
    assert predicted_speedup(0.5, 2, c1) == pytest.approx(0.916667, rel=1e-6)
    # half the steps propose: tokens 0.5 x 1.75 + 0.5 x 1 = 1.375, ms 0.5 x 18 + 0.5 x 10 = 14
    assert predicted_speedup(0.5, 2, c, share=0.5) == pytest.approx(0.982143, rel=1e-6)  # 1.375 x 10 / 14
    # a draft curve: both drafts accepted (0.5^2) costs one more token, 3.0 - 2.0 ms: 17.5 / (4 + 0.25 + 14)
    cc = Costs(target_ms=[10, 12, 14], draft_ms=2, draft_curve=(2.0, 3.0))
    assert predicted_speedup(0.5, 2, cc) == pytest.approx(0.958904, rel=1e-6)
    assert predicted_speedup(1.0, 2, c) == pytest.approx(30 / 18)  # a perfect draft: 3 tokens per 18 ms step


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
    ctl.observe([1.0], 1)
    for _ in range(8):
        g = ctl.choose(60)
        ctl.observe([1.0] * g, g)
    assert ctl.alpha > 0.8 and ctl.choose(50) >= 1  # high alpha switches speculation on
    ctl = AdaptiveGamma(MARGINAL, 4, prior=0.5)
    ctl.choose(64)
    for _ in range(12):
        ctl.observe([0.0], 1)
    picks = [ctl.choose(8) for _ in range(20)]
    assert set(picks) == {0}  # low alpha and few tokens left: probing is not worth its cost
    assert CPU.catch_up(4) == 80 and Costs([1], 2.0, draft_curve=(2.0, 3.0)).catch_up(4) == 6.0


def test_adaptive_gamma_speculates_on_a_gpu_like_curve():
    ctl = AdaptiveGamma(GPU, 6, prior=0.9)
    g = ctl.choose()
    assert g >= 4
    for _ in range(60):
        ctl.observe([0.0], g)  # rejected at the first position: the only one reached
    assert ctl.choose(8) <= 1


def test_adaptive_gamma_learns_from_one_probe():
    ctl = AdaptiveGamma(GPU, 6, prior=0.2)
    assert ctl.choose() <= 1
    ctl.observe([0.95], 1)
    for _ in range(3):
        ctl.observe([0.95] * 4, 4)
    assert ctl.alpha > 0.8 and ctl.choose() >= 4


def test_adaptive_gamma_rescales_the_calibration_by_what_steps_took():
    ctl = AdaptiveGamma(GPU, 6, prior=0.9)
    g = ctl.choose()
    assert g >= 4  # the calibration promises a cheap draft
    for _ in range(10):  # ...but every draft step takes 10x what it said: the draft costs more than it saves
        ctl.observe([0.9] * g, g, draft_ms=10 * ctl._planned_draft, verify_ms=GPU.verify(g + 1))
        g = ctl.choose(200)
        if g == 0:
            break
    assert g == 0 and ctl.costs.draft_ms > 5 * GPU.draft_ms
    assert ctl.costs.target_ms == pytest.approx(GPU.target_ms)


def test_adaptive_gamma_catches_up_the_draft_after_plain_steps():
    ctl = AdaptiveGamma(MARGINAL, 4)
    ctl.backlog = 3
    # no draft curve: three skipped tokens and two drafts, five single decodes of 20 ms
    assert ctl._draft_part(MARGINAL, 2) == pytest.approx(100.0)
    assert ctl._draft_part(MARGINAL, 0) == 0.0
    batched = Costs([70, 100, 115], 20, draft_curve=(20, 22, 24, 26))
    ctl = AdaptiveGamma(batched, 2)
    ctl.backlog = 3
    # the four tokens in one batch (26 ms), the second draft (20 ms), and w.p. alpha^2 the bonus catch-up (2 ms)
    assert ctl._draft_part(batched, 2) == pytest.approx(26 + 20 + 2 * ctl.alpha ** 2)


# measured on this project's 2-core VM (reports/runs/20261130-150917-vm/calibration, 128 cached tokens):
# Qwen2.5-Coder 1.5B Q4_K_M target, 0.5B Q4_K_M draft
VM = Costs(target_ms=[70.4, 110.1, 135.6, 126.5, 162.1, 196.5, 220.7, 233.6, 256.0], draft_ms=40.5,
           overhead_ms_per_row=1.0, draft_curve=(40.5, 51.6, 60.7, 65.3, 97.7))


def _simulate(costs: Costs, alpha, n_tokens: int, gamma, seed: int) -> float:
    """ms to emit n_tokens when each drafted token matches with probability alpha (a number, or a function of
    the output position: alpha drifting), independently, charging each step what `costs` says it takes; gamma is
    fixed or a controller. The draft's costs are written out here (gamma single decodes, the batched catch-up
    after plain steps from the draft curve, one more token when a whole block is accepted), apart from Costs."""
    alpha_at = alpha if callable(alpha) else (lambda pos: alpha)
    rng = np.random.default_rng(seed)
    ctl = gamma if isinstance(gamma, AdaptiveGamma) else None
    if ctl:
        ctl.begin()
    total, out, backlog = 0.0, 0, 0
    curve = costs.draft_curve
    while out < n_tokens:
        g = ctl.choose(n_tokens - out) if ctl else min(gamma, n_tokens - out - 1)
        match = rng.random(g) < alpha_at(out)
        k = g if match.all() else int(np.argmin(match))
        draft = 0.0
        if g:
            n = backlog + 1  # the skipped tokens and the last one, in one batch
            catch_up = curve[n - 1] if n <= len(curve) else curve[-1] * n / len(curve)
            draft = catch_up + (g - 1) * costs.draft_ms + (curve[1] - curve[0] if k == g else 0.0)
        verify = costs.verify(g + 1)
        total += draft + verify + ((g + 1) * costs.overhead_ms_per_row if g else 0.0)
        if ctl:
            ctl.observe([float(x) for x in match[:k + 1]], g, draft, verify)
        backlog = 0 if g else backlog + 1
        out += min(k + 1, n_tokens - out)
    return total


def _category(costs: Costs, alphas: list[float], n_each: int, gamma, seed: int) -> float:
    """Several prompts of one category in a row, one controller carried across them (as the bench does)."""
    return sum(_simulate(costs, a, n_each, gamma, seed * 100 + i) for i, a in enumerate(alphas))


SEEDS = range(20)


def _goal(costs: Costs, run, n_tokens: int, gamma_max: int) -> float:
    """min(plain, best fixed gamma), mean over the seeds: the 5% goal's reference."""
    fixed = min(np.mean([run(g, s) for s in SEEDS]) for g in range(1, gamma_max + 1))
    return min(n_tokens * costs.target_ms[0], fixed)


@pytest.mark.parametrize("costs", [VM, GPU], ids=["vm", "gpu"])
@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.85, 0.95])
def test_adaptive_gamma_is_within_5_percent_of_the_better_of_best_fixed_and_plain(costs, alpha):
    """The issue's goal, in simulation: over 256 tokens, mean time of auto <= 1.05 x min(plain, best fixed)."""
    n = 256
    auto = np.mean([_simulate(costs, alpha, n, AdaptiveGamma(costs, 6), s) for s in SEEDS])
    assert auto <= 1.05 * _goal(costs, lambda g, s: _simulate(costs, alpha, n, g, s), n, 6)


# a machine where a good draft wins and a poor one loses, with a batched draft catch-up (CPU prompt processing)
MARGINAL_CPU = Costs(target_ms=[70, 100, 115, 130, 150], draft_ms=20, draft_curve=(20, 22, 24, 26, 28, 30, 32, 34))


def _oracle(costs: Costs, segments: list[tuple[float, int]], gamma_max: int) -> float:
    """Knowing where alpha changes: the better of plain and the best fixed gamma on each stretch."""
    return sum(_goal(costs, lambda g, s, a=a, n=n: _simulate(costs, a, n, g, s), n, gamma_max)
               for a, n in segments)


@pytest.mark.parametrize("costs", [MARGINAL_CPU, GPU], ids=["marginal", "gpu"])
@pytest.mark.parametrize("segments", [
    [(0.2, 128), (0.95, 384)],  # a hard start, then easy: once plain, the old controller never looked again
    [(0.95, 128), (0.2, 384)],
    [(0.3, 64), (0.9, 192)],
], ids=["up", "down", "short-up"])
def test_adaptive_gamma_follows_drifting_alpha(costs, segments):
    """Alpha changes mid-generation: still the 5% goal against the best fixed gamma and plain over the same
    drifting run, and within 10% of an oracle that knows where alpha changes and picks the best on each
    stretch (the old controller, which stopped probing for good once it chose plain decoding, was 13-15% behind
    the goal and 40% behind the oracle on the GPU-like curve, 26% behind the oracle on the marginal one)."""
    n = sum(k for _, k in segments)
    edge = segments[0][1]

    def alpha_at(pos):
        return segments[0][0] if pos < edge else segments[1][0]

    auto = np.mean([_simulate(costs, alpha_at, n, AdaptiveGamma(costs, 6 if costs is GPU else 4), s) for s in SEEDS])
    gm = 6 if costs is GPU else 4
    assert auto <= 1.05 * _goal(costs, lambda g, s: _simulate(costs, alpha_at, n, g, s), n, gm)
    assert auto <= 1.10 * _oracle(costs, segments, gm)


@pytest.mark.parametrize("costs", [MARGINAL_CPU, GPU], ids=["marginal", "gpu"])
@pytest.mark.parametrize("alphas", [[0.2, 0.95, 0.95, 0.95], [0.95, 0.2, 0.2, 0.2]], ids=["hard-first", "easy-first"])
def test_one_hard_prompt_does_not_switch_speculation_off_for_the_category(costs, alphas):
    """One controller per category, as the bench runs it: four 64-token prompts."""
    gm = 6 if costs is GPU else 4
    auto = np.mean([_category(costs, alphas, 64, AdaptiveGamma(costs, gm), s) for s in SEEDS])
    assert auto <= 1.05 * _goal(costs, lambda g, s: _category(costs, alphas, 64, g, s), 4 * 64, gm)
    assert auto <= 1.10 * _oracle(costs, [(a, 64) for a in alphas], gm)


def test_draft_step_counts_the_bonus_catch_up_when_all_are_accepted():
    c = Costs(target_ms=[10, 15, 18], draft_ms=2.0, draft_curve=(2.0, 3.0))
    assert c.draft_step_ms(2, 1.0) == 5.0  # two drafts, plus one more token to evaluate w.p. alpha^2
    assert c.draft_step_ms(2, 0.0) == 4.0
    assert c.step_ms(2, 0.5) == 4.0 + 0.25 + 18
    assert Costs([10, 15, 18], 2.0).draft_step_ms(2, 1.0) == 4.0  # without a curve: gamma * T_draft(1)


# the 0.5B on an AMD EPYC VM (the replay issue): batched kernels change with the batch size, so eight tokens
# cost less than seven
IRREGULAR = Costs(target_ms=[14.6, 36.2, 44.4, 46.6, 61.7, 69.0, 75.0, 63.1, 79.1], draft_ms=3.0,
                  draft_curve=(3.0, 3.5, 4.0))


def test_a_batch_size_irregular_curve_is_read_per_block_size_not_smoothed():
    a = 0.95
    # gamma 7 verifies a block of 8: 63.1 ms, cheaper than gamma 6's block of 7 (75.0 ms)
    assert IRREGULAR.verify(8) == 63.1 and IRREGULAR.verify(7) == 75.0
    # gamma 7: E = (1 - 0.95^8) / 0.05 = 6.73159; step = 7 x 3.0 + 0.95^7 x (3.5 - 3.0) + 63.1 = 84.44917 ms;
    # speedup = 6.73159 x 14.6 / 84.44917 = 1.16379. gamma 6: E = 6.03325, step = 18 + 0.36755 + 75.0, 0.94343
    assert predicted_speedup(a, 7, IRREGULAR) == pytest.approx(1.163792, rel=1e-6)
    assert predicted_speedup(a, 6, IRREGULAR) == pytest.approx(0.943427, rel=1e-6)
    assert best_gamma(a, IRREGULAR, 8) == 7  # the dip at 8 tokens, found
    assert best_gamma(0.3, IRREGULAR, 8) == 0  # and no gamma when acceptance is low


def test_costmodel_names_the_k_max_that_works():
    """A calibration too short for a gamma names the --k-max that covers it (not just "a larger" one), and a
    gamma the batch cannot hold names the largest one that fits."""
    from harness.costmodel import Costs
    from harness.errors import HarnessError
    c = Costs((5.0, 6.0, 7.0), 4.0)
    with pytest.raises(HarnessError, match=r"--k-max 9\b"):
        c.verify(9)
    with pytest.raises(HarnessError, match="the largest gamma is 511"):
        c.verify(1001)


# -- The loop's overhead per step, one convention everywhere: a step that verified k logits rows (its
# drafts and one more) costs k times the overhead per row, in the cost model, the replay and the adaptive
# controller alike.
OH = 0.7
CURVE = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, overhead_ms_per_row=OH, draft_curve=(5, 7, 8, 9))
FLAT = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, overhead_ms_per_row=OH)
FREE = Costs(target_ms=[30, 50, 60, 70, 80], draft_ms=5, draft_curve=(5, 7, 8, 9))


@pytest.mark.parametrize("gamma", range(5))
def test_a_step_of_k_rows_costs_k_rows_overhead_in_the_model_and_the_replay(gamma):
    rows = gamma + 1
    assert CURVE.overhead(rows) == pytest.approx(rows * OH)
    assert CURVE.step_ms(gamma) - FREE.step_ms(gamma) == pytest.approx(rows * OH)
    for s in (Step(gamma, 0, 1, gamma > 0), Step(gamma, gamma, gamma + 1)):
        assert price(s.shape(), CURVE) - price(s.shape(), FREE) == pytest.approx(rows * OH)
    # a step rejected at its first draft, without a draft curve: the model's step is the replay's
    assert FLAT.step_ms(gamma) == pytest.approx(price(Step(gamma, 0, 1, gamma > 0).shape(), FLAT))
    assert CURVE.step_ms(0) == pytest.approx(price(Step(0, 0, 1).shape(), CURVE))  # a plain decode: no draft at all


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("backlog", [0, 2])
def test_the_controllers_price_is_the_replays_step_cost(gamma, backlog):
    """probe_price is the expected step cost less the tokens it is worth: the replay's cost of the step, averaged
    over all its drafts accepted (w.p. alpha^gamma: the draft's bonus catch-up) or not, at the same backlog."""
    ctl = AdaptiveGamma(CURVE, 4)
    ctl.backlog = backlog
    a = ctl.alpha
    replayed = (a ** gamma * price(Step(gamma, gamma, gamma + 1).shape(backlog), CURVE)
                + (1 - a ** gamma) * price(Step(gamma, 0, 1, True).shape(backlog), CURVE))
    # the tokens are worth what plain decoding would pay for them, its row's overhead included
    assert ctl.probe_price(gamma) + expected_tokens(a, gamma) * (30 + OH) == pytest.approx(replayed)


def test_plain_steps_in_the_predicted_speedup_pay_one_rows_overhead():
    # half the steps propose 2 (3 rows), half decode plainly (1 row): 1.375 tokens per 0.5 x (10 + 60 + 3 x 0.7)
    # + 0.5 x (30 + 0.7) ms, against plain decoding's 30 + 0.7 ms a token
    ms = 0.5 * (2 * 5 + 60 + 3 * OH) + 0.5 * (30 + OH)
    assert predicted_speedup(0.5, 2, FLAT, share=0.5) == pytest.approx(1.375 * (30 + OH) / ms)
    # no overhead, no drafts accepted, nothing proposed: exactly plain decoding
    assert predicted_speedup(0.0, 2, FLAT, share=0.0) == pytest.approx(1.0)


def test_calibration_is_interpolated_linearly_between_contexts_and_held_beyond(tmp_path):
    import json

    from harness.calibrate import costs_at
    from harness.costmodel import at_context
    cal = {"contexts": [128, 1024], "ms_by_context": [[10.0, 16.0, 20.0], [14.0, 24.0, 32.0]]}
    xs, rows = cal["contexts"], cal["ms_by_context"]
    assert at_context(xs, rows, 64) == [10.0, 16.0, 20.0] and at_context(xs, rows, 4096) == [14.0, 24.0, 32.0]
    assert at_context(xs, rows, 576) == pytest.approx([12.0, 20.0, 26.0])  # halfway
    for name, ms in (("t", cal["ms_by_context"]), ("d", [[2.0, 3.0, 3.5], [4.0, 5.0, 5.5]])):
        (tmp_path / f"{name}-t2-ngl0.json").write_text(json.dumps({"contexts": [128, 1024], "ms_by_context": ms}))
    c = costs_at(tmp_path, "t", "d", 2, 0, 0, 576, overhead_ms_per_row=0.5)
    assert c.target_ms == pytest.approx([12.0, 20.0, 26.0]) and c.draft_ms == pytest.approx(3.0)
    assert c.draft_curve == pytest.approx((3.0, 4.0, 4.5)) and c.overhead_ms_per_row == 0.5
    assert costs_at(tmp_path, "t", "missing", 2, 0, 0, 576) is None
    assert costs_at(tmp_path, "t", None, 2, 0, 0, 576).draft_ms == 0.0  # an n-gram proposer: no model
