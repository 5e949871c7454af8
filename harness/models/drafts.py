"""`harness drafts TARGET [PATH ...]`: which GGUF files on this machine can draft for TARGET.

Per candidate: whether llama-server accepts it as a draft (llama.cpp's own rule, `common_speculative_are_compatible`
in common/speculative.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors, ported clause by clause, with the
vocabulary fields as llama-vocab.cpp derives them from the header), whether the harness's alignment check accepts it
(`harness check`), its size against the target's, and a rank.

Everything but the harness's check comes from the GGUF headers (header.py), so no tensor data is touched and a folder
of 100 GB answers in seconds. The harness's check loads vocabularies (no weights) through the `align` callable the
command is given (harness.align.check_pair: models/ sits below align), and only where the headers leave its verdict
open."""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.errors import HarnessError
from harness.models import arch
from harness.models.catalog import GGUF_MAGIC
from harness.models.header import NULL, Header, Unreadable, Vocab, read_header, require_model, vocab

# common/speculative.cpp
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
# a draft at most this fraction of the target's bytes: on a memory-bound decode, a draft token costs about that
# fraction of a target token, so speculation has room to gain
FASTER_RATIO = 0.5
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)


def _c(b: bytes) -> bytes:
    return b.split(b"\0", 1)[0]  # strcmp stops at the first NUL


def _tok(b: bytes, n: int = 16) -> str:
    s = repr(b.decode("utf-8", errors="backslashreplace"))
    return s if len(s) <= n else s[:n - 2] + "…" + s[-1]


def _id(t: int) -> str:
    return "none" if t == NULL else str(t)


def llama_cpp_rule(t: Vocab, d: Vocab) -> str | None:
    """None where llama.cpp's common_speculative_are_compatible(target, draft) returns true; else the clause that
    failed (the first, as llama.cpp stops there), in words."""
    if t.type != d.type:
        return f"vocab type differs: target {t.type}, draft {d.type}"
    for what, ta, da, ti, di in (("BOS", t.add_bos, d.add_bos, t.bos, d.bos), ("EOS", t.add_eos, d.add_eos, t.eos,
                                                                                 d.eos)):
        if ta != da:
            return f"add-{what} differs: target {str(ta).lower()}, draft {str(da).lower()}"
        if ta and ti != di:  # the ids only count where the flag adds the token
            return f"{what} id differs: target {_id(ti)}, draft {_id(di)}"
    diff = abs(t.n_tokens - d.n_tokens)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return f"vocab sizes differ by {diff} (llama.cpp allows {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})"
    i = _first_difference(t.texts, d.texts, SPEC_VOCAB_CHECK_START_TOKEN_ID, c_strings=True)
    if i is not None:
        return f"token {i} differs: target {_tok(t.texts[i])}, draft {_tok(d.texts[i])}"
    return None


def _first_difference(a: list[bytes], b: list[bytes], start: int, c_strings: bool = False) -> int | None:
    n = min(len(a), len(b))
    if a[start:n] == b[start:n]:  # in C; the walk only where something differs
        return None
    for i in range(start, n):
        if a[i] != b[i] and (not c_strings or _c(a[i]) != _c(b[i])):
            return i
    return None


# -- the harness's alignment, where the header settles it -----------------------------------------------------
ALIGNED, WARNINGS, MISALIGNED = "ALIGNED", "ALIGNED WITH WARNINGS", "MISALIGNED"
Align = Callable[[Path, Path], dict]  # harness.align.check_pair


def _header_alignment(t: Header, tv: Vocab, c: Header, cv: Vocab) -> tuple[str, str] | None:
    """The harness's verdict where the headers settle it: the same tokenizer metadata is aligned; a different
    tokenizer model or pre-tokenizer, or a shared id whose text differs, is MISALIGNED (align.check_pair's first
    reasons). None: it takes the vocabulary-only check."""
    if t.tokenizer_digest == c.tokenizer_digest:
        return ALIGNED, "the same tokenizer metadata as the target"
    if tv.model != cv.model:
        return MISALIGNED, f"tokenizer model differs: target {tv.model!r}, draft {cv.model!r}"
    tp, cp = t.kv.get("tokenizer.ggml.pre"), c.kv.get("tokenizer.ggml.pre")  # as stored, as align reads them
    if tp != cp:
        return MISALIGNED, f"pre-tokenizer differs: target {tp!r}, draft {cp!r}"
    i = _first_difference(tv.texts, cv.texts, 0)
    if i is not None:
        return MISALIGNED, f"token {i} differs: target {_tok(tv.texts[i])}, draft {_tok(cv.texts[i])}"
    return None


def _checked_alignment(align: Align, target: Path, cand: Path) -> tuple[str, str | None]:
    try:
        rep = align(target, cand)
    except HarnessError as e:
        return "ERROR", str(e)
    why = (rep.get("reasons") or rep.get("warnings") or [None])[0]
    return rep["verdict"], why


# -- finding the files ----------------------------------------------------------------------------------------
def default_roots() -> list[Path]:
    """models/ and, where they exist, the places llama.cpp, LM Studio and Ollama keep their GGUFs."""
    from harness.models.catalog import models_dir
    home, env = Path.home(), os.environ
    llama_cache = Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else \
        Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "llama.cpp"
    hf = Path(env.get("HF_HUB_CACHE") or Path(env.get("HF_HOME") or home / ".cache" / "huggingface") / "hub")
    ollama = Path(env.get("OLLAMA_MODELS") or home / ".ollama" / "models") / "blobs"
    roots = [models_dir(), llama_cache, home / "Library" / "Caches" / "llama.cpp", hf, home / ".lmstudio" / "models",
             home / ".cache" / "lm-studio" / "models", ollama]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def _catalog_files() -> dict[str, str]:
    """Real path -> catalog name of every catalog model present (none where there is no catalog)."""
    from harness.models.catalog import load_catalog
    try:
        cat = load_catalog()
    except HarnessError:
        return {}
    return {os.path.realpath(m.path): m.name for m in cat.values() if m.path.is_file()}


def _ollama_names(blobs: Path) -> dict[str, str]:
    """Blob file name -> model:tag, from the manifests beside an Ollama blobs folder."""
    out: dict[str, str] = {}
    manifests = blobs.parent / "manifests"
    if blobs.name != "blobs" or not manifests.is_dir():
        return out
    for dirpath, _, files in os.walk(manifests):
        for f in files:
            p = Path(dirpath) / f
            try:
                layers = json.loads(p.read_text(encoding="utf-8")).get("layers", [])
            except (OSError, ValueError, AttributeError):
                continue
            parts = p.relative_to(manifests).parts
            name = (f"{parts[-2]}:{parts[-1]}" if len(parts) >= 2 and parts[-3:-2] == ("library",)
                    else "/".join(parts[1:-1]) + f":{parts[-1]}")
            for layer in layers if isinstance(layers, list) else []:
                if isinstance(layer, dict) and layer.get("mediaType") == "application/vnd.ollama.image.model":
                    out[str(layer.get("digest", "")).replace(":", "-")] = name
    return out


def _is_gguf(path: Path) -> bool:
    """A regular file whose first bytes say GGUF (stat first: opening a FIFO would block for ever)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def split_bytes(p: Path) -> int | None:
    """The bytes of all the parts of a split model (NAME-00001-of-0000N.gguf), None for a file of one part."""
    m = _SPLIT.match(p.name)
    if not m:
        return None
    parts = [p.with_name(f"{m['stem']}-{i:05d}-of-{m['n']}.gguf") for i in range(1, int(m["n"]) + 1)]
    if missing := [q.name for q in parts if not q.is_file()]:
        raise Unreadable("split part missing", f"a split model whose part {missing[0]} is missing")
    return sum(q.stat().st_size for q in parts)


@dataclass
class Found:
    path: Path
    name: str
    total_bytes: int | None = None


def find_files(roots: list[Path], files: list[Path] = ()) -> tuple[list[Found], list[dict]]:
    """GGUF files under the roots (recursively, following links, once each) and the given files: every *.gguf, and
    files with no suffix whose first bytes say GGUF (Ollama's blobs, the Hugging Face cache's). The second parts of
    split models are left to their first. Returns them and the split models with a part missing."""
    names: dict[str, str] = {}
    paths: list[Path] = list(files)
    skipped: list[dict] = []

    def unreadable(e: OSError) -> None:  # a folder os.walk cannot list: said, not passed over in silence
        skipped.append({"path": str(e.filename), "kind": "unreadable folder", "why": e.strerror or str(e)})
    for root in roots:
        seen_dirs: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen_dirs:
                dirnames[:] = []
                continue
            seen_dirs.add(real)
            names |= _ollama_names(Path(dirpath))
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                p = Path(dirpath) / f
                if f.lower().endswith(".gguf") or ("." not in f and _is_gguf(p)):
                    paths.append(p)
    found: dict[tuple[int, int], Found] = {}
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        if not p.is_file():
            continue
        name, total = names.get(p.name, p.stem), None
        if m := _SPLIT.match(p.name):
            if int(m["i"]) != 1:
                continue
            try:
                name, total = m["stem"], split_bytes(p)
            except Unreadable as e:
                skipped.append({"path": str(p), "kind": e.kind, "why": str(e)})
                continue
        key = (st.st_dev, st.st_ino)
        if key not in found or (not found[key].path.name.lower().endswith(".gguf") and
                                p.name.lower().endswith(".gguf")):
            found[key] = Found(p, name, total)
    return list(found.values()), skipped


# -- the survey -----------------------------------------------------------------------------------------------
def _describe(h: Header, v: Vocab | None = None) -> dict:
    kv = h.kv
    d = {k: kv.get(f"general.{k}") for k in ("architecture", "basename", "size_label")}
    d["general_name"] = kv.get("general.name")
    d["bytes"] = h.bytes
    d["arch"] = arch.facts(h)
    if v is not None:
        d["vocab"] = v.to_dict()
    return d


def _rank_key(c: dict):
    return (not c["llama_cpp"]["ok"], not (c["plausibly_faster"] and c["harness"]["ok"]), c["size_ratio"], c["name"])


def survey(target: Path, target_name: str, roots: list[Path], files: list[Path] = (),
           align: Align | None = None, target_ref: str | None = None) -> dict:
    """Every candidate under the roots (and the given files) against the target: llama.cpp's rule, the harness's
    alignment (where `align`, harness.align.check_pair, is given), size, rank. JSON-serialisable. A candidate's
    `ref` is what `harness bench` takes for it: its catalog name, else its path (the target's: `target_ref`)."""
    t0 = time.perf_counter()
    try:
        th = read_header(target, split_bytes(Path(target)))
        tv = vocab(th)
        require_model(th)
    except Unreadable as e:
        raise HarnessError(f"target {target}: {e}") from None
    found, skipped = find_files(roots, files)
    catalog = _catalog_files()
    t_real = os.path.realpath(target)
    cands: list[dict] = []
    settled: dict[str, tuple[str, str | None, str]] = {}  # tokenizer digest -> the harness's verdict
    for f in found:
        if os.path.realpath(f.path) == t_real:
            continue
        try:
            h = read_header(f.path, f.total_bytes)
            v = vocab(h)
            require_model(h)
        except Unreadable as e:
            skipped.append({"path": str(f.path), "kind": e.kind, "why": str(e)})
            continue
        ref = catalog.get(os.path.realpath(f.path))
        name = ref or f.name
        if name.startswith("sha256-") and h.kv.get("general.name"):  # an Ollama blob with no manifest
            name = f"{h.kv['general.name']} ({name[:19]})"
        clause = llama_cpp_rule(tv, v)
        if h.tokenizer_digest in settled:
            verdict, why, how = settled[h.tokenizer_digest]
        elif (got := _header_alignment(th, tv, h, v)) is not None:
            (verdict, why), how = got, "header"
        elif align is not None:
            (verdict, why), how = _checked_alignment(align, target, f.path), "check"
        else:
            verdict, why, how = None, "not checked", "none"
        settled[h.tokenizer_digest] = (verdict, why, how)
        ratio = h.bytes / th.bytes if th.bytes else float("inf")
        cands.append({"name": name, "ref": ref or str(f.path), "path": str(f.path), **_describe(h, v),
                      "llama_cpp": {"ok": clause is None, "clause": clause},
                      "harness": {"ok": verdict in (ALIGNED, WARNINGS), "verdict": verdict, "why": why, "how": how},
                      "size_ratio": round(ratio, 4), "plausibly_faster": ratio <= FASTER_RATIO, "rank": None})
    ranked = sorted((c for c in cands if c["llama_cpp"]["ok"] or c["harness"]["ok"]), key=_rank_key)
    for i, c in enumerate(ranked, 1):
        c["rank"] = i
    cands.sort(key=lambda c: (c["rank"] is None, c["rank"] or 0, c["size_ratio"], c["name"]))
    _disambiguate(cands)
    out = {"target": {"name": target_name, "ref": target_ref or str(target), "path": str(target),
                      **_describe(th, tv)}, "candidates": cands,
           "skipped": skipped, "roots": [str(r) for r in roots], "files": [str(f) for f in files]}
    out["advice"] = advice(out)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _disambiguate(cands: list[dict]) -> None:
    """Two candidates of one name (the same file name in two folders) are named by their paths."""
    seen: dict[str, int] = {}
    for c in cands:
        seen[c["name"]] = seen.get(c["name"], 0) + 1
    home = str(Path.home())
    for c in cands:
        if seen[c["name"]] > 1:
            c["name"] = "~" + c["path"][len(home):] if c["path"].startswith(home + os.sep) else c["path"]


def family(t: dict) -> str:
    """The target's family in words, from general.basename (or name) and general.architecture."""
    base = t.get("basename") or t.get("general_name")
    arch = t.get("architecture") or "unknown"
    size = f", this one {t['size_label']}" if t.get("size_label") else ""
    return f"{base} (architecture {arch}{size})" if base else f"architecture {arch}{size}"


def advice(s: dict) -> str:
    """One line: what to do with what was found."""
    t = s["target"]
    ranked = [c for c in s["candidates"] if c["rank"] is not None]
    usable = [c for c in ranked if c["plausibly_faster"]]
    both = [c for c in usable if c["llama_cpp"]["ok"] and c["harness"]["ok"]]
    tref = shlex.quote(t["ref"])
    free = (f"the model-free proposers (`harness bench --target {tref} --draft ngram:3`; llama-server's "
            f"`--spec-type ngram-simple` or `ngram-mod`)")
    smaller = f"or download a smaller model of the target's family, {family(t)}, which shares its tokenizer"
    if both:
        c = both[0]
        server = shlex.join(["llama-server", "-m", t["path"], "--spec-type", "draft-simple", "--spec-draft-model",
                             c["path"]])
        return (f"Try {c['name']}: `harness bench --target {tref} --draft {shlex.quote(c['ref'] + ',ngram:3')}` "
                f"measures it against the n-gram lookup; in llama-server: `{server}`.")
    if usable:
        c = usable[0]
        only, refuses = ("llama-server", "the harness") if c["llama_cpp"]["ok"] else ("the harness", "llama-server")
        return f"Only {only} takes {c['name']} ({refuses} refuses it); else use {free}, {smaller}."
    if ranked:
        return (f"No compatible GGUF here is at most {FASTER_RATIO:g}x the target's size, so none is likely to gain: "
                f"use {free}, {smaller}.")
    return f"No GGUF here can draft for {t['name']}: use {free}, {smaller}."
