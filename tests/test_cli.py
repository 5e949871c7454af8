"""cli.main and the bench command's parsing, against issue 43's bad-input sweep: closed standard streams, an option
that takes one value given twice."""
from __future__ import annotations

import os
import shlex
import subprocess

from tests.conftest import PROMPT_FILE, T
from tests.helpers import HARNESS, ROOT, harness, one_line_error, only_run


def test_bench_with_stdout_and_stderr_closed_runs_and_reports(tmp_path, smol):
    """Progress wrote to a None stderr: a traceback, and a half-made run directory."""
    out = tmp_path / "out"
    cmd = shlex.join([*HARNESS, "bench", "--target", T, "--prompts", str(PROMPT_FILE), "--categories", "code",
                      "--per-category", "1", "--max-tokens", "4", "--allow-busy", "--busy-threshold", "1", "--out",
                      str(out)]) + " >&- 2>&-"
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=os.environ | {"CI": "true"}, stdin=subprocess.DEVNULL)
    assert r.returncode == 0
    run = only_run(out)
    assert (out / f"{run.name}.md").exists() and (run / "results.jsonl").exists()


def test_a_profile_given_twice_is_refused(tmp_path):
    r = harness("bench", "--profile", "smoke", "--profile", "default", "--out", tmp_path / "out")
    one_line_error(r, "--profile given 2 times", "smoke, default")
    assert not (tmp_path / "out").exists()
