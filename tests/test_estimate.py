"""The time estimate's parts, from given decode costs (no model is loaded: the costs are passed in, as bench
passes the ones it measured on the idle machine)."""
from harness.bench.estimate import LOAD_S, estimate_s, replay_s, subset_s
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
    assert only_load > LOAD_S  # the target's in-situ costs and its load, without prompts
    # greedy: the draft decodes each of the 10 x 32 output tokens on its own, 10 ms each
    assert greedy - g_target > 320 * 10 / 1000
    # sampling: the draft's pass is batched, and the target needs one too (its p), which greedy does not
    assert sampled - s_target < greedy - g_target
    assert s_target > g_target == only_load
    assert replay_s([base], prompts(10), [D], 8, 32, tmp_path, dict(MEASURED)) > greedy  # grows with prompts


def test_timed_subset_is_costed_as_gamma_one_and_one_more_gamma_on_each_categorys_first_prompts(tmp_path):
    insts = [Instance(T, "none", 0, GREEDY, 0, 0, 2)] + [Instance(T, D, g, GREEDY, 0, 0, 2) for g in (1, 2, 4)]
    ps = prompts(10)
    firsts = [p for p in ps if p.id.endswith("-0")]
    got = subset_s(insts, ps, 1, 32, True, tmp_path, dict(MEASURED))
    assert got == 2 * estimate_s([(insts[1], firsts)], 32, 1, True, tmp_path, dict(MEASURED))
    assert subset_s(insts, ps, 3, 32, True, tmp_path, dict(MEASURED)) > got
