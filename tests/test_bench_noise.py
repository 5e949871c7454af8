"""Verdicts you can trust, end to end: the busy-machine guard against a real competing load, and evidence added
until verdicts settle (--until-confident) with its budget, its running out of prompts, and --resume."""
import json
import subprocess
import sys
import time

import pytest

from harness.analysis.noise import summarize, unit_summary
from tests.conftest import PROMPT_FILE
from tests.helpers import diagnostics_md, harness, harness_process, one_line_error, only_run

T = "smollm2-135m-instruct-q4_1"
# The guard's threshold in these tests: a spinning core is half of a 2-core machine's capacity (a quarter of 4
# cores'), while these VMs' own background work reaches 6-15% of the cores now and then.
GUARD = "0.2"
QUICK = ["--target", T, "--draft", "ngram:2", "--gamma", "2", "--max-tokens", "12", "--threads", "1"]
ONE = ["--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1"]


@pytest.fixture
def spinner():
    """Another process spinning on one core, as long as the test runs."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(1.0)
    yield p
    p.kill()
    p.wait()


@pytest.mark.slow  # a real spinning process beside a real run: 20 s
def test_a_busy_machine_is_refused_and_with_allow_busy_marked_unreliable(tmp_path, smol, spinner):
    """In processes of their own: the guard counts this process's children as its own, and the spinner is one."""
    args = [*QUICK, *ONE, "--busy-threshold", GUARD,
            "--out", str(tmp_path / "r")]
    r = harness_process("bench", *args)
    one_line_error(r, "busy", "--allow-busy", f"pid {spinner.pid}")
    assert not (tmp_path / "r" / "runs").exists() or not any((tmp_path / "r" / "runs").glob("2*"))
    r = harness_process("bench", *args, "--allow-busy")
    assert r.returncode == 0, r.stderr
    assert "BUSY" in r.stderr
    run = only_run(tmp_path / "r")
    noise = [json.loads(x) for x in (run / "noise.jsonl").read_text().splitlines()]
    assert noise[0]["unit"] == "idle-check" and noise[0]["busy"] and noise[0]["foreign"] > 0.3
    units = [unit_summary(n) for n in noise if n.get("config")]
    assert units and all(n["busy"] and n["foreign_max"] > 0.3 for n in units)
    md = (tmp_path / "r" / f"{run.name}.md").read_text()
    verdicts = md.split("## Verdict per category", 1)[1].split("##", 1)[0]
    assert "unreliable (busy machine)" in verdicts
    assert "speculate" not in verdicts.split("|---")[-1] and "| plain decoding" not in verdicts
    noise_md = diagnostics_md(run)  # the harness's checks of itself
    assert "## Machine noise" in noise_md and "BUSY" in noise_md.split("## Machine noise", 1)[1]
    spinner.kill()
    spinner.wait()
    r = harness_process("bench", "--resume", str(run), "--rerun-busy")  # the machine idle again: measure again
    assert r.returncode == 0, r.stderr
    assert "measuring 2 unit(s) again" in r.stderr and "2 unit(s) to run" in r.stderr and "BUSY" not in r.stderr
    md = (tmp_path / "r" / f"{run.name}.md").read_text()
    assert "unreliable" not in md.split("## Verdict per category", 1)[1].split("##", 1)[0]


@pytest.mark.slow  # the busy test's idle twin, a real run in a process of its own: 20 s
def test_an_idle_machine_runs_without_complaint(tmp_path, smol):
    r = harness("bench", *QUICK, *ONE, "--busy-threshold", GUARD,
                "--out", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    assert "BUSY" not in r.stderr and "estimated" in r.stderr and "took" in r.stderr.splitlines()[-1]
    noise = [json.loads(x) for x in (only_run(tmp_path / "r") / "noise.jsonl").read_text().splitlines()]
    assert not noise[0]["busy"] and not any(unit_summary(n)["busy"] for n in noise[1:])


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
    assert took["total"] >= took["units"] + took["rounds"] > 0 and "units" in parts
    assert f"took {took['total'] / 60:.1f} min before its report" in md


@pytest.mark.parametrize("args, words", [
    (["--until-confident", "--budget-min", "0"], ["--budget-min", "above 0"]),
    (["--until-confident", "--budget-min", "-5"], ["--budget-min", "above 0"]),
    (["--busy-threshold", "0"], ["--busy-threshold", "(0, 1]"]),
    (["--busy-threshold", "1.5"], ["--busy-threshold", "(0, 1]"]),
])
def test_bad_confidence_options_are_one_line(tmp_path, args, words):
    one_line_error(harness("bench", "--target", T, *args, "--out", str(tmp_path / "r")), *words)


def test_busy_is_a_sustained_stretch_not_a_blip():
    blip = [0.0] * 20 + [0.1] + [0.0] * 20  # 200 ms of one core (of two) in one second: a shell command
    assert not summarize(blip, 0.05)["busy"] and summarize(blip, 0.05)["foreign_max"] == pytest.approx(0.01)
    spell = [0.0] * 10 + [0.08] * 10 + [0.0] * 10  # a tenth of a core (of two) for ten seconds
    assert summarize(spell, 0.05)["busy"]
    assert summarize([0.2, 0.2], 0.05)["busy"] and summarize([], 0.05) == {
        "foreign_mean": 0.0, "foreign_max": 0.0, "own_mean": None, "slowed": False, "busy": False}


def test_rerun_busy_needs_resume(tmp_path):
    one_line_error(harness("bench", "--target", T, "--rerun-busy", "--out", str(tmp_path / "r")), "--resume")


def test_a_slowed_worker_is_marked_though_no_other_process_is_busy():
    """A unit's own CPU share against what its threads ask for: stopped and resumed (a laptop's power management)
    it gets a fraction; a unit shorter than the window, or one with offload (asked None), is not judged."""
    from harness.analysis.noise import SLOWED
    idle = [0.0] * 12
    got = summarize(idle, 0.05, own=[0.15] * 12, asked=1.0)
    assert got["slowed"] and got["busy"] and got["own_mean"] == pytest.approx(0.15)
    assert not summarize(idle, 0.05, own=[0.9] * 12, asked=1.0)["busy"]
    assert not summarize(idle, 0.05, own=[SLOWED * 0.5 + 0.01] * 12, asked=0.5)["busy"]  # 1 thread of 2 cores
    assert not summarize(idle, 0.05, own=[0.1] * 2, asked=1.0)["busy"]  # too short to judge
    assert not summarize(idle, 0.05, own=[0.1] * 12, asked=None)["busy"]


@pytest.mark.slow  # a worker stopped and resumed for real: 25 s
def test_a_worker_stopped_and_resumed_in_a_loop_is_marked_unreliable(tmp_path, smol):
    """SIGSTOP and SIGCONT to the worker, 80% of the time stopped: foreign load stays near 0, yet the unit is
    marked, and its verdict says so."""
    import os
    import signal
    import threading

    import psutil
    done = threading.Event()

    def signal_all(pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # a worker that has just finished
                pass

    def workers():
        out = []
        for p in psutil.Process().children(recursive=True):
            try:
                if "spawn_main" in " ".join(p.cmdline()):
                    out.append(p.pid)
            except psutil.Error:
                pass
        return out

    def throttle():
        while not done.is_set():
            pids = workers()
            signal_all(pids, signal.SIGSTOP)
            time.sleep(0.4)
            signal_all(pids, signal.SIGCONT)
            time.sleep(0.1)
    t = threading.Thread(target=throttle, daemon=True)
    t.start()
    try:
        r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--max-tokens", "24",
                    "--threads", "2", "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "2",
                    "--paired", "--busy-threshold", "0.5", "--out", str(tmp_path / "r"))
    finally:
        done.set()
        t.join()
    assert r.returncode == 0, r.stderr
    assert "SLOWED" in r.stderr
    run = only_run(tmp_path / "r")
    noise = [json.loads(x) for x in (run / "noise.jsonl").read_text().splitlines()]
    units = [unit_summary(n) for n in noise if n.get("config")]
    assert units and all(u["slowed"] and u["foreign_max"] < 0.5 for u in units)
    verdicts = (tmp_path / "r" / f"{run.name}.md").read_text().split("## Verdict per category", 1)[1]
    assert "unreliable (busy machine)" in verdicts.split("##", 1)[0] or "BUSY" in diagnostics_md(run)
