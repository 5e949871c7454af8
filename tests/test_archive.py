"""`harness archive`: a finished run's traces gzipped, what the report makes again dropped, and the report still
what the traces give; every reader takes a trace in either form. No model runs: the runs are copies of the
smallest committed one."""
import gzip
import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.report import check, markdown
from harness.report.archive import archive, same, size
from harness.report.tables import compute
from harness.rundir import trace_files
from harness.trace import compress, decompress, read_records
from tests.helpers import ROOT, copy_run, harness, one_line_error


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    """The smallest committed run and its report, traces plain (decompressed, and the report and diagnostics
    rendered for that form, if the committed run is archived)."""
    runs = [p for p in (ROOT / "reports" / "runs").glob("2*") if p.is_dir() and (p / "plan.json").exists()]
    run = copy_run(min(runs, key=size), tmp_path_factory.mktemp("plain"))
    gz = [f for f in trace_files(run) if f.name.endswith(".gz")]
    for f in gz:
        decompress(f)
    if gz:
        for f, text in markdown(run, compute(run), [run.parent.parent / f"{run.name}.md"]).items():
            f.write_text(text)
    return run


@pytest.fixture(scope="module")
def archived_run(plain_run, tmp_path_factory) -> tuple[Path, str]:
    """A copy of plain_run after `harness archive`, and what the command printed."""
    run = copy_run(plain_run, tmp_path_factory.mktemp("archived"))
    r = harness("archive", run)
    assert r.returncode == 0, r.stderr
    return run, r.stdout


def test_archive_gzips_the_traces_and_drops_only_what_the_report_makes_again(plain_run, archived_run):
    run, out = archived_run
    assert "the report matches the traces" in out and f"{size(plain_run):,} -> {size(run):,} bytes" in out
    traces = trace_files(run)
    assert traces and all(f.name.endswith(".jsonl.gz") for f in traces)
    assert len(traces) == len(trace_files(plain_run))
    # nothing a figure is read from went (the diagnostics are written again, as the report is); of the plots,
    # only the verdicts' and concurrency's stay
    for f in plain_run.rglob("*"):
        rel = f.relative_to(plain_run)
        if f.is_file() and rel.parts[0] != "plots" and "traces" not in rel.parts \
                and f.stem not in ("metrics", "verdicts", "tidy", "diagnostics"):
            assert (run / rel).read_bytes() == f.read_bytes(), rel
    assert {p.name for p in (run / "plots").glob("*")} <= {"verdicts.png", "concurrency.png"}
    assert not [f for f in run.iterdir() if f.stem in ("metrics", "verdicts", "tidy")]
    md = (run.parent.parent / f"{run.name}.md").read_text()
    first_screen = md.split("## Contents")[0]
    assert ("verdicts.png" in first_screen) == (plain_run / "plots" / "verdicts.png").exists()
    diagnostics = (run / "diagnostics.md").read_text()
    for text in (md, diagnostics):
        assert "gamma.png" not in text and "cost_model.png" not in text
        assert "`harness archive` kept only the first screen's" in text


def test_the_archived_run_checks_and_gives_the_plain_runs_figures(plain_run, archived_run):
    run, _ = archived_run
    r = harness("report", run, "--check")
    assert r.returncode == 0 and "report matches the traces" in r.stdout, r.stdout + r.stderr
    assert same(compute(plain_run), compute(run))


def test_archive_is_reproducible_and_idempotent(plain_run, archived_run, tmp_path):
    run, _ = archived_run
    again = copy_run(plain_run, tmp_path)
    for f in trace_files(again):
        assert compress(f).read_bytes() == (run / f.relative_to(again)).with_suffix(".jsonl.gz").read_bytes()
    twice = copy_run(run, tmp_path / "twice")
    a = archive(twice)
    assert a["gzipped"] == [] and a["dropped"] == [] and a["before"] == a["after"] == size(run)


def test_a_tampered_gzipped_trace_fails_the_check(archived_run, tmp_path):
    run = copy_run(archived_run[0], tmp_path)
    trace = next(f for f in trace_files(run) if any(r.get("accepted", 0) < r.get("proposed", 0)
                                                    for r in read_records(f)))
    lines = gzip.decompress(trace.read_bytes()).decode().splitlines()
    i = next(k for k, x in enumerate(lines) if json.loads(x).get("accepted", 0) < json.loads(x).get("proposed", 0))
    rec = json.loads(lines[i])
    rec["accepted"] += 1  # one more accepted draft than the run saw
    lines[i] = json.dumps(rec)
    trace.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    assert check(run)
    one_line_error(harness("report", str(run), "--check"), "disagrees")


def test_archive_refuses_what_it_cannot_archive_in_one_line(plain_run, tmp_path):
    one_line_error(harness("archive", str(tmp_path / "nope")), "no such run directory")
    one_line_error(harness("archive", str(tmp_path)), "not a benchmark run directory")
    run = copy_run(plain_run, tmp_path)
    results = run / "results.jsonl"
    whole = results.read_text()
    results.write_text("".join(whole.splitlines(keepends=True)[:-1]))  # a unit still to run
    one_line_error(harness("archive", str(run)), "not finished", "--resume")
    results.write_text(whole)
    md = run.parent.parent / f"{run.name}.md"
    md.write_text(md.read_text().replace("## Machine and run", "## Machine and run (edited)"))
    one_line_error(harness("archive", str(run)), "already disagrees", "nothing archived")
    assert all(f.name.endswith(".jsonl") for f in trace_files(run))


def test_archive_restores_the_plain_traces_when_the_figures_would_change(plain_run, tmp_path, monkeypatch):
    from harness.report import archive as archive_mod
    run = copy_run(plain_run, tmp_path)
    files = {f: f.read_bytes() for f in trace_files(run)}
    monkeypatch.setattr(archive_mod, "same", lambda a, b: False)
    with pytest.raises(HarnessError, match="restored"):
        archive(run)
    assert {f: f.read_bytes() for f in trace_files(run)} == files
    assert {f.relative_to(run) for f in run.rglob("*")} == {f.relative_to(plain_run) for f in plain_run.rglob("*")}


def _hold_lock(run: Path):
    """The run's lock held, as a running bench holds it (rundir.lock_run), by a process whose pid it names."""
    import fcntl
    import os
    import subprocess
    holder = subprocess.Popen(["sleep", "60"])
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, f"{holder.pid}\n".encode())
    return holder, fd


def _nest(run: Path) -> None:
    """What `harness bench --out RUN` leaves in RUN: a run under runs/, and its reports beside it."""
    inner = run / "runs" / "20261205-000000-vm"
    (inner / "traces").mkdir(parents=True)
    (inner / "plan.json").write_text("{}")
    for name in ("20261205-000000-vm.md", "latest.md"):
        (run / name).write_text("# another run\n")


def _read_only(monkeypatch):
    """The first write archive makes, refused as a read-only file system refuses it."""
    import errno
    import os

    from harness.report import archive as archive_mod

    def refused(f):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(f))
    monkeypatch.setattr(archive_mod, "compress", refused)


# (case, what is done to the run, words of the one error line; words it must not hold)
REFUSALS = [
    ("10 a bench is running it", _hold_lock, ["a bench (pid PID) is running", "let it finish"], ["--resume"]),
    ("11 another run nested in it", _nest, ["holds another run", "move runs, 20261205-000000-vm.md, latest.md out",
                                            "nothing archived"], []),
    ("6 a read-only run", None, ["Read-only file system", "copy the run somewhere writable",
                                 "`harness archive DIR/RUN`"], ["--out"]),
]


@pytest.mark.parametrize("case, damage, words, not_words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_archive_refuses_with_the_cause_and_keeps_the_run(plain_run, tmp_path, monkeypatch, case, damage, words,
                                                          not_words):
    import os
    run = copy_run(plain_run, tmp_path)
    held = damage(run) if damage else _read_only(monkeypatch)
    before = {f.relative_to(run): f.read_bytes() for f in run.rglob("*") if f.is_file()}
    try:
        pid = str(held[0].pid) if held else ""
        line = one_line_error(harness("archive", run), *(w.replace("PID", pid).replace("RUN", run.name) for w in words))
    finally:
        if held:
            os.close(held[1])
            held[0].kill()
            held[0].wait()
    assert not any(w in line for w in not_words), line
    assert {f.relative_to(run): f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
