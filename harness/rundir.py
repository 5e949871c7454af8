"""A run directory, the one place a benchmark's results live: plan.json (what was asked), results.jsonl (one
line per finished unit of work), noise.jsonl (the foreign load while each ran), traces/ (the raw records every
figure is computed from) and side runs kept apart, each with its own traces/: drift/ (the plain baselines again
at the end, with their own results.jsonl), paired/ (plain decoding beside each speculative configuration, in
its worker) and replay/ (the drafts teacher-forced along the baselines' outputs, with its own results.jsonl).

A unit of work is one configuration over one round of prompts: round 0 is the plan's prompt set, later rounds
are the prompts `--until-confident` added. A unit's id is its configuration's id, with ".rK" for round K > 0;
its traces are traces/<unit>.jsonl, or traces/<unit>.jsonl.gz once `harness archive` has gzipped a finished run's
(results.jsonl, noise.jsonl and plan.json stay plain). Every reader finds a trace through trace_file."""
from __future__ import annotations

import itertools
import json
import os
import socket
import time
from pathlib import Path

from harness.errors import HarnessError
from harness.instance import Instance
from harness.plan import Params
from harness.trace import append_record, gzipped, kind, lines, parse, read_numbered, read_records, repair

DRIFT_DIR = "drift"
PAIRED_DIR = "paired"
# A run directory's layout version, in plan.json: 1 (no "schema" key) lacks the prompts' digests; 2 has them
RUN_SCHEMA = 2
FIDELITY_FILE = "fidelity.json"  # a sweep of several targets: each against the first (harness.fidelity)
REPLAY_DIR = "replay"  # the replay of each baseline unit's outputs (bench.replay), with its own results.jsonl
RUNS_DIR = "runs"  # under the reports directory
TRACES_DIR = "traces"  # in the run directory and in each side run (drift/, paired/, replay/)
CACHE_DIR = "prompt-cache"  # the run's prompt cache (harness.promptcache), until the run is done


def cache_dir(run_dir: Path) -> Path:
    """The run's prompt cache, which the drift check's workers (run_dir/drift) share."""
    run_dir = Path(run_dir)
    return (run_dir.parent if run_dir.name == DRIFT_DIR else run_dir) / CACHE_DIR


def new_run_dir(root: Path) -> Path:
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname().split('.')[0]}"
    for k in itertools.count(1):
        d = root / (stem if k == 1 else f"{stem}-{k}")
        try:
            d.mkdir(parents=True, exist_ok=False)
            (d / "traces").mkdir()
        except FileExistsError:
            continue  # another bench started in the same second: the next suffix
        except OSError as e:
            raise HarnessError(f"cannot create the run directory {d}: {e.strerror}; choose a writable --out") from None
        break
    _point_latest(root, d.name)
    return d


def _point_latest(root: Path, name: str | None) -> None:
    latest = root / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        if name:
            latest.symlink_to(name)
    except OSError:
        pass  # a convenience link only


def discard_run_dir(d: Path) -> None:
    """A new run refused before anything ran: its directory goes, and `latest` points back at the newest run
    left (or goes), not at the stub."""
    import shutil
    shutil.rmtree(d)
    root = d.parent
    if os.path.realpath(root / "latest") == os.path.realpath(d) or not (root / "latest").exists():
        runs = sorted(x.name for x in root.iterdir() if x.name != "latest" and (x / "plan.json").is_file())
        _point_latest(root, runs[-1] if runs else None)


LOCK_FILE = ".lock"


def lock_run(run_dir: Path) -> int:
    """Take the run directory's lock (an flock on RUN/.lock, its holder's pid written in it) for one bench
    invocation, new run or resume; returns the descriptor to close when done. A run another harness process
    holds is refused: two benches of one run would both run every missing unit, and duplicate rows and traces."""
    import fcntl
    import os
    f = run_dir / LOCK_FILE
    try:
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise HarnessError(f"cannot lock the run directory {run_dir}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise HarnessError(f"another harness process (pid {pid}) is running {run_dir}: wait for it to finish, or "
                           "stop it and resume the run") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def write_plan(run_dir: Path, plan: dict) -> None:
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=1))


PLAN_KEYS = ("params", "instances", "prompt_ids", "categories")


def read_plan(run_dir: Path) -> dict:
    f = run_dir / "plan.json"
    if not f.exists():
        raise HarnessError(f"{run_dir} is not a benchmark run directory (no plan.json)")
    if not f.is_file():
        raise HarnessError(f"{f} is not a readable plan file (a directory or other non-file): {run_dir} is not a "
                           "run that can be resumed or reported")
    try:
        plan = json.loads(f.read_text())
    except OSError as e:
        raise HarnessError(f"cannot read {f}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HarnessError(f"{f} is damaged ({getattr(e, 'msg', e)}): the run's plan cannot be read; its traces "
                           "are still in the directory, but resuming or reporting it needs the plan") from None
    missing = [k for k in PLAN_KEYS if not isinstance(plan, dict) or k not in plan]
    if missing:
        raise HarnessError(f"{f} lacks {', '.join(missing)}: it was not written by `harness bench` or was cut "
                           "short; the run cannot be resumed or reported")
    if isinstance(plan.get("schema"), int) and plan["schema"] > RUN_SCHEMA:
        raise HarnessError(f"{f} is of run schema {plan['schema']}, made by a newer harness than this one (schema "
                           f"{RUN_SCHEMA}): upgrade the harness to resume or report it")
    _known_keys(f, plan)
    return plan


def _known_keys(f: Path, plan: dict) -> None:
    """Params.from_dict and Instance.from_dict of a plan would fail on a key they do not know or a field missing."""
    from dataclasses import MISSING, fields
    for what, rows, cls in (("params", [plan["params"]], Params), ("instances", plan["instances"], Instance)):
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise HarnessError(f"{f}: '{what}' is not as `harness bench` writes it: restore the plan")
        unknown = sorted({k for r in rows for k in r} - {x.name for x in fields(cls)})
        if unknown:
            raise HarnessError(f"{f}: '{what}' has unknown key(s) {', '.join(unknown)}: the plan was edited or made "
                               "by a newer harness; restore it, or upgrade the harness")
        required = {x.name for x in fields(cls) if x.default is MISSING and x.default_factory is MISSING}
        lacking = sorted({k for r in rows for k in required - set(r)})
        if lacking:
            raise HarnessError(f"{f}: '{what}' lacks {', '.join(lacking)}: the plan was edited; restore it")


def plan_rounds(plan: dict) -> list[list[str]]:
    """The prompt ids of each round (a run from before rounds has one: its prompt_ids)."""
    return plan.get("rounds") or [plan.get("prompt_ids", [])]


def unit_id(config: str, round_: int = 0) -> str:
    return config if round_ == 0 else f"{config}.r{round_}"


def record_result(run_dir: Path, record: dict) -> None:
    """Append one unit's result line to results.jsonl (what finished() reads back)."""
    append_record(run_dir / "results.jsonl", record)


def repair_results(run_dir: Path) -> None:
    """Drop half-written last lines of the run's results files (its own and the drift check's) and noise log."""
    for f in (run_dir / "results.jsonl", run_dir / DRIFT_DIR / "results.jsonl", run_dir / REPLAY_DIR / "results.jsonl",
              run_dir / NOISE_FILE):
        repair(f)


# what to do about a results.jsonl row that is not as bench wrote it
ROW_FIX = "restore the file (from git or a copy), or delete that line: `harness bench --resume` runs its unit again"


def finished(run_dir: Path) -> dict[str, dict]:
    """Results recorded so far, by unit id: the last row wins (a unit that failed, or ran on a busy machine, or
    lost its trace, is run again and appends a row). Two different "ok" rows of one unit from one attempt (the
    worker's id, in each row it writes) cannot both be bench's: refused, as is a row naming no configuration."""
    out: dict[str, dict] = {}
    oks: dict[tuple, tuple[int, dict]] = {}  # each unit's "ok" row of each attempt, with its line
    f = run_dir / "results.jsonl"
    for n, r in read_numbered(f, cut_rows=True, fix=ROW_FIX) if f.exists() else []:
        if not isinstance(r.get("config"), str):
            raise HarnessError(f"{f} line {n} names no configuration (no \"config\"): {ROW_FIX}")
        u = r.get("unit", r["config"])
        if r.get("status") == "ok":
            m, old = oks.setdefault((u, str(r.get("attempt"))), (n, r))
            if old != r:
                keys = sorted(k for k in old.keys() | r.keys() if old.get(k) != r.get(k))
                raise HarnessError(f"{f} lines {m} and {n} are two different results of unit {u} from one run of it "
                                   f"({', '.join(keys[:3])} differ): one was changed after bench wrote it; restore "
                                   "the file (from git or a copy)")
        out[u] = r
    return out


def ok_units(run_dir: Path) -> set[str]:
    return {u for u, r in finished(run_dir).items() if r.get("status") == "ok"}


def trace_path(run_dir: Path, unit: str) -> Path:
    """Where a unit's trace is written, in run_dir or a side run's directory."""
    return run_dir / TRACES_DIR / f"{unit}.jsonl"


def trace_file(run_dir: Path, unit: str) -> Path | None:
    """A unit's trace in run_dir (or a side run's directory), plain or gzipped; None if it has none. Both exist
    only when an archive was stopped between writing the gzipped copy and removing the plain one, which holds
    the same records: the plain one is read."""
    plain = trace_path(run_dir, unit)
    return next((f for f in (plain, gzipped(plain)) if f.exists()), None)


def trace_files(run_dir: Path) -> list[Path]:
    """Every trace file of the run, its own and its side runs', in either form."""
    return sorted(f for d in (run_dir, *(run_dir / s for s in (DRIFT_DIR, PAIRED_DIR, REPLAY_DIR)))
                  for f in (d / TRACES_DIR).glob("*.jsonl*") if f.name.endswith((".jsonl", ".jsonl.gz")))


def load_records(run_dir: Path, units: set[str]) -> list[dict]:
    """Trace records of the given units (a worker killed midway leaves a partial trace: not counted)."""
    return [r for u in sorted(units) if (f := trace_file(run_dir, u)) for r in read_records(f)]


def unfinished(run_dir: Path, plan: dict) -> list[str]:
    """What a run still lacks (empty once bench has finished it): units of the plan without a result line, a
    timed subset not chosen yet, an --until-confident loop that was interrupted or is still going."""
    done = finished(run_dir)
    timed = plan.get("timed")
    subset = plan.get("params", {}).get("timed_subset")
    out = [] if not subset or timed is not None else ["the timed subset"]
    for r, _ in enumerate(plan_rounds(plan)):
        for inst in (Instance.from_dict(d) for d in plan["instances"]):
            if subset and not inst.baseline and inst.id not in (timed or {}):
                continue  # timed only if the replay chose it
            if unit_id(inst.id, r) not in done:
                out.append(unit_id(inst.id, r))
    if plan.get("params", {}).get("until_confident") and (plan.get("until_confident") or {}).get("stopped") \
            in (None, "interrupted"):
        out.append("the --until-confident rounds")
    return out


def traces_missing(run_dir: Path, row: dict, paired: bool) -> list[str]:
    """The traces a finished ("ok") result row needs and the run directory lacks or holds empty (no unit that
    finished wrote none), each as "PATH is missing" or "PATH is empty": its own, and its paired twin's for a
    speculative configuration of a paired run. Skipped and error rows have none."""
    if row.get("status") != "ok":
        return []
    unit = row.get("unit", row.get("config"))
    dirs = [run_dir] + ([run_dir / PAIRED_DIR] if paired and row.get("draft", "none") != "none" else [])
    out = []
    for d in dirs:
        f = trace_file(d, unit)
        if f is None or not any(x.strip() for x in lines(f)):
            out.append(f"{(f or trace_path(d, unit)).relative_to(run_dir)} is {'missing' if f is None else 'empty'}")
    return out


# the keys of every result row bench writes (its configuration), of an "ok" one (what the worker measured) and
# of a timed "ok" one (its memory, in the report's tables); the statuses it writes
ROW_KEYS = ("config", "status", "target", "draft", "gamma", "policy")
OK_KEYS = ("peak_rss_bytes", "wall_s")
TIMED_KEYS = ("kv_bytes", "target_bytes", "draft_bytes")
STATUSES = ("ok", "error", "skipped")


def row_problem(row: dict, timed: bool) -> str | None:
    """How a result row differs from any bench writes, in words; None if it does not."""
    status = row.get("status")
    need = ROW_KEYS + (OK_KEYS + TIMED_KEYS * timed if status == "ok" else ())
    missing = [k for k in need if k not in row]
    if missing:
        return f"lacks {', '.join(missing)}"
    if status not in STATUSES:
        return f"has status {status!r}, none bench writes ({', '.join(STATUSES)})"
    if status != "ok" and not row.get("error"):
        return f"has status {status} without the error that caused it"
    return None


def rows_problems(run_dir: Path) -> list[str]:
    """results.jsonl's lines (the run's and its side runs') that bench did not write so: unreadable (cut short),
    repeated, or a row unlike any bench writes."""
    out = []
    for d in (run_dir, run_dir / DRIFT_DIR, run_dir / REPLAY_DIR):
        f = d / "results.jsonl"
        name = f.relative_to(run_dir)
        seen: dict[str, int] = {}
        for n, line in enumerate(lines(f) if f.exists() else [], 1):
            if not line.strip():
                continue
            try:
                row = parse(line)
            except ValueError:
                out.append(f"{name} line {n} is unreadable (cut short)")
                continue
            if not isinstance(row, dict):
                out.append(f"{name} line {n} is {kind(row)}, not a result row")
                continue
            unit = row.get("unit", row.get("config"))
            key = json.dumps(row, sort_keys=True)
            if key in seen:
                out.append(f"{name} line {n} repeats line {seen[key]} (unit {unit})")
            seen.setdefault(key, n)
            problem = row_problem(row, d.name != REPLAY_DIR)
            if problem:
                out.append(f"{name} line {n} (unit {unit}) {problem}: it was changed after bench wrote it")
    return out


def integrity(run_dir: Path, plan: dict) -> list[str]:
    """What makes the run's results disagree with its plan, each as a line: a result row cut short, written twice
    or changed (rows_problems), a planned unit with no result row (the run is unfinished, or a row was cut or
    removed), a finished unit whose trace is gone or empty. Empty for a finished, intact run."""
    out = rows_problems(run_dir)
    rerun = f"(`harness bench --resume {run_dir}` runs it again)"
    out += [f"{u} has no result row {rerun}" for u in unfinished(run_dir, plan) if not u.startswith("the ")]
    paired = bool(plan.get("params", {}).get("paired"))
    for u, row in sorted(finished(run_dir).items()):
        out += [f"{u} finished but its trace {t} {rerun}" for t in traces_missing(run_dir, row, paired)]
        out += replaced_models(u, row, plan)
    return out


def replaced_models(unit: str, row: dict, plan: dict) -> list[str]:
    """A finished row measured on a model file of another size than the plan recorded when the run started: the
    file was replaced mid-run (another quant), so the row measured it under the old name. A size of 0 is no file's
    (an n-gram lookup, a drafting head)."""
    models = plan.get("models") or {}
    out = []
    for side in ("target", "draft") if row.get("status") == "ok" else ():
        name, now = row.get(side), row.get(f"{side}_bytes")
        was = (models.get(str(name)) or {}).get("bytes")
        if now and was and now != was:
            out.append(f"{unit} was measured on a {side} file {name} of {now} bytes, not the {was} bytes the run "
                       "started with: the file was replaced mid-run; restore it and delete that row from "
                       "results.jsonl (`harness bench --resume` runs it again)")
    return out


def drop_unreadable(path: Path) -> int:
    """Rewrite a JSONL file without its unreadable lines (a row cut short in the middle, say); how many went. The
    file is written only when one goes."""
    if not path.exists():
        return 0
    rows = [x for x in lines(path) if x.strip()]
    keep = []
    for line in rows:
        try:
            parse(line)
            keep.append(line + b"\n")
        except ValueError:
            pass
    if len(keep) != len(rows):
        path.write_bytes(b"".join(keep))
    return len(rows) - len(keep)


NOISE_FILE = "noise.jsonl"


def record_noise(run_dir: Path, record: dict) -> None:
    append_record(run_dir / NOISE_FILE, record)


def noise_records(run_dir: Path) -> dict[str, dict]:
    """The foreign load measured while each unit ran (and before the sweep, as unit "idle-check"), by unit."""
    f = run_dir / NOISE_FILE
    fix = "restore the file (from git or a copy), or delete that line"
    out = {}
    for n, r in read_numbered(f, cut_rows=True, fix=fix) if f.exists() else []:
        if not isinstance(r.get("unit"), str):
            raise HarnessError(f"{f} line {n} names no unit: {fix}")
        out[r["unit"]] = r
    return out
