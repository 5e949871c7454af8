"""Running a function in a fresh spawned process: clean RSS, and a crash ends only that process."""
from __future__ import annotations

import multiprocessing as mp


def run_isolated(target, *args) -> int:
    """Run target(*args) in a spawned process and wait; Ctrl-C stops the child too. Returns its exit code."""
    p = mp.get_context("spawn").Process(target=target, args=args)
    p.start()
    try:
        p.join()
    except BaseException:
        p.terminate()
        p.join()
        raise
    return p.exitcode


def death(exitcode: int) -> str:
    return f"worker died with signal {-exitcode}" if exitcode < 0 else f"worker exited with code {exitcode}"
