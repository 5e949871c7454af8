"""The replay end to end on SmolLM2 (bench.replay): the baselines' outputs teacher-forced through the drafts,
predictions for every gamma and both verification rules with intervals, and the timed rows of the same
configurations beside them; each baseline replayed through its own sweep's drafts."""
import json
import statistics

import pytest

from harness.plan import expand, make_params
from harness.rundir import trace_files
from harness.trace import read_records
from tests.conftest import PROMPTS, D, T, _bench
from tests.helpers import diagnostics_md, harness, md_table, report_md


@pytest.fixture(scope="module")
def replay(replay_run):
    return replay_run, report_md(replay_run)


def test_replay_records_and_report_sections(replay):
    run, md = replay
    recs = [r for f in trace_files(run / "replay") for r in read_records(f)]
    kinds = {r["type"] for r in recs}
    assert kinds == {"replay_prompt", "replay", "costs"}
    greedy = [r for r in recs if r["type"] == "replay" and r["policy"] == "greedy"]
    assert greedy and all(set(r["match"]) <= {0, 1} for r in greedy)  # n-gram greedy is recomputed, no record
    sampled = [r for r in recs if r["type"] == "replay" and r["policy"] != "greedy"]
    assert {r["proposer"] for r in sampled} == {D, "ngram:2"}
    assert all(0 <= a <= 1 for r in sampled for a in r.get("alpha", []) + sum(r.get("alpha_blocks", []), []))
    # llama.cpp's rule swept: the draft's matches along the output, and p of its top token
    exact = [r for r in sampled if r["proposer"] == D]
    assert exact and all(set(r["match_exact"]) <= {0, 1} and len(r["match_exact"]) == len(r["alpha_exact"])
                         == len(r["alpha"]) for r in exact)
    costs = [r for r in recs if r["type"] == "costs"]
    assert all(r["reps"] > 1 and len(r["target_sd_by_context"]) == len(r["target_ms_by_context"]) for r in costs)
    # measured before the prompts and after them, pooled: every k holds both moments' repetitions
    assert all(len(t) == r["reps"] == 6 for r in costs for ctx in r["target_times_by_context"] for t in ctx)
    assert {r["proposer"] for r in costs if r.get("draft_sd_by_context")} == {D}  # a lookup's time has no spread
    diagnostics = diagnostics_md(run)  # the harness's checks of itself
    assert "Each was measured twice, before the replay's prompts and after them" in diagnostics
    assert "## Predicted from every prompt (replay)" in md
    for heading in ("## Cost (this machine only)", "## Replayed against timed",
                    "## Acceptance (models, prompts and policy only)", "## Predicted speedup"):
        assert heading in diagnostics and heading not in md
    acc = md_table(diagnostics, "## Acceptance (models, prompts and policy only)")
    assert {r["kind"] for r in acc} == {"exact", "expected"}
    assert {r["kind"] for r in acc if r["policy"] == "greedy"} == {"exact"}
    assert {r["kind"] for r in acc if "(exact)" in r["proposer"]} == {"exact"}  # replayed like greedy


def _results(run) -> dict:
    return {json.loads(x)["config"]: json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()}


def test_greedy_replay_against_the_timed_acceptance(replay):
    """An n-gram lookup's proposals are a function of the text: where no timed greedy generation left plain
    decoding, its replayed acceptance is the timed one exactly. A draft model's are exact up to its own kernel
    near-ties (the loop builds its cache in blocks of 1 or 2 tokens, as acceptance falls): close, not equal."""
    run, md = replay
    diverged = {r["config"] for f in trace_files(run) if f.parent == run / "traces" for r in read_records(f)
                if r["type"] == "divergence"}
    results = _results(run)
    plan = json.loads((run / "plan.json").read_text())
    # one row per timed greedy configuration and category it was timed in
    timed = {(c, p.split("-")[0]) for c, ps in plan["timed"].items() if results[c]["policy"]["temperature"] == 0
             for p in ps}
    rows = [r for r in md_table(diagnostics_md(run), "## Replayed against timed") if r["policy"] == "greedy"]
    assert len(rows) == len(timed) >= 4
    by_key = {(r["draft"], r["gamma"]): c for c, r in results.items() if r["policy"]["temperature"] == 0}
    exact = close = 0
    for r in rows:
        if not r["(timed)"]:  # the lookup found nothing to propose: no acceptance either way
            assert not r["acceptance (replayed)"] and r["proposer"] == "ngram:2"
            continue
        replayed, timed_acc = int(r["acceptance (replayed)"].split("%")[0]), int(r["(timed)"].rstrip("%"))
        if r["proposer"] == "ngram:2" and by_key[(r["proposer"], int(r["gamma"]))] not in diverged:
            assert replayed == timed_acc
            exact += 1
        else:
            assert abs(replayed - timed_acc) <= 10
            close += 1
    assert exact >= 1 and close >= 1


def test_llamacpps_rule_replayed_against_the_timed_acceptance(replay):
    """Under sampling, llama.cpp's rule samples what the plain twin sampled, so its replay is exact as greedy's:
    the replayed acceptance is the timed one, up to the draft's own kernel near-ties."""
    run, md = replay
    rows = [r for r in md_table(diagnostics_md(run), "## Replayed against timed") if r["policy"] != "greedy"
            and "(exact)" in r["proposer"]]
    assert rows
    for r in rows:
        replayed, timed_acc = int(r["acceptance (replayed)"].split("%")[0]), int(r["(timed)"].rstrip("%"))
        assert abs(replayed - timed_acc) <= 10


def test_the_timing_floor_sets_plain_steps_beside_their_twins_from_the_raw_traces(replay):
    """Two timings of the same work: the n-gram rows' steps that found nothing to propose, against the plain twins'
    decodes of the same prompt, recomputed here from the trace files alone."""
    run, md = replay
    spec, twin = {}, {}
    for f in trace_files(run):
        for r in read_records(f):
            if r["type"] != "step":
                continue
            key = (r["config"], r["prompt_id"], r["repeat"])
            if f.parent == run / "traces" and r["mode"] == "speculative" and r["proposed"] == 0:
                spec.setdefault(key, []).append(r["verify_ms"])
            elif f.parent == run / "paired" / "traces":
                twin.setdefault(key, []).append(r["verify_ms"])
    ratios = [statistics.mean(twin[k]) / statistics.mean(v) for k, v in spec.items() if len(v) >= 4 and k in twin]
    assert ratios
    within = sum(abs(x - 1) <= 0.10 for x in ratios)
    sentence = f"ran within 10% of each other in {within} of {len(ratios)} generations"
    # under the cost model's agreement and under the replay's, in the diagnostics
    assert diagnostics_md(run).count(sentence) == 2 and sentence not in md


def test_a_run_without_replay_says_so_once(timed_run, replay):
    assert report_md(timed_run).count("This run has no replay") == 1
    assert "This run has no replay" not in replay[1]
    run, md = replay
    assert harness("report", str(run), "--check").returncode == 0


def test_the_timed_rows_priced_again_with_their_own_costs(replay):
    """Each timed configuration's worker measured its decode costs around its generations: the replay's steps
    priced with those instead of the replay's own, for every row the table holds."""
    import re
    run, md = replay
    md = diagnostics_md(run)
    n = len(md_table(md, "## Replayed against timed"))
    m = re.search(r"own decode costs \(measured in its worker [^)]*\): (\d+) of (\d+)\.", md)
    assert m and int(m.group(2)) == n and 0 <= int(m.group(1)) <= n


@pytest.mark.slow  # a replayed sweep of its own under both rules: half a minute on 2 cores
def test_the_replay_predicts_both_rules_and_times_what_it_chose(replay_run):
    run = replay_run
    recs = [r for f in trace_files(run / "replay") for r in read_records(f)]
    rep = [x for x in recs if x["type"] == "replay" and x["policy"] != "greedy" and x["proposer"] == D]
    assert rep and all(len(x["alpha_exact"]) == len(x["alpha"]) for x in rep)
    md = report_md(run)
    pred = {x["proposer"] for x in md_table(diagnostics_md(run), "## Predicted speedup")}
    assert {D, f"{D} (exact)", "ngram:2"} <= pred
    rules = md_table(md, "## Verification rules (replayed)")
    assert {(x["category"], x["draft"]) for x in rules} >= {("code", D), ("chat", D)}
    assert all(x["alpha leviathan"] and x["alpha exact"] for x in rules)
    timed = md_table(diagnostics_md(run), "## Replayed against timed")
    assert {D, f"{D} (exact)"} <= {x["proposer"] for x in timed}  # the subset timed both rules, like for like
    r = harness("report", str(run), "--check")
    assert r.returncode == 0, r.stdout + r.stderr


LLAMAS = ("ngram-simple:size-n=2:size-m=4", "ngram-mod:n-match=2:n-max=6:n-min=1")


@pytest.mark.slow  # a replayed run of its own: a minute on 2 cores
def test_llamas_ngram_types_are_replayed_from_the_plain_run(tmp_path, smol):
    """llama.cpp's n-gram types under --replay: no record per prompt (their steps come from the tokens), their
    costs measured up to their own longest draft, their predictions at their own gamma under both policies."""
    run = _bench(tmp_path, "--target", T, "--draft", ",".join(LLAMAS), *PROMPTS, "--replay", "--timed-subset", "1",
                 "--threads", "2", "--allow-busy")
    recs = [r for f in trace_files(run / "replay") for r in read_records(f)]
    assert not [r for r in recs if r["type"] == "replay"]
    assert {(r["proposer"], r["policy"]) for r in recs if r["type"] == "costs"} == \
        {(x, p) for x in LLAMAS for p in ("greedy", "T=0.8 top_p=0.9")}
    assert all(r["k"] >= 7 for r in recs if r["type"] == "costs")
    pred = md_table(diagnostics_md(run), "## Predicted speedup")
    assert {x["proposer"] for x in pred} == set(LLAMAS)
    r = harness("report", str(run), "--check")
    assert r.returncode == 0, r.stdout + r.stderr


# -- each baseline replayed through its own sweep's drafts (a profile's further sweeps)
PROFILE = {"target": ["t-q4"], "draft": ["d1", "ngram:3"], "gamma": [1, 4], "temp": [0.0, 0.7], "top_p": [0.9],
           "also": [{"target": ["t-f16"], "draft": ["d1"], "temp": [0.0]}]}


def test_each_baseline_is_replayed_through_its_own_sweeps_drafts_only():
    from harness.bench.replay import proposers
    p = make_params(PROFILE, {})
    inst = expand(p)
    by_target = {b.target: [str(d) for d in proposers(inst, p, b)] for b in inst if b.baseline}
    assert by_target == {"t-q4": ["d1", "ngram:3"], "t-f16": ["d1"]}
