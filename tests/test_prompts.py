"""prompts.load and its files: what issue 43's bad-input sweep found. A category that would break the report's
Markdown is refused in one line naming the file and the category; a file or category given twice is read once; an
empty HARNESS_PROMPTS_DIR is unset, not the current directory; bad prompt (and profile) files, in one line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.prompts import CUT_MARK, Prompt, load, prompts_dir
from tests.helpers import harness, one_line_error, within


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


# -- Bad prompt and profile files, and unclear refusals: each case ends in one line on stderr naming the
# problem and what to do, before any model loads. One row per case: the command (with {tmp} for the
# test's directory), the files to write there (text or bytes; a name ending in / is a directory), extra
# environment (with {tmp}), then the exit code and the fragments the error line must hold.
T = "smollm2-135m-instruct-q4_1"
OK = '{"id": "a", "category": "code", "text": "hi"}\n'
BENCH = ("bench", "--target", T, "--out", "{tmp}/reports")
PROFILE = {"HARNESS_PROFILES": "{tmp}/profiles.toml"}

CASES = {
    # prompt files
    "nul-escape-in-prompt": (
        [*BENCH, "--prompts", "{tmp}/p.jsonl"],
        {"p.jsonl": OK + '{"id": "b", "category": "code", "messages": [{"role": "user", "content": "a\\u0000b"}]}\n'},
        {}, 1, ["p.jsonl:2:", "NUL"]),
    "nul-byte-in-prompt": (
        [*BENCH, "--prompts", "{tmp}/p.jsonl"],
        {"p.jsonl": b'{"id": "a", "category": "code", "text": "a\x00b"}\n'}, {}, 1, ["p.jsonl:1:", "NUL"]),
    "nul-in-run-prompt-file": (
        ["run", T, "--prompt-file", "{tmp}/p.txt"], {"p.txt": b"line one\nhalf\x00cut\n"}, {}, 1,
        ["p.txt:2:", "NUL"]),
    "chat-not-boolean": (
        [*BENCH, "--prompts", "{tmp}/p.jsonl"],
        {"p.jsonl": '{"id": "a", "category": "code", "text": "hi", "chat": "no"}\n'}, {}, 1,
        ["p.jsonl:1:", "'chat' must be true or false"]),
    "bench-prompts-bad-utf8": (
        [*BENCH, "--prompts", "{tmp}/p.jsonl"],
        {"p.jsonl": OK.encode() + b'{"id": "b", "category": "code", "text": "caf\xe9"}\n'}, {}, 1,
        ["p.jsonl:2:", "UTF-8"]),
    "run-prompt-file-bad-utf8": (
        ["run", T, "--prompt-file", "{tmp}/p.txt"], {"p.txt": b"caf\xe9\n"}, {}, 1, ["p.txt", "UTF-8"]),
    "message-content-not-string": (
        [*BENCH, "--prompts", "{tmp}/p.jsonl"],
        {"p.jsonl": '{"id": "a", "category": "code", "messages": [{"role": "user", "content": 5}]}\n'}, {}, 1,
        ["p.jsonl:1:", "'content'", "string"]),
    "message-role-not-string": (
        [*BENCH, "--prompts", "{tmp}/p.jsonl"],
        {"p.jsonl": '{"id": "a", "category": "code", "messages": [{"role": null, "content": "hi"}]}\n'}, {}, 1,
        ["p.jsonl:1:", "'role'", "string"]),
    "prompts-names-directory": (
        [*BENCH, "--prompts", "{tmp}/pdir"], {"pdir/": None}, {}, 1, ["pdir", "is a directory"]),
    "category-file-is-directory": (
        [*BENCH, "--categories", "code"], {"pd/code.jsonl/": None}, {"HARNESS_PROMPTS_DIR": "{tmp}/pd"}, 1,
        ["code.jsonl", "is a directory"]),
    # profile files
    "profiles-file-is-directory": (
        ["bench", "--profile", "p"], {"profiles.toml/": None}, PROFILE, 1, ["profiles.toml", "is a directory"]),
    "profiles-file-bad-utf8": (
        ["bench", "--profile", "p"], {"profiles.toml": b"[profiles.p]\n# caf\xe9\n"}, PROFILE, 1,
        ["profiles.toml", "UTF-8"]),
    "profiles-key-scalar": (
        ["bench", "--profile", "p"], {"profiles.toml": "profiles = 5\n"}, PROFILE, 1,
        ["profiles.toml", "'profiles'", "table"]),
    "profile-scalar": (
        ["bench", "--profile", "p"], {"profiles.toml": "[profiles]\np = 3\n"}, PROFILE, 1,
        ["profiles.toml", "profile 'p'", "table"]),
    "profile-categories-scalar": (
        ["bench", "--profile", "p"], {"profiles.toml": f'[profiles.p]\ntarget = ["{T}"]\ncategories = 5\n'},
        PROFILE, 1, ["categories", "list of names"]),
    "profile-list-of-lists": (
        ["bench", "--profile", "p"], {"profiles.toml": f'[profiles.p]\ntarget = ["{T}"]\nthreads = [[1]]\n'},
        PROFILE, 1, ["threads", "list of int"]),
    "profile-gamma-list-of-lists": (
        ["bench", "--profile", "p"], {"profiles.toml": f'[profiles.p]\ntarget = ["{T}"]\ngamma = [[1]]\n'},
        PROFILE, 1, ["--gamma", "cannot read"]),
    # unclear messages
    "categories-not-in-files": (
        [*BENCH, "--prompts", "{tmp}/code.jsonl", "--categories", "creative"], {"code.jsonl": OK}, {}, 1,
        ["--categories creative", "code.jsonl", "they hold: code"]),
    "prompts-dir-missing": (
        [*BENCH, "--categories", "code"], {}, {"HARNESS_PROMPTS_DIR": "{tmp}/nowhere"}, 1,
        ["nowhere", "does not exist", "HARNESS_PROMPTS_DIR"]),
    "fidelity-negative-per-category": (
        ["fidelity", T, "smollm2-135m-instruct-q2_k", "--per-category", "-2"], {}, {}, 1,
        ["--per-category", ">= 0"]),
}


@pytest.mark.parametrize("args, files, env, code, words", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_one_line(args, files, env, code, words, tmp_path):
    for name, content in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            p.mkdir()
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    fill = {"tmp": str(tmp_path)}
    r = harness(*(a.format(**fill) for a in args), env={k: v.format(**fill) for k, v in env.items()})
    line = one_line_error(r, *words)
    assert r.returncode == code, line
    assert not (tmp_path / "reports").exists(), "refused after starting a run"


def test_run_prompt_file_utf8_still_reads(tmp_path):
    """The prompt file of `harness run` is read as UTF-8 (non-ASCII text passes the checks and reaches the model)."""
    from harness.prompts import read_prompt_text
    f = tmp_path / "p.txt"
    f.write_text("café — naïve\n", encoding="utf-8")
    assert read_prompt_text(Path(f)) == "café — naïve\n"


@pytest.mark.parametrize("content, words", [
    ("", ["is empty"]),
    ('{"id": "a", "category": "x", "text": "hi"}\nnot json\n', [":2:", "not valid JSON"]),
    ('{"id": "a", "category": "x", "text": "hi"}\n{"id": "a", "category": "x", "text": "yo"}\n', ["duplicate"]),
    ('{"id": "a", "category": "x", "text": "  "}\n', [":1:", "empty"]),
])
def test_bad_prompt_files(content, words, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    r = harness("bench", "--target", "smollm2-135m-instruct-q4_1", "--prompts", str(f), "--out", str(tmp_path / "r"))
    one_line_error(r, *words)


# -- Your own prompts: OpenAI-style chat JSONL and ShareGPT JSON, categories optional (issue 46) -----------------
def _chat(*turns) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def _share(*turns, **extra) -> dict:
    return {"conversations": [{"from": f, "value": v} for f, v in turns], **extra}


def test_openai_chat_jsonl_is_one_category_named_after_the_file_up_to_the_last_user_turn(tmp_path):
    f = tmp_path / "support.jsonl"
    f.write_text("\n".join(json.dumps(d) for d in (
        _chat(("system", "Be brief."), ("user", "Hi?"), ("assistant", "Hello."), ("user", "Why?"),
              ("assistant", "Because.")),
        _chat(("user", "Only a question")) | {"max_tokens": 32})) + "\n")
    a, b = load(paths=[f])
    assert (a.id, a.category, b.id, b.category) == ("support-1", "support", "support-2", "support")
    assert a.messages == (("system", "Be brief."), ("user", "Hi?"), ("assistant", "Hello."), ("user", "Why?"))
    assert a.chat and b.messages == (("user", "Only a question"),) and b.max_tokens == 32
    assert [p.id for p in load(categories=["support"], paths=[f])] == ["support-1", "support-2"]


def test_sharegpt_json_as_exported_maps_its_speakers_and_keeps_its_ids(tmp_path):
    f = tmp_path / "share.json"
    f.write_text(json.dumps([
        _share(("system", "You translate."), ("human", "Ciao"), ("gpt", "Hello"), ("human", "Grazie"),
               ("gpt", "Thanks"), id="QWJhYvA_0"),
        _share(("human", "Write a haiku"), ("gpt", "..."), system="Be a poet.", category="creative"),
        _share(("human", "x")) | {"id": 7},
    ], indent=2))
    a, b, c = load(paths=[f])
    assert (a.id, a.category) == ("QWJhYvA_0", "share")
    assert a.messages == (("system", "You translate."), ("user", "Ciao"), ("assistant", "Hello"), ("user", "Grazie"))
    assert (b.id, b.category, b.messages) == ("share-2", "creative", (("system", "Be a poet."),
                                                                        ("user", "Write a haiku")))
    assert c.id == "7" and c.chat


def test_sharegpt_conversations_read_from_json_lines_too(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text(json.dumps(_share(("human", "Hi"), ("gpt", "Hey"))) + "\n")
    (p,) = load(paths=[f])
    assert (p.id, p.category, p.messages) == ("s-1", "s", (("user", "Hi"),))


def test_this_projects_own_lines_read_as_before(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(json.dumps({"id": "a", "category": "code", "messages": [{"role": "user", "content": "q"}],
                             "max_tokens": 8}) + "\n")
    (p,) = load(paths=[f])
    assert (p.id, p.category, p.messages, p.max_tokens) == ("a", "code", (("user", "q"),), 8)


OWN = {  # name -> (file name, content, the words of its one line): a bad entry in each format
    "chat-jsonl-content-missing": ("chat.jsonl", json.dumps(_chat(("user", "ok"))) + "\n" +
                                   json.dumps({"messages": [{"role": "user"}]}) + "\n",
                                   ["chat.jsonl:2:", "'role' and 'content'", "message 1"]),
    "chat-jsonl-no-user-turn": ("chat.jsonl", json.dumps(_chat(("system", "s"), ("assistant", "a"))) + "\n",
                                ["chat.jsonl:1:", "no user turn"]),
    "chat-jsonl-messages-not-list": ("chat.jsonl", '{"messages": "hi"}\n',
                                     ["chat.jsonl:1:", "'messages' must be a list"]),
    "sharegpt-unknown-speaker": ("share.json", json.dumps([_share(("human", "a")), _share(("bot", "b"))]),
                                 ["share.json: entry 2", "from \"bot\"", "human, user, gpt"]),
    "sharegpt-value-not-string": ("share.json", json.dumps([_share(("human", None))]),
                                  ["share.json: entry 1", "turn 1's 'value' must be a string"]),
    "sharegpt-entry-not-object": ("share.json", json.dumps([_share(("human", "a")), "just text"]),
                                  ["share.json: entry 2", "JSON object"]),
    "sharegpt-broken-json": ("share.json", '[\n {"conversations": []},\n {"conversations": [}\n]',
                             ["share.json:3:", "not valid JSON"]),
    "sharegpt-both-keys": ("share.json", json.dumps([_share(("human", "a")) | _chat(("user", "b"))]),
                           ["share.json: entry 1", "not both"]),
    "file-name-breaks-tables": ("a|b.jsonl", json.dumps(_chat(("user", "q"))) + "\n",
                                ["a|b.jsonl:1:", "rename the file"]),
}


@pytest.mark.parametrize("name, content, words", list(OWN.values()), ids=list(OWN))
def test_a_bad_entry_of_your_own_prompts_is_one_line_naming_it(name, content, words, tmp_path):
    f = tmp_path / name
    f.write_text(content)
    r = harness("bench", "--target", T, "--prompts", str(f), "--out", str(tmp_path / "reports"))
    one_line_error(r, *words)
    assert r.returncode == 1 and not (tmp_path / "reports").exists()


# -- issue 57: what a third bad-input sweep found in your own prompt files -----------------------------------------
BOM = "\ufeff"


@pytest.mark.parametrize("name, content", [
    ("chats.jsonl", BOM + json.dumps(_chat(("user", "q"))) + "\n"),  # case 132
    ("share.json", BOM + json.dumps([_share(("human", "q"))])),  # case 133
    ("one.json", json.dumps(_share(("human", "q")), indent=2)),  # case 150: one conversation, pretty-printed
    ("export.json", json.dumps({"data": [_share(("human", "q"))]})),  # case 151: a dataset export's wrapper
    ("export.jsonl", json.dumps({"data": [_chat(("user", "q"))]}, indent=1)),
], ids=["132-bom-chat-jsonl", "133-bom-sharegpt", "150-pretty-printed-object", "151-data-wrapper",
        "151-data-wrapper-pretty"])
def test_files_as_editors_and_exports_write_them_read(tmp_path, name, content):
    f = tmp_path / name
    f.write_text(content, encoding="utf-8")
    (p,) = load(paths=[f])
    assert p.messages == (("user", "q"),) and p.category == f.stem


def _fifo(tmp_path) -> str:
    os.mkfifo(tmp_path / "p.jsonl")
    return "{tmp}/p.jsonl"


REFUSED_57 = {  # case: (what to write, the option's value, the words of its one line)
    "139-unknown-role": ({"p.jsonl": json.dumps(_chat(("bot", "q")))}, "{tmp}/p.jsonl",
                         ["p.jsonl:1:", 'role "bot" is not one this reads', "system, developer, user"]),
    "139-role-capitalised": ({"p.jsonl": json.dumps(_chat(("Human", "q")))}, "{tmp}/p.jsonl",
                             ['role "Human"', '(write "user")']),
    "139-sharegpt-capitalised": ({"s.json": json.dumps([_share(("Human", "q"))])}, "{tmp}/s.json",
                                 ['from "Human"', '(write "human")']),
    "143-sharegpt-role-in-chat": ({"p.jsonl": json.dumps(_chat(("human", "q")))}, "{tmp}/p.jsonl",
                                  ['role "human" is not one this reads (write "user")']),
    "142-ids-collide-across-files": ({"a/chats.jsonl": json.dumps(_chat(("user", "q"))),
                                      "b/chats.jsonl": json.dumps(_chat(("user", "r")))},
                                     "{tmp}/a/chats.jsonl,{tmp}/b/chats.jsonl",
                                     ["duplicate prompt id 'chats-1'", "a/chats.jsonl and", "b/chats.jsonl",
                                      "give the prompts ids"]),
    "153-fifo": (_fifo, "{tmp}/p.jsonl", ["p.jsonl is not a regular file", "save it as a file"]),
}


@pytest.mark.parametrize("files, value, words", list(REFUSED_57.values()), ids=list(REFUSED_57))
def test_issue_57_prompt_files_are_refused_in_one_line(tmp_path, files, value, words):
    if callable(files):
        files(tmp_path)
    else:
        for name, text in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text + "\n")
    with within(20):
        r = harness("bench", "--target", T, "--prompts", value.format(tmp=tmp_path), "--out", tmp_path / "reports")
    one_line_error(r, *words)
    assert r.returncode == 1 and not (tmp_path / "reports").exists()


def test_a_prompt_file_over_the_size_read_is_refused(tmp_path, monkeypatch):
    from harness import prompts
    monkeypatch.setattr(prompts, "MAX_INPUT_BYTES", 1 << 20)
    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps(_chat(("user", "x" * (2 << 20)))) + "\n")
    with pytest.raises(HarnessError, match="has 2 MiB, above the 1 MiB read here: keep the prompts you need"):
        load(paths=[f])


def test_a_shortened_prompt_keeps_its_head_and_tail_and_its_id():
    """The budget's prompt-length cut: the longest message cut in its middle (instructions first, the question
    last), within the characters given; a prompt that fits, or chars 0, stays as it is."""
    doc = " ".join(f"word{i}" for i in range(2000))
    p = Prompt("long-1", "long_context", (("system", "Be brief."), ("user", f"Read this. {doc} Question: why?")))
    s = p.shortened(1000)
    assert s.id == p.id and s.chars <= 1000 and s.digest != p.digest
    assert s.messages[0] == ("system", "Be brief.")
    user = s.messages[1][1]
    assert user.startswith("Read this. word0 ") and user.endswith(" Question: why?") and CUT_MARK in user
    assert not any(w.startswith("word") and not w[4:].isdigit() for w in user.split())  # cut at whitespace
    assert p.shortened(0) is p and p.shortened(p.chars) is p
    raw = Prompt("raw-1", "c", text=doc, chat=False)
    assert raw.shortened(500).chars <= 500 and raw.shortened(500).text.startswith("word0 ")


def test_load_shortens_every_prompt_to_the_characters_given():
    whole = {p.id: p for p in load(["long_context", "code"], per_category=2)}
    cut = load(["long_context", "code"], per_category=2, chars=2048)
    assert [p.id for p in cut] == list(whole)
    for p in cut:
        assert p.chars <= 2048 and (p == whole[p.id]) == (whole[p.id].chars <= 2048)
