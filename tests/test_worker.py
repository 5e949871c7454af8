"""bench.worker: a worker that dies after its result or before it, and `bench --parallel` end to end (the
slots loop in the worker: per-N verdicts, throughput, latency and KV, each batch in the traces)."""
import json
import os
import re

import pytest

from tests.conftest import D, PROMPT_FILE, T
from tests.helpers import diagnostics_md, harness, md_table


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("parallel")
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "2", "--temp", "0,0.7", "--parallel", "1,2,4",
                "--prompts", str(PROMPT_FILE), "--per-category", "3", "--max-tokens", "12", "--paired",
                "--n-ctx", "2048", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    return run, (out / f"{run.name}.md").read_text()


@pytest.mark.slow  # a concurrent sweep of its own: about a minute on 2 cores
def test_bench_reports_verdicts_throughput_latency_and_kv_per_n(parallel_run):
    run, md = parallel_run
    verdicts = md_table(md, "## Verdict per category")
    assert {(r["setup"], r["category"], r["policy"]) for r in verdicts} == {
        (s, c, p) for s in ("", "parallel 2", "parallel 4") for c in ("code", "chat") for p in ("greedy", "T=0.7")}
    assert all("[" in r["speedup [95% CI]"] for r in verdicts)
    rows = md_table(md, "## Concurrent requests")
    assert sorted({r["N"] for r in rows}) == ["1", "2", "4"] and all(r["gamma"] == "2" for r in rows)
    assert all(float(r["spec tok/s (total)"]) > 0 and float(r["plain tok/s (total)"]) > 0 for r in rows)
    assert all(r["predicted"].endswith("x") for r in rows)
    assert re.search(r"Predicted within 10% of the measured speedup in \d+ of 12 row\(s\)\. The same plain work "
                     r"timed twice .* agrees within 10% in \d+ of 12 \(the largest gap \d+%\)", diagnostics_md(run))
    assert "Predicted within 10%" not in md  # a check of the harness's own, in the diagnostics
    n2 = next(r for r in rows if r["N"] == "2")
    assert float(n2["per sequence"]) < float(n2["spec tok/s (total)"])  # two sequences share each step
    assert "the category has 3 prompt(s), so at most 3 ran at once" in md  # N = 4 > 3 prompts: ran what there is
    kv = md_table(md, "KV cache per N")
    used = {r["N"]: int(r["cells in use (peak)"]) for r in kv if r["draft"] == D}
    assert used["1"] < used["2"] < used["4"]  # more sequences hold more cells at once
    assert len({r["KV allocated"] for r in kv if r["draft"] == D}) == 1  # n_ctx, shared among them
    assert (run / "plots" / "concurrency.png").exists()
    assert harness("report", str(run), "--check").returncode == 0


@pytest.mark.slow  # a concurrent sweep of its own: about a minute on 2 cores
def test_bench_traces_hold_each_batch_and_greedy_outputs_stay_lossless(parallel_run):
    run, md = parallel_run
    recs = [json.loads(x) for f in (run / "traces").glob("*.jsonl") for x in f.read_text().splitlines()]
    batches = [r for r in recs if r["type"] == "batch"]
    assert {b["parallel"] for b in batches} == {2, 4} and all(b["slots_used"] <= b["parallel"] for b in batches)
    assert all(b["requests"] == 3 and b["peak_positions"] > 0 and b["decode_ms"] <= b["wall_ms"] for b in batches)
    eq = md_table(diagnostics_md(run), "## Output equivalence (greedy)")
    assert eq and all(r["mismatches"] == "0" for r in eq)


# -- a worker that dies after its result or before it
def _result_then_die(attempt, inst_d, round_, prompts, params, run_dir):
    from pathlib import Path

    from harness.rundir import record_result
    record_result(Path(run_dir), {"config": "c1", "status": "ok", "attempt": attempt})
    os._exit(11)  # say, llama.cpp's teardown crashing after the work was done


def _die_before_result(attempt, inst_d, round_, prompts, params, run_dir):
    os._exit(11)


def test_bench_worker_dying_after_its_result_keeps_it_and_before_leaves_an_error_row(tmp_path, monkeypatch):

    from harness.bench.worker import run_in_worker
    from harness.instance import Instance
    from harness.plan import Params
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


def _full_disk(attempt, inst_d, round_, prompts, params, run_dir):
    """A worker whose trace write and then its result row meet a full disk (ENOSPC, injected)."""
    import errno
    from pathlib import Path

    from harness.bench import worker
    from harness.instance import Instance

    def full(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def work():
        full()
    worker.record_result = full
    worker.record_attempt(attempt, Instance.from_dict(inst_d), round_, Path(run_dir), work)


def test_a_worker_that_cannot_write_its_result_exits_without_a_traceback(tmp_path, monkeypatch, capfd):
    """Issue 57, cases 156, 158, 160 (a read-only --out, a full disk mid-run or in the drift check): the worker
    prints no traceback; the parent's error row says why, and a write the parent cannot make either is main()'s one
    line, naming the file (test_errors)."""
    from harness.bench.worker import run_in_worker
    from harness.instance import Instance
    from harness.plan import Params
    from harness.sampling import Policy
    from harness.specs import DraftModel
    inst = Instance("t", DraftModel("d"), 2, Policy(), 0, 0, 1)
    monkeypatch.setattr(Instance, "id", property(lambda self: "c1"))
    res = run_in_worker(inst, 0, [], Params(target=["t"], max_tokens=4), tmp_path, child=_full_disk)
    assert res["status"] == "error" and "could not write its result to the run directory" in res["error"]
    assert "Traceback" not in capfd.readouterr().err

