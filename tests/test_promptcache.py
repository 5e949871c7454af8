"""The run's prompt cache on SmolLM2: a restored prompt state decodes to the very logits a fresh evaluation gives,
in the loop and in the replay's passes; another engine setting never takes another's file; a bad file is
evaluated afresh; a bench run with it reports latency as not measured and removes the cache when it completes."""
import json
from dataclasses import replace

import numpy as np
import pytest

from harness.bench.replay import stepwise_argmax
from harness.engine import Engine, EngineConfig
from harness.loop import Request, generate
from harness.promptcache import PromptCache, evaluate_prompt, teacher_forced
from harness.proposers import DraftModelProposer
from harness.sampling import Policy
from harness.specs import parse_draft
from tests.helpers import engine_pair

CFG = EngineConfig(n_ctx=512, n_batch=32, threads=2)
TEXT = "Write a Python function that merges two sorted lists into one sorted list, and explain its complexity. " * 3


@pytest.fixture(scope="module")
def engines(smol, smol_q2k):
    with engine_pair(smol, smol_q2k, CFG) as pair:
        yield pair


def _prompt(engine) -> list[int]:
    toks = engine.vocab.tokenize(engine.vocab.apply_chat_template([{"role": "user", "content": TEXT}]))
    assert len(toks) > 2 * CFG.n_batch  # the prompt spans several decode chunks
    return toks


def _next_logits(engine, toks, cache) -> tuple[bool, np.ndarray]:
    """The prompt but its last token through the cache, then a 3-token block with all logits."""
    engine.reset()
    restored = evaluate_prompt(engine, toks[:-1], cache)
    assert engine.n_past == len(toks) - 1
    return restored, engine.decode([toks[-1], 42, 7], logits="all").copy()


def test_a_restored_state_gives_the_fresh_logits_bit_for_bit(engines, tmp_path):
    target, _ = engines
    toks = _prompt(target)
    cache = PromptCache(tmp_path)
    _, plain = _next_logits(target, toks, None)
    restored, first = _next_logits(target, toks, cache)  # evaluated and saved
    assert not restored and np.array_equal(first, plain)
    restored, again = _next_logits(target, toks, cache)
    assert restored and np.array_equal(again, plain)
    assert cache.counts() == {"restored": 1, "evaluated": 1, "rejected": 0, "unsaved": 0}
    assert [p.suffix for p in tmp_path.iterdir()] == [".kv"]  # no temporary file left behind


# sampling processes the whole vocabulary at every position: a few tokens show its random streams are untouched
@pytest.mark.parametrize("policy, n", [(Policy(), 16), (Policy(temperature=0.8, top_p=0.9, seed=3), 4)],
                         ids=["greedy", "sampled"])
def test_generate_through_the_cache_gives_the_same_outputs(engines, tmp_path, policy, n):
    target, draft = engines
    req = Request("p", _prompt(target), n)
    plain = generate(target, req, policy)
    spec = generate(target, req, policy, DraftModelProposer(draft), 3)
    cache = PromptCache(tmp_path)
    prop = DraftModelProposer(draft, cache=cache)
    runs = [generate(target, req, policy, prop, 3, cache=cache) for _ in range(2)]
    plain_cached = generate(target, req, policy, cache=cache)
    for g in runs:
        assert g["tokens"] == spec["tokens"] and g["from_draft"] == spec["from_draft"]
    assert plain_cached["tokens"] == plain["tokens"]
    first, second = runs
    assert first["prompt_cached"] is False and first["latency_ms"] > first["gen_ms"] > 0
    assert first["prompt_eval_ms"] > 0 and first["draft_prefill_ms"] > 0
    for g in (second, plain_cached):  # nothing evaluated, so no evaluation time and no latency
        assert g["prompt_cached"] is True and g["prompt_eval_ms"] is None and g["latency_ms"] is None
        assert g["tokens_per_s"] > 0
    assert second["draft_prefill_ms"] is None
    assert plain["prompt_cached"] is False and plain["latency_ms"] is not None
    assert cache.counts() == {"restored": 3, "evaluated": 2, "rejected": 0, "unsaved": 0}


def test_another_engine_setting_or_model_takes_no_other_file(engines, smol, tmp_path):
    target, draft = engines
    toks = _prompt(target)[:-1]
    cache = PromptCache(tmp_path)
    paths = {cache.path(target, toks), cache.path(draft, toks), cache.path(target, toks[:-1])}
    for other in (replace(CFG, n_ubatch=16), replace(CFG, cache_k="q8_0"), replace(CFG, flash_attn="on")):
        with Engine(smol, other) as e:
            paths.add(cache.path(e, toks))
    assert len(paths) == 6
    target.reset()
    assert not evaluate_prompt(target, toks, cache)
    with Engine(smol, replace(CFG, n_ubatch=16)) as e:
        assert not evaluate_prompt(e, toks, cache)  # evaluated afresh, not the other's state
        e.reset()
        assert evaluate_prompt(e, toks, cache)
    assert len(list(tmp_path.glob("*.kv"))) == 2


def _cut(f):
    f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])


def _flip(f):
    b = bytearray(f.read_bytes())
    b[-100] ^= 0xFF
    f.write_bytes(bytes(b))


def _garbage(f):
    f.write_bytes(b"not a state")


@pytest.mark.parametrize("spoil", [_cut, _flip, _garbage])
def test_a_bad_file_is_evaluated_afresh(engines, tmp_path, spoil):
    target, _ = engines
    toks = _prompt(target)
    cache = PromptCache(tmp_path)
    _, plain = _next_logits(target, toks, cache)
    spoil(cache.path(target, toks[:-1]))
    restored, fresh = _next_logits(target, toks, cache)
    assert not restored and np.array_equal(fresh, plain)
    assert cache.rejected == 1
    restored, again = _next_logits(target, toks, cache)  # the file was written again
    assert restored and np.array_equal(again, plain)


def test_a_state_llama_cpp_refuses_is_evaluated_afresh(engines, smol, tmp_path):
    """A sound file whose state does not fit the context (another KV type, under this one's name): llama.cpp
    refuses it, and the prompt is evaluated."""
    target, _ = engines
    toks = _prompt(target)
    cache = PromptCache(tmp_path)
    with Engine(smol, replace(CFG, cache_k="q8_0")) as e:
        evaluate_prompt(e, toks[:-1], cache)
        cache.path(e, toks[:-1]).rename(cache.path(target, toks[:-1]))
    _, plain = _next_logits(target, toks, None)
    restored, fresh = _next_logits(target, toks, cache)
    assert not restored and cache.rejected == 1 and np.array_equal(fresh, plain)


def test_the_replays_passes_are_the_same_through_the_cache(engines, tmp_path):
    """stepwise_argmax (greedy matches) and teacher_forced (alpha's p and q) give what they give without the
    cache, from a saved prompt and from a restored one."""
    target, draft = engines
    toks = _prompt(target)
    forced = generate(target, Request("p", toks, 12), Policy())["tokens"]
    cache = PromptCache(tmp_path)
    for engine in (target, draft):
        rows = teacher_forced(engine, toks, forced)
        guess = stepwise_argmax(engine, toks, forced)
        for _ in range(2):  # saved, then restored
            assert np.array_equal(teacher_forced(engine, toks, forced, cache), rows)
            assert stepwise_argmax(engine, toks, forced, cache) == guess
    assert cache.counts()["restored"] == 6 and cache.counts()["evaluated"] == 2


@pytest.mark.slow  # a bench run of its own: 12-23 s
def test_a_bench_run_with_the_cache(tmp_path, smol, smol_q2k):
    """The speculative unit restores the prompts the baseline unit evaluated (target) and its paired twin's;
    the report shows their latency as not measured; the completed run has no cache left."""
    from harness.rundir import CACHE_DIR, PAIRED_DIR, trace_files
    from harness.trace import read_records
    from tests.conftest import D, PROMPT_FILE, T
    from tests.helpers import diagnostics_md, harness, md_table, only_run
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "2", "--prompts", PROMPT_FILE, "--categories",
                "code", "--per-category", "2", "--max-tokens", "8", "--paired", "--prompt-cache", "--threads", "2",
                "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path)
    assert not (run / CACHE_DIR).exists()
    gens = {f.parent.parent.name + "/" + f.stem: [x for x in read_records(f) if x["type"] == "generation"]
            for f in trace_files(run) if f.parent.parent in (run, run / PAIRED_DIR)}
    base = [g for k, v in gens.items() for g in v if g["mode"] == "baseline" and not k.startswith(PAIRED_DIR)]
    spec = [g for v in gens.values() for g in v if g["mode"] == "speculative"]
    twin = [g for k, v in gens.items() for g in v if k.startswith(PAIRED_DIR)]
    assert len(base) == len(spec) == len(twin) == 2
    assert not any(g["prompt_cached"] for g in base) and all(g["latency_ms"] for g in base)
    assert all(g["prompt_cached"] and g["latency_ms"] is None for g in spec + twin)
    assert [g["tokens"] for g in twin] == [g["tokens"] for g in base]
    rows = {json.loads(x)["draft"]: json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()}
    assert rows["none"]["prompt_cache"] == {"restored": 0, "evaluated": 2, "rejected": 0, "unsaved": 0}
    # the draft evaluates its 2 prompts once, for the decode costs measured before the generations, at 2
    # contexts; the rest restore: the target's 2 and the draft's 2 in each of the two measurements, the target's
    # for the generations and their twins, the draft's for the generations
    assert rows[D]["prompt_cache"] == {"restored": 2 + 2 * 2 + 2 + 2 + 2, "evaluated": 2, "rejected": 0,
                                       "unsaved": 0}
    md = diagnostics_md(run)  # every timed row, per category
    code = md.split("## Per category", 1)[1].split("### code", 1)[1]
    speed = md_table("speed\n" + next(b for b in code.split("\n\n") if "| latency ms" in b), "speed")
    lat = {x["draft"]: x["latency ms"] for x in speed}
    assert lat[D] == "–" and lat["none"] not in ("–", "")
    assert "latency not measured, a prompt was restored from the run's prompt cache" in md
    assert harness("report", run, "--check").returncode == 0


def test_the_replay_through_the_cache_writes_the_same_records(replay_run, tmp_path):
    """The shared replay run's sampled baseline, whose replay takes both passes (teacher-forced rows for alpha,
    stepwise matches for llama.cpp's rule), replayed again through the cache, saving then restoring: the records
    are the run's own."""
    from harness.bench.replay import replay_unit
    from harness.instance import Instance
    from harness.plan import Params, prompt_pool
    from harness.rundir import REPLAY_DIR, read_plan, trace_path
    from harness.trace import read_records
    from tests.helpers import copy_run
    run = copy_run(replay_run, tmp_path)
    plan = read_plan(run)
    row = next(r for r in map(json.loads, (run / REPLAY_DIR / "results.jsonl").read_text().splitlines())
               if r["policy"]["temperature"] > 0)
    base = next(i for i in map(Instance.from_dict, plan["instances"]) if i.id == row["config"])
    params = replace(Params.from_dict(plan["params"]), prompt_cache=True)
    prompts = [p for p in prompt_pool(params, plan["categories"]) if p.id in plan["prompt_ids"]]
    out = trace_path(run / REPLAY_DIR, row["unit"])

    def replayed() -> list[dict]:
        return [r for r in read_records(out) if r["type"] in ("replay_prompt", "replay")]
    want = replayed()
    assert {r["proposer"] for r in want if "match_exact" in r}  # the stepwise pass ran
    for evaluated in (2 * len(prompts), 0):  # each prompt once per model, then none
        res = replay_unit(base, 0, prompts, [parse_draft(x) for x in row["proposers"]], row["gamma_max"],
                          params, run)  # a finished unit: afresh
        assert res["prompt_cache"]["evaluated"] == evaluated and res["prompt_cache"]["rejected"] == 0
        assert replayed() == want
