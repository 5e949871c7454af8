"""The timed subset's choice (bench.subset.choose) on synthetic replay records: each proposer's gamma is chosen on
the category's prompts that are not then timed, and a category without such prompts is recorded as chosen in
sample, with the number of configurations the choice was among; and the shared replay run's timed subset."""
import json
from types import SimpleNamespace

import polars as pl
import pytest

from harness.bench.subset import answered, choose, held_out_predictions
from harness.instance import Instance
from harness.sampling import Policy
from harness.specs import DraftModel, parse_draft
from harness.rundir import REPLAY_DIR, TRACES_DIR
from tests.conftest import D
from tests.helpers import diagnostics_md, report_md

GREEDY = Policy()
INSTANCES = [Instance("t", DraftModel("d"), g, GREEDY, 0, 0, 1) for g in range(1, 9)]
BASE = INSTANCES[0].plain().id
N = 30
# the draft's match at each position: the timed prompt's every token (gamma 8 wins there); the other's two in
# three, which a block of two, all accepted, catches best
MATCH = {"lucky": [1] * 4 * N, "lucky2": [1] * 4 * N, "held": [1, 1, 0] * (N // 3)}
# a verification block costs the same at any size; the draft 2 ms a token, its catch-up after all were accepted 0.2
COSTS = {"type": "costs", "proposer": "d", "contexts": [128], "target_ms_by_context": [[10.0] * 9],
         "draft_ms_by_context": [[2.0 + 0.2 * k for k in range(9)]], "overhead_ms": 0.0}


def run_dir(tmp_path, prompts: dict[str, str], llama: tuple[str, ...] = ()):
    """A run whose replay of BASE holds the prompts {id: category}, and whose plain baseline ran them at 10 ms a
    token; llama: llama.cpp's n-gram types it replayed too (from the tokens alone)."""
    common = {"config": BASE, "policy": "greedy"}
    replay = [COSTS | common] + [COSTS | common | {"proposer": x} for x in llama]
    plain = []
    for pid, cat in prompts.items():
        n = len(MATCH[pid])
        at = {"category": cat, "prompt_id": pid, "repeat": 0}
        replay += [common | at | {"type": "replay_prompt", "prompt_tokens": [1, 2, 3],
                                  "tokens": [4 + i % 5 for i in range(n)], "stop_token": None, "max_tokens": n},
                   common | at | {"type": "replay", "proposer": "d", "match": MATCH[pid]}]
        plain.append({"config": BASE, **at, "type": "generation", "prompt_tokens": 3, "n_tokens": n, "steps": n,
                      "gen_ms": 10.0 * n, "latency_ms": 10.0 * n, "prompt_eval_ms": 1.0})
    for d, recs in ((tmp_path / REPLAY_DIR, replay), (tmp_path, plain)):
        (d / TRACES_DIR).mkdir(parents=True)
        (d / TRACES_DIR / f"{BASE}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "results.jsonl").write_text(json.dumps({"config": BASE, "unit": BASE, "status": "ok"}) + "\n")
    (tmp_path / "plan.json").write_text(json.dumps({"params": {"replay_gamma": 8}, "instances": [],
                                                    "prompt_ids": list(prompts), "categories": []}))
    return tmp_path, [SimpleNamespace(id=p, category=c) for p, c in prompts.items()]


def timed_gammas(chosen: dict[str, list[str]]) -> set[int]:
    return {i.gamma for i in INSTANCES if i.id in chosen}


def test_the_gamma_is_chosen_on_the_prompts_not_timed(tmp_path):
    run, prompts = run_dir(tmp_path, {"lucky": "code", "held": "code"})
    best = {}
    for name, left_out in (("lucky", {"code": ["held"]}), ("both", {"code": []})):
        pred, _ = held_out_predictions(run, left_out)
        best[name] = pred.filter(~pred["adaptive"]).sort("speedup")["gamma"][-1]
    assert best["lucky"] == 8 and best["both"] > 2  # on every prompt, the timed one's luck carries the choice
    chosen, in_sample = choose(run, INSTANCES, prompts, 1)
    assert timed_gammas(chosen) == {1, 2} and in_sample == {}
    assert all(ids == ["lucky"] for ids in chosen.values())  # timed on the category's first prompt


def test_a_category_without_other_prompts_is_chosen_in_sample(tmp_path):
    run, prompts = run_dir(tmp_path, {"lucky": "code", "held": "chat"})
    chosen, in_sample = choose(run, INSTANCES, prompts, 1)
    assert in_sample == {"code": 8, "chat": 8}  # one proposer, gammas 1-8
    for pid, gammas in (("lucky", {1, 8}), ("held", {1, 2})):  # each chosen on its one prompt
        assert timed_gammas({c: ids for c, ids in chosen.items() if pid in ids}) == gammas


def test_the_configuration_a_predicted_speculate_names_is_timed_too(tmp_path):
    """Over all three prompts the replay says speculate at gamma 3; chosen on the two it does not time, gamma 8:
    gamma 3 is timed as well, so that the answer's own configuration has its timed check."""
    run, prompts = run_dir(tmp_path, {"held": "code", "lucky": "code", "lucky2": "code"})
    assert answered(run) == [(BASE, "greedy", "code", "d", 3)]
    chosen, _ = choose(run, INSTANCES, prompts, 1)
    assert timed_gammas(chosen) == {1, 3, 8} and all(ids == ["held"] for ids in chosen.values())


def test_with_scope_answers_the_answers_configuration_alone_is_timed(tmp_path):
    """--timed-scope answers (the budget narrows to it first): of the draft model's gammas only the one the
    answer names (gamma 3 over all prompts), neither gamma 1 nor the held-out best; on 3 prompts where asked, and
    the answer of a group that does not say speculate as well."""
    run, prompts = run_dir(tmp_path, {"held": "code", "lucky": "code", "lucky2": "code"})
    chosen, _ = choose(run, INSTANCES, prompts, 1, "answers")
    assert timed_gammas(chosen) == {3} and all(ids == ["held"] for ids in chosen.values())
    chosen, _ = choose(run, INSTANCES, prompts, 3, "answers")
    assert timed_gammas(chosen) == {3} and list(chosen.values()) == [["held", "lucky", "lucky2"]]
    slow = tmp_path / "slow"
    slow.mkdir()
    run, prompts = run_dir(slow, {"held": "code"})
    assert answered(run) == [] and answered(run, every=True)  # no gain from one prompt of two in three
    assert timed_gammas(choose(run, INSTANCES, prompts, 1, "answers")[0]) == {answered(run, every=True)[0][-1]}


def test_of_llamas_ngram_types_the_groups_best_alone_is_timed(tmp_path):
    """Sizes of llama.cpp's n-gram types, each at its own gamma: one of them timed per group, the best predicted,
    beside the draft model's gamma 1 and best; its instance is the prediction's (label and gamma)."""
    names = ("ngram-simple:size-n=2:size-m=2", "ngram-simple:size-n=2:size-m=8", "ngram-mod:n-match=2:n-max=4:n-min=1")
    run, prompts = run_dir(tmp_path, {"lucky": "code", "held": "code"}, names)
    llamas = [Instance("t", d, d.own_gamma, GREEDY, 0, 0, 1) for d in map(parse_draft, names)]
    pred, _ = held_out_predictions(run, {"code": ["lucky"]})
    rows = pred.filter(pl.col("draft").is_in(names))
    assert sorted(rows.select("proposer", "gamma").rows()) == sorted((i.draft_label, i.gamma) for i in llamas)
    best = rows.sort("speedup")["proposer"][-1]
    chosen, _ = choose(run, INSTANCES + llamas, prompts, 1)
    assert [i.draft_label for i in llamas if i.id in chosen] == [best] == ["ngram-simple:size-n=2:size-m=8"]
    assert timed_gammas(chosen) == {1, 2}


# -- end to end: the shared replay run's timed subset
@pytest.fixture(scope="module")
def replay(replay_run):
    return replay_run, report_md(replay_run)


def _results(run) -> dict:
    return {json.loads(x)["config"]: json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()}


def test_timed_subset_times_what_the_replay_chose(replay):
    """Only baselines on every prompt, then, per category and policy, each proposer's predicted best gamma (on the
    category's other prompts) and gamma 1, on the category's first prompt."""
    run, md = replay
    plan = json.loads((run / "plan.json").read_text())
    results = _results(run)
    timed = {c for c, x in results.items() if x["draft"] != "none"}
    assert timed == set(plan["timed"]) and all(x["status"] == "ok" for x in results.values())
    assert set(sum(plan["timed"].values(), [])) <= {"code-1", "chat-1"}  # each category's first prompt
    assert plan["timed_in_sample"] == {}  # each category's second prompt chose what its first was timed on
    chosen = {(results[c]["draft"], results[c]["gamma"], results[c]["policy"]["temperature"]) for c in timed}
    for temp in (0.0, 0.8):  # gamma 1 always, beside each proposer's predicted best
        assert {(D, 1, temp), ("ngram:2", 1, temp)} <= chosen
    # the predicted verdicts answer, the bottom line first; the timed ones check them, in the diagnostics
    assert "## The bottom line" in md.split("## Contents")[0] and "## Predicted from every prompt (replay)" in md
    assert "## Verdict per category" in diagnostics_md(run) and "## Verdict per category" not in md
    assert "## Drift" not in md + diagnostics_md(run)  # the timed subset is paired; the baselines ran once
