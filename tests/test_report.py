"""`harness report` and `report --check` on a run that was damaged or forged after bench wrote it, or given
arguments that cannot work (issue 43): each row says what was done to the run, the command, and the one line that
names the cause. No model runs: the run is a copy of the smallest committed one, its report rendered afresh. Then,
on the shared timed run and the committed runs: --check against tampered traces, plots not redrawn, the exports;
a full disk under the plots."""
from __future__ import annotations

import errno
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.archive import size
from harness.rundir import trace_files
from harness.trace import read_records
from tests.conftest import CATEGORIES, POLICIES, T
from tests.helpers import ROOT, copy_run, harness, one_line_error, only_run


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The smallest committed run with its report and every export, written by this harness."""
    runs = [p for p in (ROOT / "reports" / "runs").glob("2*") if p.is_dir() and (p / "plan.json").exists()]
    run = copy_run(min(runs, key=size), tmp_path_factory.mktemp("base"))
    r = harness("report", run, "--format", "md,csv,json,parquet")
    assert r.returncode == 0, r.stderr
    return run


@pytest.fixture
def run(base, tmp_path) -> Path:
    run = copy_run(base, tmp_path)
    assert harness("report", run, "--check").returncode == 0
    return run


def _trace(run: Path) -> Path:
    return next(f for f in trace_files(run) if f.parent == run / "traces" and f.name.startswith("g"))


def _trace_lines(run: Path) -> list[bytes]:
    return gzip.decompress(_trace(run).read_bytes()).split(b"\n")


def _write_trace(run: Path, lines: list[bytes]) -> None:
    _trace(run).write_bytes(gzip.compress(b"\n".join(lines), mtime=0))


def _mid_line_cut(run):
    lines = _trace_lines(run)
    lines[5] = lines[5][:20]
    _write_trace(run, lines)


def _gzipped_twice(run):
    f = _trace(run)
    f.write_bytes(gzip.compress(f.read_bytes(), mtime=0))


def _invalid_utf8(run):
    f = _trace(run)
    lines = gzip.decompress(f.read_bytes()).split(b"\n")
    lines[3] = lines[3][:30] + b"\xff\xfe" + lines[3][30:]
    f.with_name(f.name.removesuffix(".gz")).write_bytes(b"\n".join(lines))  # a plain trace: read before the .gz
    f.unlink()


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]


def _set_rows(run, rows: list) -> None:
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _conflicting_row(run):
    rows = _rows(run)
    _set_rows(run, rows + [rows[0] | {"wall_s": rows[0]["wall_s"] / 2}])


def _list_row(run):
    _set_rows(run, _rows(run) + [[1, 2]])


def _row_without_config(run):
    rows = _rows(run)
    _set_rows(run, rows + [{k: v for k, v in rows[0].items() if k not in ("unit", "config")}])


def _null_noise(run):
    with open(run / "noise.jsonl", "a") as f:
        f.write("null\n")


def _forged_answer(run):
    answer = json.loads((run / "answer.json").read_text())
    (run / "answer.json").write_text(json.dumps([a | {"verdict": "speculate"} for a in answer], indent=1))


def _forged_parquet(run):
    (run / "verdicts.parquet").write_bytes((run / "metrics.parquet").read_bytes())


def _without(*keys):
    def damage(run):
        rows = _rows(run)
        rows[1] = {k: v for k, v in rows[1].items() if k not in keys}
        _set_rows(run, rows)
    return damage


def _status_error(run):
    rows = _rows(run)
    rows[1]["status"] = "error"
    _set_rows(run, rows)


def _empty_trace(run):
    _trace(run).write_bytes(gzip.compress(b"", mtime=0))


# (case, damage, words the one error line of `report --check` holds; "TRACE" stands for the damaged trace's path)
CHECK_ROWS = [
    ("1 a damaged line mid-trace", _mid_line_cut, ["TRACE", "line 6 is damaged", "restore"]),
    ("2 a row twice, with other values", _conflicting_row, ["results.jsonl", "lines 1 and", "two different results",
                                                            "wall_s"]),
    ("3 a forged answer.json", _forged_answer, ["disagrees", "1 place"]),
    ("3 a forged Parquet export", _forged_parquet, ["disagrees", "1 place"]),
    ("5 a results line that is a JSON list", _list_row, ["results.jsonl", "is a JSON list", "restore"]),
    ("5 a results row without unit and config", _row_without_config, ["results.jsonl", "names no configuration"]),
    ("5 null in noise.jsonl", _null_noise, ["noise.jsonl line", "is null", "restore"]),
    ("5 a trace gzipped twice", _gzipped_twice, ["TRACE", "gzipped twice", "gzip -dc"]),
    ("5 a plain trace with invalid UTF-8", _invalid_utf8, ["line 4 is damaged (not UTF-8)"]),
    ("9 its status removed from a row", _without("status"), ["results.jsonl line 2", "lacks status",
                                                             "; the report disagrees with its traces in"]),
    ("9 its memory removed from a row", _without("peak_rss_bytes", "kv_bytes"),
     ["results.jsonl line 2", "lacks peak_rss_bytes, kv_bytes", "; the report disagrees with its traces in"]),
    ("9 a status changed to error", _status_error, ["results.jsonl line 2", "status error without the error",
                                                    "; the report disagrees with its traces in"]),
    ("9 a trace replaced by an empty .gz", _empty_trace, ["TRACE_NAME is empty", "--resume",
                                                          "; the report disagrees with its traces in"]),
]


@pytest.mark.parametrize("case, damage, words", CHECK_ROWS, ids=[r[0] for r in CHECK_ROWS])
def test_check_names_what_was_done_to_the_run(run, case, damage, words):
    trace = _trace(run)
    damage(run)
    r = harness("report", run, "--check")
    path = str(trace if trace.exists() else trace.with_name(trace.name.removesuffix(".gz")))
    one_line_error(r, *(w.replace("TRACE_NAME", trace.name).replace("TRACE", path) for w in words))
    if case.startswith("1"):  # the report refuses too: it would skip the line and change the figures
        md = (run.parent.parent / f"{run.name}.md").read_text()
        one_line_error(harness("report", run), path, "line 6 is damaged")
        assert (run.parent.parent / f"{run.name}.md").read_text() == md


def test_a_line_cut_short_at_the_end_of_a_trace_is_still_skipped(run):
    """What a kill mid-write leaves (an unfinished unit's last line) is no damage."""
    lines = _trace_lines(run)
    assert lines[-1] == b""
    _write_trace(run, lines[:-1] + [b'{"type": "st'])
    assert harness("report", run, "--check").returncode == 0


@pytest.mark.parametrize("forge", [_forged_answer, _forged_parquet], ids=["json", "parquet"])
def test_report_rewrites_a_forged_export_and_check_names_it(run, forge):
    forge(run)
    r = harness("report", run, "--check")
    name = "answer.json" if forge is _forged_answer else "verdicts.parquet"
    assert f"{name} differs from what the traces give" in r.stdout, r.stdout
    assert harness("report", run).returncode == 0  # every export the run holds is written again
    assert harness("report", run, "--check").returncode == 0


def test_report_through_the_latest_link_writes_and_checks_the_runs_own_report(run):
    """`make report` is `harness report reports/runs/latest`: <run>.md is written too, and checked."""
    (run.parent / "latest").symlink_to(run.name)
    md, latest = run.parent.parent / f"{run.name}.md", run.parent.parent / "latest.md"
    md.write_text(md.read_text().replace("## Machine and run", "## Machine and run (stale)"))
    latest.unlink(missing_ok=True)
    r = harness("report", run.parent / "latest")
    assert r.returncode == 0 and r.stdout.strip() == str(md.resolve()), r.stdout + r.stderr
    assert latest.read_text() == md.read_text() and "(stale)" not in md.read_text()
    assert harness("report", run.parent / "latest", "--check").returncode == 0
    latest.write_text(latest.read_text() + "edited\n")
    r = harness("report", run.parent / "latest", "--check")
    one_line_error(r, "disagrees")
    assert "latest.md has" in r.stdout
    assert harness("report", run, "--check").returncode == 0  # the run's own report is right


@pytest.mark.parametrize("formats, words", [("", ["--format ''", "names no format", "md, csv, json, parquet"]),
                                            (",,,", ["--format ',,,'", "names no format"]),
                                            ("md,xml", ["xml is not a format", "md, csv, json, parquet"])],
                         ids=["empty", "commas", "unknown"])
def test_a_format_list_that_names_nothing_writes_nothing(run, formats, words):
    before = {f: f.stat().st_mtime_ns for f in (*run.parent.parent.glob("*.md"), *run.glob("*.*"))}
    one_line_error(harness("report", run, "--format", formats), *words)
    assert {f: f.stat().st_mtime_ns for f in before} == before


def test_a_read_only_run_is_reported_without_a_write_and_refused_with_advice_that_applies(run, monkeypatch):
    """An intact results.jsonl is only read; a refused write says to copy the run (report has no --out)."""
    from harness import report
    from harness import trace as trace_mod
    modes = []
    monkeypatch.setattr(trace_mod, "open", lambda f, mode="r", *a, **k: modes.append(mode) or open(f, mode, *a, **k),
                        raising=False)

    def refused(run_dir, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(run_dir / "plots" / "verdicts.png"))
    monkeypatch.setattr(report, "draw_plots", refused)
    line = one_line_error(harness("report", run), "Read-only file system", "copy the run somewhere writable",
                          f"`harness report DIR/{run.name}`")
    assert "--out" not in line
    assert modes and all(m == "rb" for m in modes)


@pytest.mark.parametrize("args", [["--check"], []], ids=["check", "report"])
def test_a_result_lost_to_a_closed_stdout_is_not_success(run, args):
    r = subprocess.run(["sh", "-c", '"$0" -m harness.cli report "$@" >&-', sys.executable, str(run), *args],
                       cwd=ROOT, env=os.environ | {"CI": "true"}, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    one_line_error(r, "cannot write the output to standard output", "closed")


# -- the layout: a first screen that answers, sections of about a screen, the self-checks apart ------------------

DEFAULT_RUN = "20261207-130110-vm"  # the committed `make bench` run the README quotes
# what answers whether the harness predicts its own timings, and how far the machine moved by itself
SELF_CHECKS = ("## Replayed against timed", "## Cost (this machine only)", "## Adaptive gamma (greedy, replayed)",
               "## Cost model", "## Machine noise", "## Output equivalence (greedy)", "## Per category",
               "Two timings of the same work", "log-scale spread", "Each was measured twice")


def _first_screen(md: str) -> list[str]:
    """The report up to its table of contents."""
    assert "\n## Contents\n" in md
    return md.split("\n## Contents\n", 1)[0].splitlines()


def _prose(lines: list[str]) -> list[str]:
    """The lines outside code blocks."""
    out, code = [], False
    for x in lines:
        code ^= x.startswith("```")
        if not code and not x.startswith("```"):
            out.append(x)
    return out


def test_the_default_runs_first_screen_answers_and_its_self_checks_are_in_the_diagnostics():
    """The committed `make bench` run: at most 250 lines, whose first 40 (of at most 120 characters, code blocks
    aside) give the bottom line per target (a verdict in words with tok/s), the targets side by side, what the
    answer rests on, one plot and the command; the contents follow, with one line to diagnostics.md, which holds
    the self-checks and the detail the report does not. No absolute machine path."""
    md = (ROOT / "reports" / f"{DEFAULT_RUN}.md").read_text()
    diagnostics = (ROOT / "reports" / "runs" / DEFAULT_RUN / "diagnostics.md").read_text()
    first = _first_screen(md)
    assert len(first) <= 40 and len(md.splitlines()) <= 250, (len(first), len(md.splitlines()))
    assert all(len(x) <= 120 for x in _prose(first)), [x for x in _prose(first) if len(x) > 120]
    bottom = [x for x in first if x.startswith("- ")]
    targets = {i["target"] for i in json.loads((ROOT / "reports" / "runs" / DEFAULT_RUN / "plan.json").read_text())
               ["instances"]}
    assert len(bottom) == len(targets)
    assert all(re.search(r"\*\*(speculate|don't speculate|inconclusive)\*\*", x) for x in bottom)
    assert "tok/s" in "\n".join(first) and "Plain references, tok/s:" in "\n".join(first)
    # a "speculate" gives its command; the targets side by side where the run holds several
    assert ("llama-server -m models/" in "\n".join(first)) == any("**speculate**" in x for x in bottom)
    headings = [x for x in first if x.startswith("## ")]
    assert headings == ["## The bottom line"] + ["## Speculation against quantization"] * (len(targets) > 1)
    assert sum(x.startswith("![") for x in first) == 1 and "verdicts.png" in "\n".join(first)
    assert sum(x.startswith("|--") for x in first) == (len(targets) > 1)  # the quantization table
    assert not re.search(r"(/work/|/root/|/home/)\S*\.gguf", md)
    assert [x for x in md.splitlines() if "diagnostics.md" in x] == [
        next(x for x in md.splitlines() if x.startswith(f"- [Diagnostics](runs/{DEFAULT_RUN}/diagnostics.md)"))]
    for check in (*SELF_CHECKS, "## Acceptance (models, prompts and policy only)",
                  "## Predicted speedup (acceptance and cost combined)"):
        assert check in diagnostics and check not in md, check
    sections = re.split(r"\n(?=## )", md.split("\n## Contents\n", 1)[1])
    assert all(len(s.splitlines()) <= 60 for s in sections), [s.splitlines()[0] for s in sections
                                                              if len(s.splitlines()) > 60]


def test_a_fresh_report_answers_first_and_keeps_its_self_checks_in_the_diagnostics(run):
    md, diagnostics = (run.parent.parent / f"{run.name}.md").read_text(), (run / "diagnostics.md").read_text()
    first = "\n".join(_first_screen(md))
    assert len(first.splitlines()) <= 40
    # a timed run, without a replay, opens with its bottom line too (its categories pooled); the answer per
    # category and its table follow the contents
    assert "## The bottom line" in first and "tok/s" in first and "## Verdict per category" not in first
    assert "## The answer per category" in md and "## Verdict per category" in md and "## Memory" in md
    assert first.count("![") == 1
    for heading in ("## Per category", "## Output equivalence (greedy)"):
        assert heading in diagnostics and heading not in md
    assert "## Cost model" not in md  # in the diagnostics where the run has one (a run of N requests has not)
    assert f"[its report](../../{run.name}.md)" in diagnostics


def test_diagnostics_are_written_and_checked_as_the_report_is(run):
    diagnostics = run / "diagnostics.md"
    text = diagnostics.read_text()
    diagnostics.write_text(text.replace("## Per category", "## Per category (edited)"))
    r = harness("report", run, "--check")
    one_line_error(r, "disagrees", "1 place")
    assert "diagnostics.md line" in r.stdout
    one_line_error(harness("archive", run), "already disagrees", "nothing archived")
    diagnostics.unlink()
    r = harness("report", run, "--check")
    one_line_error(r, "disagrees")
    assert "no diagnostics.md" in r.stdout
    assert harness("report", run).returncode == 0 and diagnostics.read_text() == text
    assert harness("report", run, "--check").returncode == 0


# -- a full disk under the plots
PROMPTS = str(ROOT / "tests" / "data" / "prompts.jsonl")


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_bench_full_disk_in_the_png_writer(tmp_path, monkeypatch):
    """A full disk under the report's plots: one line naming the PNG, the run's results kept, and `harness report`
    writes the report once there is room."""
    from harness import plots
    if not plots.available():
        pytest.skip("no matplotlib: no PNG writer")
    from matplotlib.figure import Figure
    real = Figure.savefig

    def full(fig, path, **kw):
        with open("/dev/full", "wb") as f:  # the real ENOSPC, raised by a write that names no file
            f.write(b"x" * 65536)
            f.flush()
    monkeypatch.setattr(Figure, "savefig", full)
    out = tmp_path / "out"
    r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "1", "--prompts", PROMPTS,
                "--categories", "code", "--per-category", "1", "--max-tokens", "2", "--no-paired", "--allow-busy",
                "--out", out)
    run = only_run(out)
    line = one_line_error(r, "cannot write", str(run / "plots"), ".png", os.strerror(errno.ENOSPC),
                          "free some space", f"`harness report {run}`")
    assert "are kept" in line
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert rows and all(x["status"] == "ok" for x in rows)
    monkeypatch.setattr(Figure, "savefig", real)
    r = harness("report", run)
    assert r.returncode == 0, r.stderr
    assert (out / f"{run.name}.md").is_file()


def test_report_full_disk_in_the_png_writer(tmp_path, monkeypatch):
    """`harness report` of a committed run (copied), the disk full under its plots: one line, the traces kept."""
    from harness import plots
    if not plots.available():
        pytest.skip("no matplotlib: no PNG writer")
    from matplotlib.figure import Figure

    from tests.helpers import copy_run
    committed = sorted(p for p in (ROOT / "reports" / "runs").iterdir() if (p / "plan.json").is_file())[0]
    run = copy_run(committed, tmp_path)
    before = sorted(p.name for p in (run / "traces").iterdir())

    def full(fig, path, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write to a full disk raises it: no file name
    monkeypatch.setattr(Figure, "savefig", full)
    line = one_line_error(harness("report", run), "cannot write", str(run / "plots"), ".png",
                          os.strerror(errno.ENOSPC), "free some space", f"`harness report {run}`")
    assert "are kept" in line
    assert sorted(p.name for p in (run / "traces").iterdir()) == before


# -- on the shared timed run and the committed runs: --check against tampered traces, plots not redrawn, exports
def _tamper(trace: Path, pick, change) -> None:
    """Change the first record of a trace that pick() selects, written back in the trace's own form."""
    recs = read_records(trace)
    change(next(r for r in recs if pick(r)))
    text = "".join(json.dumps(r) + "\n" for r in recs)
    if trace.name.endswith(".gz"):
        trace.write_bytes(gzip.compress(text.encode()))
    else:
        trace.write_text(text)


def _own_traces(run: Path, side: str = "") -> list[Path]:
    d = run / side if side else run
    return [f for f in trace_files(d) if f.parent == d / "traces" and f.name.startswith("g")]


def _rejected(r: dict) -> bool:
    return r.get("accepted", 0) < r.get("proposed", 0)


@pytest.mark.parametrize("what", ["accepted", "gen_ms", "paired gen_ms"])
def test_report_check_fails_when_a_trace_disagrees(timed_run, tmp_path, what):
    """One more accepted draft than the run saw; a generation 10% slower; its paired twin (the reference the
    speedup and its interval are built from) 10% faster: each is a difference that --check shows."""
    run = copy_run(timed_run, tmp_path)
    assert harness("report", str(run), "--check").returncode == 0
    if what == "accepted":
        trace = next(f for f in _own_traces(run) if any(_rejected(r) for r in read_records(f)))
        _tamper(trace, _rejected, lambda r: r.update(accepted=r["accepted"] + 1))
    elif what == "gen_ms":
        _tamper(_own_traces(run)[0], lambda r: r["type"] == "generation", lambda r: r.update(gen_ms=r["gen_ms"] * 1.1))
    else:
        _tamper(_own_traces(run, "paired")[0], lambda r: r["type"] == "generation",
                lambda r: r.update(gen_ms=r["gen_ms"] / 1.1))
    r = harness("report", str(run), "--check")
    one_line_error(r, "disagrees")
    assert r.stdout.strip()  # the differing lines are shown


def test_report_check_neither_redraws_plots_nor_depends_on_how_the_path_is_typed(timed_run):
    pngs = {p: p.stat().st_mtime_ns for p in (timed_run / "plots").glob("*.png")}
    assert pngs, "the run draws its plots (the dev extra has matplotlib)"
    for args, cwd in (([str(timed_run.resolve())], ROOT), ([timed_run.name], timed_run.parent),
                      ([f"./{timed_run.name}/"], timed_run.parent)):
        r = harness("report", *args, "--check", cwd=cwd)
        assert r.returncode == 0 and "matches" in r.stdout, r.stdout + r.stderr
    assert {p: p.stat().st_mtime_ns for p in pngs} == pngs


def test_report_exports(timed_run, tmp_path):
    run = copy_run(timed_run, tmp_path)
    r = harness("report", str(run), "--format", "md,csv,json,parquet")
    assert r.returncode == 0, r.stderr
    for ext in ("csv", "json", "parquet"):
        assert (run / f"metrics.{ext}").stat().st_size > 0
        assert (run / f"verdicts.{ext}").stat().st_size > 0
    import polars as pl
    m = pl.read_parquet(run / "metrics.parquet")
    for col in ("speedup_lo", "speedup_hi", "acceptance_rate_lo", "mean_accepted_len_hi", "alpha_lo", "prompts"):
        assert col in m.columns
    spec = m.filter(pl.col("draft") != "none")
    assert (spec["speedup_lo"] <= spec["speedup"]).all() and (spec["speedup"] <= spec["speedup_hi"]).all()
    v = pl.read_csv(run / "verdicts.csv")
    assert set(v["verdict"]) <= {"speculate", "plain decoding", "inconclusive", "unreliable (busy machine)"}
    assert len(v) == len(CATEGORIES) * len(POLICIES)


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(p.name for p in (ROOT / "reports" / "runs").glob("2*") if p.is_dir()))
def test_committed_reference_runs_match_their_traces(run):
    """The README's figures come from these runs: their reports must be what the traces give."""
    r = harness("report", str(Path("reports") / "runs" / run), "--check")
    assert r.returncode == 0, r.stdout + r.stderr
