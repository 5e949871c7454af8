"""Running a function in a fresh spawned process: clean RSS, and a crash ends only that process."""
from __future__ import annotations

import multiprocessing as mp
import resource
import signal
import sys


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
    default = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where SIGINT is ignored
    if default:
        signal.signal(signal.SIGINT, lambda *_: noted.append(1))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if default:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if noted:
            raise KeyboardInterrupt
        if on_start:
            on_start(p.pid)
        p.join()
    except BaseException:
        p.terminate()
        p.join()
        raise
    return p.exitcode


def death(exitcode: int) -> str:
    return f"worker died with signal {-exitcode}" if exitcode < 0 else f"worker exited with code {exitcode}"


def rss_bytes_now() -> int:
    """This process's resident set size now, with llama.cpp's libraries loaded (its backend initialised)."""
    import psutil

    from harness.engine import llama
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
