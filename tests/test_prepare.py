"""bench.prepare's checks before a sweep runs, against issue 43's bad-input sweep: a resumed run whose prompts or
path models changed, prompts that cannot fit the context (the dry run included), an --out that is empty or inside a
run, a latest.md of the user's in --out. Each refused in one line before anything is made."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from harness.bench.prepare import REPORT_HEADINGS, check_out, models_info, same_models
from harness.errors import HarnessError
from tests.conftest import PROMPT_FILE, T
from tests.helpers import ROOT, copy_run, harness, one_line_error


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
