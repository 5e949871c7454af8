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


def _result_then_die(attempt, inst_d, round_, prompts, params, run_dir):
    from pathlib import Path

    from harness.rundir import record_result
    record_result(Path(run_dir), {"config": "c1", "status": "ok", "attempt": attempt})
    os._exit(11)  # say, llama.cpp's teardown crashing after the work was done


def _die_before_result(attempt, inst_d, round_, prompts, params, run_dir):
    os._exit(11)


def test_bench_worker_dying_after_its_result_keeps_it_and_before_leaves_an_error_row(tmp_path, monkeypatch):

    from harness.bench.worker import run_in_worker
    from harness.plan import Instance, Params
    from harness.rundir import finished
    from harness.sampling import Policy
    from harness.specs import DraftModel
    inst = Instance("t", DraftModel("d"), 2, Policy(), 0, 0, 1)
    monkeypatch.setattr(Instance, "id", property(lambda self: "c1"))
    params = Params(target=["t"], max_tokens=4)
    res = run_in_worker(inst, 0, [], params, tmp_path, child=_result_then_die)
    assert res["status"] == "ok" and finished(tmp_path)["c1"]["status"] == "ok"
    res = run_in_worker(inst, 0, [], params, tmp_path, child=_die_before_result)
    assert res["status"] == "error" and "exited with code 11" in res["error"]
    assert finished(tmp_path)["c1"] == {"config": "c1", "unit": "c1", "round": 0, **inst.to_dict(), "status": "error",
                                        "error": "worker exited with code 11"}
