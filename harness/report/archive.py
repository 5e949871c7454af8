"""`harness archive RUN_DIR`: a finished run made small enough to commit. Its traces are gzipped (every reader
takes x.jsonl.gz for x.jsonl), what `harness report` makes again from them is dropped (the exports, and every
plot but the verdicts' and concurrency's), the Markdown report and diagnostics are written again without the
dropped plots' links, and both are checked against the traces as `harness report --check` does. Nothing a figure
is computed from is removed: plan.json, results.jsonl, noise.jsonl, calibration/ and fidelity.json stay as they
are."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from harness.errors import HarnessError
from harness.report import EXPORT_FORMATS, EXPORTS, LATEST, check, markdown, reports_root, run_of, writable
from harness.report.concurrency import PLOT as CONCURRENCY_PLOT
from harness.report.render import VERDICT_PLOT
from harness.report.tables import compute
from harness.rundir import LOCK_FILE, RUNS_DIR, read_plan, trace_files, unfinished
from harness.trace import GZ, compress, decompress

KEPT = (VERDICT_PLOT, CONCURRENCY_PLOT)  # the plots the report shows among its answers: the verdicts, against N


def derived(run_dir: Path) -> list[Path]:
    """What `harness report RUN_DIR --format md,csv,json,parquet` makes again from the traces and no figure is
    read from: the exports, and the plots but KEPT; and bench's lock file."""
    exports = [run_dir / f"{name}.{fmt}" for name in EXPORTS for fmt in EXPORT_FORMATS]
    plots = sorted((run_dir / "plots").glob("*.png"))
    lock = [run_dir / LOCK_FILE] if (run_dir / LOCK_FILE).exists() else []  # bench's lock: no evidence
    return [f for f in exports if f.exists()] + [p for p in plots if p.name not in KEPT] + lock


def size(run_dir: Path) -> int:
    return sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())


def same(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> bool:
    """Whether two runs of compute gave the very same figures."""
    from polars.testing import assert_frame_equal
    if a.keys() != b.keys():
        return False
    try:
        for k in a:
            assert_frame_equal(a[k], b[k], check_exact=True)
    except AssertionError:
        return False
    return True


def running(run_dir: Path) -> str | None:
    """The pid of the bench that holds the run's lock (rundir.lock_run) now; None when none does."""
    import fcntl
    import os
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None  # no lock file: no bench has run it since locks were taken, or none is running
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # releases the lock this took, if it took one


def nested(run_dir: Path) -> list[str]:
    """The entries of the run directory that hold another run: a bench whose --out was this run wrote its run
    under runs/ here, and that run's reports beside it. Archived, they would be committed inside this run."""
    runs = [p.parent for p in run_dir.rglob("plan.json") if p.parent != run_dir]
    tops = {p.relative_to(run_dir).parts[0] for p in runs} | ({RUNS_DIR} if (run_dir / RUNS_DIR).is_dir() else set())
    reports = [n for n in sorted({f"{r.name}.md" for r in runs} | {f"{LATEST}.md"}) if (run_dir / n).exists()]
    return sorted(tops) + reports if tops else []


def archive(run_dir: Path) -> dict:
    """Archive a finished run whose report matches its traces; what was gzipped and dropped, and its size in
    bytes before and after."""
    run_dir = run_of(run_dir)[0]
    plan = read_plan(run_dir)  # a directory that is not a run says so first
    pid = running(run_dir)
    if pid is not None:
        raise HarnessError(f"a bench (pid {pid}) is running {run_dir}: let it finish, then archive the run")
    inside = nested(run_dir)
    if inside:
        raise HarnessError(f"{run_dir} holds another run (a `harness bench --out` that named this run wrote it "
                           f"there): move {', '.join(inside)} out of it, then archive it; nothing archived")
    left = unfinished(run_dir, plan)
    if left:
        raise HarnessError(f"{run_dir} is not finished (no result yet for {', '.join(left[:3])}"
                           f"{f' and {len(left) - 3} more' if len(left) > 3 else ''}): finish it with "
                           f"`harness bench --resume {run_dir}` before archiving it")
    figures = compute(run_dir)
    diffs = check(run_dir, figures, exports=False)  # the exports go: what they say does not matter
    if diffs:
        raise HarnessError(f"the report of {run_dir} already disagrees with its traces in {len(diffs)} place(s) "
                           f"(see `harness report {run_dir} --check`): nothing archived")
    before = size(run_dir)
    gzipped = []
    try:
        for f in trace_files(run_dir):
            if not f.name.endswith(GZ):
                gzipped.append(compress(f))
        if not same(figures, compute(run_dir)):
            raise HarnessError(f"the gzipped traces of {run_dir} give other figures than the plain ones: the plain "
                               "traces are restored, nothing archived")
    except BaseException:
        for f in gzipped:
            decompress(f)
        raise
    dropped = derived(run_dir)
    for f in dropped:
        f.unlink()
    if (run_dir / "plots").is_dir() and not any((run_dir / "plots").iterdir()):
        (run_dir / "plots").rmdir()
    md = reports_root(run_dir) / f"{run_dir.name}.md"
    for f, text in markdown(run_dir, figures, [md]).items():  # the same figures, without the dropped plots' links
        if not f.exists() or f.read_text() != text:
            f.write_text(text)
    diffs = check(run_dir)  # what `harness report --check` does: every figure again, from the gzipped traces
    if diffs:
        raise HarnessError(f"after archiving, the report of {run_dir} disagrees with its traces in {len(diffs)} "
                           f"place(s) (see `harness report {run_dir} --check`)")
    return {"gzipped": [f.relative_to(run_dir).as_posix() for f in gzipped],
            "dropped": [f.relative_to(run_dir).as_posix() for f in dropped], "before": before,
            "after": size(run_dir)}


def archive_command(run_dir: Path) -> str:
    with writable(run_dir, "archive"):
        a = archive(run_dir)
    mib = 2 ** 20
    dropped = ", ".join(a["dropped"]) or "nothing"
    return (f"{run_dir}: gzipped {len(a['gzipped'])} trace file(s); dropped {dropped}; {a['before']:,} -> "
            f"{a['after']:,} bytes ({a['before'] / mib:.1f} -> {a['after'] / mib:.1f} MiB); "
            "the report matches the traces")
