"""Running a function in a fresh spawned process: clean RSS, and a crash ends only that process."""
from __future__ import annotations

import multiprocessing as mp
import resource
import signal
import sys


def run_isolated(target, *args, on_start=None) -> int:
    """Run target(*args) in a spawned process and wait; Ctrl-C stops the child too. Returns its exit code.
    on_start(pid) is told the child's pid once it runs. SIGINT is held back while the child starts: an interrupt
    in the middle of handing it its arguments would leave it to die with a traceback of its own. The child keeps
    it blocked; the parent stops it."""
    p = mp.get_context("spawn").Process(target=target, args=args)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        p.start()
        if on_start:
            on_start(p.pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a Ctrl-C held back during the start lands here
        p.join()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if p.pid is not None:
            p.terminate()
            p.join()
        raise
    return p.exitcode


def death(exitcode: int) -> str:
    return f"worker died with signal {-exitcode}" if exitcode < 0 else f"worker exited with code {exitcode}"


def peak_rss_bytes() -> int:
    """This process's peak resident set size: getrusage reports KiB on Linux, bytes on macOS."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)
