"""The time estimate's parts, from given decode costs (no model is loaded: the costs are passed in, as bench
passes the ones it measured on the idle machine)."""
import pytest

from harness.bench.estimate import LOAD_S, replay_s, subset_s
from harness.plan import Instance
from harness.prompts import Prompt

T, D = "target-model", "draft-model"
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
SAMPLED = GREEDY | {"temperature": 0.7, "top_p": 0.9}
MEASURED = {(T, 2, 0): 30.0, (D, 2, 0): 10.0}  # ms of one decode, keyed (model, threads, ngl)


def prompts(per_category: int, cats=("code", "creative")) -> list[Prompt]:
    return [Prompt(f"{c}-{i}", c, text="x" * 400, max_tokens=32) for c in cats for i in range(per_category)]


def test_replay_costs_one_draft_decode_per_output_token_under_greedy_and_batched_passes_under_sampling(tmp_path):
    base = Instance(T, "none", 0, GREEDY, 0, 0, 2)
    ps = prompts(5)
    sbase = Instance(T, "none", 0, SAMPLED, 0, 0, 2)
    only_load = replay_s([base], [], [], 8, 32, tmp_path, dict(MEASURED))
    greedy = replay_s([base], ps, [D], 8, 32, tmp_path, dict(MEASURED))
    sampled = replay_s([sbase], ps, [D], 8, 32, tmp_path, dict(MEASURED))
    g_target, s_target = (replay_s([b], ps, [], 8, 32, tmp_path, dict(MEASURED)) for b in (base, sbase))
    assert only_load == LOAD_S  # without prompts the replay measures nothing: the target's load alone
    # greedy: the draft decodes each of the 10 x 32 output tokens on its own, 10 ms each
    assert greedy - g_target > 320 * 10 / 1000
    # sampling: the draft's pass is batched, and the target needs one too (its p), which greedy does not
    assert sampled - s_target < greedy - g_target
    # greedy: no target pass, only its in-situ costs where the prompts' rows decode (from 100 to 132 tokens)
    assert s_target > g_target > only_load
    assert replay_s([base], prompts(10), [D], 8, 32, tmp_path, dict(MEASURED)) > greedy  # grows with prompts


def test_timed_subset_is_costed_as_gamma_one_and_one_more_gamma_on_each_categorys_first_prompts(tmp_path):
    insts = [Instance(T, "none", 0, GREEDY, 0, 0, 2)] + [Instance(T, D, g, GREEDY, 0, 0, 2) for g in (1, 2, 4)]
    ps = prompts(10)
    # By hand, n = 1: code-0 and creative-0, 2 x 32 = 64 tokens out, 2 x 400 / 4 = 200 prompt tokens. Uncalibrated
    # costs: a decode 30 ms, verifying 2 tokens 30 x (1 + 1/3) = 40 ms, a draft decode 10 ms. Gamma 1 at alpha
    # 0.6: a step 10 + 40 = 50 ms for 1.6 tokens, 31.25 ms a token, plus the paired plain run's 30 ms:
    #   64 x (31.25 + 30)                        = 3920 ms
    #   200 x 0.22 x (30 + 30 + 10) prompt passes = 3080 ms (the speculative target, its plain twin, the draft)
    #   worker start-up                          = 2000 ms
    # 9.0 s, twice (gamma 1 and the predicted best gamma, costed alike): 18.0 s
    assert subset_s(insts, ps, 1, 32, True, tmp_path, dict(MEASURED)) == pytest.approx(18.0)
    # n = 3: 192 tokens out, 600 prompt tokens: 2 x (192 x 61.25 + 600 x 15.4 + 2000) / 1000
    assert subset_s(insts, ps, 3, 32, True, tmp_path, dict(MEASURED)) == pytest.approx(46.0)
    # gammas 2 and 4 add nothing: the subset is costed from the gamma-1 configurations alone
    assert subset_s(insts[:2], ps, 1, 32, True, tmp_path, dict(MEASURED)) == pytest.approx(18.0)
    # an n-gram lookup evaluates no prompt of its own, and its step is the verification alone (40 ms for 1.6
    # tokens): 2 x (64 x (25 + 30) + 200 x 0.22 x (30 + 30) + 2000) / 1000
    ngram = [insts[0], Instance(T, "ngram:3", 1, GREEDY, 0, 0, 2)]
    assert subset_s(ngram, ps, 1, 32, True, tmp_path, dict(MEASURED)) == pytest.approx(16.32)
