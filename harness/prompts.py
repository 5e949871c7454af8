"""Prompt sets: prompts/<category>.jsonl, one prompt per line, or the user's own files (--prompts): OpenAI-style chat
JSONL and ShareGPT JSON; rendering through the model's chat template."""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from harness.errors import HarnessError

MAX_INPUT_BYTES = 512 << 20  # an input file read whole (prompts, profiles): larger ones are refused
CATEGORIES = ("code", "multilingual", "creative", "domain", "grounded", "long_context")
CUT_MARK = "\n[...]\n"  # where a shortened prompt's middle was


def prompts_dir() -> Path:
    return Path(os.environ.get("HARNESS_PROMPTS_DIR") or "prompts")  # set but empty is unset, not "."


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[tuple[str, str], ...] = ()
    text: str = ""
    max_tokens: int = 96
    chat: bool = True

    @property
    def digest(self) -> str:
        """A hash of what the prompt asks (messages or text, chat or raw): two runs compare on it."""
        import hashlib
        import json
        blob = json.dumps([self.messages, self.text, self.chat], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def render(self, vocab) -> str:
        """The exact text the models see: chat template applied when chat is true."""
        if self.chat and self.messages:
            return vocab.apply_chat_template([{"role": r, "content": c} for r, c in self.messages])
        return self.text or "\n".join(c for _, c in self.messages)

    @property
    def chars(self) -> int:
        """The characters of what the models see, the chat template aside."""
        if self.text and not (self.chat and self.messages):
            return len(self.text)
        return sum(len(c) for _, c in self.messages)

    def shortened(self, chars: int) -> Prompt:
        """The prompt in at most `chars` characters (0: whole): its longest message, and its text, cut in the middle,
        where LongBench cuts too, since the head and the tail hold the instructions and the question."""
        if not chars or self.chars <= chars:
            return self
        msgs = self.messages
        if (over := sum(len(c) for _, c in msgs) - chars) > 0:
            i = max(range(len(msgs)), key=lambda j: len(msgs[j][1]))
            role, content = msgs[i]
            msgs = msgs[:i] + ((role, _middle(content, len(content) - over)),) + msgs[i + 1:]
        return replace(self, messages=msgs, text=_middle(self.text, chars) if len(self.text) > chars else self.text)


def _middle(text: str, keep: int) -> str:
    """text in at most `keep` characters: its head and tail, cut at whitespace, with CUT_MARK between."""
    half = max(keep - len(CUT_MARK), 0) // 2
    if half == 0:
        return CUT_MARK.strip()
    head, tail = text[:half], text[len(text) - half:]
    words = head.rsplit(None, 1)
    head = words[0] if len(words) > 1 else head
    tail = tail.split(None, 1)[-1]
    return head + CUT_MARK + tail


# ShareGPT's speakers ("from"), as common exports write them, and the chat template's role for each
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
# an OpenAI-style chat's roles, which chat templates know; any other reaches the template verbatim
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _parse(line: str, where: str, stem: str, n: int) -> Prompt:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise HarnessError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise HarnessError(f"{where}: each line must be a JSON object")
    return _entry(d, where, stem, n)


def _entry(d: dict, where: str, stem: str, n: int) -> Prompt:
    """One prompt: this project's fields, an OpenAI-style chat ({"messages": [...]}) or a ShareGPT conversation
    ({"conversations": [...]}). Without an id it is STEM-N (N its line or entry); without a category, the file's
    stem."""
    pid, cat = d.get("id", f"{stem}-{n}"), d.get("category", stem)
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)  # ShareGPT exports number their conversations
    if not isinstance(pid, str) or not pid:
        raise HarnessError(f"{where}: 'id' must be a non-empty string")
    if not isinstance(cat, str) or not cat:
        raise HarnessError(f"{where}: 'category' must be a non-empty string")
    bad = next((c for c in cat if c == "|" or not c.isprintable()), None)  # it names rows of Markdown tables
    if bad:
        fix = "rename the category" if "category" in d else "rename the file (its name is the category) or give " \
            "each prompt a 'category'"
        raise HarnessError(f"{where}: category {json.dumps(cat)} holds {json.dumps(bad)}, which would break the "
                           f"report's tables: {fix}")
    text = d.get("text", "")
    if not isinstance(text, str):
        raise HarnessError(f"{where}: 'text' must be a string")
    messages = _to_last_user(_conversation(d, where), where)
    if "\x00" in text or any("\x00" in r + c for r, c in messages):
        raise HarnessError(f"{where}: the prompt holds a NUL character (\\u0000), which would cut it short there: "
                           "remove it")
    if not text.strip() and not any(c.strip() for _, c in messages):
        raise HarnessError(f"{where}: the prompt is empty (give 'messages' or 'text')")
    mt = d.get("max_tokens", 96)
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        raise HarnessError(f"{where}: 'max_tokens' must be a positive integer")
    chat = d.get("chat", bool(messages))
    if not isinstance(chat, bool):
        raise HarnessError(f"{where}: 'chat' must be true or false, got {chat!r}")
    return Prompt(pid, cat, messages, text, mt, chat)


def _conversation(d: dict, where: str) -> tuple[tuple[str, str], ...]:
    """(role, content) pairs from 'messages' (role, content) or ShareGPT's 'conversations' (from, value)."""
    if "messages" in d and "conversations" in d:
        raise HarnessError(f"{where}: give 'messages' or 'conversations', not both")
    sharegpt = "conversations" in d
    key, role_key, text_key = ("conversations", "from", "value") if sharegpt else ("messages", "role", "content")
    turns = d.get(key, [])
    if not isinstance(turns, list):
        raise HarnessError(f"{where}: '{key}' must be a list")
    out, turn = [], "turn" if sharegpt else "message"
    for k, m in enumerate(turns, 1):
        if not isinstance(m, dict) or role_key not in m or text_key not in m:
            raise HarnessError(f"{where}: each {turn} needs '{role_key}' and '{text_key}' ({turn} {k} has not)")
        role, content = m[role_key], m[text_key]
        for name, v in ((role_key, role), (text_key, content)):
            if not isinstance(v, str):
                raise HarnessError(f"{where}: {turn} {k}'s '{name}' must be a string, got {json.dumps(v)}")
        known = SHAREGPT_ROLES if sharegpt else CHAT_ROLES
        if role not in known:
            alike = role.lower() if sharegpt else SHAREGPT_ROLES.get(role.lower())  # 'Human', 'human', 'gpt'
            hint = f" (write {json.dumps(alike)})" if alike in known else ""
            raise HarnessError(f"{where}: {turn} {k}'s {role_key} {json.dumps(role)} is not one this reads{hint}; "
                               f"the known ones: {', '.join(known)}")
        if sharegpt:
            role = SHAREGPT_ROLES[role]
        out.append((role, content))
    system = d.get("system") if sharegpt else None  # LLaMA-Factory's ShareGPT keeps the system prompt beside
    if system is not None:
        if not isinstance(system, str):
            raise HarnessError(f"{where}: 'system' must be a string")
        out.insert(0, ("system", system))
    return tuple(out)


def _to_last_user(messages: tuple[tuple[str, str], ...], where: str) -> tuple[tuple[str, str], ...]:
    """The conversation up to its last user turn: the turns after it are answers, which the model is to give."""
    last = max((i for i, (r, _) in enumerate(messages) if r == "user"), default=None)
    if last is None:
        if messages:
            raise HarnessError(f"{where}: the conversation has no user turn: nothing to answer")
        return messages
    return messages[:last + 1]


def read_text(path: Path, what: str) -> str:
    """An input file (a prompt file, the profiles file) as UTF-8 text, or one line saying why it cannot be read:
    missing, a directory, unreadable, or not UTF-8 (with the line of the first bad byte)."""
    path = Path(path)
    if not path.exists():
        raise HarnessError(f"{what} {path} does not exist")
    if path.is_dir():
        raise HarnessError(f"{what} {path} is a directory: name a file")
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read for ever, a device never end
            raise HarnessError(f"{what} {path} is not a regular file (a FIFO or device): save it as a file")
        if st.st_size > MAX_INPUT_BYTES:
            raise HarnessError(f"{what} {path} has {st.st_size / 2**20:.0f} MiB, above the {MAX_INPUT_BYTES >> 20} "
                               "MiB read here: keep the prompts you need in a smaller file")
        data = path.read_bytes()
    except OSError as e:
        raise HarnessError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a BOM (Windows editors write one) is no text
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise HarnessError(f"{path}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x}): save the {what} as "
                           "UTF-8") from None


def _lines(text: str) -> list[str]:
    """Lines as a text-mode file gives them (\\n, \\r\\n and \\r end a line), not str.splitlines()'s wider set."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _refuse_nul(path: Path, text: str) -> None:
    """A NUL byte would cut the prompt short where llama.cpp reads it as a C string: refused, with its line."""
    if "\x00" in text:
        line = len(_lines(text[:text.index("\x00")]))
        raise HarnessError(f"{path}:{line}: a NUL byte, which would cut the prompt short there: remove it")


def read_prompt_text(path: Path) -> str:
    """The text of `harness run --prompt-file`: UTF-8, no NUL byte."""
    text = read_text(path, "prompt file")
    _refuse_nul(path, text)
    return text


def load_file(path: Path) -> list[Prompt]:
    """A prompt file: JSON lines (this project's, OpenAI-style chats, ShareGPT conversations), or a JSON list of
    ShareGPT conversations, as exported."""
    path = Path(path)
    text = read_text(path, "prompt file")
    _refuse_nul(path, text)
    out = []
    if (entries := _document(path, text)) is not None:
        for n, d in enumerate(entries, 1):
            where = f"{path}: entry {n}"
            if not isinstance(d, dict):
                raise HarnessError(f"{where}: each entry of the list must be a JSON object")
            out.append(_entry(d, where, path.stem, n))
    else:
        for n, line in enumerate(_lines(text), 1):
            if line.strip():
                out.append(_parse(line, f"{path}:{n}", path.stem, n))
    if not out:
        raise HarnessError(f"prompt file {path} is empty")
    return out


def _document(path: Path, text: str) -> list | None:
    """The entries of a file that is one JSON document: a list (ShareGPT's export), a {"data": [...]} wrapper, or one
    conversation pretty-printed over several lines; None for JSON lines."""
    start = text.lstrip()[:1]
    if start not in ("[", "{"):
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if start == "[":
            raise HarnessError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return None  # JSON lines, each read (and refused) on its own
    if isinstance(doc, dict) and isinstance(doc.get("data"), list) and \
            not {"messages", "conversations", "text"} & set(doc):
        return doc["data"]  # a dataset export's wrapper
    if isinstance(doc, dict) and len([x for x in _lines(text) if x.strip()]) > 1:
        return [doc]  # one conversation, pretty-printed
    if isinstance(doc, list):
        return doc
    return None


def load(categories: list[str] | None = None, paths: list[Path] | None = None, per_category: int = 0,
         chars: int = 0) -> list[Prompt]:
    """Prompts from explicit files, or from prompts/<category>.jsonl; the first per_category of each (0 = all), each
    in at most `chars` characters (Prompt.shortened; 0: whole)."""
    categories = list(dict.fromkeys(categories or []))  # a category or file given twice is read once
    source: dict[int, Path] = {}  # id(prompt) -> its file, for a duplicate id's line
    if paths:
        paths = list({Path(p).resolve(): Path(p) for p in paths}.values())
        prompts = []
        for path in paths:
            for p in load_file(path):
                prompts.append(p)
                source[id(p)] = path
    else:
        cats = categories or list(CATEGORIES)
        d = prompts_dir()
        if not d.is_dir():
            how = "set by HARNESS_PROMPTS_DIR" if os.environ.get("HARNESS_PROMPTS_DIR") else \
                "the default, relative to the current directory"
            state = "is not a directory" if d.exists() else "does not exist"
            raise HarnessError(f"the prompts directory {d} ({how}) {state}: run from the project root, point "
                               "HARNESS_PROMPTS_DIR at the directory of <category>.jsonl files, or give --prompts FILE")
        for c in cats:
            if not (d / f"{c}.jsonl").exists():
                known = sorted(p.stem for p in d.glob("*.jsonl"))
                raise HarnessError(f"unknown prompt category '{c}' (known: {', '.join(known)})")
        prompts = [p for c in cats for p in load_file(d / f"{c}.jsonl")]
    if categories and paths:
        held = list(dict.fromkeys(p.category for p in prompts))
        missing = [c for c in categories if c not in held]
        if missing:
            raise HarnessError(f"--categories {', '.join(missing)}: not in the prompt files "
                               f"{', '.join(str(x) for x in paths)} (they hold: {', '.join(held)})")
        prompts = [p for p in prompts if p.category in categories]
    seen: dict[str, Prompt] = {}
    for p in prompts:
        if p.id in seen:
            files = list(dict.fromkeys(str(source[id(x)]) for x in (seen[p.id], p) if id(x) in source))
            where = f" (in {' and '.join(files)})" if files else ""
            raise HarnessError(f"duplicate prompt id '{p.id}'{where}: give the prompts ids of their own, or rename a "
                               "file (an id left out is the file's name and the line's number)")
        seen[p.id] = p
    if per_category:
        counts: dict[str, int] = {}
        kept = []
        for p in prompts:
            counts[p.category] = counts.get(p.category, 0) + 1
            if counts[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    if not prompts:
        raise HarnessError("no prompts selected")
    return [p.shortened(chars) for p in prompts]
