"""Running `harness` in the tests, and reading what it wrote.

`harness()` calls the console script's main(argv) in this process: a refusal or a report costs no interpreter
start and no re-import. `harness_process()` starts a real process, for the tests where the process itself is
under test (the console script, signals, kill and resume, the busy guard's view of other processes)."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = [sys.executable, "-m", "harness.cli"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _bench_args(args: tuple) -> tuple:
    """A bench run not about the busy-machine guard tolerates more foreign load (0.25 of the cores) than the
    default, so that a background blip on a CI machine cannot fail it."""
    if args and args[0] == "bench" and "--resume" not in args and "--busy-threshold" not in args:
        return (*args, "--busy-threshold", "0.25")
    return args


@contextlib.contextmanager
def _environ(extra: dict):
    old = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(old)


def harness(*args, cwd=ROOT, env=None) -> Result:
    """`harness ARGS` in-process: exit code, stdout and stderr as the console script would give them (an
    uncaught exception becomes a traceback on stderr and exit 1, as Python's would)."""
    from harness.cli import main
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.chdir(cwd), _environ({"CI": "true"} | (env or {})), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in _bench_args(args)])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # noqa: BLE001 - what the console script would print
            traceback.print_exc()
            code = 1
    return Result(code, out.getvalue(), err.getvalue())


def harness_process(*args, cwd=ROOT, env=None, **kw) -> subprocess.CompletedProcess:
    """`harness ARGS` in a process of its own."""
    e = os.environ | {"CI": "true"} | (env or {})
    return subprocess.run([*HARNESS, *map(str, _bench_args(args))], cwd=cwd, env=e, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def one_line_error(r, *words) -> str:
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("harness: error:")]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def only_run(out: Path) -> Path:
    """The one run directory under OUT/runs (not the `latest` link)."""
    runs = [d for d in (out / "runs").iterdir() if d.is_dir() and not d.is_symlink()]
    assert len(runs) == 1, runs
    return runs[0]


def report_md(run: Path) -> str:
    return (run.parent.parent / f"{run.name}.md").read_text()


def diagnostics_md(run: Path) -> str:
    """The run's diagnostics.md: the harness's checks of itself, apart from the report."""
    return (run / "diagnostics.md").read_text()


def copy_run(run: Path, dest_root: Path) -> Path:
    """The run and its report, copied into a reports directory of their own: for tests that change a run."""
    dest = dest_root / "reports" / "runs" / run.name
    shutil.copytree(run, dest, symlinks=True)
    shutil.copy(run.parent.parent / f"{run.name}.md", dest.parent.parent / f"{run.name}.md")
    return dest


def md_table(md: str, heading: str) -> list[dict]:
    """The first Markdown table after a heading, as dicts."""
    lines = md.split(heading, 1)[1].splitlines()
    start = next(k for k, ln in enumerate(lines) if ln.startswith("|"))
    end = next((k for k in range(start, len(lines)) if not lines[k].startswith("|")), len(lines))
    rows = lines[start:end]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in rows[2:]]


@contextlib.contextmanager
def engine_pair(target: Path, draft: Path, cfg):
    """A target and a draft Engine with one config, closed after."""
    from harness.engine import Engine
    t, d = Engine(target, cfg), Engine(draft, cfg)
    try:
        yield t, d
    finally:
        t.close()
        d.close()
