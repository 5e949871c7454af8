"""bench.partial: a unit interrupted midway keeps the prompts it finished, and --resume runs only the others
(a real Ctrl-C in a sweep; a kill in the replay and in the timed subset)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from harness.rundir import finished
from harness.trace import read_records
from tests.conftest import PROMPT_FILE, T
from tests.helpers import HARNESS, ROOT, diagnostics_md, harness, md_table, only_run, report_md


@pytest.mark.slow  # 18-32 s; the fast tier interrupts mid-unit below (in the replay and the timed subset)
def test_ctrl_c_mid_unit_keeps_the_prompts_it_finished_and_resume_runs_the_rest(tmp_path, smol):
    """A real Ctrl-C while a paired unit is past its first prompt: the prompts finished in both of its traces are
    kept (said as it stops), --resume runs the others, and each prompt's records are in the traces once."""
    out = tmp_path / "runs"
    args = ["bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--prompts", str(PROMPT_FILE),
            "--categories", "code", "--per-category", "3", "--max-tokens", "24", "--paired", "--out", str(out),
            "--allow-busy"]
    p = subprocess.Popen([*HARNESS, *args], cwd=ROOT, env=os.environ | {"CI": "true"}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, twin = time.time() + 120, None
    while time.time() < deadline and not (twin and b'"type": "generation"' in twin.read_bytes()):
        twin = next(out.glob("runs/*/paired/traces/g2-*.jsonl"), None)  # its first prompt: speculative, then twin
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err, err
    run = only_run(out)
    spec = run / "traces" / twin.name
    if twin.stem in finished(run):
        pytest.skip("the unit finished before the signal reached it")
    n = int(re.search(r"gamma=2 .*: stopped after (\d) of 3 prompts", err).group(1))
    assert n >= 1 and "the prompts the stopped one finished" in err, err
    before = {f: read_records(f) for f in (spec, twin)}  # a line cut short at the end is not read
    kept = {r["prompt_id"] for r in before[twin] if r["type"] == "generation"} & {
        r["prompt_id"] for r in before[spec] if r["type"] == "generation"}
    assert len(kept) == n
    r = harness("bench", "--resume", run, "--allow-busy")
    assert r.returncode == 0, r.stderr
    assert harness("report", run, "--check").returncode == 0
    for f, recs in before.items():
        after = read_records(f)
        assert [x["prompt_id"] for x in after if x["type"] == "generation"] == ["code-1", "code-2", "code-3"]
        mine = [x for x in recs if x.get("prompt_id") is None or x["prompt_id"] in kept]  # with the unit's costs
        assert after[:len(mine)] == mine  # kept as they were: not run again


# -- a kill in the replay and in the timed subset of the shared replay run
@pytest.fixture(scope="module")
def replay(replay_run):
    return replay_run, report_md(replay_run)


def _cut_after_first_prompt(f) -> str:
    """A trace as a kill mid-unit leaves it: the records of its first prompt (and of the unit itself, before it),
    then half a line of the next prompt's. The whole records are marked ("kept"), as a rerun would not write them.
    Returns them."""
    recs = [json.loads(x) for x in f.read_text().splitlines()]
    first = next(r["prompt_id"] for r in recs if r.get("prompt_id"))
    k = next(k for k, r in enumerate(recs) if r.get("prompt_id") not in (None, first))
    kept = "".join(json.dumps(r | {"kept": True}, ensure_ascii=False) + "\n" for r in recs[:k])
    f.write_text(kept + json.dumps(recs[k])[:40])
    return kept


def _per_prompt(f, kind: str) -> list[str]:
    return [r["prompt_id"] for r in read_records(f) if r.get("type") == kind]


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_a_resume_after_a_kill_in_the_replay_and_in_the_timed_subset(replay, tmp_path):
    """The replay of one baseline and one timed configuration killed midway (no result line, a trace cut after
    its first prompt, half a line of the next): --resume keeps that prompt, runs the others, and the report's
    acceptance and token counts come out as in the uninterrupted run."""
    from harness.rundir import trace_file
    from tests.helpers import copy_run
    original, md = replay
    run = copy_run(original, tmp_path)
    cut = {}
    for side, pick, kind in (("replay", lambda r: r["draft"] == "none", "replay_prompt"),
                             ("", lambda r: r["draft"] != "none", "generation")):
        d = run / side if side else run
        lines = (d / "results.jsonl").read_text().splitlines()
        k = next(i for i, x in enumerate(lines) if pick(json.loads(x)))
        f = trace_file(d, json.loads(lines[k])["unit"])
        cut[f] = (_per_prompt(f, kind), kind, _cut_after_first_prompt(f))
        (d / "results.jsonl").write_text("".join(x + "\n" for i, x in enumerate(lines) if i != k))
    r = harness("bench", "--resume", str(run))
    assert r.returncode == 0, r.stderr
    assert "1 unit(s) to run" in r.stderr and "[replay 1/1]" in r.stderr
    assert harness("report", str(run), "--check").returncode == 0
    for f, (prompts, kind, kept) in cut.items():
        assert f.read_text().startswith(kept), f  # the first prompt kept, not run again
        assert _per_prompt(f, kind) == prompts, f  # every prompt's records once
        assert [r for r in read_records(f) if r.get("kept")] == [json.loads(x) for x in kept.splitlines()]
    twin = run / "paired" / "traces" / f.name
    assert _per_prompt(twin, "generation") == prompts
    acceptance = "## Acceptance (models, prompts and policy only)"
    assert md_table(diagnostics_md(run), acceptance) == md_table(diagnostics_md(original), acceptance)
    for cat in ("code", "chat"):  # proposed, accepted, acceptance, alpha, tokens per call: no time in them
        per = [m.split("## Per category", 1)[1] for m in (diagnostics_md(original), diagnostics_md(run))]
        assert md_table(per[1], f"### {cat}") == md_table(per[0], f"### {cat}"), cat
