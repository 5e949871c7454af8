"""Progress while a unit runs. Its worker is another process, so the parent watches the unit's traces grow and
counts the prompts finished in them: a marker each finished prompt writes, counted in the file's bytes without
parsing a line (a read of a file the page cache holds: nothing that disturbs the measurement). On a terminal, a
line per unit rewritten in place every second; elsewhere (a log, CI), a line every 30 seconds."""
from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

from harness.rundir import PAIRED_DIR, REPLAY_DIR, trace_path

TTY_EVERY_S, LOG_EVERY_S = 1.0, 30.0
GENERATION, REPLAY, REPLAY_PROMPT = b'"type": "generation"', b'"type": "replay",', b'"type": "replay_prompt"'

Watch = list[tuple[Path, bytes, int]]  # (trace, marker, markers per finished prompt)


def clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def line(label: str, done: int, total: int, elapsed_s: float, done_at_start: int = 0, width: int = 0,
         weights: list[float] | None = None) -> str:
    """'label: 23/60 prompts, 4:12 elapsed, about 6:50 left', the time left at the pace of the prompts this
    worker finished (a resumed unit's kept prompts are done but took none of its time); unsaid before the first.
    weights: each prompt's estimated time, in the order they run, so that the pace of short prompts does not
    promise the long ones' time (a sweep's long-context prompts come last, and take most of its first unit).
    width: the label shortened to fit (a line that wraps cannot be rewritten in place)."""
    out = f": {done}/{total} prompts, {clock(elapsed_s)} elapsed"
    w = weights or [1.0] * total
    ran = sum(w[done_at_start:done])
    if ran > 0 and done < total:
        out += f", about {clock(elapsed_s / ran * sum(w[done:]))} left"
    if width and len(label) + len(out) > width:
        label = label[:max(0, width - len(out) - 3)] + "..."
    return label + out


def count(watch: Watch) -> int:
    """Prompts finished: in each trace, its marker's count over how many a prompt writes; the least of them."""
    out = []
    for path, marker, per in watch:
        try:
            out.append(path.read_bytes().count(marker) // per)
        except OSError:  # not written yet
            out.append(0)
    return min(out, default=0)


def timed_watch(run_dir: Path, unit: str, paired: bool) -> Watch:
    """A timed unit: a generation in its trace and, paired, in its twin's."""
    return [(trace_path(d, unit), GENERATION, 1) for d in [run_dir] + ([run_dir / PAIRED_DIR] if paired else [])]


def replay_watch(run_dir: Path, unit: str, per_prompt: int) -> Watch:
    """A replay unit: a record per proposer that writes one per prompt (none: its replay_prompt record)."""
    f = trace_path(run_dir / REPLAY_DIR, unit)
    return [(f, REPLAY, per_prompt)] if per_prompt else [(f, REPLAY_PROMPT, 1)]


class Progress:
    """While the block runs, a thread shows line() for the unit; on an interruption, how far it got."""

    def __init__(self, label: str, total: int, watch: Watch, stream=None, weights: list[float] | None = None):
        self.label, self.total, self.watch, self.weights = label, total, watch, weights
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._stop = threading.Event()

    def _show(self) -> None:
        width = shutil.get_terminal_size().columns - 1 if self.tty else 0
        text = line(self.label, min(count(self.watch), self.total), self.total, time.monotonic() - self.t0,
                    self.at_start, width, self.weights)
        self.stream.write(f"\r\x1b[K{text}" if self.tty else text + "\n")
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(TTY_EVERY_S if self.tty else LOG_EVERY_S):
            self._show()

    def __enter__(self) -> Progress:
        self.t0, self.at_start = time.monotonic(), count(self.watch)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, *_) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:
            self.stream.write("\r\x1b[K")  # the unit's own line takes its place
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.stream.write(f"{self.label}: stopped after {min(count(self.watch), self.total)} of {self.total} "
                              "prompts\n")
        self.stream.flush()
