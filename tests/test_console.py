"""The console script's standard streams and --help's layout (console.py), against issue 43's bad-input
sweep and issue 44, item 6: closed standard streams at start; bench's first screen, the advanced options
below it, the maintenance commands apart."""
from __future__ import annotations

import os
import shlex
import subprocess

import click
import pytest

from tests.conftest import PROMPT_FILE, T
from tests.helpers import HARNESS, ROOT, harness, only_run


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_bench_with_stdout_and_stderr_closed_runs_and_reports(tmp_path, smol):
    """Progress wrote to a None stderr: a traceback, and a half-made run directory."""
    out = tmp_path / "out"
    # a draft given: a bare target runs the default profile's method (bench.autodraft), minutes of it
    cmd = shlex.join([*HARNESS, "bench", "--target", T, "--draft", "ngram:2", "--prompts", str(PROMPT_FILE),
                      "--categories", "code", "--per-category", "1", "--max-tokens", "4", "--allow-busy",
                      "--busy-threshold", "1", "--out", str(out)]) + " >&- 2>&-"
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=os.environ | {"CI": "true"}, stdin=subprocess.DEVNULL)
    assert r.returncode == 0
    run = only_run(out)
    assert (out / f"{run.name}.md").exists() and (run / "results.jsonl").exists()


def _help(*args) -> dict[str, list[str]]:
    """`harness ARGS --help` at 80 columns, as its sections: heading -> the options (or commands) listed under it."""
    r = harness(*args, "--help", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    sections, rows = {}, None
    for line in r.stdout.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            rows = sections.setdefault(line[:-1], [])
        elif rows is not None and line.startswith("  ") and not line.startswith("   "):
            rows.append(line.split()[0])
    return sections


def test_bench_help_shows_what_a_user_needs_first_and_every_option_once():
    from harness.cli import bench
    sections = _help("bench")
    first, rest = sections["Options"], sections["Advanced options (docs/usage.md)"]
    assert list(sections) == ["Options", "Advanced options (docs/usage.md)"]
    assert len(first) <= 16 and {"--profile", "--target", "--draft", "--gamma", "--dry-run", "--help"} <= set(first)
    assert {"--replay-gamma", "--paired", "--timed-subset", "--busy-threshold", "--cache-type-k-draft"} <= set(rest)
    declared = [p.opts[0] for p in bench.params if isinstance(p, click.Option)]
    assert sorted(first + rest) == sorted([*declared, "--help"])  # none left out, none twice


def test_harness_help_lists_the_maintenance_commands_apart():
    from harness.cli import cli
    sections = _help()
    assert sections["Maintenance commands"] == ["archive", "crosscheck"]
    assert {"bench", "run", "report", "models", "predict"} <= set(sections["Commands"])
    assert sorted(sections["Commands"] + sections["Maintenance commands"]) == sorted(cli.commands)
    assert _help("predict")["Maintenance options"] == ["--against"]


def test_run_with_stdout_closed_writes_nothing_and_exits_0(smol):
    cmd = shlex.join([*HARNESS, "run", T, "--prompt", "hi", "--max-tokens", "4"]) + " >&-"
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=os.environ | {"CI": "true"}, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
