"""The busy-machine guard: how much of the machine's CPU something other than this benchmark uses.

llama.cpp's threads spin-wait on oversubscribed cores, so another process is not a 2x slowdown but 10-100x:
a benchmark must know when its own numbers are not to be trusted, and the threshold has to be low (one other
process using a fifth of a core cost plain decoding 15% on a 2-core machine).

Foreign load = the machine's busy CPU time (user, nice, system, irq, softirq, steal: /proc/stat and the like)
less this process's and its workers', over an interval, as a share of all cores. Reading it costs a few file
reads, so a sampler thread can take it every second while a worker measures without disturbing it."""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.analysis.noise import unit_summary
from harness.errors import HarnessError
from harness.rundir import noise_records

SAMPLE_S = 1.0


def _busy_cpu() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


class Meter:
    """CPU seconds used by this process and its descendants (the worker, multiprocessing's resource tracker),
    live or reaped."""

    def __init__(self):
        self.me = psutil.Process()
        self.watched: list[psutil.Process] = []

    def watch(self, pid: int | None = None) -> None:
        """Take note of this process's descendants (one scan of the process table, once per worker)."""
        self.watched = self.me.children(recursive=True)

    def own(self) -> float:
        total = 0.0
        for p in list(self.watched):
            try:
                t = p.cpu_times()  # a zombie still reads; a reaped one is gone, its time in children_* below
                total += t.user + t.system
            except psutil.NoSuchProcess:
                self.watched.remove(p)
            except psutil.Error:
                pass
        t = self.me.cpu_times()
        return total + t.user + t.system + t.children_user + t.children_system

    def reading(self) -> tuple[float, float, float]:
        return time.monotonic(), _busy_cpu(), self.own()


def foreign_share(a: tuple[float, float, float], b: tuple[float, float, float], cores: int) -> float:
    """Share of all cores used by others between two readings (clipped at 0: clock ticks are 10 ms)."""
    wall = b[0] - a[0]
    if wall <= 0:
        return 0.0
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall / cores)


def own_share(a: tuple[float, float, float], b: tuple[float, float, float], cores: int) -> float:
    """Share of all cores this process and its workers used between two readings."""
    wall = b[0] - a[0]
    return max(0.0, (b[2] - a[2]) / wall / cores) if wall > 0 else 0.0


def top_processes(seconds: float = 1.0, n: int = 3) -> list[tuple[str, int, float]]:
    """(name, pid, share of one core) of the busiest other processes over `seconds`."""
    mine = {psutil.Process().pid} | {c.pid for c in psutil.Process().children(recursive=True)}

    def snap():
        out = {}
        for p in psutil.process_iter(["name", "cpu_times"]):
            if p.pid in mine or p.info["cpu_times"] is None:
                continue
            out[p.pid] = (p.info["name"], p.info["cpu_times"].user + p.info["cpu_times"].system)
        return out

    a = snap()
    time.sleep(seconds)
    b = snap()
    use = [(name, pid, (cpu - a[pid][1]) / seconds) for pid, (name, cpu) in b.items() if pid in a]
    return sorted((u for u in use if u[2] > 0.005), key=lambda u: -u[2])[:n]


def idle_check(threshold: float, allow_busy: bool, seconds: float = 2.0) -> dict:
    """Measure foreign load before the sweep; refuse to start above the threshold unless allowed."""
    cores = psutil.cpu_count() or 1
    m = Meter()
    a = m.reading()
    time.sleep(seconds)
    share = foreign_share(a, m.reading(), cores)
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    busy = share > threshold
    if busy and not allow_busy:
        names = ", ".join(f"{name} (pid {pid}, {u:.0%} of a core)" for name, pid, u in top_processes()) or \
            "no single process stands out"
        raise HarnessError(f"the machine is busy: other processes use {share:.0%} of its {cores} cores (threshold "
                           f"{threshold:.0%}; busiest: {names}); timings would not be trustworthy: stop them, or "
                           "pass --allow-busy to run anyway with every configuration marked")
    return {"foreign": share, "load1": load1, "busy": busy, "threshold": threshold, "cores": cores}


@dataclass
class Sampler:
    """Foreign load, and the worker's own, sampled every SAMPLE_S seconds by a thread while a configuration runs.
    asked: the share of the cores the worker's threads ask for (None where offload makes its CPU time no
    measure of its progress): a worker stopped and resumed again and again (a laptop's power or thermal
    management) gets far less, while no other process shows up as foreign load."""
    threshold: float
    asked: float | None = None
    cores: int = field(default_factory=lambda: psutil.cpu_count() or 1)
    meter: Meter = field(default_factory=Meter)
    shares: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        # Ctrl-C must reach the main thread: a signal this thread took would leave it blocked in waitpid()
        # until the worker ended on its own
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        marks = [self.meter.reading()]
        while not self._stop.wait(SAMPLE_S):
            marks.append(self.meter.reading())
        marks.append(self.meter.reading())
        if len(marks) > 2 and marks[-1][0] - marks[-2][0] < SAMPLE_S:
            del marks[-2]  # a short tail joins the window before it: 10 ms clock ticks need a second to resolve
        self.shares = [foreign_share(a, b, self.cores) for a, b in zip(marks, marks[1:])]
        self.own = [own_share(a, b, self.cores) for a, b in zip(marks, marks[1:])]

    def __enter__(self) -> "Sampler":
        self.shares = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="noise-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """What noise.jsonl keeps of the unit: the per-second shares, foreign and its own (the report derives
        mean, worst stretch and busy from them: analysis.noise), the threshold, the load average at the end."""
        return {"shares": [round(x, 4) for x in self.shares], "threshold": self.threshold,
                "own_shares": [round(x, 4) for x in self.own], "asked": self.asked,
                "load1": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def busy_units(run_dir: Path, units: list[str]) -> list[str]:
    """Of these units, those whose last measurement ran on a busy machine (or slowed)."""
    recs = noise_records(run_dir)
    return [u for u in units if u in recs and unit_summary(recs[u])["busy"]]
