"""`harness bench` end to end on the session's shared timed run (tests/conftest.py): the report's figures against
the raw traces, tampering, exports, resume, Ctrl-C and bad input; the real smoke profile in the slow tier."""
import gzip
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.rundir import trace_files
from harness.trace import read_records
from tests.conftest import CATEGORIES, POLICIES, PROMPT_FILE, T, gpu_build, skip_on_gpu_build
from tests.helpers import (HARNESS, ROOT, copy_run, diagnostics_md, harness, md_table, one_line_error, only_run,
                           report_md)

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
    for heading in ("### Models", "## Verdict per category", "## Quantization", "## Memory", "## How to read this"):
        assert heading in md
    for heading in ("## Machine noise", "## Per category", *(f"### {c}" for c in categories),
                    "## Output equivalence (greedy)"):  # the harness's checks of itself, and every timed row
        assert heading in diagnostics and heading not in md
    first_screen = md.split("## Contents")[0]
    assert "## Verdict per category" in first_screen and "verdicts.png" in first_screen  # the answer comes first
    assert "## Memory" in first_screen
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


def _tamper(trace: Path, pick, change) -> None:
    """Change the first record of a trace that pick() selects, written back in the trace's own form."""
    recs = read_records(trace)
    change(next(r for r in recs if pick(r)))
    text = "".join(json.dumps(r) + "\n" for r in recs)
    if trace.name.endswith(".gz"):
        trace.write_bytes(gzip.compress(text.encode()))
    else:
        trace.write_text(text)


def _own_traces(run: Path, side: str = "") -> list[Path]:
    d = run / side if side else run
    return [f for f in trace_files(d) if f.parent == d / "traces" and f.name.startswith("g")]


def _rejected(r: dict) -> bool:
    return r.get("accepted", 0) < r.get("proposed", 0)


@pytest.mark.parametrize("what", ["accepted", "gen_ms", "paired gen_ms"])
def test_report_check_fails_when_a_trace_disagrees(timed_run, tmp_path, what):
    """One more accepted draft than the run saw; a generation 10% slower; its paired twin (the reference the
    speedup and its interval are built from) 10% faster: each is a difference that --check shows."""
    run = copy_run(timed_run, tmp_path)
    assert harness("report", str(run), "--check").returncode == 0
    if what == "accepted":
        trace = next(f for f in _own_traces(run) if any(_rejected(r) for r in read_records(f)))
        _tamper(trace, _rejected, lambda r: r.update(accepted=r["accepted"] + 1))
    elif what == "gen_ms":
        _tamper(_own_traces(run)[0], lambda r: r["type"] == "generation", lambda r: r.update(gen_ms=r["gen_ms"] * 1.1))
    else:
        _tamper(_own_traces(run, "paired")[0], lambda r: r["type"] == "generation",
                lambda r: r.update(gen_ms=r["gen_ms"] / 1.1))
    r = harness("report", str(run), "--check")
    one_line_error(r, "disagrees")
    assert r.stdout.strip()  # the differing lines are shown


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


def test_report_check_neither_redraws_plots_nor_depends_on_how_the_path_is_typed(timed_run):
    pngs = {p: p.stat().st_mtime_ns for p in (timed_run / "plots").glob("*.png")}
    assert pngs, "the run draws its plots (the dev extra has matplotlib)"
    for args, cwd in (([str(timed_run.resolve())], ROOT), ([timed_run.name], timed_run.parent),
                      ([f"./{timed_run.name}/"], timed_run.parent)):
        r = harness("report", *args, "--check", cwd=cwd)
        assert r.returncode == 0 and "matches" in r.stdout, r.stdout + r.stderr
    assert {p: p.stat().st_mtime_ns for p in pngs} == pngs


def test_report_exports(timed_run, tmp_path):
    run = copy_run(timed_run, tmp_path)
    r = harness("report", str(run), "--format", "md,csv,json,parquet")
    assert r.returncode == 0, r.stderr
    for ext in ("csv", "json", "parquet"):
        assert (run / f"metrics.{ext}").stat().st_size > 0
        assert (run / f"verdicts.{ext}").stat().st_size > 0
    import polars as pl
    m = pl.read_parquet(run / "metrics.parquet")
    for col in ("speedup_lo", "speedup_hi", "acceptance_rate_lo", "mean_accepted_len_hi", "alpha_lo", "prompts"):
        assert col in m.columns
    spec = m.filter(pl.col("draft") != "none")
    assert (spec["speedup_lo"] <= spec["speedup"]).all() and (spec["speedup"] <= spec["speedup_hi"]).all()
    v = pl.read_csv(run / "verdicts.csv")
    assert set(v["verdict"]) <= {"speculate", "plain decoding", "inconclusive", "unreliable (busy machine)"}
    assert len(v) == len(CATEGORIES) * len(POLICIES)


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


@pytest.mark.parametrize("content, words", [
    ("", ["is empty"]),
    ('{"id": "a", "category": "x", "text": "hi"}\nnot json\n', [":2:", "not valid JSON"]),
    ('{"id": "a", "category": "x", "text": "hi"}\n{"id": "a", "category": "x", "text": "yo"}\n', ["duplicate"]),
    ('{"id": "a", "category": "x", "text": "  "}\n', [":1:", "empty"]),
])
def test_bad_prompt_files(content, words, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--prompts", str(f), "--out", str(tmp_path / "r"))
    one_line_error(r, *words)


def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--categories", "code", "--per-category", "1",
                "--max-tokens", "4", "--out", str(blocker / "runs"))
    one_line_error(r, "run directory")


def isolated_env(tmp_path) -> dict:
    """Run from an empty directory so calibrations start empty; models, prompts and profiles from the repo."""
    return {"HARNESS_CATALOG": str(ROOT / "models.toml"), "HARNESS_MODELS_DIR": str(ROOT / "models"),
            "HARNESS_PROMPTS_DIR": str(ROOT / "prompts"), "HARNESS_PROFILES": str(ROOT / "profiles.toml")}


def test_gamma_auto_needs_a_calibration(tmp_path, smol, smol_q2k):
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--draft", "smollm2-135m-instruct-q2_k",
                "--gamma", "auto:2", "--categories", "code", "--per-category", "1", "--max-tokens", "4",
                "--out", str(tmp_path / "runs"), cwd=tmp_path, env=isolated_env(tmp_path))
    one_line_error(r, "harness calibrate", "--calibrate")
    assert not any((tmp_path / "runs").glob("runs/2*")), "a refused run leaves no run directory"


def _adaptive_run(tmp_path, *extra) -> Path:
    """gamma 1 and auto:2 on the tiny prompts, from an empty directory with its own calibrations."""
    from tests.conftest import D
    env = isolated_env(tmp_path)
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "1,auto:2", "--prompts", str(PROMPT_FILE),
                "--categories", "code", "--per-category", "1", "--max-tokens", "12", *extra,
                "--out", str(tmp_path / "reports"), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "reports")
    md = diagnostics_md(run)
    assert "## Cost model" in md and "auto<=2" in md and "Recommended gamma" in md
    steps = [s for f in trace_files(run) if f.name.startswith("auto-") for s in read_records(f)]
    assert {s["gamma"] for s in steps if s["type"] == "step"} <= {0, 1, 2}
    assert harness("report", str(run), "--check", cwd=tmp_path, env=env).returncode == 0
    cals = {f.name: f.read_text() for f in (run / "calibration").iterdir()}
    assert len(cals) == 2  # target and draft
    r = harness("bench", "--resume", str(run), cwd=tmp_path, env=env)  # nothing left: no new calibration
    assert r.returncode == 0 and "calibrating" not in r.stderr, r.stderr
    assert {f.name: f.read_text() for f in (run / "calibration").iterdir()} == cals
    return run


@pytest.mark.slow  # a calibration, then an adaptive sweep: 20 s
def test_calibrate_then_adaptive_gamma_with_cost_model(tmp_path, smol, smol_q2k):
    """`harness calibrate` writes ./reports/calibration, which a later bench copies into its run."""
    from tests.conftest import D
    env = isolated_env(tmp_path)
    for m in (T, D):
        r = harness("calibrate", m, "--k-max", "3", "--reps", "1", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert "vs k=1" in r.stdout
    assert len(list((tmp_path / "reports/calibration").iterdir())) == 2
    _adaptive_run(tmp_path)


@pytest.mark.slow
def test_bench_calibrate_measures_its_own_costs_first(tmp_path, smol, smol_q2k):
    run = _adaptive_run(tmp_path, "--calibrate")
    assert all(json.loads(f.read_text())["k"][-1] == 16 for f in (run / "calibration").iterdir())


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


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(p.name for p in (ROOT / "reports" / "runs").glob("2*") if p.is_dir()))
def test_committed_reference_runs_match_their_traces(run):
    """The README's figures come from these runs: their reports must be what the traces give."""
    r = harness("report", str(Path("reports") / "runs" / run), "--check")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("content, words", [
    ('{"instances": [', ["plan.json", "damaged"]),
    ("{}", ["plan.json", "lacks", "instances"]),
])
def test_damaged_plan_is_one_line_for_resume_and_report(tmp_path, content, words):
    run = tmp_path / "runs" / "r1"
    (run / "traces").mkdir(parents=True)
    (run / "plan.json").write_text(content)
    one_line_error(harness("bench", "--resume", str(run)), *words)
    one_line_error(harness("report", str(run)), *words)
    one_line_error(harness("report", str(run), "--check"), *words)


def test_report_check_on_a_directory_that_is_not_a_run(tmp_path):
    one_line_error(harness("report", str(tmp_path), "--check"), "not a benchmark run directory")


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
