"""Worker processes: peak RSS in bytes on every platform; a worker that dies after writing its result."""
import os
import resource
import sys

from harness.procs import peak_rss_bytes, run_isolated


def _own_peak(path):
    with open(path, "w") as f:
        f.write(str(peak_rss_bytes()))


def test_a_spawned_worker_reports_its_own_peak_not_its_parents(tmp_path):
    big = bytearray(400 * 2**20)
    for i in range(0, len(big), 4096):
        big[i] = 1  # touched: resident in this (the parent) process
    assert run_isolated(_own_peak, str(tmp_path / "rss")) == 0
    assert int((tmp_path / "rss").read_text()) < 300 * 2**20  # getrusage's ru_maxrss would say >= 400 MiB
    del big


def test_peak_rss_without_proc_is_kib_on_linux_and_bytes_on_macos(monkeypatch):
    import harness.procs

    def no_proc(*a, **k):
        raise OSError("no /proc")
    monkeypatch.setattr(harness.procs, "open", no_proc, raising=False)
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    monkeypatch.setattr(sys, "platform", "linux")
    assert peak_rss_bytes() >= kib * 1024
    monkeypatch.setattr(sys, "platform", "darwin")
    assert kib <= peak_rss_bytes() < kib * 1024


def _write_then_die(path):
    with open(path, "w") as f:
        f.write("done\n")
    os._exit(9)


def test_a_worker_that_dies_after_writing_keeps_what_it_wrote(tmp_path):
    f = tmp_path / "out.txt"
    assert run_isolated(_write_then_die, str(f)) == 9
    assert f.read_text() == "done\n"
