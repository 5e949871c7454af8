"""Where the harness writes, and what it refuses before writing: every failed write (a full disk, a file in the
way of --out) ends in one line on stderr; arguments that cannot work are refused before anything loads; the
calibrations `bench --calibrate` measures land under its --out. Each row is fast: refusals need no model, or
load one once."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, harness, one_line_error, only_run

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"
PROMPTS = str(ROOT / "tests" / "data" / "prompts.jsonl")


def _calibration(**over) -> dict:
    """A calibration as `harness calibrate` writes it (k = 1..3 at two contexts), with fields replaced."""
    c = {"model": T, "path": "x.gguf", "threads": 1, "ngl": 0, "contexts": [128, 1024], "k": [1, 2, 3],
         "ms_by_context": [[5.0, 6.0, 7.0], [6.0, 7.0, 8.0]], "ms_last_by_context": [[4.0, 4.5, 5.0], [5.0, 5.5, 6.0]],
         "ms": [5.0, 6.0, 7.0], "reps": 1, "date": "2026-12-01 00:00:00", "sha256": "",
         "machine": {"host": "vm", "cpu": "cpu", "date": "2026-12-01", "llama-cpp-python": "0"}}
    return c | over


def _setup(tmp: Path) -> dict[str, str]:
    """The files a row's arguments name: FILE (a regular file), RUN (an empty directory), LIST and ZERO (bad
    calibrations)."""
    (tmp / "file").write_text("in the way\n")
    (tmp / "run").mkdir()
    (tmp / "list.json").write_text(json.dumps([1, 2, 3]))
    zero = _calibration(ms_by_context=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    (tmp / "zero.json").write_text(json.dumps(zero))
    return {"FILE": str(tmp / "file"), "RUN": str(tmp / "run"), "LIST": str(tmp / "list.json"),
            "ZERO": str(tmp / "zero.json"), "OUT": str(tmp / "out")}


# (case, argv with FILE/RUN/LIST/ZERO/OUT placeholders, words the one error line must hold)
ROWS = [
    ("calibrate --out a regular file",
     ["calibrate", T, "--k-max", "2", "--reps", "1", "--out", "FILE"],
     ["cannot write", "file", "File exists", "a file is in the way", "--out"]),
    ("calibrate --out under a regular file",
     ["calibrate", T, "--k-max", "2", "--reps", "1", "--out", "FILE/cal"],
     ["cannot write", "Not a directory", "a file is in the way", "--out"]),
    ("compare --out a regular file",
     ["compare", "RUN", "OUT", "--out", "FILE"],
     ["cannot write", "File exists", "a file is in the way", "--out"]),
    ("predict --out a regular file",
     ["predict", "RUN", "--costs", "LIST", "--out", "FILE"],
     ["cannot write", "File exists", "a file is in the way", "--out"]),
    ("run --trace on a full disk",
     ["run", T, "--prompt", "hi", "--max-tokens", "2", "--trace", "/dev/full"],
     ["cannot write /dev/full", os.strerror(errno.ENOSPC), "free some space", "--trace"]),
    ("predict --costs a JSON list",
     ["predict", "RUN", "--costs", "LIST", "--out", "OUT"],
     ["--costs", "list.json", "JSON list", "harness calibrate"]),
    ("predict --costs zero costs",
     ["predict", "RUN", "--costs", "ZERO", "--out", "OUT"],
     ["--costs", "zero.json", "positive time", "harness calibrate"]),
    ("calibrate --k-max above the batch",
     ["calibrate", T, "--k-max", "2000", "--out", "OUT"],
     ["--k-max 2000", "batch size 512", "--k-max 512 or less"]),
    ("calibrate --k-max far above the batch",
     ["calibrate", T, "--k-max", "100000", "--out", "OUT"],
     ["--k-max 100000", "batch size 512"]),
    ("bench --gamma above the batch",
     ["bench", "--target", T, "--draft", "ngram:2", "--gamma", "1000", "--prompts", PROMPTS, "--per-category", "1",
      "--max-tokens", "2", "--out", "OUT"],
     ["--gamma 1000", "1001 tokens", "batch of 512", "the largest gamma is 511"]),
    ("compare the same run twice",
     ["compare", "RUN", "RUN", "--out", "OUT"],
     ["is given twice", "compare each run once"]),
    ("compare the same run under two names",
     ["compare", "RUN", "RUN/.", "--out", "OUT"],
     ["are the same run", "compare each run once"]),
]


@pytest.mark.parametrize("case,argv,words", ROWS, ids=[r[0] for r in ROWS])
def test_one_line(tmp_path, case, argv, words):
    names = _setup(tmp_path)
    args = []
    for a in argv:
        for k, v in names.items():
            if a == k or a.startswith(k + "/"):
                a = v + a[len(k):]
        args.append(a)
    r = harness(*args)
    one_line_error(r, *words)
    assert not (tmp_path / "out").exists(), "refused, yet --out was written"


def test_calibrate_refuses_before_loading(tmp_path, monkeypatch):
    """--k-max above the batch is refused before any model loads (it used to measure for minutes)."""
    import harness.calibrate as cal

    def no_engine(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(cal, "Engine", no_engine)
    one_line_error(harness("calibrate", T, "--k-max", "513", "--out", tmp_path), "--k-max 513")


def test_costmodel_names_the_k_max_that_works():
    """A calibration too short for a gamma names the --k-max that covers it (not just "a larger" one), and a
    gamma the batch cannot hold names the largest one that fits."""
    from harness.costmodel import Costs
    from harness.errors import HarnessError
    c = Costs((5.0, 6.0, 7.0), 4.0)
    with pytest.raises(HarnessError, match=r"--k-max 9\b"):
        c.verify(9)
    with pytest.raises(HarnessError, match="the largest gamma is 511"):
        c.verify(1001)


def test_zero_costs_never_divide(tmp_path):
    """The zero-cost calibration is refused as such, not by a ZeroDivisionError further on."""
    from harness.compare.predict import load_calibrations
    from harness.errors import HarnessError
    names = _setup(tmp_path)
    with pytest.raises(HarnessError, match="positive time"):
        load_calibrations([names["ZERO"]])
    half = _calibration(ms_last_by_context=[[4.0, 0, 5.0], [5.0, 5.5, 6.0]])
    (tmp_path / "half.json").write_text(json.dumps(half))
    with pytest.raises(HarnessError, match="positive time"):
        load_calibrations([str(tmp_path / "half.json")])
    (tmp_path / "ok.json").write_text(json.dumps(_calibration()))
    assert load_calibrations([str(tmp_path / "ok.json")])[0][T]["k"] == [1, 2, 3]


def test_os_error_line():
    """The one place a failed write becomes a line: the errno's advice, the option, the run kept."""
    from harness.errors import naming, os_error_line
    for code, advice in ((errno.ENOSPC, "free some space"), (errno.EROFS, "choose a writable --out"),
                         (errno.EACCES, "choose a writable --out"), (errno.EEXIST, "a file is in the way"),
                         (errno.ENOTDIR, "a file is in the way"), (errno.EISDIR, "a directory is in the way")):
        line = os_error_line(OSError(code, os.strerror(code), "/x/y"))
        assert line.startswith(f"cannot write /x/y: {os.strerror(code)}; {advice}"), line
    assert os_error_line(OSError(errno.ECONNRESET, "reset")) is None  # not a write's: a traceback still
    with pytest.raises(OSError) as e, naming("/r/plots/a.png", run=Path("/r")), naming(None, option="--trace"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    line = os_error_line(e.value)
    assert "cannot write /r/plots/a.png" in line and "another --trace" in line and "`harness report /r`" in line


def _instances():
    from harness.plan import Params, expand
    return expand(Params(target=[T], draft=[D], gamma=[2], threads=[1]))


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory that is not the project's (the catalog still found), a run under OUT/runs."""
    monkeypatch.setenv("HARNESS_CATALOG", str(ROOT / "models.toml"))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "out" / "runs" / "r1"
    run.mkdir(parents=True)
    return tmp_path, run


def test_bench_calibrate_writes_under_out(elsewhere, monkeypatch):
    """bench --calibrate saves what it measures in OUT/calibration (not ./reports/calibration) and copies it
    into the run."""
    import harness.calibrate as cal
    from harness.bench.prepare import prepare_calibrations
    tmp, run = elsewhere
    monkeypatch.setattr(cal, "calibrate", lambda ref, threads, ngl, *a: _calibration(model=ref, threads=threads,
                                                                                     ngl=ngl))
    prepare_calibrations(_instances(), run, True)
    for m in (T, D):
        assert (tmp / "out" / "calibration" / f"{m}-t1-ngl0.json").is_file()
        assert (run / "calibration" / f"{m}-t1-ngl0.json").is_file()
    assert not (tmp / "reports").exists()


def test_bench_finds_calibrations_under_out_then_reports(elsewhere):
    """Without --calibrate, a run takes OUT/calibration's, else reports/calibration's (`harness calibrate`'s
    default)."""
    from harness.bench.prepare import prepare_calibrations
    tmp, run = elsewhere
    for root, m, tag in ((tmp / "out" / "calibration", T, "out"), (tmp / "reports" / "calibration", T, "reports"),
                         (tmp / "reports" / "calibration", D, "reports")):
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{m}-t1-ngl0.json").write_text(json.dumps(_calibration(model=m, date=tag)))
    prepare_calibrations(_instances(), run, False)
    got = {m: json.loads((run / "calibration" / f"{m}-t1-ngl0.json").read_text())["date"] for m in (T, D)}
    assert got == {T: "out", D: "reports"}


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


def test_reports_compare_ignored():
    """compare's default output is not committed; predict's are, only those committed already."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert "reports/compare/" in lines
    assert "reports/predict/*" in lines
