"""A run directory, the one place a benchmark's results live: plan.json (what was asked), results.jsonl (one
line per finished configuration), traces/ (the raw records every figure is computed from) and side runs kept
apart, each with its own traces/: drift/ (the plain baselines again at the end, with their own results.jsonl)
and paired/ (plain decoding beside each speculative configuration, in its worker)."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from harness.errors import HarnessError
from harness.trace import append_record, read_records, repair

DRIFT_DIR = "drift"
PAIRED_DIR = "paired"
RUNS_DIR = "runs"  # under the reports directory


def new_run_dir(root: Path) -> Path:
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname().split('.')[0]}"
    d = root / name
    try:
        d.mkdir(parents=True, exist_ok=False)
        (d / "traces").mkdir()
    except OSError as e:
        raise HarnessError(f"cannot create the run directory {d}: {e.strerror}; choose a writable --out") from None
    latest = root / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(name)
    except OSError:
        pass  # a convenience link only
    return d


def write_plan(run_dir: Path, plan: dict) -> None:
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=1))


PLAN_KEYS = ("params", "instances", "prompt_ids", "categories")


def read_plan(run_dir: Path) -> dict:
    f = run_dir / "plan.json"
    if not f.exists():
        raise HarnessError(f"{run_dir} is not a benchmark run directory (no plan.json)")
    try:
        plan = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HarnessError(f"{f} is damaged ({getattr(e, 'msg', e)}): the run's plan cannot be read; its traces "
                           "are still in the directory, but resuming or reporting it needs the plan") from None
    missing = [k for k in PLAN_KEYS if not isinstance(plan, dict) or k not in plan]
    if missing:
        raise HarnessError(f"{f} lacks {', '.join(missing)}: it was not written by `harness bench` or was cut "
                           "short; the run cannot be resumed or reported")
    return plan


def record_result(run_dir: Path, record: dict) -> None:
    """Append one configuration's result line to results.jsonl (what finished() reads back)."""
    append_record(run_dir / "results.jsonl", record)


def repair_results(run_dir: Path) -> None:
    """Drop half-written last lines of the run's results files (its own and the drift check's)."""
    for d in (run_dir, run_dir / DRIFT_DIR):
        repair(d / "results.jsonl")


def finished(run_dir: Path) -> dict[str, dict]:
    """Results recorded so far, by instance id (the last record wins)."""
    out = {}
    f = run_dir / "results.jsonl"
    if f.exists():
        for r in read_records(f):
            out[r["config"]] = r
    return out


def load_records(run_dir: Path, configs: set[str]) -> list[dict]:
    """Trace records of the given configurations (a worker killed midway leaves a partial trace: not counted)."""
    return [r for c in sorted(configs) if (run_dir / "traces" / f"{c}.jsonl").exists()
            for r in read_records(run_dir / "traces" / f"{c}.jsonl")]
