"""How drafts are made and checked, end to end on SmolLM2: llama.cpp's verification rule beside Leviathan's,
p-min and n-min, in the sweep, the replay and the report; and their bad inputs."""
import json

import pytest

from harness.rundir import trace_files
from harness.trace import read_records
from harness.plan import Instance, Params, expand
from harness.sampling import Policy
from harness.specs import DraftModel
from harness.drafting import Drafting
from tests.conftest import PROMPT_FILE
from tests.helpers import ROOT, diagnostics_md, harness, md_table, one_line_error, report_md

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"
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


@pytest.fixture(scope="module")
def rules_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("rules")
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "3", "--temp", "0.8", "--top-p", "0.9",
                "--verify", "leviathan,exact", "--draft-p-min", "0,0.6", "--draft-n-min", "0,2",
                "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "2", "--max-tokens", "16",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    return run, (out / f"{run.name}.md").read_text()


@pytest.mark.slow  # a sweep of both rules and both draft knobs: 30 s
def test_exact_rule_and_p_min_in_the_sweep_and_report(rules_run):
    run, md = rules_run
    res = {json.loads(x)["config"]: json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()}
    assert all(r["status"] == "ok" for r in res.values())
    plan = json.loads((run / "plan.json").read_text())
    insts = [Instance.from_dict(d) for d in plan["instances"] if d["draft"] != "none"]
    assert len(insts) == 8
    steps = {}
    for i in insts:
        recs = [json.loads(x) for x in (run / "traces" / f"{i.id}.jsonl").read_text().splitlines()]
        steps[(i.verify, i.p_min, i.n_min)] = [r for r in recs if r.get("type") == "step"]
    exact = [s for s in steps[("exact", 0.0, 0)] if s["proposed"]]
    # a probability at every drafted position (that it is p(the draft's token) is tested on a scripted engine)
    assert exact and all(0 <= a <= 1 for s in exact for a in s["alpha"])
    full = [s["proposed"] for s in steps[("leviathan", 0.0, 0)]]
    pmin = [s["proposed"] for s in steps[("leviathan", 0.6, 0)]]
    assert sum(pmin) < sum(full)  # drafting stopped early at low confidence
    assert all(n == 0 or n >= 2 for s in (steps[("leviathan", 0.6, 2)],) for n in (x["proposed"] for x in s))
    acc = md_table(diagnostics_md(run), "### code")  # every timed row, in the diagnostics
    labels = {r["draft"] for r in acc}
    assert {D, f"{D} (exact)", f"{D} (p-min 0.6)", f"{D} (exact, p-min 0.6, n-min 2)"} <= labels
    assert all(r["drafted/step"] for r in acc)
    r = harness("report", str(run), "--check")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("args, words", [
    (["--verify", "medusa"], ["verification rule", "medusa", "leviathan"]),
    (["--draft-p-min", "1.5"], ["--draft-p-min", "[0, 1]"]),
    (["--draft-n-min", "-1"], ["--draft-n-min", ">= 0"]),
    (["--replay", "--timed-subset", "1", "--draft-p-min", "0.5"], ["--draft-p-min", "--timed-subset"]),
])
def test_bad_drafting_options_are_one_line(tmp_path, args, words):
    one_line_error(harness("bench", "--target", T, "--draft", D, "--temp", "0.8", *args, "--out",
                           str(tmp_path / "r")), *words)


@pytest.mark.slow  # a replayed sweep of its own under both rules: half a minute on 2 cores
def test_the_replay_predicts_both_rules_and_times_what_it_chose(replay_run):
    run = replay_run
    recs = [r for f in trace_files(run / "replay") for r in read_records(f)]
    rep = [x for x in recs if x["type"] == "replay" and x["policy"] != "greedy" and x["proposer"] == D]
    assert rep and all(len(x["alpha_exact"]) == len(x["alpha"]) for x in rep)
    md = report_md(run)
    pred = {x["proposer"] for x in md_table(md, "## Predicted speedup")}
    assert {D, f"{D} (exact)", "ngram:2"} <= pred
    rules = md_table(md, "## Verification rules (replayed)")
    assert {(x["category"], x["draft"]) for x in rules} >= {("code", D), ("chat", D)}
    assert all(x["alpha leviathan"] and x["alpha exact"] for x in rules)
    timed = md_table(diagnostics_md(run), "## Replayed against timed")
    assert {D, f"{D} (exact)"} <= {x["proposer"] for x in timed}  # the subset timed both rules, like for like
    r = harness("report", str(run), "--check")
    assert r.returncode == 0, r.stdout + r.stderr
