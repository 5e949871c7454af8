"""`harness bench --profile smoke` end to end, the report's figures against the raw traces, resume, bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import gpu_build, skip_on_gpu_build

ROOT = Path(__file__).resolve().parent.parent
HARNESS = [sys.executable, "-m", "harness.cli"]


def harness(*args, cwd=ROOT, env=None):
    """`harness ARGS` in a subprocess. A bench run not about the busy-machine guard tolerates more foreign load
    (0.25 of the cores) than the default, so that a background blip on a CI machine cannot fail it."""
    if args and args[0] == "bench" and "--resume" not in args and "--busy-threshold" not in args:
        args = (*args, "--busy-threshold", "0.25")
    e = os.environ | {"CI": "true"} | (env or {})
    return subprocess.run([*HARNESS, *args], cwd=cwd, env=e, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def one_line_error(r, *words):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("harness: error:")]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("reports")
    r = harness("bench", "--profile", "smoke", "--out", str(out))
    assert r.returncode == 0, r.stderr
    runs = [p for p in (out / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1
    return runs[0]


def raw(run_dir: Path) -> list[dict]:
    recs = []
    for f in (run_dir / "traces").glob("*.jsonl"):
        recs += [json.loads(line) for line in f.read_text().splitlines()]
    return recs


def test_smoke_report_structure(smoke_run):
    md = (smoke_run.parent.parent / f"{smoke_run.name}.md").read_text()
    assert (smoke_run.parent.parent / "latest.md").read_text() == md
    for heading in ("### Models", "## Verdict per category", "## Machine noise", "## Per category", "### code",
                    "### long_context", "## Quantization", "## Memory", "## Output equivalence (greedy)",
                    "## How to read this"):
        assert heading in md
    assert md.index("## Verdict per category") < md.index("## Machine and run")  # the answer comes first
    assert "verdicts.png" in md.split("## Machine and run")[0]  # with its plot
    assert ("GPU offload available" if gpu_build() else "CPU only") in md
    assert "requantized from smollm2-135m-instruct-q4_1" in md
    assert "| greedy" in md and "T=0.8 top_p=0.9" in md  # every table states the policy
    assert f"`runs/{smoke_run.name}/traces`" in md  # relative to the report: the same however the path was typed
    results = [json.loads(x) for x in (smoke_run / "results.jsonl").read_text().splitlines()]
    assert len(results) == 10 and all(r["status"] == "ok" for r in results)
    assert all(r["peak_rss_bytes"] > 50 * 2**20 for r in results)


def test_plain_baselines_run_again_at_the_end_to_measure_drift(smoke_run):
    again = [json.loads(x) for x in (smoke_run / "drift" / "results.jsonl").read_text().splitlines()]
    opening = [json.loads(x) for x in (smoke_run / "results.jsonl").read_text().splitlines()]
    assert sorted(r["config"] for r in again) == sorted(r["config"] for r in opening if r["draft"] == "none")
    rows = [r for r in json.loads((smoke_run / "metrics.json").read_text()) if r["draft"] == "none"]
    assert len(rows) == 12  # two policies x six categories
    recs = raw(smoke_run / "drift")
    for r in rows:
        key = (r["config"], r["category"])
        gens = [g for g in recs if g["type"] == "generation" and (g["config"], g["category"]) == key]
        end = sum(g["n_tokens"] for g in gens) / sum(g["gen_ms"] for g in gens) * 1000
        assert r["base_end_tokens_per_s"] == pytest.approx(end)
        assert r["drift"] == pytest.approx(end / r["base_tokens_per_s"])
    md = (smoke_run.parent.parent / f"{smoke_run.name}.md").read_text()
    assert "## Drift" in md and "end / start" in md


def test_paired_plain_runs_are_the_reference_of_every_speculative_row(smoke_run):
    results = [json.loads(x) for x in (smoke_run / "results.jsonl").read_text().splitlines()]
    spec = {r["config"] for r in results if r["draft"] != "none"}
    assert {f.stem for f in (smoke_run / "paired" / "traces").glob("*.jsonl")} == spec
    paired = raw(smoke_run / "paired")
    assert {r["mode"] for r in paired} == {"baseline"} and not any(r.get("proposed") for r in paired)
    main = raw(smoke_run)
    base_out = {(g["prompt_id"], json.dumps(g["tokens"])) for g in main
                if g["type"] == "generation" and g["mode"] == "baseline" and g["config"].startswith("base")}
    rows = [r for r in json.loads((smoke_run / "metrics.json").read_text()) if r["draft"] != "none"]
    assert len(rows) == len(spec) * 6
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
    md = (smoke_run.parent.parent / f"{smoke_run.name}.md").read_text()
    assert "paired plain tok/s (range)" in md and "(within drift)" not in md


def test_report_figures_equal_those_recomputed_from_traces(smoke_run):
    metrics = json.loads((smoke_run / "metrics.json").read_text())
    recs = raw(smoke_run)
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
    assert checked >= 6
    r = harness("report", str(smoke_run), "--check")
    assert r.returncode == 0 and "matches" in r.stdout


def copy_run(run: Path, tmp_path: Path) -> Path:
    """The run and its report, copied into a reports directory of their own (to tamper with)."""
    import shutil
    dest = tmp_path / "reports" / "runs" / run.name
    shutil.copytree(run, dest, symlinks=True)
    shutil.copy(run.parent.parent / f"{run.name}.md", dest.parent.parent / f"{run.name}.md")
    return dest


def test_report_check_fails_when_a_trace_disagrees(smoke_run, tmp_path):
    run = copy_run(smoke_run, tmp_path)
    assert harness("report", str(run), "--check").returncode == 0
    trace = next(f for f in sorted((run / "traces").glob("g*.jsonl"))
                 if any(json.loads(x).get("accepted", 0) < json.loads(x).get("proposed", 0)
                        for x in f.read_text().splitlines()))
    lines = trace.read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if json.loads(x).get("accepted", 0) < json.loads(x).get("proposed", 0))
    rec = json.loads(lines[i])
    rec["accepted"] += 1  # one more accepted draft than the run saw
    lines[i] = json.dumps(rec)
    trace.write_text("\n".join(lines) + "\n")
    r = harness("report", str(run), "--check")
    one_line_error(r, "disagrees")
    assert "acceptance" in r.stdout or "%" in r.stdout  # the differing lines are shown


def md_table(md: str, heading: str) -> list[dict]:
    """The first Markdown table after a heading, as dicts."""
    lines = md.split(heading, 1)[1].splitlines()
    start = next(k for k, ln in enumerate(lines) if ln.startswith("|"))
    end = next((k for k in range(start, len(lines)) if not lines[k].startswith("|")), len(lines))
    rows = lines[start:end]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in rows[2:]]


def test_equivalence_table_counts_every_greedy_generation(smoke_run):
    md = (smoke_run.parent.parent / f"{smoke_run.name}.md").read_text()
    table = md_table(md, "## Output equivalence (greedy)")
    recs = raw(smoke_run)
    gens = [r for r in recs if r["type"] == "generation"]
    results = {json.loads(x)["config"]: json.loads(x) for x in (smoke_run / "results.jsonl").read_text().splitlines()}
    greedy = [g for g in gens if results[g["config"]]["policy"]["temperature"] == 0]
    base = {g["prompt_id"]: g["tokens"] for g in greedy if results[g["config"]]["draft"] == "none"}
    spec = [g for g in greedy if results[g["config"]]["draft"] != "none"]
    assert len(table) == len({(g["config"], g["category"]) for g in spec}) > 0
    assert sum(int(r["generations"]) for r in table) == len(spec)
    differ = sum(g["tokens"] != base[g["prompt_id"]] for g in spec)
    checked = [r for r in recs if r["type"] == "divergence"]
    assert len(checked) == differ  # paired: every divergence was re-evaluated in its worker
    assert sum(int(r["kernel near-ties"]) + int(r["mismatches"]) + int(r["unchecked"]) for r in table) == differ
    assert all(r["mismatches"] == "0" and r["unchecked"] == "0" for r in table)
    exact = sum(float(r["exact match"].rstrip("%")) / 100 * int(r["generations"]) for r in table)
    assert exact == pytest.approx(len(spec) - differ)


def test_report_check_neither_redraws_plots_nor_depends_on_how_the_path_is_typed(smoke_run):
    pngs = {p: p.stat().st_mtime_ns for p in (smoke_run / "plots").glob("*.png")}
    assert pngs, "the smoke run draws its plots (the dev extra has matplotlib)"
    for args, cwd in (([str(smoke_run.resolve())], ROOT), ([smoke_run.name], smoke_run.parent),
                      ([f"./{smoke_run.name}/"], smoke_run.parent)):
        r = harness("report", *args, "--check", cwd=cwd)
        assert r.returncode == 0 and "matches" in r.stdout, r.stdout + r.stderr
    assert {p: p.stat().st_mtime_ns for p in pngs} == pngs


def test_reports_land_inside_the_out_directory(tmp_path, smol):
    out = tmp_path / "results" / "runA"
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--draft", "ngram:2", "--gamma", "2",
                "--categories", "code", "--per-category", "1", "--max-tokens", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    assert (out / f"{run.name}.md").exists() and (out / "latest.md").exists()
    assert not list((tmp_path / "results").glob("*.md"))


def test_report_exports(smoke_run):
    r = harness("report", str(smoke_run), "--format", "md,csv,json,parquet")
    assert r.returncode == 0, r.stderr
    for ext in ("csv", "json", "parquet"):
        assert (smoke_run / f"metrics.{ext}").stat().st_size > 0
        assert (smoke_run / f"verdicts.{ext}").stat().st_size > 0
    import polars as pl
    m = pl.read_parquet(smoke_run / "metrics.parquet")
    for col in ("speedup_lo", "speedup_hi", "acceptance_rate_lo", "mean_accepted_len_hi", "alpha_lo", "prompts"):
        assert col in m.columns
    spec = m.filter(pl.col("draft") != "none")
    assert (spec["speedup_lo"] <= spec["speedup"]).all() and (spec["speedup"] <= spec["speedup_hi"]).all()
    v = pl.read_csv(smoke_run / "verdicts.csv")
    assert set(v["verdict"]) <= {"speculate", "plain decoding", "inconclusive", "unreliable (busy machine)"}
    assert len(v) == 12  # six categories x two policies


def test_resume_runs_only_what_is_missing(smoke_run):
    """The last result line half-written, as a kill in the middle of the write leaves it: that configuration
    runs again and its new line is kept whole."""
    res = smoke_run / "results.jsonl"
    lines = res.read_text().splitlines()
    res.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:len(lines[-1]) // 2])
    r = harness("bench", "--resume", str(smoke_run))
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


def test_calibrate_then_adaptive_gamma_with_cost_model(tmp_path, smol, smol_q2k):
    env = isolated_env(tmp_path)
    r = harness("calibrate", "smollm2-135m-instruct-q4_1", "--k-max", "4", "--reps", "1", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "vs k=1" in r.stdout and (tmp_path / "reports/calibration").is_dir()
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--draft", "smollm2-135m-instruct-q2_k",
                "--gamma", "1,auto:2", "--categories", "code", "--per-category", "1", "--max-tokens", "12",
                "--calibrate", "--out", str(tmp_path / "reports"), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "reports/latest.md").read_text()
    assert "## Cost model" in md and "auto<=2" in md and "Recommended gamma" in md
    run = next(p for p in (tmp_path / "reports/runs").iterdir() if not p.is_symlink())
    steps = [json.loads(x) for f in (run / "traces").glob("auto-*.jsonl") for x in f.read_text().splitlines()]
    assert {s["gamma"] for s in steps if s["type"] == "step"} <= {0, 1, 2}
    assert harness("report", str(run), "--check", cwd=tmp_path, env=env).returncode == 0
    cals = {f.name: f.read_text() for f in (run / "calibration").iterdir()}
    r = harness("bench", "--resume", str(run), cwd=tmp_path, env=env)  # nothing left: no new calibration
    assert r.returncode == 0 and "calibrating" not in r.stderr, r.stderr
    assert {f.name: f.read_text() for f in (run / "calibration").iterdir()} == cals


def test_ctrl_c_keeps_what_finished(tmp_path, smol):
    import signal
    import time
    out = tmp_path / "runs"
    p = subprocess.Popen([*HARNESS, "bench", "--target", "smollm2-135m-instruct-q4_1", "--draft", "ngram:2",
                          "--gamma", "1,2,3", "--categories", "code", "--per-category", "1", "--max-tokens", "8",
                          "--out", str(out)], cwd=ROOT, env=os.environ | {"CI": "true"}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(out.glob("runs/*/results.jsonl")):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    done = (run / "results.jsonl").read_text().splitlines()
    assert 1 <= len(done) < 4
    assert (out / f"{run.name}.md").exists()


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
