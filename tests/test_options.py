"""Options no other test exercised: bench's --repeat, --seed, --skip-unsupported and --cache-type-v in one small
sweep; run's --prompt-file and --seed; --until-confident stopping once every verdict has settled."""
import json

import pytest

from harness.engine import cache_bytes
from harness.rundir import trace_files
from harness.trace import read_records
from tests.conftest import PROMPT_FILE, T, gpu_build
from tests.helpers import harness, only_run, report_md


@pytest.fixture(scope="module")
def options_run(tmp_path_factory, smol):
    out = tmp_path_factory.mktemp("options")
    r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--prompts", str(PROMPT_FILE),
                "--categories", "chat", "--per-category", "1", "--max-tokens", "6", "--temp", "0.8", "--top-p", "0.9",
                "--repeat", "2", "--seed", "7", "--ngl", "0,99", "--skip-unsupported", "--cache-type-v", "f16,q8_0",
                "--flash-attn", "on", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = only_run(out)
    return run, [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]


def test_repeat_runs_every_prompt_again_with_the_next_seed(options_run):
    run, results = options_run
    plan = json.loads((run / "plan.json").read_text())
    assert {i["policy"]["seed"] for i in plan["instances"]} == {7}
    gens = [g for f in trace_files(run) if f.parent == run / "traces" for g in read_records(f)
            if g["type"] == "generation"]
    ran = [r for r in results if r["status"] == "ok"]
    assert ran and sorted((g["config"], g["repeat"]) for g in gens) == sorted((r["config"], k) for r in ran
                                                                                for k in (0, 1))
    metrics = json.loads((run / "metrics.json").read_text())
    for m in metrics:  # both repeats count
        assert m["tokens"] == sum(g["n_tokens"] for g in gens if g["config"] == m["config"])


def test_skip_unsupported_records_gpu_configurations_as_skipped(options_run):
    run, results = options_run
    if gpu_build():
        assert all(r["status"] == "ok" for r in results)  # a GPU build runs them
        return
    skipped = [r for r in results if r["status"] == "skipped"]
    assert skipped and {r["ngl"] for r in skipped} == {99} and all("GPU" in r["error"] for r in skipped)
    assert {r["ngl"] for r in results if r["status"] == "ok"} == {0}
    assert "GPU offload requested but this build has none" in report_md(run)


def test_cache_type_v_sets_the_targets_v_cache(options_run):
    """K f16 with V q8_0 against both f16: llama.cpp's KV figure for the target follows the types."""
    _, results = options_run
    ok = {r["cache_v"]: r for r in results if r["status"] == "ok" and r["draft"] == "none" and r["ngl"] == 0}

    def kv(r):
        return sum(b["bytes"] for b in r["memory"] if b["kind"] == "kv" and b["model"] == "target")
    n = kv(ok["f16"]) // 4  # elements of K (= of V): f16 keeps 2 bytes each of both
    assert kv(ok["q8_0"]) == pytest.approx(cache_bytes("f16", n) + cache_bytes("q8_0", n), rel=0.01)


def _run_tokens(tmp_path, name, *args) -> list[int]:
    trace = tmp_path / f"{name}.jsonl"
    r = harness("run", T, *args, "--max-tokens", "8", "--temp", "1.0", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    return next(x for x in read_records(trace) if x["type"] == "generation")["tokens"]


def test_run_reads_its_prompt_from_a_file_and_its_seed_decides_the_sample(tmp_path, smol):
    text = "Write one sentence about the sea."
    (tmp_path / "p.txt").write_text(text)
    from_file = _run_tokens(tmp_path, "file", "--prompt-file", str(tmp_path / "p.txt"), "--seed", "7")
    assert _run_tokens(tmp_path, "inline", "--prompt", text, "--seed", "7") == from_file
    others = [_run_tokens(tmp_path, f"s{s}", "--prompt", text, "--seed", str(s)) for s in (8, 9, 10)]
    assert any(o != from_file for o in others)  # at T=1 three other seeds cannot all draw the same 8 tokens


@pytest.mark.slow  # rounds of a real run until settled: 11 s
def test_until_confident_stops_once_every_verdict_has_settled(tmp_path, smol, monkeypatch):
    """Which verdicts are open is the verdicts' business (tested with them); here the loop: a category open
    after round 0 gets its next prompt, and once none is open the run stops, says so, and records why."""
    import harness.bench.run as bench_run
    looks = []

    def open_once(verdicts):
        looks.append(verdicts is not None)
        return ["code"] if len(looks) == 1 else []
    monkeypatch.setattr(bench_run, "open_categories", open_once)
    out = tmp_path / "r"
    r = harness("bench", "--target", T, "--draft", "ngram:2", "--gamma", "2", "--max-tokens", "6", "--threads", "1",
                "--prompts", str(PROMPT_FILE), "--categories", "code", "--per-category", "1", "--until-confident",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "--until-confident: settled after 2 round(s)" in r.stderr and looks == [True, True]
    plan = json.loads((only_run(out) / "plan.json").read_text())
    assert plan["rounds"] == [["code-1"], ["code-2"]] and plan["until_confident"]["stopped"] == "settled"
    assert [h["round"] for h in plan["until_confident"]["history"]] == [0, 1]
