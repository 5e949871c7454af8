"""The busy-machine guard (bench.noise) end to end: a real competing load refused (and with --allow-busy marked
unreliable), an idle machine's run without complaint, a worker stopped and resumed in a loop marked."""
import json
import subprocess
import sys
import time

import pytest

from harness.analysis.noise import SLOWED_MIN_S, unit_summary
from tests.conftest import PROMPT_FILE, T
from tests.helpers import diagnostics_md, harness, harness_process, one_line_error, only_run
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
        r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--max-tokens", "64",
                    "--threads", "2", "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "2",
                    "--paired", "--busy-threshold", "0.5", "--out", str(tmp_path / "r"))
    finally:
        done.set()
        t.join()
    assert r.returncode == 0, r.stderr
    assert "SLOWED" in r.stderr
    run = only_run(tmp_path / "r")
    noise = [json.loads(x) for x in (run / "noise.jsonl").read_text().splitlines()]
    # the rule judges units of SLOWED_MIN_S seconds or more: 64 tokens last that long at 20% of a fast CPU
    judged = [unit_summary(n) for n in noise if n.get("config") and len(n["own_shares"]) >= SLOWED_MIN_S]
    assert len(judged) >= 2 and all(u["slowed"] and u["foreign_max"] < 0.5 for u in judged)
    verdicts = (tmp_path / "r" / f"{run.name}.md").read_text().split("## Verdict per category", 1)[1]
    assert "unreliable (busy machine)" in verdicts.split("##", 1)[0] or "BUSY" in diagnostics_md(run)
