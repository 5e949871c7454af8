"""`harness bench` end to end (bench.run): on the session's shared timed run (tests/conftest.py), the report's
structure and figures against the raw traces, drift, pairing, resume; on sweeps of its own, Ctrl-C and signals, a
run whose every unit failed, --until-confident's rounds, the knobs' and several targets' sweeps, --repeat, --seed,
--skip-unsupported and --cache-type-v, --dry-run; the real smoke profile in the slow tier."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.engine import cache_bytes
from harness.rundir import trace_files
from harness.trace import read_records
from tests.conftest import CATEGORIES, D, POLICIES, PROMPT_FILE, T, gpu_build
from tests.helpers import (HARNESS, ROOT, copy_run, diagnostics_md, harness, md_table, one_line_error, only_run,
                           report_md, result_rows)

def raw(run_dir: Path) -> list[dict]:
    """The records of a run's own traces (not its side runs'), plain or gzipped."""
    return [r for f in trace_files(run_dir) if f.parent == run_dir / "traces" for r in read_records(f)]


def results(run: Path) -> list[dict]:
    """Each unit's result row as bench reads it: the last (a unit that ran busy is measured again)."""
    from harness.rundir import finished
    return list(finished(run).values())


def check_structure(run: Path, categories) -> None:
    md, diagnostics = report_md(run), diagnostics_md(run)
    assert (run.parent.parent / "latest.md").read_text() == md
    for heading in ("### Models", "## Verdict per category", "## Memory", "## How to read this"):
        assert heading in md
    for heading in ("## Machine noise", "## Per category", *(f"### {c}" for c in categories), "## Quantization",
                    "## Output equivalence (greedy)"):  # the harness's checks of itself, and every timed row
        assert heading in diagnostics and heading not in md
    first_screen = md.split("## Contents")[0]
    # the answer comes first: the bottom line with its plot; the answer per category and its table after
    assert "## The bottom line" in first_screen and "verdicts.png" in first_screen
    assert "## Verdict per category" not in first_screen and "## The answer per category" in md
    assert ("GPU offload available" if gpu_build() else "CPU only") in md
    assert "requantized from smollm2-135m-instruct-q4_1" in md
    assert "| greedy" in md and "T=0.8 top_p=0.9" in md  # every table states the policy
    assert f"`runs/{run.name}/traces`" in md  # relative to the report: the same however the path was typed
    plan = json.loads((run / "plan.json").read_text())
    res = results(run)
    assert len(res) == len(plan["instances"]) and all(r["status"] == "ok" for r in res)
    assert all(r["peak_rss_bytes"] > 50 * 2**20 for r in res)


def test_report_structure(timed_run):
    check_structure(timed_run, CATEGORIES)


@pytest.mark.slow
def test_the_smoke_profile_end_to_end(tmp_path, smol, smol_q2k):
    """What a new user runs first, with the long-prompt categories added: all six, long_context's 1000 tokens
    included."""
    out = tmp_path / "reports"
    every = ("code", "creative", "domain", "grounded", "long_context", "multilingual")
    r = harness("bench", "--profile", "smoke", "--categories", ",".join(every), "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = only_run(out)
    check_structure(run, every)
    assert harness("report", str(run), "--check").returncode == 0


@pytest.mark.slow
def test_prompts_cut_to_the_characters_given_run_shortened_and_resume_alike(tmp_path, smol):
    """--prompt-chars (the budget's prompt-length cut): long_context's 6,000 characters reach the model as 2,048,
    the report's evidence line says so, and a resume reads the same shortened prompts."""
    out = tmp_path / "reports"
    r = harness("bench", "--target", T, "--categories", "long_context", "--per-category", "1", "--max-tokens", "4",
                "--draft", "ngram:2", "--gamma", "2", "--prompt-chars", "2048", "--allow-busy", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = only_run(out)
    gens = [x for x in raw(run) if x.get("type") == "generation"]
    assert gens and all(g["prompt_tokens"] < 700 for g in gens)  # whole, about 1,300
    assert "prompts cut in the middle to 2048 characters;" in report_md(run)
    again = harness("bench", "--resume", str(run), "--allow-busy", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert harness("report", str(run), "--check").returncode == 0


def test_reports_land_inside_the_out_directory(timed_run):
    out = timed_run.parent.parent  # the fixture's --out: results/runA
    assert (out / f"{timed_run.name}.md").exists() and (out / "latest.md").exists()
    assert not list(out.parent.glob("*.md"))


def test_plain_baselines_run_again_at_the_end_to_measure_drift(timed_run):
    again = results(timed_run / "drift")
    assert sorted(r["config"] for r in again) == sorted(r["config"] for r in results(timed_run)
                                                        if r["draft"] == "none")
    rows = [r for r in json.loads((timed_run / "metrics.json").read_text()) if r["draft"] == "none"]
    assert len(rows) == len(POLICIES) * len(CATEGORIES)
    recs = raw(timed_run / "drift")
    for r in rows:
        key = (r["config"], r["category"])
        gens = [g for g in recs if g["type"] == "generation" and (g["config"], g["category"]) == key]
        end = sum(g["n_tokens"] for g in gens) / sum(g["gen_ms"] for g in gens) * 1000
        assert r["base_end_tokens_per_s"] == pytest.approx(end)
        assert r["drift"] == pytest.approx(end / r["base_tokens_per_s"])
    md = diagnostics_md(timed_run)
    assert "## Drift" in md and "end / start" in md


def test_paired_plain_runs_are_the_reference_of_every_speculative_row(timed_run):
    spec = {r["config"] for r in results(timed_run) if r["draft"] != "none"}
    assert {f.name.split(".")[0] for f in trace_files(timed_run / "paired")} == spec
    paired = raw(timed_run / "paired")
    assert {r["mode"] for r in paired} == {"baseline"} and not any(r.get("proposed") for r in paired)
    main = raw(timed_run)
    base_out = {(g["prompt_id"], json.dumps(g["tokens"])) for g in main
                if g["type"] == "generation" and g["mode"] == "baseline" and g["config"].startswith("base")}
    rows = [r for r in json.loads((timed_run / "metrics.json").read_text()) if r["draft"] != "none"]
    assert len(rows) == len(spec) * len(CATEGORIES)
    for r in rows:
        key = (r["config"], r["category"])
        pg = [g for g in paired if g["type"] == "generation" and (g["config"], g["category"]) == key]
        sg = [g for g in main if g["type"] == "generation" and (g["config"], g["category"]) == key]
        assert [g["prompt_id"] for g in pg] == [g["prompt_id"] for g in sg]  # one plain run per speculative one
        ref = sum(g["n_tokens"] for g in pg) / sum(g["gen_ms"] for g in pg)
        assert r["paired_tokens_per_ms"] == pytest.approx(ref)
        assert r["speedup"] == pytest.approx(r["tokens_per_ms"] / ref)
        assert r["speedup_vs_baseline"] == pytest.approx(r["tokens_per_ms"] / r["base_tokens_per_ms"])
        if r["policy"] == "greedy":  # plain greedy decoding in another worker gives the baseline's tokens
            assert all((g["prompt_id"], json.dumps(g["tokens"])) in base_out for g in pg)
    assert "paired plain tok/s (range)" in diagnostics_md(timed_run)


def test_report_figures_equal_those_recomputed_from_traces(timed_run):
    metrics = json.loads((timed_run / "metrics.json").read_text())
    recs = raw(timed_run)
    checked = 0
    for row in metrics:
        steps = [r for r in recs if r["type"] == "step" and r["config"] == row["config"]
                 and r["category"] == row["category"]]
        gens = [r for r in recs if r["type"] == "generation" and r["config"] == row["config"]
                and r["category"] == row["category"]]
        proposed = sum(s["proposed"] for s in steps)
        accepted = sum(s["accepted"] for s in steps)
        assert row["proposed"] == proposed and row["accepted"] == accepted
        tokens, ms = sum(g["n_tokens"] for g in gens), sum(g["gen_ms"] for g in gens)
        assert row["tokens_per_s"] == pytest.approx(tokens / ms * 1000)
        if proposed:
            assert row["acceptance_rate"] == pytest.approx(accepted / proposed)
            # the positions reached: accepted drafts and the rejected one
            alphas = [a for s in steps for a in s["alpha"][:s["accepted"] + (s["rejected_at"] is not None)]]
            assert row["alpha"] == pytest.approx(sum(alphas) / len(alphas))
            vsteps = sum(1 for s in steps if s["proposed"] > 0)
            assert row["mean_accepted_len"] == pytest.approx(accepted / vsteps)
            checked += 1
    assert checked >= 2 * len(CATEGORIES)
    r = harness("report", str(timed_run), "--check")
    assert r.returncode == 0 and "matches" in r.stdout


def test_equivalence_table_counts_every_greedy_generation(timed_run):
    table = md_table(diagnostics_md(timed_run), "## Output equivalence (greedy)")
    recs = raw(timed_run)
    gens = [r for r in recs if r["type"] == "generation"]
    res = {r["config"]: r for r in results(timed_run)}
    greedy = [g for g in gens if res[g["config"]]["policy"]["temperature"] == 0]
    base = {g["prompt_id"]: g["tokens"] for g in greedy if res[g["config"]]["draft"] == "none"}
    spec = [g for g in greedy if res[g["config"]]["draft"] != "none"]
    assert len(table) == len({(g["config"], g["category"]) for g in spec}) > 0
    assert sum(int(r["generations"]) for r in table) == len(spec)
    differ = sum(g["tokens"] != base[g["prompt_id"]] for g in spec)
    checked = [r for r in recs if r["type"] == "divergence"]
    assert len(checked) == differ  # paired: every divergence was re-evaluated in its worker
    assert sum(int(r["kernel near-ties"]) + int(r["mismatches"]) + int(r["unchecked"]) for r in table) == differ
    assert all(r["mismatches"] == "0" and r["unchecked"] == "0" for r in table)
    exact = sum(float(r["exact match"].rstrip("%")) / 100 * int(r["generations"]) for r in table)
    assert exact == pytest.approx(len(spec) - differ)


def test_resume_runs_only_what_is_missing(timed_run, tmp_path):
    """The last result line half-written, as a kill in the middle of the write leaves it: that configuration
    runs again and its new line is kept whole."""
    run = copy_run(timed_run, tmp_path)
    res = run / "results.jsonl"
    lines = res.read_text().splitlines()
    res.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:len(lines[-1]) // 2])
    r = harness("bench", "--resume", str(run))
    assert r.returncode == 0, r.stderr
    assert "1 unit(s) to run" in r.stderr
    again = [json.loads(x) for x in res.read_text().splitlines()]
    assert len(again) == len(lines) and all(x["status"] == "ok" for x in again)


def test_ctrl_c_keeps_what_finished(tmp_path, smol):
    """The process itself is under test: a real console process and a real SIGINT."""
    out = tmp_path / "runs"
    args = ["bench", "--target", T, "--draft", "ngram:2", "--gamma", "1,2,3", "--prompts", str(PROMPT_FILE),
            "--categories", "code", "--per-category", "1", "--max-tokens", "8", "--out", str(out)]
    p = subprocess.Popen([*HARNESS, *args], cwd=ROOT, env=os.environ | {"CI": "true"}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(out.glob("runs/*/results.jsonl")):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    run = only_run(out)
    done = (run / "results.jsonl").read_text().splitlines()
    assert 1 <= len(done) < 4
    assert (out / f"{run.name}.md").exists()


# -- a run whose every unit failed, and a signal to bench (a small run of their own)


def test_a_run_whose_every_configuration_failed_reports_each_error_and_exits_non_zero(small_run, tmp_path):
    """A prompt beyond the context is refused up front now (test_prepare): here a directory stands where each unit
    writes its trace, so every worker fails. The report says why for each; bench exits non-zero, in one line."""
    run = copy_run(small_run, tmp_path)
    shutil.rmtree(run / "drift")
    (run / "results.jsonl").write_text("")
    for f in (run / "traces").glob("*.jsonl"):
        f.unlink()
        f.mkdir()
    r = harness("bench", "--resume", run, "--allow-busy")
    one_line_error(r, "every unit of the run failed (2;", "says why")
    rows = [json.loads(x) for x in result_rows(run)]
    assert rows and all(x["status"] == "error" for x in rows), rows
    md = report_md(run)
    assert all(x["error"] in md for x in rows), md
    assert not (run / "drift").exists()  # the failed baseline is not run again for the drift check
    assert harness("report", run).returncode == 0


def test_a_run_with_a_failed_unit_names_it_and_resume_and_exits_3(small_run, tmp_path):
    """Issue 57, cases 47, 49, 162, 165: a unit that fails (a head that will not load, a server or worker killed,
    a draft file swapped) leaves the sweep going, but the run ends with a line naming it and --resume, exit 3."""
    from harness.bench.run import FAILED_UNITS_EXIT
    from harness.rundir import trace_file, trace_path
    run = copy_run(small_run, tmp_path)
    rows = [json.loads(x) for x in result_rows(run)]
    spec = next(x for x in rows if x["draft"] != "none")
    (run / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows if x["unit"] != spec["unit"]))
    trace_file(run, spec["unit"]).unlink()
    trace_path(run, spec["unit"]).mkdir()  # where the unit writes its trace: its worker fails
    r = harness("bench", "--resume", run, "--allow-busy")
    line = one_line_error(r, "1 unit(s) of the run failed", f"the first, {spec['unit']}:", "stands on the others",
                          f"`harness bench --resume {run}` runs the failed ones again")
    assert r.returncode == FAILED_UNITS_EXIT == 3, line
    assert finished_status(run) == {x["unit"]: "ok" for x in rows} | {spec["unit"]: "error"}


def finished_status(run: Path) -> dict[str, str]:
    from harness.rundir import finished
    return {u: r["status"] for u, r in finished(run).items()}


# -- SIGTERM and SIGHUP to bench -----------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_a_signal_stops_the_worker_and_keeps_what_finished(tmp_path, smol, sig):
    """The process itself is under test: a real console process and a real signal."""
    out = tmp_path / "runs"
    args = ["bench", "--target", T, "--draft", "ngram:2", "--gamma", "1,2,3", "--prompts", str(PROMPT_FILE),
            "--categories", "code", "--per-category", "1", "--max-tokens", "8", "--out", str(out),
            "--allow-busy"]
    p = subprocess.Popen([*HARNESS, *args], cwd=ROOT, env=os.environ | {"CI": "true"}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(out.glob("runs/*/results.jsonl")):
        time.sleep(0.2)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err
    assert "Traceback" not in err and "--resume" in err and sig.name in err, err
    run = only_run(out)
    rows = result_rows(run)
    time.sleep(3)  # an orphaned worker would append its row now
    assert result_rows(run) == rows and 1 <= len(rows) < 4
    assert (out / f"{run.name}.md").exists()


# -- --until-confident: the next prompts in file order until they run out, and the budget spent
QUICK = ["--target", T, "--draft", "ngram:2", "--gamma", "2", "--max-tokens", "12", "--threads", "1"]


# An n-gram lookup's gain differs far between a text that repeats itself and one that does not: two such prompts
# leave the verdict open (t with one degree of freedom), whatever the machine's speed.
TEXTS = ["Repeat exactly, ten times: red blue green red blue green red blue green", "Name one colour.",
         "Count from 1 to 6.", "Say hello."]


def prompt_file(tmp_path, n):
    f = tmp_path / "few.jsonl"
    f.write_text("".join(json.dumps({"id": f"few-{i}", "category": "few", "max_tokens": 12,
                                     "messages": [{"role": "user", "content": t}]}) + "\n"
                         for i, t in enumerate(TEXTS[:n], 1)))
    return f


@pytest.mark.slow  # three rounds of a real run, and a resume: 14 s
def test_until_confident_adds_the_next_prompts_in_file_order_and_says_when_they_run_out(tmp_path, smol):
    """Two prompts in the category: round 1 adds the second (two prompts cannot settle a verdict: t with one
    degree of freedom), then there are none left: said in the report, not an error. --resume continues."""
    out = tmp_path / "r"
    r = harness("bench", *QUICK, "--prompts", str(prompt_file(tmp_path, 2)), "--per-category", "1",
                "--until-confident", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = only_run(out)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["rounds"] == [["few-1"], ["few-2"]]
    assert plan["until_confident"]["stopped"] == "prompts" and plan["until_confident"]["exhausted"] == ["few"]
    units = {json.loads(x)["unit"] for x in (run / "results.jsonl").read_text().splitlines()}
    assert len(units) == 4 and {u.split(".r")[-1] for u in units if ".r" in u} == {"1"}
    md = (out / f"{run.name}.md").read_text()
    assert "## Evidence until settled" in md and "Out of prompts: few" in md
    assert "| 2 " in md.split("## Verdict per category", 1)[1].split("##", 1)[0]  # the verdicts rest on 2 prompts
    r = harness("bench", "--resume", str(run))
    assert r.returncode == 0, r.stderr
    assert "0 unit(s) to run" in r.stderr and json.loads((run / "plan.json").read_text())["rounds"] == plan["rounds"]
    assert harness("report", str(run), "--check").returncode == 0


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_until_confident_stops_when_the_budget_is_spent(tmp_path, smol):
    out = tmp_path / "r"
    # at the suite's usual 2 threads, whose probe of the model an earlier run took (at 1 thread, probing alone
    # costs 12 s on the Xeon VM)
    r = harness("bench", *QUICK[:-2], "--prompts", str(prompt_file(tmp_path, 4)), "--per-category", "1",
                "--until-confident", "--budget-min", "0.01", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = only_run(out)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["rounds"] == [["few-1"]] and plan["until_confident"]["stopped"] == "budget"
    md = (out / f"{run.name}.md").read_text()
    assert "the budget (0.01 min) was spent" in md and "Left open: few" in md
    # 12 tokens, gamma 2, one prompt: nothing to cut, said in the run's summary
    assert plan["budget"]["budget_min"] == 0.01 and not plan["budget"]["cuts"] and not plan["budget"]["fits"]
    assert "- budget 0.01 min (fitted to 85% of it): estimated " in md and "nothing can be cut: running anyway" in md
    # what it took, per part and in all, beside the estimate's parts
    took, parts = plan["took_s"], plan["budget"]["parts_s"]
    assert took["total"] >= took["evidence"] + took["units"] + took["rounds"] > 0 and "evidence" in parts
    assert took["evidence"] > 0 and set(plan["budget"]["evidence_s"]) == {"prompt evaluation", "generation"}
    assert f"took {took['total'] / 60:.1f} min before its report" in md


# -- the context knobs' sweep, and several targets' (the quantization ladder), run for real
@pytest.fixture(scope="module")
def knobs_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("knobs")
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "2", "--cache-type-k-draft", "f16,q4_0",
                "--cache-type-v-draft", "f16,q4_0", "--flash-attn", "on", "--ubatch", "512,32", "--prompts",
                str(PROMPT_FILE), "--categories", "code", "--per-category", "1", "--max-tokens", "12", "--paired",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    return run, (out / f"{run.name}.md").read_text()


@pytest.mark.slow  # the knobs' sweep of its own, 10 configurations paired: 40-45 s of setup
def test_memory_is_broken_down_per_buffer_and_follows_the_knobs(knobs_run):
    run, md = knobs_run
    res = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    by = {(r["ubatch"], r["draft"], r.get("cache_k_draft"), r.get("cache_v_draft")): r for r in res}
    assert all(r["flash_attn"] == ({"target": True} | ({"draft": True} if r["draft"] != "none" else {}))
               for r in res)

    def total(r, kind, model=None):
        return sum(b["bytes"] for b in r["memory"] if b["kind"] == kind and model in (None, b["model"]))
    f16, q4 = by[(512, D, "f16", "f16")], by[(512, D, "q4_0", "q4_0")]
    # llama.cpp's own KV figure (2 decimals of MiB) against the one computed from the types
    for r in (f16, q4):
        assert abs(total(r, "kv") - r["kv_bytes"]) < 2 * 2**20 * 0.01
    assert total(q4, "kv", "draft") == pytest.approx(total(f16, "kv", "draft") * 18 / 64, rel=0.01)
    assert total(q4, "kv", "target") == total(f16, "kv", "target")
    small = by[(32, D, "f16", "f16")]  # a smaller ubatch shrinks the compute buffer (ubatch x vocabulary logits)
    assert total(small, "compute") < total(f16, "compute") / 4
    table = md_table(md, "## Memory")
    assert {row["draft"] for row in table} == {"none", D} | {f"{D} (KV {kv})" for kv in ("q4_0/q4_0", "q4_0/f16",
                                                                                         "f16/q4_0")}
    assert {row["ubatch"] for row in table} == {"512", "32"}
    for row in table:
        rss, own = (int(row[k].split()[0]) for k in ("peak RSS", "harness's own"))
        assert 0 < own < rss  # the process before any weights loaded
    assert "Devices: no device" in md


@pytest.mark.slow  # the knobs' sweep of its own, 10 configurations paired: 40-45 s of setup
def test_knobs_name_their_rows_and_pair_with_their_own_plain_twins(knobs_run):
    run, md = knobs_run
    plan = json.loads((run / "plan.json").read_text())
    assert plan["params"]["ubatch"] == [512, 32] and plan["params"]["flash_attn"] == ["on"]
    verdict_rows = md_table(md, "## Verdict per category")
    assert {r["setup"] for r in verdict_rows} == {"FA on", "FA on, ubatch 32"}
    assert f"{D} (KV q4_0/q4_0)" in md
    assert harness("report", str(run), "--check").returncode == 0


@pytest.mark.slow  # two targets' sweep and their fidelity, run for real: 15 s
def test_several_targets_get_a_quantization_table_with_their_fidelity(tmp_path, smol, smol_q2k):
    r = harness("bench", "--target", f"{T},{D}", "--draft", "ngram:2", "--gamma", "2", "--prompts", str(PROMPT_FILE),
                "--per-category", "1", "--max-tokens", "12", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.is_symlink())
    fid = {x["model"]: x for x in json.loads((run / "fidelity.json").read_text())}
    assert fid[T]["alpha_vs_reference"] == 1.0 and 0 < fid[D]["alpha_vs_reference"] < 1
    md = (tmp_path / f"{run.name}.md").read_text()
    targets = {row["target"]: row for row in md_table(diagnostics_md(run), "## Quantization per draft")}
    assert set(targets) == {T, D}
    assert targets[D]["alpha"] == f"{fid[D]['alpha_vs_reference']:.4f}"
    assert float(targets[D]["plain tok/s"]) > 0 and targets[D]["peak RSS"].endswith("MiB")
    assert {row["target"] for row in md_table(md, "## Verdict per category")} == {T, D}


# -- options in one small sweep: --repeat, --seed, --skip-unsupported, --cache-type-v
@pytest.fixture(scope="module")
def options_run(tmp_path_factory, smol):
    out = tmp_path_factory.mktemp("options")
    r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--prompts", str(PROMPT_FILE),
                "--categories", "chat", "--per-category", "1", "--max-tokens", "6", "--temp", "0.8", "--top-p", "0.9",
                "--repeat", "2", "--seed", "7", "--ngl", "0,99", "--skip-unsupported", "--cache-type-v", "f16,q8_0",
                "--flash-attn", "on", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = only_run(out)
    return run, [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]


def test_repeat_runs_every_prompt_again_with_the_next_seed(options_run):
    run, results = options_run
    plan = json.loads((run / "plan.json").read_text())
    assert {i["policy"]["seed"] for i in plan["instances"]} == {7}
    gens = [g for f in trace_files(run) if f.parent == run / "traces" for g in read_records(f)
            if g["type"] == "generation"]
    ran = [r for r in results if r["status"] == "ok"]
    assert ran and sorted((g["config"], g["repeat"]) for g in gens) == sorted((r["config"], k) for r in ran
                                                                                for k in (0, 1))
    metrics = json.loads((run / "metrics.json").read_text())
    for m in metrics:  # both repeats count
        assert m["tokens"] == sum(g["n_tokens"] for g in gens if g["config"] == m["config"])


def test_skip_unsupported_records_gpu_configurations_as_skipped(options_run):
    run, results = options_run
    if gpu_build():
        assert all(r["status"] == "ok" for r in results)  # a GPU build runs them
        return
    skipped = [r for r in results if r["status"] == "skipped"]
    assert skipped and {r["ngl"] for r in skipped} == {99} and all("GPU" in r["error"] for r in skipped)
    assert {r["ngl"] for r in results if r["status"] == "ok"} == {0}
    assert "GPU offload requested but this build has none" in report_md(run)


def test_cache_type_v_sets_the_targets_v_cache(options_run):
    """K f16 with V q8_0 against both f16: llama.cpp's KV figure for the target follows the types."""
    _, results = options_run
    ok = {r["cache_v"]: r for r in results if r["status"] == "ok" and r["draft"] == "none" and r["ngl"] == 0}

    def kv(r):
        return sum(b["bytes"] for b in r["memory"] if b["kind"] == "kv" and b["model"] == "target")
    n = kv(ok["f16"]) // 4  # elements of K (= of V): f16 keeps 2 bytes each of both
    assert kv(ok["q8_0"]) == pytest.approx(cache_bytes("f16", n) + cache_bytes("q8_0", n), rel=0.01)


@pytest.mark.slow  # rounds of a real run until settled: 11 s
def test_until_confident_stops_once_every_verdict_has_settled(tmp_path, smol, monkeypatch):
    """Which verdicts are open is the verdicts' business (tested with them); here the loop: a category open
    after round 0 gets its next prompt, and once none is open the run stops, says so, and records why."""
    import harness.bench.run as bench_run
    looks = []

    def open_once(verdicts):
        looks.append(verdicts is not None)
        return ["code"] if len(looks) == 1 else []
    monkeypatch.setattr(bench_run, "open_categories", open_once)
    out = tmp_path / "r"
    r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--max-tokens", "6", "--threads", "1",
                "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1", "--until-confident",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "--until-confident: settled after 2 round(s)" in r.stderr and looks == [True, True]
    plan = json.loads((only_run(out) / "plan.json").read_text())
    assert plan["rounds"] == [["code-1"], ["code-2"]] and plan["until_confident"]["stopped"] == "settled"
    assert [h["round"] for h in plan["until_confident"]["history"]] == [0, 1]


# -- bench --dry-run
def test_a_dry_run_prints_the_plan_and_the_cuts_and_runs_nothing(tmp_path, smol, smol_q2k):
    out = tmp_path / "r"
    r = harness("bench", "--target", T, "--draft", f"{D},ngram:2", "--gamma", "1,2,3,4,5,6", "--prompts", PROMPT_FILE,
                "--max-tokens", "64", "--replay", "--replay-gamma", "6", "--timed-subset", "1", "--paired",
                "--budget-min", "0.01", "--dry-run", "--out", out)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("budget 0.01 min (fitted to 85% of it): estimated ")
    # the gammas and the timed subset's configurations before the tokens, which go to 32 at the most
    assert "cut replay gamma 6 -> 4, timed subset's configurations proposers -> answers, max tokens 64 -> 32 " \
           "(--budget-min " in lines[0], lines
    assert lines[0].endswith("nothing more can be cut: running anyway"), lines
    assert "x 6 prompts x 1 repeat(s); 1 unit(s) to run, then the replay of 1 baseline(s)" in r.stderr
    assert "up to gamma 4" in r.stderr and "estimated time: about" in r.stderr
    est = next(ln for ln in lines if ln.startswith("estimated time: about"))
    assert all(f"{part} " in est for part in ("evidence", "replay", "timed subset", "worker starts and model loads"))
    assert "(the evidence: prompt evaluation " in est and "covers: target " in r.stderr
    assert f"dry run: each model's probe for the estimate ({T}: a prompt token " in r.stderr, r.stderr
    assert " ms a further token of a block; loaded in " in r.stderr and f" s; {D}: " in r.stderr and not out.exists()
