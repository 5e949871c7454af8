"""bench.units: a unit that ran while another process took the CPU is measured again at the end of its pass, and
no answer rests on one still busy. A real spinning process, on SmolLM2: a spell during the plain baseline only
(measured again, clean), and one for the whole run (no verdict, with the reason on the answer's line)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.analysis.noise import unit_summary
from harness.analysis.verdict import BUSY, SPECULATE
from tests.conftest import PROMPT_FILE, T
from tests.helpers import HARNESS, ROOT, only_run

ARGS = ("bench", "--target", T, "--draft", "ngram:2", "--gamma", "1,2", "--prompts", str(PROMPT_FILE),
        "--categories", "code", "--per-category", "2", "--max-tokens", "8", "--replay", "--replay-gamma", "2",
        "--timed-subset", "1", "--paired", "--threads", "1")
SPIN = [sys.executable, "-c", "while 1: pass"]


def _bench(out: Path, spin_until) -> tuple[subprocess.CompletedProcess, Path]:
    """The bench in a process of its own, a spinning process started once its run directory exists (after the
    idle check) and stopped when spin_until(run_dir) says."""
    env = os.environ | {"CI": "true"}
    bench = subprocess.Popen([*HARNESS, *ARGS, "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    spinner = None
    try:
        while bench.poll() is None:
            runs = list((out / "runs").glob("*/plan.json")) if (out / "runs").is_dir() else []
            if runs and spinner is None:
                spinner = subprocess.Popen(SPIN)
            if spinner is not None and spin_until(runs[0].parent):
                break
            time.sleep(0.1)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    stdout, stderr = bench.communicate(timeout=600)
    return subprocess.CompletedProcess(bench.args, bench.returncode, stdout, stderr), only_run(out)


def _noise(run: Path, unit: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "noise.jsonl").read_text().splitlines()) if r.get("unit") == unit]


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_a_busy_spell_in_the_baseline_is_measured_again(tmp_path):
    def first_row(run: Path) -> bool:
        f = run / "results.jsonl"
        return f.exists() and f.read_text().strip() != ""
    r, run = _bench(tmp_path, first_row)
    assert r.returncode == 0, r.stderr
    base = json.loads((run / "results.jsonl").read_text().splitlines()[0])["unit"]
    recs = _noise(run, base)
    assert unit_summary(recs[0])["busy"], "the spinner did not make the baseline busy"
    assert "measuring 1 unit(s) again that ran on a busy machine" in r.stderr
    assert len(recs) == 2 and not unit_summary(recs[-1])["busy"]
    answers = json.loads((run / "answer.json").read_text())
    assert answers and all(a["verdict"] != BUSY and "busy machine" not in (a["why"] or "") for a in answers)


@pytest.mark.slow  # a second bench under load: about a minute
def test_a_run_busy_throughout_answers_no_verdict(tmp_path):
    r, run = _bench(tmp_path, lambda run: False)
    assert r.returncode == 0, r.stderr
    assert "again that ran on a busy machine" in r.stderr
    answers = json.loads((run / "answer.json").read_text())
    assert answers and all(a["verdict"] == BUSY and a["server"] is None for a in answers)
    assert all(a["verdict"] != SPECULATE for a in answers)
    first = (run.parent.parent / "latest.md").read_text().splitlines()[:60]
    assert any("**no verdict**" in x and "other processes" in x for x in first), "\n".join(first)
