"""plan.make_params and plan.check: a parameter set that cannot run is refused in one line before anything starts
(issue 43's bad-input sweep). One row per case: the profile, the command line's overrides, the words of the error.
Then the sweeps a plan expands into (KV types, flash attention, ubatch, --parallel, --kv-unified, the verification
rules), the ids they keep, a profile's further sweeps (`also`), and bench's options refused in one line."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from harness.drafting import Drafting
from harness.errors import HarnessError
from harness.instance import Instance
from harness.plan import Params, check, expand, make_params
from harness.howto import howto
from harness.sampling import Policy
from harness.specs import DraftModel, NGram
from tests.conftest import D, PROMPT_FILE, skip_on_gpu_build
from tests.helpers import ROOT, harness, one_line_error

T = "smollm2-135m-instruct-q4_1"
NAN, INF = float("nan"), float("inf")

REFUSED = {
    # every float option, non-finite, from the command line or a profile (nan passes any range check)
    "budget-min-nan": ({}, {"budget_min": NAN}, ["--budget-min", "finite", "nan"]),
    "budget-min-inf": ({}, {"budget_min": INF}, ["--budget-min", "finite"]),
    "min-gain-nan": ({}, {"min_gain": NAN}, ["--min-gain", "finite"]),
    "busy-threshold-inf-in-profile": ({"busy_threshold": INF}, {}, ["--busy-threshold", "finite"]),
    "temp-list-inf": ({}, {"temp": "0,inf"}, ["--temp", "finite", "inf"]),
    "min-p-nan": ({}, {"min_p": "nan"}, ["--min-p", "finite"]),
    "draft-p-min-nan-in-profile": ({"draft_p_min": [NAN]}, {}, ["--draft-p-min", "finite"]),
    # --replay-gamma means nothing without --replay, as --timed-subset does not
    "replay-gamma-without-replay": ({}, {"replay_gamma": 4}, ["--replay-gamma", "give --replay"]),
    "replay-gamma-replay-off-on-command-line": ({"replay": True, "replay_gamma": 4}, {"replay": False},
                                                ["--replay-gamma", "give --replay"]),
    # a negative seed failed in every worker, and the run exited 0
    "seed-negative": ({}, {"seed": -1}, ["--seed", ">= 0", "-1"]),
    # max tokens alone beyond the context: the dry run estimated hundreds of minutes
    "max-tokens-beyond-n-ctx": ({}, {"max_tokens": 100000}, ["--max-tokens 100000", "--n-ctx 2048"]),
    "max-tokens-equal-n-ctx": ({}, {"max_tokens": 512, "n_ctx": 512}, ["--max-tokens 512", "--n-ctx 512"]),
    "threads-beyond-cores": ({}, {"threads": "100000"}, ["--threads 100000", "logical cores"]),
    "prompt-chars-negative": ({}, {"prompt_chars": -1}, ["--prompt-chars", ">= 0"]),
}


@pytest.mark.parametrize("profile, overrides, words", list(REFUSED.values()), ids=list(REFUSED))
def test_a_parameter_set_that_cannot_run_is_refused_in_one_line(profile, overrides, words):
    with pytest.raises(HarnessError) as e:
        make_params({"target": [T], **profile}, overrides)
    for w in words:
        assert w in str(e.value), str(e.value)


ACCEPTED = {
    "replay-gamma-with-replay": ({}, {"replay": True, "replay_gamma": 4}),
    "replay-off-keeps-default-replay-gamma": ({"replay": True, "replay_gamma": 8}, {"replay": False}),
    "max-tokens-just-under-n-ctx": ({}, {"max_tokens": 511, "n_ctx": 512}),
    "prompt-chars-in-profile": ({"prompt_chars": 2048}, {}),
    "budget-min-finite": ({}, {"budget_min": 20.0}),
    # the replay prices llama.cpp's n-gram types at their own gamma (analysis.replay.llama_ngram_steps)
    "llama-ngram-with-replay": ({}, {"replay": True, "draft": "ngram-mod:n-max=16:n-min=12"}),
}


@pytest.mark.parametrize("profile, overrides", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_the_values_beside_them_still_run(profile, overrides):
    make_params({"target": [T], **profile}, overrides)


@pytest.mark.parametrize("key, given", [("categories", "code,code"), ("categories", ["code", "chat", "code"]),
                                        ("prompts", "a.jsonl,a.jsonl")])
def test_a_category_or_prompt_file_given_twice_is_one(key, given):
    p = make_params({}, {"target": T, key: given})
    assert getattr(p, key) == list(dict.fromkeys(x for x in (given.split(",") if isinstance(given, str) else given)))


# -- options accepted but meaningless, and --resume with options of its own
BASE = ("bench", "--target", T, "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1")


@pytest.mark.parametrize("args, words", [
    ((*BASE, "--draft", "smollm2-135m-instruct-q2_k", "--gamma", "2", "--draft-n-min", "5"),
     ["--draft-n-min 5", "--gamma 2", "never speculate"]),
    ((*BASE, "--draft", "ngram:2", "--gamma", "auto:0"), ["--gamma auto:0", "N >= 1"]),
    ((*BASE, "--draft", "ngram:2", "--threads", "1000"), ["--threads 1000", f"{os.cpu_count()} logical cores"]),
    (("bench", "--resume", "RUN", "--gamma", "5", "--max-tokens", "2", "--temp", "0.7"),
     ["--resume takes the run's own options", "--gamma, --max-tokens, --temp"]),
    (("bench", "--resume", "RUN", "--busy-threshold", "0.5"), ["--resume takes", "--busy-threshold"]),
], ids=["n-min-above-gamma", "gamma-auto-0", "threads-above-cores", "resume-with-options",
        "resume-with-threshold"])
def test_meaningless_options_are_refused_in_one_line(tmp_path, args, words):
    run = tmp_path / "runs" / "r1"
    (run / "traces").mkdir(parents=True)
    (run / "plan.json").write_text("{}")
    args = [str(run) if a == "RUN" else a for a in args]
    r = harness(*args, "--out", tmp_path / "o") if "--resume" not in args else harness(*args)
    one_line_error(r, *words)
    assert not (tmp_path / "o").exists()


# -- bench's bad input, and a profile's values of the wrong type
@pytest.mark.parametrize("args, words", [
    (["--profile", "nope"], ["unknown profile"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--categories", "poetry"], ["unknown prompt category"]),
    (["--target", "no-such-model"], ["unknown model"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--gamma", "0", "--draft", "ngram:2"], ["gamma"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--draft", "ngram:0"], ["n-gram size"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--ngl", "99"], ["GPU", "CMAKE_ARGS"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--draft", "gemma-3-270m-q4_k_m"], []),
    (["--resume", "/tmp"], ["not a benchmark run"]),
    (["--target", ""], ["no target"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--per-category", "-1"], ["--per-category", ">= 0"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--threads", "2,-1"], ["--threads", ">= 0"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--n-ctx", "32"], ["--n-ctx", "64"]),
    (["--target", "smollm2-135m-instruct-q4_1", "--per-category", "x"], ["--per-category", "not a valid integer"]),
])
def test_bad_bench_input_is_one_line(args, words, tmp_path):
    if "--ngl" in args:
        skip_on_gpu_build("the --ngl refusal of a CPU-only build")
    if "gemma-3-270m-q4_k_m" in args and not (ROOT / "models" / "gemma-3-270m-q4_k_m.gguf").exists():
        pytest.skip("gemma not fetched")
    r = harness("bench", *args, "--out", str(tmp_path / "runs"))
    one_line_error(r, *words)
    if "gemma-3-270m-q4_k_m" in args:
        assert r.returncode == 2 and "not aligned" in r.stderr


@pytest.mark.parametrize("line, words", [
    ('per_category = "two"', ["per_category", "an integer", "'two'", "profile"]),
    ('max_tokens = "x"', ["max_tokens", "an integer", "'x'"]),
    ('paired = "yes"', ["paired", "true or false"]),
])
def test_profile_values_of_the_wrong_type_are_one_line(tmp_path, line, words):
    prof = tmp_path / "profiles.toml"
    prof.write_text(f'[profiles.p]\ntarget = ["smollm2-135m-instruct-q4_1"]\n{line}\n')
    one_line_error(harness("bench", "--profile", "p", "--out", str(tmp_path / "runs"),
                           env={"HARNESS_PROFILES": str(prof)}), *words)


# -- the sweeps a plan expands into (--parallel, --kv-unified, the context knobs, the verification rules),
# the ids they keep, and the options refused beside them
GREEDY_ARGS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}


def test_parallel_is_swept_labelled_and_keeps_single_sequence_ids():
    p = Params(target=[T], draft=[D], gamma=[2], parallel=[1, 4])
    check(p)
    insts = expand(p)
    assert sorted({(i.parallel, i.setup) for i in insts}) == [(1, ""), (4, "parallel 4")]
    one = Instance(T, DraftModel(D), 2, Policy(**GREEDY_ARGS), 0, 0, 0)
    assert one.id == replace(one, parallel=1).id  # runs from before --parallel keep theirs
    four = next(i for i in insts if i.parallel == 4 and not i.baseline)
    assert four.plain().parallel == 4
    assert four.engine_config(4096).n_seq == 4 and four.draft_engine_config(4096).n_seq == 4


@pytest.mark.parametrize("params, words", [
    (dict(parallel=[0]), ("--parallel", ">= 1")),
    (dict(parallel=[-2, 2]), ("--parallel", ">= 1")),
    (dict(parallel=[2], gamma=["auto"]), ("auto", "one sequence's steps", "fixed gammas")),
    (dict(parallel=[1, 2], replay=True), ("--replay", "one sequence's plain run")),
    (dict(parallel=[2], until_confident=True), ("--until-confident", "a batch pairs a category's requests")),
    (dict(parallel=[64], gamma=[8]), ("576 tokens per step", "batch size 512")),
])
def test_plan_refuses_what_concurrent_decoding_cannot_run(params, words):
    with pytest.raises(HarnessError) as e:
        check(Params(target=[T], **params))
    assert all(w in str(e.value) for w in words)


GREEDY = Policy()


def test_kv_unified_is_swept_labelled_and_reaches_both_engines():
    insts = expand(make_params({}, {"target": T, "draft": D, "gamma": "2", "parallel": "1,4", "kv_unified": "off,on"}))
    assert sorted({(i.parallel, i.kv_unified, i.setup) for i in insts}) == [
        (1, False, ""), (4, False, "parallel 4"), (4, True, "parallel 4, unified KV")]  # one sequence: one buffer
    four = next(i for i in insts if i.kv_unified and not i.baseline)
    assert four.plain().kv_unified and four.engine_config(4096).kv_unified
    one = Instance(T, DraftModel(D), 2, GREEDY, 0, 0, 0)
    assert four.draft_engine_config(4096).kv_unified and not one.engine_config(4096).kv_unified
    # off is the default, and stays out of the id: runs from before keep theirs
    assert replace(one, parallel=4).id == replace(one, parallel=4, kv_unified=False).id
    assert Params().kv_unified == ["off"]
    assert " -np 4 -kvu " in howto(four, 4096, catalog={}).server  # llama-server's flag
    with pytest.raises(HarnessError) as e:
        make_params({}, {"target": T, "kv_unified": "maybe"})
    assert "--kv-unified takes on, off" in str(e.value)


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_kv_unified_through_the_command_line_dry_run(tmp_path, smol, smol_q2k):
    args = ("bench", "--target", T, "--draft", D, "--gamma", "2", "--parallel", "1,2", "--prompts", PROMPT_FILE,
            "--max-tokens", "8", "--dry-run", "--allow-busy", "--out", tmp_path / "r")  # a dry run times nothing
    r = harness(*args, "--kv-unified", "off,on")
    # parallel 1: baseline and draft; parallel 2: both with a KV buffer per sequence, and both unified
    assert r.returncode == 0 and "6 configurations x" in r.stderr, r.stderr
    assert "prompt cache" not in r.stderr
    one_line_error(harness(*args, "--kv-unified", "yes"), "--kv-unified takes on, off")
    # the prompt cache serves one request at a time: a sweep with several says so, and why
    r = harness(*args, "--prompt-cache")
    assert r.returncode == 0 and "prompt cache: for one request at a time only" in r.stderr, r.stderr


@pytest.mark.parametrize("args, words", [
    (["--until-confident", "--budget-min", "0"], ["--budget-min", "above 0"]),
    (["--until-confident", "--budget-min", "-5"], ["--budget-min", "above 0"]),
    (["--busy-threshold", "0"], ["--busy-threshold", "(0, 1]"]),
    (["--busy-threshold", "1.5"], ["--busy-threshold", "(0, 1]"]),
])
def test_bad_confidence_options_are_one_line(tmp_path, args, words):
    one_line_error(harness("bench", "--target", T, *args, "--out", str(tmp_path / "r")), *words)


def test_cache_types_flash_attention_and_ubatch_are_swept_and_labelled():
    p = Params(target=[T], draft=[D, "ngram:2"], gamma=[2], cache_type_k_draft=["f16", "q8_0"],
               cache_type_v_draft=["f16", "q8_0"], ubatch=[512, 64])
    inst = expand(p)
    base = [i for i in inst if i.baseline]
    assert sorted(i.ubatch for i in base) == [64, 512]
    model = [i for i in inst if i.draft == DraftModel(D)]
    assert len(model) == 2 * 4  # ubatch x (K, V) of the draft
    assert {i.cache_k_draft for i in inst if i.draft == NGram(2)} == {"f16"}  # a lookup has no cache
    q = next(i for i in model if (i.cache_k_draft, i.cache_v_draft, i.ubatch) == ("q8_0", "q8_0", 64))
    assert q.draft_label == f"{D} (KV q8_0/q8_0)" and q.setup == "ubatch 64"
    assert q.plain().setup == "ubatch 64" and q.plain().id in {i.id for i in base}
    d = q.draft_engine_config(2048)
    assert (d.cache_k, d.cache_v, d.n_ubatch, d.flash_attn) == ("q8_0", "q8_0", 64, "auto")
    one = Instance(T, DraftModel(D), 2, GREEDY, 0, 0, 2)
    assert one.setup == ""
    # a run from before these fields keeps its ids
    assert one.id == replace(one, cache_k="f16", ubatch=512).id
    assert replace(one, cache_k="q8_0").id != one.id


@pytest.mark.parametrize("params, words", [
    (dict(cache_type_k=["q8_0"], calibrate=True), ("calibrations", "without --calibrate")),
    (dict(flash_attn=["off"], gamma=["auto:4"]), ("auto gamma", "fixed gammas")),
    (dict(cache_type_v_draft=["f16", "q8_0"], replay=True), ("replay", "--cache-type-k-draft/-v-draft")),
    (dict(ngl_draft=[0, 99], replay=True), ("replay", "--ngl-draft")),
    (dict(ubatch=[0]), ("--ubatch", ">= 1")),
])
def test_plan_refuses_knobs_it_cannot_measure_honestly(params, words):
    with pytest.raises(HarnessError) as e:
        check(Params(target=[T], **params))
    assert all(w in str(e.value) for w in words)


@pytest.mark.parametrize("args, words", [
    (["--draft", "ngram:2", "--timed-subset", "1"], ["--timed-subset", "--replay"]),  # a bare target replays
    (["--replay", "--replay-gamma", "0"], ["--replay-gamma", ">= 1"]),
    (["--replay", "--timed-subset", "1", "--until-confident"], ["--until-confident", "--timed-subset"]),
])
def test_bad_replay_options_are_one_line(tmp_path, args, words):
    one_line_error(harness("bench", "--target", T, *args, "--out", str(tmp_path / "r")), *words)


SAMPLED = Policy(0.8, 0, 0.9, 0.0, 0)


def test_rules_are_swept_only_where_they_differ_and_old_ids_stay():
    p = Params(target=[T], draft=[D, "ngram:2"], gamma=[2], temp=[0.0, 0.8], verify=["leviathan", "exact"],
               draft_p_min=[0.0, 0.5])
    got = {(i.policy.temperature, str(i.draft), i.verify, i.p_min) for i in expand(p) if not i.baseline}
    # greedy: one rule; a lookup has no probabilities for p-min
    assert got == {(0.0, D, "leviathan", 0.0), (0.0, D, "leviathan", 0.5), (0.0, "ngram:2", "leviathan", 0.0),
                   (0.8, D, "leviathan", 0.0), (0.8, D, "leviathan", 0.5), (0.8, D, "exact", 0.0),
                   (0.8, D, "exact", 0.5), (0.8, "ngram:2", "leviathan", 0.0), (0.8, "ngram:2", "exact", 0.0)}
    assert Instance(T, DraftModel(D), 2, SAMPLED, 0, 0, 2, verify="exact").id != \
        Instance(T, DraftModel(D), 2, SAMPLED, 0, 0, 2).id
    assert Drafting("exact", 0.75, 2).label(D) == f"{D} (exact, p-min 0.75, n-min 2)"


@pytest.mark.parametrize("run", ["20261130-143720-vm", "20261201-170912-vm", "20261201-194704-vm"])
def test_ids_are_those_committed_runs_recorded(run):
    """A configuration's id names its traces: the ids the code gives today the plans of the first day (before
    the drafting fields) and of later days must be those their runs recorded, or their traces could not be found."""
    d = ROOT / "reports" / "runs" / run
    plan = json.loads((d / "plan.json").read_text())
    recorded = {json.loads(x)["config"] for x in (d / "results.jsonl").read_text().splitlines()}
    ids = {Instance.from_dict(i).id for i in plan["instances"]}
    assert recorded <= ids and set(plan.get("timed") or ids) <= recorded  # a timed subset ran only its choice


# -- A profile's further sweeps (`also`): instances added beside the main product, dropped where the command
# line sets the same list, refused in one line when malformed.
PROFILE = {"target": ["t-q4"], "draft": ["d1", "ngram:3"], "gamma": [1, 4], "temp": [0.0, 0.7], "top_p": [0.9],
           "also": [{"target": ["t-f16"], "draft": ["d1"], "temp": [0.0]}]}


def test_also_adds_its_own_product_beside_the_main_one():
    inst = expand(make_params(PROFILE, {}))
    f16 = [i for i in inst if i.target == "t-f16"]
    # one greedy baseline, and d1 at each gamma of the main sweep (inherited), greedy only
    assert sorted((str(i.draft), i.gamma) for i in f16) == [("d1", 1), ("d1", 4), ("none", 0)]
    assert all(i.policy.greedy for i in f16)
    assert len([i for i in inst if i.target == "t-q4"]) == 2 * (1 + 2 * 2)


def test_an_instance_in_both_sweeps_runs_once():
    prof = PROFILE | {"also": [{"draft": ["d1"]}]}  # a subset of the main sweep
    assert len(expand(make_params(prof, {}))) == len(expand(make_params(PROFILE | {"also": []}, {})))


def test_a_list_given_on_the_command_line_drops_the_sweeps_that_set_it():
    assert {i.target for i in expand(make_params(PROFILE, {"target": "mine"}))} == {"mine"}
    # a list the further sweep does not set keeps it, with the command line's value inherited
    inst = expand(make_params(PROFILE, {"gamma": "2"}))
    assert {i.target for i in inst} == {"t-q4", "t-f16"} and {i.gamma for i in inst} == {0, 2}


@pytest.mark.parametrize("also", [[{"per_category": 3}], [{}], ["t-f16"], [{"target": [["x"]]}]])
def test_a_malformed_further_sweep_is_refused(also):
    with pytest.raises(HarnessError, match="also|target"):
        expand(make_params(PROFILE | {"also": also}, {}))


def test_a_further_sweep_is_checked_like_the_main_one():
    with pytest.raises(HarnessError, match="threads"):
        make_params(PROFILE | {"also": [{"threads": [-1]}]}, {})


@pytest.mark.parametrize("given, words", [
    ({"server_check": -1}, ["--server-check N (N >= 1"]),
    ({"server_check": 2, "engine": "server"}, ["llama-server's already"]),
    ({"llama_server": "/x/llama-server"}, ["--llama-server names the binary", "--server-check"])])
def test_server_check_options(given, words):
    with pytest.raises(HarnessError) as e:
        check(Params(**given))
    assert all(w in str(e.value) for w in words)
    check(Params(server_check=2, llama_server="/x/llama-server"))  # the binary the check runs
