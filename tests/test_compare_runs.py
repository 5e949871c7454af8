"""`harness compare`: two runs of one sweep (SmolLM2 at one thread and at two, standing in for two machines) side
by side, and every way runs can differ refused in one line."""
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import CATEGORIES, D, POLICIES, T
from tests.helpers import ROOT, copy_run, harness, md_table, one_line_error

# the tests of two_runs are slow: the threads-1 sweep they read is the fast tier's dearest run (77 s, Xeon VM)
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def two_runs(timed_run_t1, timed_run):
    """One sweep at 1 thread and at 2: two machines."""
    return [timed_run_t1, timed_run]


@slow
def test_compare_puts_each_machines_verdict_side_by_side(two_runs, tmp_path):
    r = harness("compare", *map(str, two_runs), "--out", str(tmp_path), "--format", "md,csv,json")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "compare.md").read_text()
    rows = md_table(md, "# Speculative decoding across machines")
    assert {(x["category"], x["policy"]) for x in rows} == {(c, p) for c in CATEGORIES for p in POLICIES}
    for x in rows:
        for m in ("A", "B"):
            assert x[m].startswith(("speculate:", "plain decoding:", "inconclusive:", "unreliable (busy machine):"))
            assert re.search(rf"({re.escape(D)}|ngram:2) g=2\b", x[m]) and "[" in x[m], x[m]
    machines = md_table(md, "## Machines")
    assert [m["run"] for m in machines] == [p.name for p in two_runs]
    assert all(m["verdicts"] == "timed" and m["cores"] for m in machines)
    data = json.loads((tmp_path / "compare.json").read_text())
    assert len(data["machines"]) == 2 and len(data["verdicts"]) == 8
    # each machine's figures are its own run's, recomputed from its traces
    for k, original in enumerate(two_runs):
        run = copy_run(original, tmp_path / f"copy{k}")
        harness("report", str(run), "--format", "json")
        own = {(v["category"], v["policy"]): v["speedup"] for v in json.loads((run / "verdicts.json").read_text())}
        got = {(v["category"], v["policy"]): v["speedup"] for v in data["verdicts"] if v["run"] == run.name}
        assert got == pytest.approx(own)
        tidy = json.loads((run / "tidy.json").read_text())  # the table to pool: one row per configuration x category
        assert {x["schema_version"] for x in tidy} == {3} and {x["run"] for x in tidy} == {run.name}
        assert {x["parallel"] for x in tidy} == {1}
        sha = json.loads((run / "plan.json").read_text())["models"][T]["sha256"]
        assert {x["target_sha256"] for x in tidy} == {sha}
        configs = len(json.loads((run / "plan.json").read_text())["instances"])
        assert len(tidy) == configs * len(CATEGORIES)
        assert all(x["speedup_lo"] <= x["speedup"] <= x["speedup_hi"] for x in tidy if x["draft"] != "none")
    assert (tmp_path / "compare.csv").exists() and "compare.png" in md


def _copy(run, tmp_path, name):
    dest = tmp_path / name
    shutil.copytree(run, dest)
    return dest


def _edit_plan(run, change):
    plan = json.loads((run / "plan.json").read_text())
    change(plan)
    (run / "plan.json").write_text(json.dumps(plan))


@slow
def test_runs_that_measured_different_things_are_refused(two_runs, tmp_path):
    a, b = two_runs
    one_line_error(harness("compare", str(a), "--out", str(tmp_path)), "at least two")
    one_line_error(harness("compare", str(a), str(tmp_path / "nope"), "--out", str(tmp_path)), "no such run")
    one_line_error(harness("compare", str(a), str(b), "--format", "xls", "--out", str(tmp_path)), "format 'xls'")

    c = _copy(b, tmp_path, "sha")
    _edit_plan(c, lambda p: p["models"][D].update(sha256="0" * 64))
    one_line_error(harness("compare", str(a), str(c), "--out", str(tmp_path)), "models", D, "sha256")

    c = _copy(b, tmp_path, "prompt")
    _edit_plan(c, lambda p: p["prompt_digests"].update({p["prompt_ids"][0]: "f" * 16}))
    one_line_error(harness("compare", str(a), str(c), "--out", str(tmp_path)), "prompts", "other contents")

    c = _copy(b, tmp_path, "ids")
    _edit_plan(c, lambda p: p.update(prompt_ids=p["prompt_ids"][1:], rounds=[p["prompt_ids"][1:]]))
    one_line_error(harness("compare", str(a), str(c), "--out", str(tmp_path)), "prompts", "only")

    c = _copy(b, tmp_path, "policy")
    _edit_plan(c, lambda p: [i["policy"].update(temperature=0.9) for i in p["instances"]
                             if i["policy"]["temperature"] > 0])
    one_line_error(harness("compare", str(a), str(c), "--out", str(tmp_path)), "sampling policies", "T=0.9")


@slow
def test_a_run_from_before_prompt_digests_is_compared_by_id_and_says_so(two_runs, tmp_path):
    a, b = two_runs
    c = _copy(b, tmp_path, "old")
    _edit_plan(c, lambda p: [p.pop("prompt_digests"), p.pop("schema")])
    r = harness("compare", str(a), str(c), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "predates prompt digests (schema 1)" in (tmp_path / "out" / "compare.md").read_text()


@slow
def test_timed_rows_both_runs_measured_are_set_against_each_other(two_runs, tmp_path):
    a, b = two_runs

    def section(*runs):
        r = harness("compare", *map(str, runs), "--out", str(tmp_path / "x"))
        assert r.returncode == 0, r.stderr
        md = (tmp_path / "x" / "compare.md").read_text()
        return md.split("## Timed rows measured twice", 1)[1] if "## Timed rows measured twice" in md else None

    assert section(a, b) is None  # 1 thread and 2: no configuration in common
    again = _copy(b, tmp_path, "again")  # the same traces: every row repeats exactly
    spec = [i for i in json.loads((b / "plan.json").read_text())["instances"] if i["draft"] != "none"]
    n, greedy = len(spec) * len(CATEGORIES), sum(i["policy"]["temperature"] == 0 for i in spec) * len(CATEGORIES)
    text = section(b, again)
    assert f"again against {b.name}: {n} timed rows in both" in text
    assert f"within 10% of each other in {n}, greedy {greedy} of {greedy}." in text
    assert "Read as repeats" not in text  # every row within: no error to solve for
    shorter = _copy(b, tmp_path, "shorter")
    _edit_plan(shorter, lambda p: p["params"].update(max_tokens=p["params"]["max_tokens"] // 2))
    assert section(b, shorter) is None  # other lengths: not the same measurement


# -- runs and options the bad-input sweep found (issue 43), on copies of a small committed run: no sweep --------

SMOKE = ROOT / "reports" / "runs" / "20261202-054828-vm"


def _two_hosts(tmp_path):
    """The committed run as two hosts' runs of one name (both hosts called vm), in hostA/ and hostB/."""
    return [Path(shutil.copytree(SMOKE, tmp_path / h / "runs" / SMOKE.name)) for h in ("hostA", "hostB")]


@pytest.mark.parametrize("paths, want", [
    (["a/x", "b/y"], ["x", "y"]),
    (["/h/A/runs/vm", "/h/B/runs/vm", "/h/B/runs/other"], ["vm (A/runs)", "vm (B/runs)", "other"]),
    (["/p/a/x/vm", "/p/b/x/vm", "/p/a/y/vm"], ["vm (a/x)", "vm (b/x)", "vm (a/y)"]),
    (["/vm", "/d/vm"], ["vm (/)", "vm (d)"]),
], ids=["apart", "two-hosts", "three", "at-the-root"])
def test_runs_of_one_name_are_told_apart(paths, want):
    from harness.compare.runs import labels
    assert labels([Path(p) for p in paths]) == want


def test_two_hosts_runs_of_one_name_keep_their_own_columns(tmp_path):
    a, b = _two_hosts(tmp_path)
    r = harness("compare", a, b, "--out", tmp_path / "out", "--format", "md,json")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    names = [f"{SMOKE.name} (hostA/runs)", f"{SMOKE.name} (hostB/runs)"]
    assert [m["run"] for m in data["machines"]] == names
    per_run = {n: [v for v in data["verdicts"] if v["run"] == n] for n in names}
    assert len(per_run[names[0]]) == len(per_run[names[1]]) > 0
    md = (tmp_path / "out" / "compare.md").read_text()
    assert [m["run"] for m in md_table(md, "## Machines")] == names
    assert all(x["A"] and x["B"] for x in md_table(md, "# Speculative decoding across machines"))


def _gz_empty(f: Path) -> None:
    f.write_bytes(b"")


def _gz_of_nothing(f: Path) -> None:
    import gzip
    f.write_bytes(gzip.compress(b""))


def _plain_cut_to_nothing(f: Path) -> None:
    f.with_name(f.name.removesuffix(".gz")).write_text("")
    f.unlink()


# (what is done to hostB's copy: the damage, the trace it is done to) and the words of the one line
DAMAGED = {
    "empty-gz": (_gz_empty, "traces/g3-6d79a589cf.jsonl.gz", ["traces/g3-6d79a589cf.jsonl.gz holds no record"]),
    "gz-of-nothing": (_gz_of_nothing, "traces/base-493ec14085.jsonl.gz",
                      ["traces/base-493ec14085.jsonl.gz holds no record"]),
    "paired-gz-empty": (_gz_empty, "paired/traces/g3-6d79a589cf.jsonl.gz",
                        ["paired/traces/g3-6d79a589cf.jsonl.gz holds no record"]),
    "plain-trace-empty": (_plain_cut_to_nothing, "traces/g3-9c0aa52177.jsonl.gz",
                          ["traces/g3-9c0aa52177.jsonl holds no record"]),
}


@pytest.mark.parametrize("damage, trace, words", list(DAMAGED.values()), ids=list(DAMAGED))
def test_a_run_whose_trace_holds_nothing_is_refused(damage, trace, words, tmp_path):
    """Its configuration would drop out of the verdicts without a word: refused, naming the trace, nothing
    written."""
    a, b = _two_hosts(tmp_path)
    damage(b / trace)
    one_line_error(harness("compare", a, b, "--out", tmp_path / "out"), str(b), *words, "restore the file")
    assert not (tmp_path / "out").exists()


def test_home_in_compares_paths_is_expanded(tmp_path):
    """'~/x' reaches the harness unexpanded when quoted or after --out=: it is the home folder, not a folder
    named ~."""
    _two_hosts(tmp_path / "home")
    runs = [f"~/hostA/runs/{SMOKE.name}", f"~/hostB/runs/{SMOKE.name}"]
    r = harness("compare", *runs, "--out=~/cmp", cwd=tmp_path, env={"HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "home" / "cmp" / "compare.md").is_file() and not (tmp_path / "~").exists()
    assert r.stdout.strip() == str(tmp_path / "home" / "cmp" / "compare.md")


ENGINES = {  # issue 57, case 169: (each run's engine and its rows' llama-server version, the note's words)
    "169-server-beside-the-loop": ((("harness", None), ("server", "version: 4242 (f)")),
                                   ["a was measured in the harness loop, b in the llama-server 4242 (f)",
                                    "differ by engine as well as by machine"]),
    "169-two-servers": ((("server", "version: 1 (x)"), ("server", "version: 2 (y)")),
                        ["llama-server 1 (x), b in the llama-server 2 (y)"]),
    "one-engine": ((("harness", None), ("harness", None)), []),
}


@pytest.mark.parametrize("engines, words", list(ENGINES.values()), ids=list(ENGINES))
def test_runs_of_different_engines_are_compared_and_say_so(tmp_path, engines, words):
    from harness.compare.runs import Run, require_comparable
    runs = []
    for name, (engine, version) in zip("ab", engines):
        (tmp_path / name).mkdir()
        row = {"config": "c", "unit": "c", "status": "ok"} | ({"llama_server_version": version} if version else {})
        (tmp_path / name / "results.jsonl").write_text(json.dumps(row) + "\n")
        runs.append(Run(tmp_path / name, {"params": {"engine": engine}, "instances": [], "models": {},
                                          "prompt_ids": ["p"], "prompt_digests": {"p": "0"}}))
    notes = [n for n in require_comparable(runs) if "engine" in n]
    assert len(notes) == (1 if words else 0), notes
    for w in words:
        assert w in notes[0], notes
    assert runs[0].machine()["engine"] == ("harness loop" if engines[0][0] == "harness" else "llama-server 1 (x)")


def test_a_contradicted_prediction_is_compared_as_the_answer_gives_it():
    """compare sets each machine's answer side by side: a predicted speculate its timed run contradicted is the
    answer's inconclusive there, not the prediction."""
    from harness.compare.runs import _answered
    from harness.report.replayed import predicted_verdicts
    from tests.test_answer import INSTANCE, _fast_pred, _timed
    pred = _timed(_fast_pred(), 0.60, 0.52, 0.69)
    v = predicted_verdicts(pred).with_columns(pl.format("{} g={}", "proposer", "gamma").alias("best"))
    assert set(v["verdict"]) == {"speculate"}
    got = _answered(v, {"replay": pred, "replay_verdicts": v}, {"instances": [INSTANCE], "params": {}})
    assert set(got["verdict"]) == {"inconclusive"} and got.columns == v.columns


def test_reports_compare_ignored():
    """compare's default output is not committed; predict's are, only those committed already."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert "reports/compare/" in lines
    assert "reports/predict/*" in lines
