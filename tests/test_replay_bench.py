"""The replay end to end on SmolLM2: the baselines' outputs teacher-forced through the drafts, predictions for
every gamma with intervals, and the timed rows of the same configurations beside them."""
import json

import pytest

from tests.test_bench import harness, md_table

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("replay")
    r = harness("bench", "--target", T, "--draft", f"{D},ngram:2", "--gamma", "1,3", "--temp", "0,0.8",
                "--top-p", "0.9", "--categories", "code,grounded", "--per-category", "2", "--max-tokens", "16",
                "--replay", "--replay-gamma", "4", "--paired", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    return run, (out / f"{run.name}.md").read_text()


def test_replay_records_and_report_sections(replay_run):
    run, md = replay_run
    recs = [json.loads(x) for f in (run / "replay" / "traces").glob("*.jsonl") for x in f.read_text().splitlines()]
    kinds = {r["type"] for r in recs}
    assert kinds == {"replay_prompt", "replay", "costs"}
    greedy = [r for r in recs if r["type"] == "replay" and r["policy"] == "greedy"]
    assert greedy and all(set(r["match"]) <= {0, 1} for r in greedy)  # n-gram greedy is recomputed, no record
    sampled = [r for r in recs if r["type"] == "replay" and r["policy"] != "greedy"]
    assert {r["proposer"] for r in sampled} == {D, "ngram:2"}
    assert all(0 <= a <= 1 for r in sampled for a in r.get("alpha", []) + sum(r.get("alpha_blocks", []), []))
    for heading in ("## Predicted from every prompt (replay)", "### Acceptance (models, prompts and policy only)",
                    "### Cost (this machine only)", "### Predicted speedup", "### Replayed against timed"):
        assert heading in md
    acc = md_table(md, "### Acceptance (models, prompts and policy only)")
    assert {r["kind"] for r in acc} == {"exact", "expected"}
    assert {r["kind"] for r in acc if r["policy"] == "greedy"} == {"exact"}


def test_greedy_replay_against_the_timed_acceptance(replay_run):
    """An n-gram lookup's proposals are a function of the text: where no timed greedy generation left plain
    decoding, its replayed acceptance is the timed one exactly. A draft model's are exact up to its own kernel
    near-ties (the loop builds its cache in blocks of 1 or 2 tokens, as acceptance falls): close, not equal."""
    run, md = replay_run
    diverged = {json.loads(x)["config"] for f in (run / "traces").glob("g*.jsonl")
                for x in f.read_text().splitlines() if json.loads(x)["type"] == "divergence"}
    rows = [r for r in md_table(md, "### Replayed against timed") if r["policy"] == "greedy"]
    assert len(rows) == 8
    results = {json.loads(x)["config"]: json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()}
    by_key = {(r["draft"], r["gamma"]): c for c, r in results.items() if r["policy"]["temperature"] == 0}
    exact = 0
    for r in rows:
        replayed, timed = int(r["acceptance (replayed)"].split("%")[0]), int(r["(timed)"].rstrip("%"))
        if r["proposer"] == "ngram:2" and by_key[(r["proposer"], int(r["gamma"]))] not in diverged:
            assert replayed == timed
            exact += 1
        else:
            assert abs(replayed - timed) <= 10
    assert exact >= 2


def test_a_run_without_replay_says_so_once(replay_run):
    from pathlib import Path
    old = Path(__file__).resolve().parent.parent / "reports" / "20261201-132149-vm.md"
    assert old.read_text().count("This run has no replay") == 1
    run, md = replay_run
    assert harness("report", str(run), "--check").returncode == 0


def test_timed_subset_times_what_the_replay_chose(tmp_path, smol, smol_q2k):
    """Only baselines on every prompt, then, per category and policy, each proposer's predicted best gamma and
    gamma 1, on the category's first prompt."""
    out = tmp_path / "r"
    r = harness("bench", "--target", T, "--draft", f"{D},ngram:2", "--gamma", "1,2,3", "--temp", "0",
                "--categories", "code,grounded", "--per-category", "2", "--max-tokens", "12", "--replay",
                "--replay-gamma", "3", "--timed-subset", "1", "--paired", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    plan = json.loads((run / "plan.json").read_text())
    results = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    timed = {x["config"] for x in results if x["draft"] != "none"}
    assert timed == set(plan["timed"]) and all(x["status"] == "ok" for x in results)
    assert set(sum(plan["timed"].values(), [])) <= {"code-01", "grounded-01"}
    by_id = {i_id: i for i_id, i in ((x["config"], x) for x in results)}
    chosen = {(by_id[c]["draft"], by_id[c]["gamma"]) for c in timed}
    assert {(D, 1), ("ngram:2", 1)} <= chosen  # gamma 1 always, beside each proposer's predicted best
    md = (out / f"{run.name}.md").read_text()
    assert md.index("## Predicted from every prompt (replay)") < md.index("## Verdict per category")
    assert "## Drift" not in md  # the timed subset is paired; the baselines ran on every prompt once


@pytest.mark.parametrize("args, words", [
    (["--timed-subset", "1"], ["--timed-subset", "--replay"]),
    (["--replay", "--replay-gamma", "0"], ["--replay-gamma", ">= 1"]),
    (["--replay", "--timed-subset", "1", "--until-confident"], ["--until-confident", "--timed-subset"]),
])
def test_bad_replay_options_are_one_line(tmp_path, args, words):
    from tests.test_bench import one_line_error
    one_line_error(harness("bench", "--target", T, *args, "--out", str(tmp_path / "r")), *words)
