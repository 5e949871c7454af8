"""`harness drafts TARGET [PATH ...] [--json]`: the survey (models.drafts) as a table and a line of advice, or as
JSON: the printer apart from what it prints."""
from __future__ import annotations

import json
import os
from pathlib import Path

from harness.errors import HarnessError
from harness.models import arch
from harness.models.drafts import ALIGNED, FASTER_RATIO, WARNINGS, Align, default_roots, family, survey


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _clip(s: str, n: int = 60) -> str:
    s = s.replace("|", "\\|")
    return s if len(s) <= n else s[:n - 1] + "…"


def format_survey(s: dict) -> str:
    from tabulate import tabulate
    t = s["target"]
    v = t["vocab"]
    f, why = t["arch"], arch.refusal("harness bench refuses it", t["arch"])
    lines = [f"Target {t['name']}: {_size(t['bytes'])}, {family(t)}, vocab {v['type']} ({v['model']}, "
             f"{v['pre'] or 'no'} pre-tokenizer), {v['n_tokens']} tokens.",
             " ".join([f"Architecture: {arch.words(f)}.", *arch.implications(f), *([why + "."] if why else [])]), ""]
    rows = []
    for c in s["candidates"]:
        h = c["harness"]
        head = (h["why"] or "").split(":")[0].split(" (")[0]  # the table names the reason; --json has its values
        hcell = ("ok" if h["verdict"] == ALIGNED else "not checked" if h["verdict"] is None
                 else f"ok; {head}" if h["verdict"] == WARNINGS else f"no: {head}")
        size = f"{_size(c['bytes'])} = {c['size_ratio']:.2f}x, " + ("faster" if c["plausibly_faster"] else "too big")
        rows.append((str(c["rank"] or "-"), _clip(c["name"], 48), size,
                     "ok" if c["llama_cpp"]["ok"] else _clip(c["llama_cpp"]["clause"]), _clip(hcell)))
    if rows:
        lines.append(tabulate(rows, headers=("rank", "candidate", "size vs target", "llama-server", "harness check"),
                              tablefmt="github"))
    else:
        lines.append("No other GGUF model found.")
    where = ", ".join(s["roots"] + s["files"]) or "nothing"
    kinds: dict[str, int] = {}
    for k in s["skipped"]:
        kinds[k["kind"]] = kinds.get(k["kind"], 0) + 1
    skip = "; skipped " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + " (--json names them)" if kinds else ""
    lines += ["", f"{len(s['candidates'])} candidates in {where}, {s['seconds']:.1f} s{skip}. Faster: plausibly, at "
                  f"most {FASTER_RATIO:g}x the target's bytes.", s["advice"]]
    return "\n".join(lines)


def drafts_command(target_ref: str, paths: list[str], as_json: bool, align: Align | None = None) -> str:
    """`harness drafts TARGET [PATH ...] [--json]`."""
    from harness.models.catalog import require_present, resolve
    m = resolve(target_ref)
    tpath = require_present(m)
    roots, files = [], []
    for p in map(Path, paths):
        if p.is_dir():
            try:
                os.scandir(p).close()
            except OSError as e:  # a folder named and not readable is an error, not "no GGUF found"
                raise HarnessError(f"{p}: cannot read the folder ({e.strerror or e}): check its permissions") \
                    from None
            roots.append(p)
        elif p.is_file():
            files.append(p)
        else:
            raise HarnessError(f"{p}: no such file or folder")
    if not paths:
        roots = default_roots()
    s = survey(tpath, m.name, roots, files, align, m.name if m.kind != "file" else str(tpath))
    return json.dumps(s, indent=1, ensure_ascii=False) if as_json else format_survey(s)
