"""rundir: a plan.json that cannot be read as a plan is refused in one line (by read_plan, so by every reader:
resume, report, compare), and two runs started in the same second get two directories (issue 43)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.plan import Instance, Params
from harness.rundir import RUN_SCHEMA, new_run_dir, read_plan
from tests.helpers import harness, one_line_error


def _plan(**over) -> dict:
    inst = asdict(Instance("m", "none", 0, {"temperature": 0.0}, 0, 0, 0))
    return {"schema": RUN_SCHEMA, "params": asdict(Params(target=["m"])), "instances": [inst], "prompt_ids": [],
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
