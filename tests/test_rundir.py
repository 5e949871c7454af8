"""rundir: a plan.json that cannot be read as a plan is refused in one line (by read_plan, so by every reader:
resume, report, compare), and two runs started in the same second get two directories (issue 43). The results,
noise and traces: rows bench writes again for a unit run again are read, the last winning; rows it cannot have
written are refused in one line naming the file and the line, or named by `report --check` before it counts the
differences. The run's lock, a run whose rows or traces were damaged and then resumed, a run directory that cannot
be created."""
from __future__ import annotations

import fcntl
import gzip
import json
import os
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.instance import Instance
from harness.plan import Params
from harness.sampling import Policy
from harness.specs import NoDraft
from harness.rundir import (RUN_SCHEMA, drop_unreadable, finished, load_records, new_run_dir, noise_records, read_plan,
                            record_result, repair_results, replaced_models, rows_problems, trace_file,
                            traces_missing)
from harness.trace import compress
from tests.helpers import HARNESS, ROOT, copy_run, harness, one_line_error, result_rows


def _plan(**over) -> dict:
    inst = Instance("m", NoDraft(), 0, Policy(), 0, 0, 0).to_dict()
    return {"schema": RUN_SCHEMA, "params": Params(target=["m"]).to_dict(), "instances": [inst], "prompt_ids": [],
            "categories": []} | over


def _write(run: Path, plan) -> None:
    run.mkdir()
    if plan == "dir/":
        (run / "plan.json").mkdir()
    else:
        (run / "plan.json").write_text(json.dumps(plan))


CASES = {
    "schema-newer": (_plan(schema=99), ["schema 99", "newer harness", "upgrade"]),
    "params-unknown-key": (_plan(params=asdict(Params(target=["m"])) | {"warp": 9}),
                           ["'params'", "unknown key(s) warp", "restore"]),
    "instance-unknown-key": (_plan(instances=[_plan()["instances"][0] | {"warp": 9}]),
                             ["'instances'", "unknown key(s) warp"]),
    "instance-lacks-a-field": (_plan(instances=[{k: v for k, v in _plan()["instances"][0].items() if k != "target"}]),
                               ["'instances'", "lacks target"]),
    "params-not-a-table": (_plan(params=[1]), ["'params'", "not as `harness bench` writes it"]),
    "plan-is-a-directory": ("dir/", ["plan.json", "not a readable plan file"]),
}


@pytest.mark.parametrize("plan, words", list(CASES.values()), ids=list(CASES))
def test_a_plan_that_cannot_be_read_is_refused_in_one_line(tmp_path, plan, words):
    run = tmp_path / "run"
    _write(run, plan)
    with pytest.raises(HarnessError) as e:
        read_plan(run)
    for w in words:
        assert w in str(e.value), str(e.value)
    r = harness("bench", "--resume", run)  # the resume that tracebacked (a TypeError) or spoke of writing
    line = one_line_error(r, *words)
    assert "cannot write" not in line
    assert sorted(p.name for p in run.iterdir()) == ["plan.json"]  # nothing made in it


def test_a_plan_of_this_schema_and_one_from_before_schemas_are_read(tmp_path):
    for name, plan in (("now", _plan()), ("old", {k: v for k, v in _plan().items() if k != "schema"})):
        _write(tmp_path / name, plan)
        assert read_plan(tmp_path / name)["params"]["target"] == ["m"]


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    dirs = [new_run_dir(tmp_path) for _ in range(3)]
    stem = dirs[0].name
    assert stem.startswith("20260101-000000-") and [d.name for d in dirs] == [stem, f"{stem}-2", f"{stem}-3"]
    assert all((d / "traces").is_dir() for d in dirs)
    assert (tmp_path / "latest").resolve() == dirs[-1].resolve()


# -- results, noise and traces ------------------------------------------------------------------------------------

OK = {"config": "g2-a", "unit": "g2-a", "status": "ok", "target": "t", "draft": "d", "gamma": 2, "policy": {},
      "peak_rss_bytes": 1, "wall_s": 2.0, "kv_bytes": 3, "target_bytes": 4, "draft_bytes": 5, "attempt": "a1"}
ERROR = {k: v for k, v in OK.items() if k in ("config", "unit", "target", "draft", "gamma", "policy")} | {
    "status": "error", "error": "killed by signal 9"}


def _lines(*rows) -> str:
    return "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows)


# (case, results.jsonl, what finished() gives as unit -> wall_s (None: an error row), or the error line's words)
FINISHED_ROWS = [
    ("a unit run again: the last row wins", _lines(ERROR, OK, OK | {"wall_s": 9.0, "attempt": "a2"}),
     {"g2-a": 9.0}),
    ("a byte-identical copy", _lines(OK, OK), {"g2-a": 2.0}),
    ("a worker that died twice", _lines(ERROR, ERROR | {"error": "exit code 1"}), {"g2-a": None}),
    ("a row cut short mid-file", _lines(OK, '{"config": "g3-b", "sta\n', OK | {"unit": "g3-b", "config": "g3-b"}),
     {"g2-a": 2.0, "g3-b": 2.0}),
    ("one attempt's row with other values", _lines(OK, ERROR, OK | {"wall_s": 1.0}),
     ["results.jsonl lines 1 and 3", "unit g2-a", "wall_s differ", "restore"]),
    ("rows from before attempts, with other values", _lines(*({k: v for k, v in r.items() if k != "attempt"}
                                                             for r in (OK, OK | {"kv_bytes": 7}))),
     ["lines 1 and 2", "kv_bytes differ"]),
    ("a JSON list", _lines(OK, [1, 2]), ["results.jsonl line 2 is a JSON list", "restore"]),
    ("null", _lines("null\n", OK), ["results.jsonl line 1 is null"]),
    ("no unit and no config", _lines(OK, {"status": "ok"}), ["results.jsonl line 2 names no configuration"]),
]


@pytest.mark.parametrize("case, text, want", FINISHED_ROWS, ids=[r[0] for r in FINISHED_ROWS])
def test_finished(tmp_path, case, text, want):
    (tmp_path / "results.jsonl").write_text(text)
    if isinstance(want, dict):
        got = finished(tmp_path)
        assert {u: r.get("wall_s") for u, r in got.items()} == want
        return
    with pytest.raises(HarnessError) as e:
        finished(tmp_path)
    assert "\n" not in str(e.value) and str(tmp_path / "results.jsonl") in str(e.value)
    for w in want:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("text, words", [("null\n", ["noise.jsonl line 1 is null"]),
                                         ('{"share": 0.1}\n', ["noise.jsonl line 1 names no unit"]),
                                         ('[{"unit": "a"}]\n', ["line 1 is a JSON list"])],
                         ids=["null", "no unit", "list"])
def test_noise_records_refuse_a_line_bench_did_not_write(tmp_path, text, words):
    (tmp_path / "noise.jsonl").write_text('{"unit": "idle-check", "share": 0.0}\n' + text.replace("line 1", "line 2"))
    with pytest.raises(HarnessError) as e:
        noise_records(tmp_path)
    for w in words:
        assert w.replace("line 1", "line 2") in str(e.value), str(e.value)


# (case, where, results.jsonl, the problems rows_problems names)
PROBLEM_ROWS = [
    ("intact", "", _lines(ERROR, OK), []),
    ("status removed", "", _lines({k: v for k, v in OK.items() if k != "status"}),
     ["results.jsonl line 1 (unit g2-a) lacks status: it was changed after bench wrote it"]),
    ("memory removed", "", _lines({k: v for k, v in OK.items() if k not in ("kv_bytes", "wall_s")}),
     ["results.jsonl line 1 (unit g2-a) lacks wall_s, kv_bytes: it was changed after bench wrote it"]),
    ("a status bench never writes", "", _lines(OK | {"status": "done"}),
     ["results.jsonl line 1 (unit g2-a) has status 'done', none bench writes (ok, error, skipped): it was changed "
      "after bench wrote it"]),
    ("error without its error", "", _lines(OK | {"status": "error"}),
     ["results.jsonl line 1 (unit g2-a) has status error without the error that caused it: it was changed after "
      "bench wrote it"]),
    ("a side run's row", "drift", _lines({k: v for k, v in OK.items() if k != "policy"}),
     ["drift/results.jsonl line 1 (unit g2-a) lacks policy: it was changed after bench wrote it"]),
    ("a replay row measures no memory", "replay", _lines({k: v for k, v in OK.items() if not k.endswith("bytes")}
                                                          | {"peak_rss_bytes": 1}), []),
    ("cut, repeated, a list", "", _lines('{"config": "g2\n', OK, OK, [1]),
     ["results.jsonl line 1 is unreadable (cut short)", "results.jsonl line 3 repeats line 2 (unit g2-a)",
      "results.jsonl line 4 is a JSON list, not a result row"]),
]


@pytest.mark.parametrize("case, where, text, want", PROBLEM_ROWS, ids=[r[0] for r in PROBLEM_ROWS])
def test_rows_problems(tmp_path, case, where, text, want):
    (tmp_path / where).mkdir(exist_ok=True)
    (tmp_path / where / "results.jsonl").write_text(text)
    assert rows_problems(tmp_path) == want


# issue 57, case 163: a row measured on a file of another size than the plan's (the draft swapped mid-run)
REPLACED_ROWS = {
    "163-draft-another-quant": (OK | {"draft_bytes": 6}, ["g2-a was measured on a draft file d of 6 bytes, not the 5 "
                                                          "bytes the run started with", "replaced mid-run",
                                                          "delete that row"]),
    "target-another-file": (OK | {"target_bytes": 9}, ["on a target file t of 9 bytes, not the 4"]),
    "as-planned": (OK, []),
    "an-error-row": (ERROR | {"draft_bytes": 6}, []),
    "an-ngram-draft": (OK | {"draft_bytes": 0}, []),
}


@pytest.mark.parametrize("row, words", list(REPLACED_ROWS.values()), ids=list(REPLACED_ROWS))
def test_a_row_measured_on_a_replaced_model_is_named(row, words):
    got = replaced_models("g2-a", row, {"models": {"t": {"bytes": 4}, "d": {"bytes": 5}}})
    assert len(got) == (1 if words else 0), got
    for w in words:
        assert w in got[0], got


@pytest.mark.parametrize("name, data, want", [
    (None, None, ["traces/g2-a.jsonl is missing"]),
    ("g2-a.jsonl", b"", ["traces/g2-a.jsonl is empty"]),
    ("g2-a.jsonl.gz", gzip.compress(b"", mtime=0), ["traces/g2-a.jsonl.gz is empty"]),
    ("g2-a.jsonl.gz", b"", ["traces/g2-a.jsonl.gz is empty"]),
    ("g2-a.jsonl.gz", gzip.compress(b'{"type": "step"}\n', mtime=0), []),
], ids=["missing", "empty", "empty gz", "zero-byte gz", "intact"])
def test_traces_missing_counts_an_empty_trace(tmp_path, name, data, want):
    (tmp_path / "traces").mkdir()
    if name:
        (tmp_path / "traces" / name).write_bytes(data)
    assert traces_missing(tmp_path, OK, paired=False) == want
    assert traces_missing(tmp_path, ERROR, paired=False) == []


def test_drop_unreadable_writes_only_when_a_line_goes(tmp_path, monkeypatch):
    f = tmp_path / "results.jsonl"
    keep = _lines(OK, OK | {"error": "é"}).encode()
    f.write_bytes(keep)
    monkeypatch.setattr(type(f), "write_bytes", lambda *a: pytest.fail("an intact file was written"))
    assert drop_unreadable(f) == 0
    monkeypatch.undo()
    f.write_bytes(b'{"config": "g\n' + keep + b'{"error": "\xff"}\n')
    assert drop_unreadable(f) == 2 and f.read_bytes() == keep


# -- run directories under stress: a small run of their own, copied, then locked or damaged


# -- two benches of one run --------------------------------------------------------------------------------

def test_a_run_another_process_holds_is_refused(small_run, tmp_path):
    run = copy_run(small_run, tmp_path)
    rows = result_rows(run)
    holder = subprocess.Popen(["sleep", "60"])  # the pid the lock file names
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, f"{holder.pid}\n".encode())
        one_line_error(harness("bench", "--resume", run, "--allow-busy"), "another harness process",
                       f"pid {holder.pid}", "is running")
    finally:
        os.close(fd)
        holder.kill()
        holder.wait()
    assert result_rows(run) == rows  # nothing written
    r = harness("bench", "--resume", run, "--allow-busy")  # free again: resumes (nothing to run)
    assert r.returncode == 0 and "0 unit(s) to run" in r.stderr, r.stderr


@pytest.mark.slow  # two real processes: 9-15 s
def test_two_resumes_at_once_run_each_unit_once(small_run, tmp_path):
    """The process itself is under test: two real benches resuming the same run at the same moment."""
    run = copy_run(small_run, tmp_path)
    (run / "results.jsonl").write_text("")
    for f in (run / "traces").iterdir():
        f.unlink()
    env = os.environ | {"CI": "true"}
    ps = [subprocess.Popen([*HARNESS, "bench", "--resume", str(run), "--allow-busy"], cwd=ROOT, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in ps]
    codes = sorted(p.returncode for p in ps)
    assert codes == [0, 1], errs
    assert any("another harness process" in e for e in errs), errs
    assert len(result_rows(run)) == 2  # each configuration once
    assert harness("report", run, "--check").returncode == 0


# -- a configuration without its row or trace, or with two rows --------------------------------------------

def _dup_row(run):
    rows = result_rows(run)
    (run / "results.jsonl").write_text("".join(rows + rows[:1]))


def _drop_trace(run):
    unit = next(u for u, r in finished(run).items() if r["draft"] != "none")
    trace_file(run, unit).unlink()


def _cut_row(run):
    rows = result_rows(run)
    (run / "results.jsonl").write_text(rows[0][: len(rows[0]) // 2] + "\n" + "".join(rows[1:]))


@pytest.mark.parametrize("damage, words, resumed", [
    (_dup_row, "repeats line 1", 0),
    (_drop_trace, "is missing", 1),
    (_cut_row, "no result row", 1),
])
def test_check_fails_on_a_missing_or_doubled_row_and_resume_reruns_it(small_run, tmp_path, damage, words, resumed):
    run = copy_run(small_run, tmp_path)
    assert harness("report", run, "--check").returncode == 0
    damage(run)
    r = harness("report", run, "--check")
    one_line_error(r, "disagrees")
    assert words in r.stdout, r.stdout
    r = harness("bench", "--resume", run, "--allow-busy")
    assert r.returncode == 0 and f"{resumed} unit(s) to run" in r.stderr, r.stderr
    if resumed:
        assert harness("report", run, "--check").returncode == 0


# -- a run directory that cannot be made, a damaged plan, a directory that is not a run, a unit's trace in
# either form, a kill mid-write
def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--categories", "code", "--per-category", "1",
                "--max-tokens", "4", "--out", str(blocker / "runs"))
    one_line_error(r, "run directory")


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


def test_a_units_trace_is_found_in_either_form(tmp_path):
    (tmp_path / "traces").mkdir()
    assert trace_file(tmp_path, "u1") is None
    (tmp_path / "traces" / "u1.jsonl").write_text('{"config": "u1"}\n')
    (tmp_path / "traces" / "u2.jsonl").write_text('{"config": "u2"}\n')
    compress(tmp_path / "traces" / "u2.jsonl")
    assert trace_file(tmp_path, "u1").name == "u1.jsonl"
    assert trace_file(tmp_path, "u2").name == "u2.jsonl.gz"
    assert load_records(tmp_path, {"u1", "u2", "u3"}) == [{"config": "u1"}, {"config": "u2"}]
    # an archive stopped between writing the gzipped copy and removing the plain one: the plain one is read
    (tmp_path / "traces" / "u2.jsonl").write_text('{"config": "u2", "plain": true}\n')
    assert load_records(tmp_path, {"u2"}) == [{"config": "u2", "plain": True}]


def test_a_run_directory_keeps_every_result_after_a_kill_mid_write(tmp_path):
    (tmp_path / "drift").mkdir()
    (tmp_path / "results.jsonl").write_text(json.dumps({"config": "a", "status": "ok"}) + '\n{"config": "b"')
    (tmp_path / "drift" / "results.jsonl").write_text('{"config": "a", "st')
    record_result(tmp_path, {"config": "b", "status": "ok"})
    assert set(finished(tmp_path)) == {"a", "b"}
    repair_results(tmp_path)
    assert (tmp_path / "drift" / "results.jsonl").read_text() == ""
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["config"] for x in lines if x.startswith("{") and x.endswith("}")] == ["a", "b"]


def test_a_refused_run_leaves_latest_at_the_run_before(tmp_path):  # issue 57, case 114
    from harness.rundir import discard_run_dir, new_run_dir
    old = tmp_path / "20261201-000000-vm"
    old.mkdir()
    (old / "plan.json").write_text("{}")
    d = new_run_dir(tmp_path)
    assert (tmp_path / "latest").resolve() == d.resolve()
    discard_run_dir(d)
    assert not d.exists() and (tmp_path / "latest").resolve() == old.resolve()
    shutil.rmtree(old)
    discard_run_dir(new_run_dir(tmp_path))
    assert not (tmp_path / "latest").is_symlink()  # no run left to point at
