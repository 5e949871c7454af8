"""crosscheck.json: the rows of every configuration measured in llama-server (harness crosscheck, and bench's
llama-server check), written as each one finishes, so that an interruption loses nothing finished and a rerun
skips it. What measures writes here; report.llamaserver presents it."""
from __future__ import annotations

import json
import os
from pathlib import Path

JSON = "crosscheck.json"
LOGS = "crosscheck-logs"
UNMEASURED = "not measured within the run's budget (harness crosscheck RUN measures it)"
VERSION = 1
RULE = ("A verdict holds in llama.cpp when llama-server's own 95% interval, over the same prompts, supports it by "
        "the run's rule: speculate when its lower bound is above 1 + the least gain worth having; no gain worth "
        "having when its upper bound is below 1 + that gain; plain decoding when its upper bound is below 1. "
        "Contradicted: the interval supports the opposite; unsettled: neither (more prompts would tell). An "
        "inconclusive verdict claims nothing (-): llama.cpp's own reading stands beside it.")


def load(run_dir: Path) -> list[dict]:
    """The rows crosscheck.json holds ([] when there is none, or it cannot be read: it is measured again)."""
    try:
        d = json.loads((run_dir / JSON).read_text())
    except (OSError, ValueError):
        return []
    rows = d.get("rows") if isinstance(d, dict) and d.get("version") == VERSION else None
    return [r for r in rows if isinstance(r, dict) and r.get("key")] if isinstance(rows, list) else []


def save(run_dir: Path, rows: list[dict]) -> None:
    """Written whole to a temporary file, then renamed over the old one: a kill never leaves half a file."""
    from harness.errors import naming
    path = run_dir / JSON
    tmp = path.with_suffix(".json.tmp")
    with naming(path, run=run_dir):
        tmp.write_text(json.dumps({"version": VERSION, "rule": RULE, "rows": rows}, indent=1))
        os.replace(tmp, path)


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """This invocation's rows in its order, then rows of earlier ones it did not touch (kept, never lost)."""
    keys = {r["key"] for r in new}
    return new + [r for r in old if r["key"] not in keys]
