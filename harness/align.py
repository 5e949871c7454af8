"""Tokenizer alignment of a draft/target pair: speculative decoding passes token ids between the two models,
so both must map every id they can exchange to the same text, agree on special tokens and tokenize the
prompts identically. Only the vocab-only part of each GGUF is loaded (no weights), so a check is fast."""
from __future__ import annotations

import json
import re
import time
from contextlib import contextmanager
from pathlib import Path

from harness.errors import HarnessError
from harness.llamacpp import Vocab, llama, load_model
from harness.prompts import Prompt

ALIGNED = "ALIGNED"
ALIGNED_WITH_WARNINGS = "ALIGNED WITH WARNINGS"
MISALIGNED = "MISALIGNED"

ATTR_UNUSED = 1 << 1  # LLAMA_TOKEN_ATTR_UNUSED
ATTR_NAMES = ((1 << 0, "unknown"), (1 << 1, "unused"), (1 << 2, "normal"), (1 << 3, "control"),
              (1 << 4, "user_defined"), (1 << 5, "byte"), (1 << 6, "normalized"), (1 << 7, "lstrip"),
              (1 << 8, "rstrip"), (1 << 9, "single_word"))
N_FIRST = 5
SPECIAL_IDS = ("bos", "eos", "eot", "pad")
SPECIAL_FLAGS = ("add_bos", "add_eos")

# texts that padding tokens get from converters: [PAD151935], <pad>, <pad_3>, <|pad_0|>, <unused12>, ...
_PAD_TEXT = re.compile(rb"^(\[PAD\d*\]|<\|?(pad|unused|padding)[_-]?\d*\|?>)$", re.IGNORECASE)

# Round-trip probes used when no prompts are given: each stresses a different part of a tokenizer.
PROBES: tuple[Prompt, ...] = (
    Prompt("probe-english", "probe", text="The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?"),
    Prompt("probe-code", "probe", text=(
        "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
        "for i in range(10):\n\tprint(f\"{i:>3} {fib(i)}\")  # tabs & spaces\n")),
    Prompt("probe-chinese", "probe", text="推测解码使用一个小的草稿模型来提出令牌，再由大模型并行验证。"),
    Prompt("probe-emoji", "probe", text="Emoji 🚀🔥👍🏽 and 👨‍👩‍👧‍👦 family, flags 🇯🇵🇫🇷, math ∑∫√∞ ≠ ≤."),
    Prompt("probe-whitespace", "probe", text="a  b   c    d\n\n\n   indented\t\ttabs  \r\n trailing   \n\n"),
    Prompt("probe-numbers", "probe", text="1234567890 3.14159 -42 1e-9 0xFF 2025-01-31T12:00:00Z"),
    Prompt("probe-chat", "probe", messages=(("system", "You are a helpful assistant."),
                                            ("user", "Say hello in three languages.")), chat=True),
)


# -- loading ------------------------------------------------------------------------------------------------
@contextmanager
def _vocab(path: Path, role: str):
    """A vocab-only load of one GGUF, freed on exit. Every failure is a one-line HarnessError."""
    from harness.models.catalog import check_gguf_file
    path = Path(path)
    try:
        check_gguf_file(path)
        model = load_model(path, n_gpu_layers=0, vocab_only=True)
    except HarnessError as e:
        raise HarnessError(f"{role} model: {e}", e.exit_code) from None
    except OSError as e:
        raise HarnessError(f"{role} model: cannot read {path}: {e.strerror or e}") from None
    try:
        yield Vocab(model)
    finally:
        llama().llama_model_free(model)


def _tables(v: Vocab) -> tuple[list[bytes], list[int]]:
    """Text and attribute of every id, read once (two ctypes calls per id, ~0.1 s for 150k ids)."""
    ll, vv, n = v._ll, v.vocab, v.n_vocab
    get_text, get_attr = ll.llama_vocab_get_text, ll.llama_vocab_get_attr
    texts = [get_text(vv, i) or b"" for i in range(n)]
    attrs = [int(get_attr(vv, i)) for i in range(n)]
    return texts, attrs


def _s(b: bytes) -> str:
    return b.decode("utf-8", errors="backslashreplace")


def attr_names(attr: int) -> str:
    names = [name for bit, name in ATTR_NAMES if attr & bit]
    return "|".join(names) or "undefined"


def is_padding(text: bytes, attr: int) -> bool:
    return bool(attr & ATTR_UNUSED) or bool(_PAD_TEXT.match(text))


def _side(v: Vocab, path: Path) -> dict:
    tmpl = v.chat_template()
    return {"path": str(path), "name": Path(path).stem, "n_vocab": int(v.n_vocab),
            "tokenizer_model": v.meta("tokenizer.ggml.model"), "pre": v.meta("tokenizer.ggml.pre"),
            "specials": {k: (int(x) if not isinstance(x, bool) else x) for k, x in v.specials().items()},
            "chat_template_chars": len(tmpl) if tmpl is not None else None}


# -- the check ----------------------------------------------------------------------------------------------
def _compare_vocab(tt: list[bytes], ta: list[int], dt: list[bytes], da: list[int],
                   reasons: list[str], warnings: list[str]) -> tuple[dict, dict]:
    n_t, n_d = len(tt), len(dt)
    n_shared = min(n_t, n_d)
    # size
    size = {"target": n_t, "draft": n_d, "shared": n_shared, "extra_side": None, "extra": 0,
            "extra_padding": 0, "extra_not_padding": 0, "first_extra_not_padding": []}
    if n_t != n_d:
        side, texts, attrs = ("target", tt, ta) if n_t > n_d else ("draft", dt, da)
        not_pad = [i for i in range(n_shared, len(texts)) if not is_padding(texts[i], attrs[i])]
        extra = len(texts) - n_shared
        size.update(extra_side=side, extra=extra, extra_padding=extra - len(not_pad),
                    extra_not_padding=len(not_pad),
                    first_extra_not_padding=[{"id": i, "text": _s(texts[i])} for i in not_pad[:N_FIRST]])
        if not_pad:
            ex = ", ".join(f"{i} {_s(texts[i])!r}" for i in not_pad[:3])
            reasons.append(f"vocabulary sizes differ (target {n_t}, draft {n_d}) and {len(not_pad)} of the "
                           f"{extra} extra {side} ids are real tokens, not padding (first: {ex})")
        elif side == "target":
            warnings.append(f"vocabulary sizes differ (target {n_t}, draft {n_d}): the {extra} extra target ids "
                            f"({n_shared}..{n_t - 1}) are all padding; the draft can never propose them")
        else:
            warnings.append(f"vocabulary sizes differ (target {n_t}, draft {n_d}): the {extra} extra draft ids "
                            f"({n_shared}..{n_d - 1}) are all padding; the target can't produce them")
    # shared ids: list equality runs in C, the per-id walk only happens when something differs
    same_text = tt[:n_shared] == dt[:n_shared] if n_t != n_d else tt == dt
    same_attr = ta[:n_shared] == da[:n_shared] if n_t != n_d else ta == da
    n_text = n_attr = 0
    diff_ids: list[int] = []
    if not (same_text and same_attr):
        for i, (a, b, x, y) in enumerate(zip(tt, dt, ta, da)):
            dtxt, datt = a != b, x != y
            if dtxt or datt:
                n_text += dtxt
                n_attr += datt
                diff_ids.append(i)
    first = [{"id": i, "target_text": _s(tt[i]), "draft_text": _s(dt[i]),
              "target_attr": attr_names(ta[i]), "draft_attr": attr_names(da[i])} for i in diff_ids[:N_FIRST]]
    tokens = {"shared": n_shared, "differ": len(diff_ids), "text_differ": n_text, "attr_differ": n_attr,
              "first": first}
    if diff_ids:
        f = first[0]
        what = f"'{f['target_text']}' vs '{f['draft_text']}'"
        if f["target_text"] == f["draft_text"]:
            what = f"'{f['target_text']}' attr {f['target_attr']} vs {f['draft_attr']}"
        reasons.append(f"{len(diff_ids)} of {n_shared} shared token ids differ ({n_text} in text, {n_attr} in "
                       f"attributes); first: id {f['id']} {what}".replace("\n", "\\n"))
    return size, tokens


def _render(p: Prompt, target: Vocab, notes: list[str]) -> str:
    try:
        return p.render(target)
    except HarnessError as e:
        if p.chat and p.messages:
            notes.append(f"prompt '{p.id}': target chat template unusable ({e}); tokenized its plain text")
            return "\n".join(c for _, c in p.messages)
        raise


def _round_trip(prompts: list[Prompt], target: Vocab, draft: Vocab, tt: list[bytes], dt: list[bytes],
                source: str, notes: list[str], reasons: list[str]) -> dict:
    results = []
    first_mismatch = None
    for p in prompts:
        text = _render(p, target, notes)
        a = target.tokenize(text, add_special=True, parse_special=True)
        b = draft.tokenize(text, add_special=True, parse_special=True)
        if a == b:
            results.append({"id": p.id, "tokens": len(a), "equal": True})
            continue
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        tid, did = (a[k] if k < len(a) else None), (b[k] if k < len(b) else None)
        r = {"id": p.id, "tokens": len(a), "draft_tokens": len(b), "equal": False, "offset": k,
             "target_id": tid, "draft_id": did,
             "target_text": _s(tt[tid]) if tid is not None and tid < len(tt) else None,
             "draft_text": _s(dt[did]) if did is not None and did < len(dt) else None}
        results.append(r)
        first_mismatch = first_mismatch or r
    n_bad = sum(not r["equal"] for r in results)
    if first_mismatch:
        m = first_mismatch
        tshow = "end" if m["target_id"] is None else f"{m['target_id']} {m['target_text']!r}"
        dshow = "end" if m["draft_id"] is None else f"{m['draft_id']} {m['draft_text']!r}"
        reasons.append(f"round trip: {n_bad} of {len(results)} {source} tokenize differently; first: "
                       f"'{m['id']}' at token {m['offset']} (target {tshow}, draft {dshow})")
    return {"source": source, "n": len(results), "mismatched": n_bad, "first_mismatch": first_mismatch,
            "prompts": results}


def check_pair(target_path, draft_path, prompts: list[Prompt] | None = None) -> dict:
    """Compare the tokenizers of a target and a draft GGUF. Returns a JSON-serialisable report whose
    'verdict' is ALIGNED, ALIGNED WITH WARNINGS or MISALIGNED, with one-line 'reasons' and 'warnings'."""
    t0 = time.perf_counter()
    target_path, draft_path = Path(target_path), Path(draft_path)
    reasons: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    with _vocab(target_path, "target") as tv, _vocab(draft_path, "draft") as dv:
        target, draft = _side(tv, target_path), _side(dv, draft_path)
        for key, label in (("tokenizer_model", "tokenizer model"), ("pre", "pre-tokenizer")):
            if target[key] != draft[key]:
                reasons.append(f"{label} differs: target {target[key]!r}, draft {draft[key]!r}")
        tt, ta = _tables(tv)
        dt, da = _tables(dv)
        size, tokens = _compare_vocab(tt, ta, dt, da, reasons, warnings)

        specials = {}
        for k in SPECIAL_IDS + SPECIAL_FLAGS:
            a, b = target["specials"][k], draft["specials"][k]
            specials[k] = {"target": a, "draft": b, "equal": a == b}
            if a != b:
                if k in SPECIAL_FLAGS:
                    reasons.append(f"{k} flag differs: target {a}, draft {b}")
                else:
                    reasons.append(f"{k.upper()} token id differs: target {_special(a, tt)}, "
                                   f"draft {_special(b, dt)}")

        t_tmpl, d_tmpl = tv.chat_template(), dv.chat_template()
        chat = {"equal": t_tmpl == d_tmpl, "target_chars": target["chat_template_chars"],
                "draft_chars": draft["chat_template_chars"], "first_difference": None}
        if t_tmpl != d_tmpl:
            if t_tmpl is None or d_tmpl is None:
                which = "target" if t_tmpl is None else "draft"
                warnings.append(f"chat templates differ: the {which} has none (prompts are rendered with the "
                                f"target's)")
            else:
                k = next((i for i, (x, y) in enumerate(zip(t_tmpl, d_tmpl)) if x != y),
                         min(len(t_tmpl), len(d_tmpl)))
                chat["first_difference"] = k
                warnings.append(f"chat templates differ (target {len(t_tmpl)} chars, draft {len(d_tmpl)} chars, "
                                f"first difference at char {k}); prompts are rendered with the target's")

        source = "prompts" if prompts else "probes"
        round_trip = _round_trip(list(prompts) if prompts else list(PROBES), tv, dv, tt, dt, source, notes,
                                 reasons)

    verdict = MISALIGNED if reasons else ALIGNED_WITH_WARNINGS if warnings else ALIGNED
    return {"target": target, "draft": draft, "verdict": verdict, "reasons": reasons, "warnings": warnings,
            "notes": notes, "vocab_size": size, "tokens": tokens, "specials": specials, "chat_template": chat,
            "round_trip": round_trip, "seconds": round(time.perf_counter() - t0, 3)}


def _special(tok: int, texts: list[bytes]) -> str:
    if tok < 0:
        return "none"
    return f"{tok} {_s(texts[tok])!r}" if tok < len(texts) else str(tok)


# -- output -------------------------------------------------------------------------------------------------
def _status(ok: bool, warn: bool = False) -> str:
    return "ok" if ok else ("warn" if warn else "DIFF")


def _clip(s: str, n: int = 40) -> str:
    s = s.encode("unicode_escape").decode("ascii") if any(c in s for c in "\n\r\t") else s
    return s if len(s) <= n else s[:n - 1] + "…"


def format_report(report: dict) -> str:
    from tabulate import tabulate
    t, d = report["target"], report["draft"]
    size, tok, sp, chat, rt = (report[k] for k in ("vocab_size", "tokens", "specials", "chat_template",
                                                   "round_trip"))
    rows = [
        ("file", t["name"], d["name"], ""),
        ("tokenizer model", t["tokenizer_model"], d["tokenizer_model"],
         _status(t["tokenizer_model"] == d["tokenizer_model"])),
        ("pre-tokenizer", t["pre"], d["pre"], _status(t["pre"] == d["pre"])),
        ("vocab size", t["n_vocab"], d["n_vocab"],
         _status(size["extra"] == 0, size["extra"] > 0 and size["extra_not_padding"] == 0)
         + (f" ({size['extra_padding']} padding, {size['extra_not_padding']} not)" if size["extra"] else "")),
        ("shared ids: text", f"{size['shared']} ids", "", _status(tok["text_differ"] == 0)
         + (f" ({tok['text_differ']} differ)" if tok["text_differ"] else "")),
        ("shared ids: attr", "", "", _status(tok["attr_differ"] == 0)
         + (f" ({tok['attr_differ']} differ)" if tok["attr_differ"] else "")),
    ]
    for k in SPECIAL_IDS + SPECIAL_FLAGS:
        rows.append((k if k in SPECIAL_FLAGS else f"{k.upper()} id", sp[k]["target"], sp[k]["draft"],
                     _status(sp[k]["equal"])))
    rows.append(("chat template", _chars(chat["target_chars"]), _chars(chat["draft_chars"]),
                 _status(chat["equal"], True)))
    rows.append((f"round trip ({rt['source']})", f"{rt['n'] - rt['mismatched']}/{rt['n']} identical", "",
                 _status(rt["mismatched"] == 0)))
    out = [tabulate(rows, headers=("check", "target", "draft", "status"))]
    if tok["first"]:
        out.append("\nfirst differing shared ids:")
        out.append(tabulate([(f["id"], _clip(f["target_text"]), _clip(f["draft_text"]), f["target_attr"],
                              f["draft_attr"]) for f in tok["first"]],
                            headers=("id", "target text", "draft text", "target attr", "draft attr")))
    out.append(f"\nverdict: {report['verdict']}  ({report['seconds']:.2f} s)")
    out += [f"  reason: {r}" for r in report["reasons"]]
    out += [f"  warning: {w}" for w in report["warnings"]]
    out += [f"  note: {n}" for n in report.get("notes", [])]
    return "\n".join(out)


def _chars(n: int | None) -> str:
    return "none" if n is None else f"{n} chars"


# -- entry points -------------------------------------------------------------------------------------------
def require_aligned(target_path, draft_path, prompts: list[Prompt] | None = None) -> dict:
    """check_pair, raising HarnessError (exit code 2) when the pair is MISALIGNED; the report otherwise."""
    report = check_pair(target_path, draft_path, prompts)
    if report["verdict"] == MISALIGNED:
        first = "; ".join(report["reasons"][:2])
        more = f" (+{len(report['reasons']) - 2} more)" if len(report["reasons"]) > 2 else ""
        raise HarnessError(f"draft {draft_path} is not aligned with target {target_path}: {first}{more}; "
                           f"run `harness check {target_path} {draft_path}` for the full diff", exit_code=2)
    return report


def _resolve_path(ref: str) -> Path:
    from harness.models import catalog
    return catalog.require_present(catalog.resolve(ref))


def check_command(target_ref: str, draft_ref: str, prompts_path: str | None, as_json: bool) -> tuple[str, int]:
    """`harness check TARGET DRAFT [--prompts FILE] [--json]`: (output, exit code 0, or 2 when MISALIGNED)."""
    from harness import prompts as prompts_mod
    target, draft = _resolve_path(target_ref), _resolve_path(draft_ref)
    prompts = prompts_mod.load(paths=[Path(prompts_path)]) if prompts_path else None
    report = check_pair(target, draft, prompts)
    text = json.dumps(report, indent=2, ensure_ascii=False) if as_json else format_report(report)
    return text, 2 if report["verdict"] == MISALIGNED else 0
