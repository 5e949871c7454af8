"""bench.prepare's checks before a sweep runs, against issue 43's bad-input sweep: a resumed run whose prompts or
path models changed, prompts that cannot fit the context (the dry run included), an --out that is empty or inside a
run, a latest.md of the user's in --out. Each refused in one line before anything is made. Where a run's
calibrations come from (--calibrate, `harness calibrate`, --gamma auto without one), a model file other than the
plan's on resume, a context too small for --parallel's sequences."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from harness.bench.prepare import REPORT_HEADINGS, check_out, models_info, same_models, same_sizes
from harness.errors import HarnessError
from harness.rundir import trace_files
from harness.trace import read_records
from tests.conftest import D, PROMPT_FILE, T
from tests.helpers import (FAST, ROOT, calibration as _calibration, change_model, copy_run, diagnostics_md, harness,
                           one_line_error, only_run)


def test_resume_after_a_prompt_changed_under_its_id_is_refused(tmp_path):
    from harness.plan import Params, expand
    from harness.prompts import load
    prompts = load(paths=[PROMPT_FILE])
    params = Params(target=[T], prompts=[str(PROMPT_FILE)])
    digests = {p.id: p.digest for p in prompts} | {prompts[0].id: "f" * 16}  # as if its text was edited since
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({
        "schema": 2, "params": params.to_dict(), "instances": [i.to_dict() for i in expand(params)],
        "prompt_ids": [prompts[0].id], "rounds": [[prompts[0].id]], "categories": [prompts[0].category],
        "prompt_digests": digests, "models": {}}))
    one_line_error(harness("bench", "--resume", run), f"prompt '{prompts[0].id}'", "changed", "restore", "new run")
    assert not (run / "results.jsonl").exists()


def test_a_path_model_is_recorded_by_its_sha256(tiny_set, tmp_path):
    f = tmp_path / "mine.gguf"
    shutil.copy(tiny_set["a"], f)
    info = models_info({str(f)})[str(f)]
    assert info["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest() and info["bytes"] == f.stat().st_size


REPLACED = {
    # the file replaced by another of the same size: only its sha256 tells them apart
    "path-model-replaced": (lambda f: models_info({str(f)})[str(f)], ["mine.gguf", "not the file", "restore"]),
    # a plan from before path models had a sha256: their size still tells
    "older-plan-size-only": (lambda f: {"quant": "", "bytes": f.stat().st_size + 1, "sha256": ""},
                             ["bytes", "not the file"]),
}


@pytest.mark.parametrize("record, words", list(REPLACED.values()), ids=list(REPLACED))
def test_resume_on_a_path_model_replaced_by_another_file_is_refused(tiny_set, tmp_path, record, words):
    f = tmp_path / "mine.gguf"
    shutil.copy(tiny_set["a"], f)
    plan = {"models": {str(f): record(f)}}
    shutil.copy(tiny_set["b"], f)
    assert f.stat().st_size == tiny_set["a"].stat().st_size
    with pytest.raises(HarnessError) as e:
        same_models(plan)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_resume_on_the_same_path_model_goes_on(tiny_set, tmp_path):
    f = tmp_path / "mine.gguf"
    shutil.copy(tiny_set["a"], f)
    same_models({"models": {str(f): models_info({str(f)})[str(f)], "ngram:2": models_info({"ngram:2"})["ngram:2"]}})


MID_RUN = {  # issue 57: the file swapped for another while the run runs (the draft, between two units)
    "163-another-quant": ("a", "padding", ["model 'DRAFT' at", "was replaced while the run ran", "bytes when it "
                                           "started", "units finished so far are kept", "--resume RUN"]),
    "162-another-tokenizer": ("a", "other_tokenizer", ["was replaced while the run ran", "restore that file"]),
    "the-same-file": ("a", "a", []),
}


@pytest.mark.parametrize("first, then, words", list(MID_RUN.values()), ids=list(MID_RUN))
def test_a_model_replaced_mid_run_stops_the_next_unit(tiny_set, tmp_path, first, then, words):
    f = tmp_path / "mine.gguf"
    shutil.copy(tiny_set[first], f)
    plan = {"instances": [{"target": T}], "models": {str(f): models_info({str(f)})[str(f)],
                                                     "ngram:2": models_info({"ngram:2"})["ngram:2"]}}
    shutil.copy(tiny_set[then], f)
    if not words:
        same_sizes(plan, tmp_path / "RUN")
        return
    assert f.stat().st_size != tiny_set[first].stat().st_size
    with pytest.raises(HarnessError) as e:
        same_sizes(plan, tmp_path / "RUN")
    for w in words:
        assert w.replace("DRAFT", str(f)).replace("RUN", str(tmp_path / "RUN")) in str(e.value), str(e.value)


def _long_prompt(tmp_path: Path) -> Path:
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps({"id": "long-1", "category": "long_context", "text": "word " * 3000}) + "\n")
    return f


BENCH = ("bench", "--target", T, "--out", "{tmp}/reports")

CASES = {
    # prompt + max tokens beyond --n-ctx: the dry run estimated hundreds of minutes and exited 0
    "dry-run-prompt-beyond-n-ctx": ([*BENCH, "--prompts", "{long}", "--dry-run"], {},
                                    ["prompt long-1", "exceed --n-ctx 2048", "raise --n-ctx"]),
    "run-prompt-beyond-n-ctx": ([*BENCH, "--prompts", "{long}"], {}, ["prompt long-1", "exceed --n-ctx 2048"]),
    "dry-run-max-tokens-beyond-n-ctx": ([*BENCH, "--categories", "code", "--max-tokens", "100000", "--dry-run"], {},
                                        ["--max-tokens 100000", "--n-ctx 2048"]),
    # --out: empty (the current directory), or inside a run directory (a run nested in it)
    "out-empty": (["bench", "--target", T, "--categories", "code", "--out", ""], {}, ["--out is empty"]),
    "out-is-a-run": (["bench", "--target", T, "--categories", "code", "--out", "{tmp}/run"], {"run/plan.json": "{}"},
                     ["inside the run directory", "--resume"]),
    "out-inside-a-run": (["bench", "--target", T, "--categories", "code", "--out", "{tmp}/run/traces"],
                         {"run/plan.json": "{}"}, ["inside the run directory"]),
    # the user's own latest.md where the report would go
    "out-holds-users-latest-md": ([*BENCH, "--categories", "code"], {"reports/latest.md": "# my notes\n"},
                                  ["latest.md", "not written by the harness", "move it"]),
    "out-holds-a-latest-md-directory": ([*BENCH, "--categories", "code"], {"reports/latest.md/x": "x"},
                                        ["latest.md", "not written by the harness"]),
}


@pytest.mark.parametrize("args, files, words", list(CASES.values()), ids=list(CASES))
def test_bad_bench_input_is_refused_before_anything_is_made(args, files, words, tmp_path, smol):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    fill = {"tmp": str(tmp_path), "long": str(_long_prompt(tmp_path))}
    env = {f"HARNESS_{k}": str(ROOT / v) for k, v in (("CATALOG", "models.toml"), ("MODELS_DIR", "models"),
                                                      ("PROMPTS_DIR", "prompts"), ("PROFILES", "profiles.toml"))}
    one_line_error(harness(*(a.format(**fill) for a in args), cwd=tmp_path, env=env), *words)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == sorted([*before, Path("long.jsonl")])


def test_a_latest_md_the_harness_wrote_is_replaced(tmp_path):
    run = copy_run(ROOT / "reports" / "runs" / "20261202-054828-vm", tmp_path)  # the smoke run, committed
    assert harness("report", run).returncode == 0
    out = run.parent.parent
    assert (out / "latest.md").read_bytes().startswith(REPORT_HEADINGS[0])  # report.render's first line, still
    check_out(out, None)
    (out / "latest.md").write_bytes(REPORT_HEADINGS[1] + b"\n")  # an older harness's
    check_out(out, None)
    check_out(tmp_path / "none", None)  # no latest.md at all


# -- where a run's calibrations are written and found
def _instances():
    from harness.plan import Params, expand
    return expand(Params(target=[T], draft=[D], gamma=[2], threads=[1]))


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory that is not the project's (the catalog still found), a run under OUT/runs."""
    monkeypatch.setenv("HARNESS_CATALOG", str(ROOT / "models.toml"))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "out" / "runs" / "r1"
    run.mkdir(parents=True)
    return tmp_path, run


def test_bench_calibrate_writes_under_out(elsewhere, monkeypatch):
    """bench --calibrate saves what it measures in OUT/calibration (not ./reports/calibration) and copies it
    into the run."""
    import harness.calibrate as cal
    from harness.bench.prepare import prepare_calibrations
    tmp, run = elsewhere
    monkeypatch.setattr(cal, "calibrate", lambda ref, threads, ngl, *a: _calibration(model=ref, threads=threads,
                                                                                     ngl=ngl))
    prepare_calibrations(_instances(), run, True)
    for m in (T, D):
        assert (tmp / "out" / "calibration" / f"{m}-t1-ngl0.json").is_file()
        assert (run / "calibration" / f"{m}-t1-ngl0.json").is_file()
    assert not (tmp / "reports").exists()


def test_bench_finds_calibrations_under_out_then_reports(elsewhere):
    """Without --calibrate, a run takes OUT/calibration's, else reports/calibration's (`harness calibrate`'s
    default)."""
    from harness.bench.prepare import prepare_calibrations
    tmp, run = elsewhere
    for root, m, tag in ((tmp / "out" / "calibration", T, "out"), (tmp / "reports" / "calibration", T, "reports"),
                         (tmp / "reports" / "calibration", D, "reports")):
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{m}-t1-ngl0.json").write_text(json.dumps(_calibration(model=m, date=tag)))
    prepare_calibrations(_instances(), run, False)
    got = {m: json.loads((run / "calibration" / f"{m}-t1-ngl0.json").read_text())["date"] for m in (T, D)}
    assert got == {T: "out", D: "reports"}


# -- a model file that changed under its catalog name


@pytest.mark.slow  # a model copied and hashed: 14 s
def test_resume_refuses_a_model_file_other_than_the_plans(own_models, tmp_path):
    from harness.models.store import mark_verified, sha256_file
    env = {"HARNESS_MODELS_DIR": str(own_models), "HARNESS_CATALOG": str(ROOT / "models.toml")}
    out = tmp_path / "o"
    assert harness("bench", *FAST, "--allow-busy", "--out", out, env=env).returncode == 0
    run = only_run(out)
    model = own_models / f"{T}.gguf"
    change_model(model)
    mark_verified(model, sha256_file(model))  # swapped and verified: the sidecar agrees, the plan does not
    one_line_error(harness("bench", "--resume", run, "--allow-busy", env=env), T, "not the file this run started with")


# -- --gamma auto and its calibrations, from an empty directory
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


# -- a context too small for --parallel's sequences
def test_a_too_small_context_for_n_sequences_is_refused_in_one_line(tmp_path, smol, smol_q2k):
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "3", "--parallel", "1,8", "--categories", "grounded",
                "--per-category", "2", "--max-tokens", "16", "--n-ctx", "1024", "--out", str(tmp_path))
    one_line_error(r, "--parallel 8", "--n-ctx is 1024", "raise --n-ctx to")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    one_line_error(harness("bench", "--target", T, "--parallel", "0", "--out", str(tmp_path)), "--parallel", ">= 1")


def test_models_info_of_llama_server_types(smol_q2k):
    """A combination is recorded by its draft model's file, a type without one by what it drafts with."""
    combo, mtp = f"ngram-mod+{smol_q2k}", "draft-mtp"
    info = models_info({combo, mtp, "ngram-cache"})
    assert info[combo]["bytes"] == smol_q2k.stat().st_size and info[combo]["sha256"]
    assert info[mtp]["note"] == "the target's own MTP layers" and info[mtp]["bytes"] == 0
    assert info["ngram-cache"]["note"] == "n-gram lookup (no model)"


def test_a_target_path_with_a_plus_is_a_model_not_a_combination(tiny_set, tmp_path):  # case 62
    t = tmp_path / "smol+q4.gguf"
    shutil.copy(tiny_set["a"], t)
    info = models_info({"ngram:2"}, targets={str(t)})
    assert info[str(t)]["bytes"] == t.stat().st_size and info[str(t)]["sha256"]
