"""How drafts are made and checked, end to end on SmolLM2: llama.cpp's verification rule beside Leviathan's,
p-min and n-min, in the sweep, the replay and the report; and their bad inputs."""
import json

import pytest

from harness.instance import Instance
from tests.conftest import PROMPT_FILE
from tests.helpers import diagnostics_md, harness, md_table, one_line_error

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"


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
