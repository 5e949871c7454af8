"""Running a function in a fresh spawned process: clean RSS, and a crash ends only that process."""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import resource
import signal
import sys
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to a bench, raised in its main thread by stop_on_signals' handler: a Ctrl-C by another
    name (the worker is stopped, what finished is kept, the run stays resumable), exiting 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals():
    """While the block runs, SIGTERM and SIGHUP raise Terminated (like SIGINT's KeyboardInterrupt) instead of
    killing the process at once and leaving its worker running as an orphan. Only the main thread can install
    handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, _frame):
        raise Terminated(signum)
    old = {s: signal.signal(s, raise_terminated) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_isolated(target, *args, on_start=None) -> int:
    """Run target(*args) in a spawned process and wait; Ctrl-C stops the child too. Returns its exit code.
    on_start(pid) is told the child's pid once it runs.

    A Ctrl-C is held back while the child starts: one in the middle of handing it its arguments would leave it
    to die with a traceback of its own. Blocking SIGINT in this thread is not enough, as any other thread of the
    process (llama.cpp's OpenMP pool from an in-process decode, the noise sampler) can take the signal and
    Python then raises in the main thread anyway; so the handler only notes it until the child has started.
    The blocked mask is inherited: the child keeps SIGINT blocked, and the parent stops it."""
    p = mp.get_context("spawn").Process(target=target, args=args)
    noted: list[int] = []
    # the handlers to hold back: SIGINT's default one (not where SIGINT is ignored), stop_on_signals' ones
    held_back = {s: h for s in (signal.SIGINT, *STOP_SIGNALS) if (h := signal.getsignal(s)) is not None
                 and (h is signal.default_int_handler if s == signal.SIGINT else callable(h))}
    for s in held_back:
        signal.signal(s, lambda signum, _: noted.append(signum))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # not SIGTERM: terminate() sends it
    try:
        p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        for s, h in held_back.items():
            signal.signal(s, h)
    try:
        if noted:
            held_back[noted[0]](noted[0], None)  # raises KeyboardInterrupt or Terminated
        if on_start:
            on_start(p.pid)
        p.join()
    except BaseException:
        p.terminate()
        p.join()
        raise
    return p.exitcode


UNWRITABLE_EXIT = 75  # a worker whose result row the run directory would not take (read-only, full: EX_TEMPFAIL)


def death(exitcode: int) -> str:
    if exitcode == UNWRITABLE_EXIT:
        return "worker could not write its result to the run directory (read-only or full?)"
    return f"worker died with signal {-exitcode}" if exitcode < 0 else f"worker exited with code {exitcode}"


def rss_bytes_now() -> int:
    """This process's resident set size now, with llama.cpp's libraries loaded (its backend initialised)."""
    import psutil

    from harness.llamacpp import llama
    llama()
    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """This process's peak resident set size. On Linux, the high-water mark of its own memory map (VmHWM):
    getrusage's ru_maxrss also keeps the parent's RSS at the fork that starts a spawned worker, so every worker of
    a bench whose process had a model loaded (for its time estimate) reported at least that. Elsewhere getrusage
    (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)
