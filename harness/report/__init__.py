"""Reports from a run directory's traces: Markdown (the report, and the run's diagnostics.md), CSV, JSON, Parquet;
and --check, which recomputes every figure from the traces and compares it with the written report, the
diagnostics and every export the run holds."""
from __future__ import annotations

import errno
import io
import json
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from harness.errors import HarnessError, naming
from harness.report.diagnostics import DIAGNOSTICS, render_diagnostics
from harness.report.render import render_markdown
from harness.report.tables import compute
from harness.rundir import RUNS_DIR, integrity, read_plan, repair_results

# the tables export writes, each as <name>.<format> in the run directory
EXPORTS = ("metrics", "verdicts", "tidy", "answer")
EXPORT_FORMATS = ("csv", "json", "parquet")
FORMATS = ("md", *EXPORT_FORMATS)
LATEST = "latest"  # runs/latest, the link to the newest run, and its report latest.md


def parse_formats(text: str) -> tuple[str, ...]:
    """--format's comma list, refused before anything is written if it names no format or an unknown one."""
    fmts = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        what = f"{bad[0]} is not a format" if bad else "it names no format"
        raise HarnessError(f"--format {text!r}: {what}; give a comma list of {', '.join(FORMATS)}")
    return fmts


def run_of(path: Path) -> tuple[Path, list[str]]:
    """The run a path names and the names of its Markdown reports: <run>.md, and also latest.md where the path is
    a link to the run (runs/latest, what `make report` gives), whose report is latest.md."""
    if not path.is_symlink():
        return path, [path.name]
    run = path.resolve()
    return run, list(dict.fromkeys((run.name, path.name)))


def reports_root(run_dir: Path) -> Path:
    """Where a run's Markdown report goes: the reports directory above runs/ (bench --out), or, for a run
    directory copied elsewhere, the directory holding it."""
    run_dir = run_dir.resolve()
    return run_dir.parent.parent if run_dir.parent.name == RUNS_DIR else run_dir.parent


@contextmanager
def writable(run_dir: Path, command: str):
    """A write the file system refuses (a read-only run, one of another user's): one line that says what would
    work, as `report` and `archive` have no --out: a copy of the run somewhere writable."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise HarnessError(f"cannot write {e.filename or run_dir}: {e.strerror}; copy the run somewhere writable "
                           f"(cp -r {run_dir} DIR/) and run `harness {command} DIR/{run_dir.name}` there") from None


def draw_plots(run_dir: Path, data: dict[str, pl.DataFrame]) -> None:
    from harness import plots
    from harness.report import concurrency
    sweep = data.get("sweep")
    if not plots.available() or sweep is None or not len(sweep):
        return
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    from harness.report.answer import answer_frame
    plots.verdicts(answer_frame(data, read_plan(run_dir)), out)  # the answer, as its first lines give it
    plots.gamma_curves(sweep, out)
    cm = data.get("cost_model")
    points = [] if cm is None else [(r["predicted"], r["speedup"], r["category"]) for r in cm.iter_rows(named=True)
                                    if r["predicted"] is not None and r["speedup"]]
    plots.predicted_vs_measured(points, out)
    plots.calibration(run_dir, out)
    concurrency.plot(data, out)


def write_reports(run_dir: Path, formats: tuple[str, ...] = ("md", "json")) -> Path:
    """The Markdown report (<run>.md and latest.md) and the diagnostics (<run>/diagnostics.md), and the exports in
    `formats`; every export the run already holds is written again too, so that none is left that the traces do
    not give."""
    run_dir = run_of(run_dir)[0]
    repair_results(run_dir)
    data = compute(run_dir)
    root = reports_root(run_dir)
    md = root / f"{run_dir.name}.md"
    with naming(None, run=run_dir):  # a full disk: one line that says the run's results are kept
        if "md" in formats:
            draw_plots(run_dir, data)
            for p, text in markdown(run_dir, data, [md, root / f"{LATEST}.md"]).items():
                with naming(p):
                    p.write_text(text)
        held = [f.suffix[1:] for f in exports_held(run_dir)]
        for fmt in dict.fromkeys((*formats, *held)):
            if fmt != "md":
                export(data, run_dir, fmt)
    return md


def markdown(run_dir: Path, data: dict[str, pl.DataFrame], reports: list[Path]) -> dict[Path, str]:
    """The Markdown a run's figures give, by the path it belongs at: its report at each of `reports` (<run>.md,
    latest.md: the same text, all in one directory) and its diagnostics in the run directory."""
    text = render_markdown(run_dir, data, reports[0].parent)
    return {p: text for p in reports} | {run_dir / DIAGNOSTICS: render_diagnostics(run_dir, data, reports[0])}


def export_frames(data: dict[str, pl.DataFrame], run_dir: Path) -> dict[str, pl.DataFrame]:
    """metrics (a row per configuration x category, intervals included), verdicts (a row per category, policy
    and target), tidy (report.tidy: the versioned table to pool) and answer (the answer per group, with the
    llama.cpp command of each "speculate"), each without its list columns."""
    from harness.report.answer import answer_frame
    from harness.report.tidy import tidy
    sweep = data.get("sweep")
    plan = read_plan(run_dir)
    pooled = tidy(sweep, plan, run_dir.name) if sweep is not None and len(sweep) else None
    out = {}
    for name, frame in zip(EXPORTS, (sweep, data.get("verdicts"), pooled, answer_frame(data, plan))):
        frame = pl.DataFrame() if frame is None else frame
        out[name] = frame.select([c for c in frame.columns if not isinstance(frame[c].dtype, pl.List)])
    return out


def encode(frame: pl.DataFrame, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(frame.to_dicts(), indent=1, default=str).encode()
    buf = io.BytesIO()
    if fmt == "csv":
        frame.write_csv(buf)
    else:
        frame.write_parquet(buf)
    return buf.getvalue()


def export(data: dict[str, pl.DataFrame], run_dir: Path, fmt: str) -> Path:
    """Each of export_frames as <name>.<fmt> in the run directory."""
    for name, frame in export_frames(data, run_dir).items():
        (run_dir / f"{name}.{fmt}").write_bytes(encode(frame, fmt))
    return run_dir / f"metrics.{fmt}"


def exports_held(run_dir: Path) -> list[Path]:
    return [f for name in EXPORTS for fmt in EXPORT_FORMATS if (f := run_dir / f"{name}.{fmt}").exists()]


def _export_diffs(run_dir: Path, data: dict[str, pl.DataFrame], shown: Path) -> list[str]:
    """The exports the run holds that differ from what the traces give (a Parquet file by its table, as its
    bytes name the library that wrote them)."""
    held = exports_held(run_dir)
    if not held:
        return []
    frames = export_frames(data, run_dir)
    out = []
    for f in held:
        fresh = frames[f.stem]
        if f.suffix == ".parquet":
            try:
                same = pl.read_parquet(f).equals(fresh)
            except (OSError, pl.exceptions.PolarsError):  # not a Parquet file, or a damaged one
                same = False
        else:
            same = f.read_bytes() == encode(fresh, f.suffix[1:])
        if not same:
            out.append(f"{f.name} differs from what the traces give (`harness report {shown} --format "
                       f"{f.suffix[1:]}` writes it again)")
    return out


def differences(path: Path, data: dict[str, pl.DataFrame] | None = None,
                exports: bool = True) -> tuple[list[str], list[str]]:
    """What --check finds, in two lists: causes, where the run's own files are not as bench wrote them (rows,
    traces; rundir.integrity), which explain the rest; and differences, between the written reports and
    diagnostics (and, with exports, the exports) and what the traces give now (or data, the run's figures as
    compute gave them)."""
    run_dir, names = run_of(path)
    plan = read_plan(run_dir)  # a directory that is not a run says so first
    root = reports_root(run_dir)
    mds = [root / f"{n}.md" for n in names]
    if not mds[0].exists():
        raise HarnessError(f"no report for {run_dir} at {mds[0]}: run `harness report {run_dir}` first")
    data = compute(run_dir) if data is None else data
    # first, as they explain the rest: a configuration without its row or trace (or with two rows) is in no
    # table or in one twice, so no line need differ; the plan says what is missing
    causes = integrity(run_dir, plan)
    diffs = []
    for md, text in markdown(run_dir, data, mds).items():
        where = "" if md == mds[0] else f"{md.name} "
        if not md.exists():
            if md.name == DIAGNOSTICS:  # a latest.md not written yet is no difference; a missing diagnostics is
                diffs.append(f"no {DIAGNOSTICS} in {run_dir} (`harness report {path}` writes it)")
            continue
        old, fresh = md.read_text().splitlines(), text.splitlines()
        said = "it" if md.name == DIAGNOSTICS else "report"
        diffs += [f"{where}line {i + 1}: {said} has {a!r}, traces give {b!r}"
                  for i, (a, b) in enumerate(zip(old, fresh)) if a != b]
        if len(old) != len(fresh):
            diffs.append(f"{where or 'report '}has {len(old)} lines, traces give {len(fresh)}")
    return causes, diffs + (_export_diffs(run_dir, data, path) if exports else [])


def check(run_dir: Path, data: dict[str, pl.DataFrame] | None = None, exports: bool = True) -> list[str]:
    """Every cause and difference --check finds (differences), causes first; empty where the run is intact and
    its reports and exports are what its traces give."""
    causes, diffs = differences(run_dir, data, exports)
    return causes + diffs


def disagreement(causes: list[str], diffs: list[str]) -> str:
    """--check's one line for a run that fails it: the first cause (what to fix), then how many places differ."""
    n = len(causes) + len(diffs)
    line = f"the report disagrees with its traces in {n} place(s)"
    if not causes:
        return line
    more = f" (and {len(causes) - 1} more such problem(s))" if len(causes) > 1 else ""
    return f"{causes[0]}{more}; {line}"
