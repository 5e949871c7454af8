"""prompts.load and its files: what issue 43's bad-input sweep found. A category that would break the report's
Markdown is refused in one line naming the file and the category; a file or category given twice is read once; an
empty HARNESS_PROMPTS_DIR is unset, not the current directory."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.prompts import load, prompts_dir


def _line(pid: str, cat: str) -> str:
    return json.dumps({"id": pid, "category": cat, "text": "hi"}) + "\n"


@pytest.mark.parametrize("cat, shown", [("a|b", '"|"'), ("a\nb", '"\\n"'), ("code\r", '"\\r"'), ("a\tb", '"\\t"')],
                         ids=["pipe", "newline", "carriage-return", "tab"])
def test_a_category_that_would_break_the_reports_tables_is_refused(tmp_path, cat, shown):
    f = tmp_path / "p.jsonl"
    f.write_text(_line("ok", "code") + _line("x", cat))
    with pytest.raises(HarnessError) as e:
        load(paths=[f])
    msg = str(e.value)
    assert f"{f}:2:" in msg and json.dumps(cat) in msg and shown in msg and "rename" in msg and "\n" not in msg


@pytest.mark.parametrize("spell", [lambda f: f, lambda f: f.parent / "." / f.name], ids=["same", "another-spelling"])
def test_a_prompt_file_given_twice_is_read_once(tmp_path, spell):
    f = tmp_path / "p.jsonl"
    f.write_text(_line("a", "code") + _line("b", "chat"))
    assert [p.id for p in load(paths=[f, spell(f)])] == ["a", "b"]
    assert [p.id for p in load(categories=["code", "code"], paths=[f])] == ["a"]


def test_a_category_given_twice_is_read_once(tmp_path, monkeypatch):
    (tmp_path / "code.jsonl").write_text(_line("a", "code"))
    monkeypatch.setenv("HARNESS_PROMPTS_DIR", str(tmp_path))
    assert [p.id for p in load(categories=["code", "code"])] == ["a"]


def test_two_different_prompts_under_one_id_are_still_refused(tmp_path):
    f, g = tmp_path / "p.jsonl", tmp_path / "q.jsonl"
    f.write_text(_line("a", "code"))
    g.write_text(_line("a", "code"))
    with pytest.raises(HarnessError, match="duplicate prompt id 'a'"):
        load(paths=[f, g])


def test_an_empty_prompts_dir_variable_is_unset(monkeypatch):
    monkeypatch.setenv("HARNESS_PROMPTS_DIR", "")
    assert prompts_dir() == Path("prompts")
    monkeypatch.setenv("HARNESS_PROMPTS_DIR", "/x/p")
    assert prompts_dir() == Path("/x/p")


def test_an_empty_prompts_dir_variable_names_the_default_when_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_PROMPTS_DIR", "")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HarnessError) as e:
        load(categories=["code"])
    assert "prompts" in str(e.value) and "the default" in str(e.value)
