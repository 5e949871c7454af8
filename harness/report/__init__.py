"""Reports from a run directory's traces: Markdown, CSV, JSON, Parquet; and --check, which recomputes every
figure from the traces and compares it with the written report."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from harness.errors import HarnessError, naming
from harness.report.render import render_markdown
from harness.report.tables import compute
from harness.rundir import RUNS_DIR, integrity, read_plan, repair_results


def reports_root(run_dir: Path) -> Path:
    """Where a run's Markdown report goes: the reports directory above runs/ (bench --out), or, for a run
    directory copied elsewhere, the directory holding it."""
    run_dir = run_dir.resolve()
    return run_dir.parent.parent if run_dir.parent.name == RUNS_DIR else run_dir.parent


def draw_plots(run_dir: Path, data: dict[str, pl.DataFrame]) -> None:
    from harness import plots
    from harness.report import concurrency
    sweep = data.get("sweep")
    if not plots.available() or sweep is None or not len(sweep):
        return
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    plots.verdicts(data["replay_verdicts"] if "replay_verdicts" in data else data.get("verdicts"), out)
    plots.gamma_curves(sweep, out)
    cm = data.get("cost_model")
    points = [] if cm is None else [(r["predicted"], r["speedup"], r["category"]) for r in cm.iter_rows(named=True)
                                    if r["predicted"] is not None and r["speedup"]]
    plots.predicted_vs_measured(points, out)
    plots.calibration(run_dir, out)
    concurrency.plot(data, out)


def write_reports(run_dir: Path, formats: tuple[str, ...] = ("md", "json")) -> Path:
    repair_results(run_dir)
    data = compute(run_dir)
    root = reports_root(run_dir)
    md = root / f"{run_dir.name}.md"
    with naming(None, run=run_dir):  # a full disk: one line that says the run's results are kept
        if "md" in formats:
            draw_plots(run_dir, data)
            md_text = render_markdown(run_dir, data, root)
            for p in (md, root / "latest.md"):
                with naming(p):
                    p.write_text(md_text)
        for fmt in formats:
            if fmt != "md":
                export(data, run_dir, fmt)
    return md


# the tables export writes, each as <name>.<format> in the run directory
EXPORTS = ("metrics", "verdicts", "tidy", "answer")
EXPORT_FORMATS = ("csv", "json", "parquet")


def export(data: dict[str, pl.DataFrame], run_dir: Path, fmt: str) -> Path:
    """metrics.FMT (a row per configuration x category, intervals included), verdicts.FMT (a row per
    category, policy and target), tidy.FMT (report.tidy: the versioned table to pool) and answer.FMT (the answer
    per group, with the llama.cpp command of each "speculate") in the run directory."""
    from harness.report.answer import answer_frame
    from harness.report.tidy import tidy
    if fmt not in EXPORT_FORMATS:
        raise HarnessError(f"unknown report format '{fmt}' (md, csv, json, parquet)")
    sweep = data.get("sweep")
    plan = read_plan(run_dir)
    pooled = tidy(sweep, plan, run_dir.name) if sweep is not None and len(sweep) else None
    tables = dict(zip(EXPORTS, (sweep, data.get("verdicts"), pooled, answer_frame(data, plan))))
    for name, frame in tables.items():
        frame = pl.DataFrame() if frame is None else frame
        flat = frame.select([c for c in frame.columns if not isinstance(frame[c].dtype, pl.List)])
        path = run_dir / f"{name}.{fmt}"
        if fmt == "csv":
            flat.write_csv(path)
        elif fmt == "json":
            path.write_text(json.dumps(flat.to_dicts(), indent=1, default=str))
        else:
            flat.write_parquet(path)
    return run_dir / f"metrics.{fmt}"


def check(run_dir: Path, data: dict[str, pl.DataFrame] | None = None) -> list[str]:
    """Differences between the written Markdown report and one recomputed from the traces now (or rendered from
    data, the run's figures as compute gave them)."""
    plan = read_plan(run_dir)  # a directory that is not a run says so first
    md = reports_root(run_dir) / f"{run_dir.name}.md"
    if not md.exists():
        raise HarnessError(f"no report for {run_dir} at {md}: run `harness report {run_dir}` first")
    fresh = render_markdown(run_dir, compute(run_dir) if data is None else data, md.parent).splitlines()
    old = md.read_text().splitlines()
    # first, as they explain the rest: a configuration without its row or trace (or with two rows) is in no
    # table or in one twice, so no line need differ; the plan says what is missing
    diffs = integrity(run_dir, plan)
    diffs += [f"line {i + 1}: report has {a!r}, traces give {b!r}" for i, (a, b) in enumerate(zip(old, fresh))
              if a != b]
    if len(old) != len(fresh):
        diffs.append(f"report has {len(old)} lines, traces give {len(fresh)}")
    return diffs
