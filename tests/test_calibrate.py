"""calibrate.py: the decode costs a worker measures before its generations (in_situ, on SmolLM2, from the
prompts' cached state too) and after them, pooled; `harness calibrate`'s table and its refusal before loading."""
import pytest

from harness.loop import generate
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from tests.conftest import T
from tests.helpers import chat_requests, harness, one_line_error


def test_two_moments_pool_their_repetitions():
    """calibrate.pooled: the two moments' repetitions together, the spread taking in the drift between them."""
    from harness.calibrate import pooled, summarized
    first = summarized({"type": "costs", "contexts": [100], "k": 2, "reps": 3,
                        "target_times_by_context": [[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]]]})
    second = summarized({"type": "costs", "contexts": [100], "k": 2, "reps": 3,
                         "target_times_by_context": [[[14.0, 15.0, 16.0], [24.0, 25.0, 26.0]]]})
    assert first["target_ms_by_context"] == [[11.0, 21.0]] and first["target_sd_by_context"] == [[1.0, 1.0]]
    both = pooled(first, second)
    assert both["reps"] == 6 and both["target_times_by_context"][0][0] == [10.0, 11.0, 12.0, 14.0, 15.0, 16.0]
    assert both["target_ms_by_context"] == [[13.0, 23.0]]  # between the two moments
    assert both["target_sd_by_context"][0][0] == pytest.approx(2.366, abs=1e-3)  # wider than either moment's 1.0


def test_the_costs_two_moments_say_how_far_the_machine_moved():
    from harness.calibrate import moved
    rec = {"reps": 4, "target_times_by_context": [[[10.0, 10.0, 12.0, 12.0], [20.0, 20.0, 18.0, 18.0]]]}
    assert moved(rec) == pytest.approx([0.2, -0.1])
    assert moved({"reps": 3, "target_ms_by_context": [[10.0]]}) is None  # measured once, before the pooling


def test_a_workers_costs_before_and_after_its_generations_are_pooled():
    """calibrate.unit_costs: the first and last costs record of a configuration pooled (in-situ: repetitions
    together; batched: the mean of the two medians); a record measured once, or a replay's, as it is."""
    from harness.calibrate import summarized, unit_costs
    once = summarized({"type": "costs", "config": "a", "contexts": [100], "k": 1, "reps": 2,
                       "target_times_by_context": [[[10.0, 12.0]]]})
    later = summarized({"type": "costs", "config": "a", "contexts": [100], "k": 1, "reps": 2,
                        "target_times_by_context": [[[14.0, 16.0]]]})
    batched = [{"type": "costs", "config": "b", "seqs": [1, 8], "plain_ms": [10.0, 40.0], "verify_ms": [20.0, 80.0],
                "draft_ms": [5.0, 20.0], "draft_catch_up_ms": [8.0, 34.0]},
               {"type": "costs", "config": "b", "seqs": [1, 8], "plain_ms": [12.0, 44.0], "verify_ms": [22.0, 90.0],
                "draft_ms": [5.0, 24.0], "draft_catch_up_ms": [8.0, 40.0]}]
    replay = {"type": "costs", "config": "c", "proposer": "d", "contexts": [100], "target_ms_by_context": [[1.0]]}
    got = unit_costs([once, {"type": "step"}, later, *batched, replay])
    assert set(got) == {"a", "b"}  # the replay's records are pooled where they are written
    assert got["a"]["reps"] == 4 and got["a"]["target_ms_by_context"] == [[13.0]]
    assert got["b"]["plain_ms"] == [11.0, 42.0] and got["b"]["verify_ms"] == [21.0, 85.0]
    assert got["b"]["draft_ms"] == [5.0, 22.0] and got["b"]["draft_catch_up_ms"] == [8.0, 37.0]
    assert unit_costs([once])["a"] is once


def test_long_blocks_are_timed_at_a_few_sizes_and_read_at_every_k():
    """calibrate.block_sizes: every k up to 8, then doubling to k_max: ngram-mod's 65 (n-max 64) times 11 sizes,
    not 65 (12 minutes on a 2-core VM before a worker's first prompt). summarized reads each k between them
    linearly, so that the cost model's readers see k = 1..k_max as before."""
    from harness.calibrate import block_sizes, pooled, summarized, unit_costs
    assert block_sizes(65) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 65]
    assert block_sizes(9) == list(range(1, 10)) and block_sizes(1) == [1]  # a sweep's gammas up to 8: every k
    assert block_sizes(24) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24] and block_sizes(17) == [*range(1, 9), 17]
    ks = [1, 2, 4]
    rec = summarized({"type": "costs", "config": "a", "contexts": [100], "k": 4, "ks": ks, "reps": 2,
                      "target_times_by_context": [[[10.0, 10.0], [20.0, 20.0], [40.0, 60.0]]]})
    assert rec["target_ms_by_context"] == [[10.0, 20.0, 35.0, 50.0]]
    assert rec["target_sd_by_context"][0][:2] == [0.0, 0.0] and rec["target_sd_by_context"][0][3] > 0
    later = summarized(rec | {"target_times_by_context": [[[12.0, 12.0], [22.0, 22.0], [52.0, 52.0]]]})
    assert pooled(rec, later)["target_ms_by_context"] == [[11.0, 21.0, 36.5, 52.0]]
    dense = summarized({k: v for k, v in later.items() if k not in ("ks", "target_ms_by_context")} |
                       {"k": 3, "target_times_by_context": [[[12.0], [22.0], [52.0]]]})
    assert unit_costs([rec, dense])["a"] is rec  # measured at other sizes: not pooled


# -- `harness calibrate`
def test_calibrate_refuses_before_loading(tmp_path, monkeypatch):
    """--k-max above the batch is refused before any model loads (it used to measure for minutes)."""
    import harness.calibrate as cal

    def no_engine(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(cal, "Engine", no_engine)
    one_line_error(harness("calibrate", T, "--k-max", "513", "--out", tmp_path), "--k-max 513")


@pytest.mark.slow  # the threads-1 sweep and calibrations: 2 min of the fast tier
def test_calibrate_prints_its_table_and_where_it_saved(calibrations):
    cals, printed = calibrations
    assert "vs k=1" in printed and all(f"saved to {c}" in printed for c in cals)


# -- the costs measured in the worker (calibrate.in_situ), on SmolLM2


def test_costs_measured_in_the_worker(smol_pair):
    """calibrate.in_situ: the target's blocks with all logits, the draft's with the last row's only."""
    from harness.calibrate import in_situ
    target, draft = smol_pair
    tokens = chat_requests(target)[0].tokens
    rec = in_situ(target, draft, tokens, k_max=3, contexts=(16, 48), reps=2)
    assert rec["type"] == "costs" and rec["contexts"] == [16, 48] and rec["k"] == 3
    for role in ("target_ms_by_context", "draft_ms_by_context"):  # k = 1..3 after each context
        assert [len(x) for x in rec[role]] == [3, 3] and all(v > 0 for x in rec[role] for v in x)
    room = min(target.n_ctx, draft.n_ctx) - 3 - 2  # a context that does not fit is replaced by the largest that does
    assert in_situ(target, None, tokens, k_max=3, contexts=(10 ** 6,), reps=1)["contexts"] == [room]
    assert target.n_past == 0 and draft.n_past == 0  # both left empty for the generations


@pytest.mark.slow  # 9-24 s on the 2-core VM under other processes' load (its blocks run to 49 tokens)
def test_a_long_blocks_costs_are_timed_at_a_few_sizes(smol_pair):
    """An n-gram type's blocks of up to 49 tokens (n-max 48; this fixture's batch holds 64): 11 sizes timed, every
    k read."""
    from harness.calibrate import block_sizes, in_situ
    target, _ = smol_pair
    rec = in_situ(target, None, chat_requests(target)[0].tokens, k_max=49, contexts=(80,), reps=1)
    assert rec["ks"] == block_sizes(49) and len(rec["target_times_by_context"][0]) == 11
    (ms,) = rec["target_ms_by_context"]
    assert len(ms) == 49 and all(v > 0 for v in ms) and target.n_past == 0


def test_costs_start_from_the_prompts_cached_state(smol_pair, tmp_path):
    """calibrate.in_situ with the run's prompt cache: each context starts from the longest prompt that fits, as
    the loop evaluates it (all but its last token), which the generation then restores."""
    from harness.calibrate import in_situ
    from harness.promptcache import PromptCache
    target, draft = smol_pair
    reqs = chat_requests(target)
    cache = PromptCache(tmp_path)
    starts = [r.tokens[:-1] for r in reqs]
    short, long = sorted(len(x) for x in starts)[0], max(len(x) for x in starts)
    text = [t for r in reqs for t in r.tokens]
    rec = in_situ(target, draft, text, k_max=3, contexts=(short, long + 20), reps=1, cache=cache, prefixes=starts)
    assert rec["contexts"] == [short, long + 20] and all(v > 0 for x in rec["target_ms_by_context"] for v in x)
    assert cache.counts() == {"restored": 0, "evaluated": 4, "rejected": 0, "unsaved": 0}  # 2 prompts x 2 models
    assert target.n_past == 0 and draft.n_past == 0
    # measured again (after the generations): every start restored
    in_situ(target, draft, text, k_max=3, contexts=(short, long + 20), reps=1, cache=cache, prefixes=starts)
    assert cache.counts()["restored"] == 4
    # the generation of the longest prompt restores what the costs evaluated
    gen = generate(target, max(reqs, key=lambda r: len(r.tokens)), Policy(), DraftModelProposer(draft, cache=cache),
                   2, cache=cache)
    assert gen["prompt_cached"] and cache.counts()["restored"] == 6 and cache.counts()["evaluated"] == 4
