"""JSONL records: a half-written line left by a kill never swallows the next record, and is repaired away."""
import json

from harness.rundir import finished, record_result, repair_results
from harness.trace import append_record, read_records, repair


def test_a_partial_last_line_does_not_swallow_the_next_record(tmp_path):
    f = tmp_path / "results.jsonl"
    f.write_text('{"config": "a", "status": "ok"}\n{"config": "b", "sta')  # killed mid-write
    append_record(f, {"config": "c", "status": "ok"})
    assert [r["config"] for r in read_records(f)] == ["a", "c"]


def test_repair_cuts_only_a_partial_last_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"x": 1}\n{"x": 2')
    assert repair(f) is True
    assert f.read_text() == '{"x": 1}\n'
    assert repair(f) is False and f.read_text() == '{"x": 1}\n'
    f.write_text('{"x": 1')
    assert repair(f) is True and f.read_text() == ""
    assert repair(tmp_path / "missing.jsonl") is False


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
