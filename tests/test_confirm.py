"""bench.confirm (`--server-check N`): a run's answers measured in llama-server inside the run, on a copy of the
session's timed run with the fake llama-server (tests/fake_llama_server.py); the budget, a failing server and a
missing one; and the report's line under each answer."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from harness.analysis.verdict import SPECULATE
from harness.bench.confirm import server_check
from harness.checkrows import UNMEASURED
from harness.plan import Params
from harness.report import write_reports
from harness.rundir import read_plan
from tests.helpers import copy_run


@pytest.fixture
def run(timed_run, tmp_path) -> Path:
    return copy_run(timed_run, tmp_path)


def rows(run: Path) -> list[dict]:
    return json.loads((run / "crosscheck.json").read_text())["rows"]


def report(run: Path) -> str:
    return write_reports(run).read_text()


def test_every_answer_runs_in_llama_server_and_the_answer_shows_it(run, fake):
    """Every answer's configuration is measured: the bottom lines first (one a policy, the categories pooled),
    then speculate answers before the others; under each answer of the report, its llama-server flags, speedup
    with interval, acceptance and outputs compared."""
    server_check(Params(server_check=2, llama_server=str(fake)), run, read_plan(run))
    got = rows(run)
    assert len(got) == 6 and all(r.get("llama") for r in got)
    pooled, per_category = got[:2], got[2:]
    assert {r["category"] for r in pooled} == {"all"} and "all" not in {r["category"] for r in per_category}
    first = [r["verdict"] == SPECULATE for r in per_category]
    assert first == sorted(first, reverse=True)  # speculate answers before the others
    assert all(len(r["prompts"]) == 2 for r in per_category)
    md = report(run)
    answer = md.split("## The answer", 1)[1].split("\n## ", 1)[0]
    assert answer.count("In llama-server (`--spec-type ") == 4
    assert "1.5" in answer and "outputs equal to plain" in answer and "crosscheck.md" in answer


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_the_budget_stops_the_check_and_the_report_says_what_was_left(run, fake):
    left = itertools.chain([100.0] * 3, itertools.repeat(0.0))  # the two bottom lines and one answer
    server_check(Params(server_check=1, llama_server=str(fake)), run, read_plan(run), lambda: next(left))
    got = rows(run)
    assert sum(bool(r.get("llama")) for r in got) == 3
    assert [r["skip"] for r in got if not r.get("llama")] == [UNMEASURED] * 3
    md = report(run)
    assert "not measured" not in md and "1 of the 4 answers ran there within the run's budget" in md
    assert md.count("In llama-server (`") == 1
    server_check(Params(server_check=1, llama_server=str(fake)), run, read_plan(run))  # with time: the rest, once
    assert len(rows(run)) == 6 and all(r.get("llama") for r in rows(run))


def test_a_failing_server_leaves_a_row_and_the_check_goes_on(run, fake, monkeypatch):
    monkeypatch.setenv("FAKE_SERVER_MODE", "exit")
    server_check(Params(server_check=1, llama_server=str(fake)), run, read_plan(run))  # no exception
    got = rows(run)
    assert len(got) == 6 and all(r["skip"].startswith("failed: ") and "exited with code 3" in r["skip"] for r in got)


def test_without_a_llama_server_the_run_and_its_report_say_so(run, tmp_path, capsys):
    plan = read_plan(run)
    server_check(Params(server_check=1, llama_server=str(tmp_path / "none" / "llama-server")), run, plan)
    assert "llama-server check: not run:" in capsys.readouterr().err
    assert read_plan(run)["server_check"]["not_run"]
    assert not (run / "crosscheck.json").exists()
    assert "Not run in llama-server (`--server-check`):" in report(run)


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_a_check_the_budget_cannot_hold_is_passed_over_for_cheaper_ones(run, fake):
    """Priced by cost(check) and scaled by what the measured ones took against their price: the first check, priced
    over the time left, is skipped, and the cheaper ones after it run."""
    from harness.crosscheck.checks import checks
    from harness.crosscheck.run import measure_checks
    found, _ = checks(run, "all", 1)
    price = {id(c): 1e6 if k == 0 else 0.01 for k, c in enumerate(found)}
    rows, measured = measure_checks(run, found, [], fake, "version: 4242 (fake0000)", None, 30.0, 30.0,
                                    keep_going=True, time_left=lambda: 60.0, cost=lambda c: price[id(c)])
    assert measured == len(found) - 1 and rows[0]["skip"] == UNMEASURED and all(r.get("llama") for r in rows[1:])
