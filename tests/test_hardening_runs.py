"""Run directories under stress: two benches of one run, a run whose rows or traces were damaged, a run whose
every configuration failed, a signal to bench, a model file swapped under its name, options that mean nothing.
Each case: what the user does, the exit code, the one line that says what is wrong (or what the run is now)."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.rundir import finished, trace_file
from harness.trace import read_records
from tests.conftest import PROMPT_FILE, T
from tests.helpers import HARNESS, ROOT, copy_run, harness, one_line_error, only_run, report_md

FAST = ("--target", T, "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1",
        "--max-tokens", "6", "--draft", "ngram:2", "--gamma", "2")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, smol) -> Path:
    """A finished two-configuration run (the baseline and ngram:2 at gamma 2): what the damage cases copy."""
    out = tmp_path_factory.mktemp("small")
    r = harness("bench", *FAST, "--allow-busy", "--out", out)
    assert r.returncode == 0, r.stderr
    return only_run(out)


def _rows(run: Path) -> list[str]:
    return (run / "results.jsonl").read_text().splitlines(keepends=True)


# -- 1. two benches of one run --------------------------------------------------------------------------------

def test_a_run_another_process_holds_is_refused(small_run, tmp_path):
    run = copy_run(small_run, tmp_path)
    rows = _rows(run)
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
    assert _rows(run) == rows  # nothing written
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
    assert len(_rows(run)) == 2  # each configuration once
    assert harness("report", run, "--check").returncode == 0


# -- 2. a configuration without its row or trace, or with two rows --------------------------------------------

def _dup_row(run):
    rows = _rows(run)
    (run / "results.jsonl").write_text("".join(rows + rows[:1]))


def _drop_trace(run):
    unit = next(u for u, r in finished(run).items() if r["draft"] != "none")
    trace_file(run, unit).unlink()


def _cut_row(run):
    rows = _rows(run)
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


# -- 3. every configuration failed ------------------------------------------------------------------------------

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
    rows = [json.loads(x) for x in _rows(run)]
    assert rows and all(x["status"] == "error" for x in rows), rows
    md = report_md(run)
    assert all(x["error"] in md for x in rows), md
    assert not (run / "drift").exists()  # the failed baseline is not run again for the drift check
    assert harness("report", run).returncode == 0


# -- 4. SIGTERM and SIGHUP to bench -----------------------------------------------------------------------------

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
    rows = _rows(run)
    time.sleep(3)  # an orphaned worker would append its row now
    assert _rows(run) == rows and 1 <= len(rows) < 4
    assert (out / f"{run.name}.md").exists()


@pytest.mark.slow  # 18-32 s; the fast tier interrupts mid-unit in test_replay_bench (replay and timed subset)
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


# -- 5. a model file that changed under its catalog name --------------------------------------------------------

@pytest.fixture
def own_models(tmp_path, smol):
    """The target and its sidecar in a models directory of the test's own (HARNESS_MODELS_DIR), to change."""
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(smol, d / smol.name)
    shutil.copy(smol.with_name(smol.name + ".json"), d / (smol.name + ".json"))
    return d


def _change(model: Path) -> None:
    with open(model, "ab") as f:  # still a loadable GGUF, another sha256
        f.write(b"\0" * 32)


def test_run_refuses_a_model_file_that_differs_from_its_verified_sidecar(own_models, tmp_path):
    env = {"HARNESS_MODELS_DIR": str(own_models), "HARNESS_CATALOG": str(ROOT / "models.toml")}
    args = ("run", T, "--prompt", "hi", "--max-tokens", "2", "--draft", "ngram:2")
    assert harness(*args, env=env).returncode == 0  # copied: mtime moved, same sha256; the sidecar is updated
    _change(own_models / f"{T}.gguf")
    one_line_error(harness(*args, env=env), T, "not the file that was verified", f"harness models fetch {T}")
    one_line_error(harness("bench", *FAST, "--allow-busy", "--out", tmp_path / "o", env=env),
                   "not the file that was verified")


@pytest.mark.slow  # a model copied and hashed: 14 s
def test_resume_refuses_a_model_file_other_than_the_plans(own_models, tmp_path):
    from harness.models.store import mark_verified, sha256_file
    env = {"HARNESS_MODELS_DIR": str(own_models), "HARNESS_CATALOG": str(ROOT / "models.toml")}
    out = tmp_path / "o"
    assert harness("bench", *FAST, "--allow-busy", "--out", out, env=env).returncode == 0
    run = only_run(out)
    model = own_models / f"{T}.gguf"
    _change(model)
    mark_verified(model, sha256_file(model))  # swapped and verified: the sidecar agrees, the plan does not
    one_line_error(harness("bench", "--resume", run, "--allow-busy", env=env), T, "not the file this run started with")


# -- 6. options accepted but meaningless; 7. --resume with options of its own ----------------------------------

BASE = ("bench", "--target", T, "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1")


@pytest.mark.parametrize("args, words", [
    ((*BASE, "--draft", "smollm2-135m-instruct-q2_k", "--gamma", "2", "--draft-n-min", "5"),
     ["--draft-n-min 5", "--gamma 2", "never speculate"]),
    ((*BASE, "--draft", "ngram:2", "--gamma", "auto:0"), ["--gamma auto:0", "N >= 1"]),
    ((*BASE, "--draft", "ngram:2", "--threads", "1000"), ["--threads 1000", f"{os.cpu_count()} logical cores"]),
    (("bench", "--resume", "RUN", "--gamma", "5", "--max-tokens", "2", "--temp", "0.7"),
     ["--resume takes the run's own options", "--gamma, --max-tokens, --temp"]),
    (("bench", "--resume", "RUN", "--busy-threshold", "0.5"), ["--resume takes", "--busy-threshold"]),
], ids=["n-min-above-gamma", "gamma-auto-0", "threads-above-cores", "resume-with-options",
        "resume-with-threshold"])
def test_meaningless_options_are_refused_in_one_line(tmp_path, args, words):
    run = tmp_path / "runs" / "r1"
    (run / "traces").mkdir(parents=True)
    (run / "plan.json").write_text("{}")
    args = [str(run) if a == "RUN" else a for a in args]
    r = harness(*args, "--out", tmp_path / "o") if "--resume" not in args else harness(*args)
    one_line_error(r, *words)
    assert not (tmp_path / "o").exists()
