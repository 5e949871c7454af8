"""harness bench --engine server (harness.bench.serverunit): the flags each configuration runs with, the plan's
refusals, one unit against the fake llama-server (restarts, deaths, missing timings, flags the binary lacks,
divergent outputs), and (slow tier) a whole bench run against the fake and one against the real llama-server."""
import json
import os

import pytest

from harness.bench import serverunit
from harness.crosscheck import binary as binary_mod
from harness.errors import HarnessError
from harness.plan import expand, first_round, make_params
from harness.rundir import PAIRED_DIR, finished, trace_path
from harness.trace import read_records
from tests.conftest import PROMPT_FILE, D, T


def server_params(fake, draft="ngram-mod", **more):
    return make_params({}, {"target": T, "draft": f"none,{draft}", "gamma": "2", "prompts": str(PROMPT_FILE),
                            "categories": "code", "per_category": 2, "max_tokens": 6, "engine": "server",
                            "llama_server": str(fake)} | more)


def run_unit(tmp_path, params, baseline=False, on_start=None):
    inst = next(i for i in expand(params) if i.baseline == baseline)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return inst, run_dir, serverunit.run_server_unit(inst, 0, first_round(params), params, run_dir, on_start)


def test_command_maps_types_to_llama_cpp_flags(smol, smol_q2k, fake):
    p = server_params(fake, draft=f"{D},ngram-mod:n-max=8:n-min=2")
    insts = {str(i.draft): i for i in expand(p)}
    c = serverunit.command(insts[D], p)
    spec = " ".join(c.spec)
    assert "--spec-type draft-simple --spec-draft-model" in spec and "--spec-draft-n-max 2" in spec
    assert "--spec-draft-p-min 0" in spec and "-np 1" in spec and c.temp is None
    assert c.plain[-2:] == ["--spec-type", "none"] and not any(a.startswith("--spec-draft") for a in c.plain)
    mod = " ".join(serverunit.command(insts["ngram-mod:n-max=8:n-min=2"], p).spec)
    assert "--spec-type ngram-mod --spec-ngram-mod-n-match 24 --spec-ngram-mod-n-max 8 --spec-ngram-mod-n-min 2" in mod
    base = serverunit.command(insts["none"], p)
    assert base.spec == base.plain


def test_a_draft_path_with_a_plus_runs_as_that_file(tmp_path, smol_q2k, fake):  # case 59
    d = tmp_path / "c++-draft.gguf"
    d.symlink_to(smol_q2k)
    p = server_params(fake, draft=f"{d}+ngram-mod")
    spec = serverunit.command(next(i for i in expand(p) if not i.baseline), p).spec
    assert spec[spec.index("--spec-draft-model") + 1] == str(d)
    assert spec[spec.index("--spec-type") + 1] == "ngram-mod,draft-simple"


def test_lacking_flags():
    known = frozenset({"-m", "--spec-type", "-np"})
    assert binary_mod.lacking(["-m", "x.gguf", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8", "-np",
                               "1", "--temp", "-1"], known) == ["--spec-ngram-mod-n-max", "--temp"]


@pytest.mark.parametrize("draft, more, said", [
    ("ngram:2", {}, "ngram:2 is the harness's own prompt lookup"),
    ("ngram-foo", {}, "no n-gram type ngram-foo"),
    ("ngram-mod", {"paired": False}, "leave out --no-paired"),
    (D, {"replay": True}, "does not take --replay"),
    ("ngram-mod", {"gamma": "auto"}, "does not take adaptive gamma"),
    ("ngram-mod", {"engine": "vllm"}, "--engine vllm: give harness"),
])
def test_plan_refuses_what_llama_server_lacks(fake, draft, more, said):
    with pytest.raises(HarnessError, match=said):
        server_params(fake, draft=draft, **more)


def test_engine_server_is_paired_and_recorded(fake):
    p = server_params(fake)
    assert p.paired and p.to_dict()["engine"] == "server"
    with pytest.raises(HarnessError, match="--llama-server names the binary"):
        make_params({}, {"target": T, "llama_server": str(fake)})


def test_speculative_unit_abba_one_server_per_request(tmp_path, smol, fake, monkeypatch):
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_SERVER_LOG", str(log))
    pids = []  # each server as it starts, for the CPU meter
    inst, run_dir, row = run_unit(tmp_path, server_params(fake), on_start=pids.append)
    assert row["status"] == "ok", row
    assert len(set(pids)) == 4
    assert row["target_bytes"] == smol.stat().st_size and row["draft_bytes"] == 0 and row["kv_bytes"] is None
    assert row["server_command"][row["server_command"].index("--spec-type") + 1] == "ngram-mod"
    reqs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["role"] for r in reqs] == ["speculative", "plain", "plain", "speculative"]  # ABBA
    assert all(r["body"]["cache_prompt"] is False and r["body"]["n_predict"] == 6 and r["body"]["temperature"] == 0
               for r in reqs)
    assert len(list((run_dir / serverunit.LOGS_DIR / inst.id).glob("*.log"))) == 4  # a server per request
    spec = read_records(trace_path(run_dir, inst.id))
    gens = [r for r in spec if r["type"] == "generation"]
    steps = [r for r in spec if r["type"] == "step"]
    assert [g["mode"] for g in gens] == ["speculative"] * 2 and all(s["server_totals"] for s in steps)
    g, s = gens[0], steps[0]
    # the fake drafts 10 + n_prompt % 3 and accepts 6 + n_prompt % 2
    assert s["proposed"] == 10 + g["server"]["prompt_n"] % 3 and s["accepted"] == 6 + g["server"]["prompt_n"] % 2
    assert g["n_tokens"] == 5 and g["output_tokens"] == 6 and g["tokens"] == list(range(6))
    assert g["tokens_per_s"] == pytest.approx(5 / g["server"]["predicted_ms"] * 1e3)
    # the server's log, parsed: its one request's acceptance line (the fake's 3 verification steps)
    assert (g["server"]["log_accepted"], g["server"]["log_drafted"]) == (s["accepted"], s["proposed"])
    assert g["server"]["log_mean_len"] == round(1 + s["accepted"] / 3, 2)
    twins = [r for r in read_records(trace_path(run_dir / PAIRED_DIR, inst.id)) if r["type"] == "generation"]
    assert [t["mode"] for t in twins] == ["baseline"] * 2 and twins[0]["server"]["draft_n"] == 0


def test_a_combination_runs_as_llama_servers_comma_list(tmp_path, smol, smol_q2k, fake, monkeypatch):
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_SERVER_LOG", str(log))
    inst, _, row = run_unit(tmp_path, server_params(fake, draft=f"{D}+ngram-mod:n-match=4:n-max=8:n-min=2"))
    assert row["status"] == "ok", row
    argv = row["server_command"]
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod,draft-simple" and "--spec-ngram-mod-n-max" in argv
    assert argv[argv.index("--spec-draft-n-max") + 1] == "2" and row["draft_bytes"] == smol_q2k.stat().st_size
    assert str(inst.draft) == f"ngram-mod:n-match=4:n-max=8:n-min=2+{D}"


def test_drafting_heads_are_checked_in_their_files_before_anything_runs(tmp_path, smol, fake):
    """draft-eagle3 takes an EAGLE-3 GGUF; draft-mtp on a target without MTP layers is refused in one line."""
    from harness.bench.prepare import preflight
    from tests.tiny_gguf import write_arch_header
    eagle = write_arch_header(tmp_path / "e3.gguf", "eagle3")
    for draft, said in ((f"draft-eagle3:{eagle}", None), ("draft-mtp", "carries no MTP layers"),
                        (f"ngram-mod+draft-dflash:{eagle}", "not the 'dflash' head")):
        p = server_params(fake, draft=draft)
        insts = expand(p)
        if said is None:
            assert preflight(insts, first_round(p), False, 6) == {}
            spec = serverunit.command(next(i for i in insts if not i.baseline), p).spec
            assert spec[spec.index("--spec-type") + 1:spec.index("--spec-type") + 4] == \
                ["draft-eagle3", "--spec-draft-model", str(eagle)]
            continue
        with pytest.raises(HarnessError, match=said):
            preflight(insts, first_round(p), False, 6)


def test_baseline_unit_runs_on_one_server(tmp_path, smol, fake):
    inst, run_dir, row = run_unit(tmp_path, server_params(fake), baseline=True)
    assert row["status"] == "ok", row
    assert [p.name for p in (run_dir / serverunit.LOGS_DIR / inst.id).iterdir()] == ["plain.log"]
    assert len([r for r in read_records(trace_path(run_dir, inst.id)) if r["type"] == "generation"]) == 2


@pytest.mark.parametrize("ngl", ["0", "5"], ids=["cpu", "188-ngl-on-a-wheel-without-offload"])
def test_greedy_divergence_is_classified_on_the_target(tmp_path, smol, fake, monkeypatch, ngl):
    """The fake's speculative outputs leave the plain ones at position 2 for a token SmolLM2 chooses in no block
    (1002): re-evaluated on the target once the servers stopped, unchecked (the server's kernels decided it). With
    --ngl, llama-server offloads; a wheel that cannot evaluates on the CPU."""
    from harness import llamacpp
    monkeypatch.setattr(llamacpp, "gpu_offload_supported", lambda: False)
    monkeypatch.setenv("FAKE_SERVER_DIVERGE", "2")
    inst, run_dir, row = run_unit(tmp_path, server_params(fake, ngl=ngl))
    assert row["status"] == "ok", row
    div = [r for r in read_records(trace_path(run_dir, inst.id)) if r["type"] == "divergence"]
    assert [(d["diverged_at"], d["kind"]) for d in div] == [(2, "unchecked")] * 2
    assert all(isinstance(d["plain_argmax"], int) and d["margin"] >= 0 for d in div)


@pytest.mark.parametrize("baseline", [False, True], ids=["52-speculative", "52-baseline"])
def test_an_interrupted_unit_keeps_its_finished_prompts(tmp_path, smol, fake, monkeypatch, baseline):  # case 52
    """Ctrl-C in the unit's second prompt: --resume keeps the first prompt's records as they were and measures
    only the second, its twin first as ABBA had it."""
    from harness.crosscheck import run
    real, asked = run.ask, []

    def ask(*a, **kw):
        asked.append(a[1])
        if len(asked) == (2 if baseline else 3):
            raise KeyboardInterrupt
        return real(*a, **kw)
    monkeypatch.setattr(run, "ask", ask)
    params = server_params(fake)
    inst = next(i for i in expand(params) if i.baseline == baseline)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(KeyboardInterrupt):
        serverunit.run_server_unit(inst, 0, first_round(params), params, run_dir)
    files = [trace_path(run_dir, inst.id)] + ([] if baseline else [trace_path(run_dir / PAIRED_DIR, inst.id)])
    before = {f: read_records(f) for f in files}
    assert inst.id not in finished(run_dir)
    assert all([r["prompt_id"] for r in recs if r["type"] == "generation"] == ["code-1"] for recs in before.values())
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_SERVER_LOG", str(log))
    monkeypatch.setattr(run, "ask", real)
    row = serverunit.run_server_unit(inst, 0, first_round(params), params, run_dir)
    assert row["status"] == "ok", row
    reqs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["role"] for r in reqs] == (["plain"] if baseline else ["plain", "speculative"])
    for f, recs in before.items():
        after = read_records(f)
        assert after[:len(recs)] == recs
        assert [r["prompt_id"] for r in after if r["type"] == "generation"] == ["code-1", "code-2"]


def test_sampled_requests_carry_the_policy(tmp_path, smol, fake, monkeypatch):
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_SERVER_LOG", str(log))
    _, _, row = run_unit(tmp_path, server_params(fake, temp="0.8", top_p="0.9", seed=5))
    assert row["status"] == "ok", row
    reqs = [json.loads(x) for x in log.read_text().splitlines()]
    argv = reqs[0]["argv"]
    assert argv[argv.index("--temp") + 1] == "0.8" and argv[argv.index("--top-p") + 1] == "0.9"
    assert {r["body"]["seed"] for r in reqs} == {5} and all("temperature" not in r["body"] for r in reqs)


@pytest.mark.parametrize("env, said", [
    ({"FAKE_SERVER_MODE": "exit"}, "exited with code 3 before it was ready"),
    ({"FAKE_SERVER_MODE": "notimings"}, "without timings"),
    ({"FAKE_SERVER_COUNTER": "{tmp}/n", "FAKE_SERVER_LIMIT": "1"}, "died (exit code"),
    ({"FAKE_SERVER_MODE": "silent"}, "did not answer /health"),
    ({"FAKE_SERVER_LACKS": "--spec-ngram-mod-n-match"}, "has no --spec-ngram-mod-n-match"),
    ({"FAKE_SERVER_NO_TYPES": "ngram-mod"}, "unknown speculative type: ngram-mod"),  # a build without the type
    # issue 57: answers that are no measurement (cases 14, 15, 17), a plain twin that drafts (93)
    ({"FAKE_SERVER_TOKENS": '"1 2 3"'}, "tokens '1 2 3' (not a list of token ids)"),
    ({"FAKE_SERVER_TIMINGS": '{{"predicted_n": 1000000000000}}'}, "predicted_n 1000000000000 above the n_predict 6"),
    ({"FAKE_SERVER_TOKENS": '["a", "b", "c", "d", "e", "f"]'}, "tokens holding 'a'"),
    ({"FAKE_SERVER_TOKENS": '[1, 2]'}, "2 tokens for timings.predicted_n 6"),
    ({"FAKE_SERVER_PLAIN_DRAFTS": "5"}, "plain twin (--spec-type none) drafted 5 tokens on prompt"),
    # the server's log read for the line that says why, not its last (82, 83, 199)
    ({"FAKE_SERVER_MODE": "badarg"}, 'error while handling argument "--temp": stof'),
    ({"FAKE_SERVER_NO_TYPES": "ngram-mod"}, '"--spec-type": unknown speculative type'),
    ({"FAKE_SERVER_MODE": "assert"}, "GGML_ASSERT(n_max > 0) failed"),
    # the bench's own timeouts (21, 22)
    ({"FAKE_SERVER_MODE": "hang"}, "gave no answer to prompt code-1 within 1 s (--request-timeout"),
])
def test_failures_are_one_line_error_rows(tmp_path, smol, fake, monkeypatch, env, said):
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(tmp=tmp_path))
    _, _, row = run_unit(tmp_path, server_params(fake, start_timeout=2.0, request_timeout=1.0))
    assert row["status"] == "error" and said in row["error"] and "\n" not in row["error"], row
    for noise in ("to show complete usage", "Inferior 1"):
        assert noise not in row["error"], row


def test_a_plain_baseline_that_drafts_is_refused(tmp_path, smol, fake, monkeypatch):  # case 93
    monkeypatch.setenv("FAKE_SERVER_PLAIN_DRAFTS", "3")
    _, _, row = run_unit(tmp_path, server_params(fake), baseline=True)
    assert row["status"] == "error" and "drafted 3 tokens" in row["error"] and "LLAMA_ARG_" in row["error"], row


def test_the_server_timeouts_are_bench_options(fake):  # cases 21, 22
    p = server_params(fake, start_timeout=5, request_timeout=7.5)
    assert (p.start_timeout, p.request_timeout) == (5, 7.5) and p.to_dict()["start_timeout"] == 5
    for opts, said in (({"engine": "server", "llama_server": str(fake), "start_timeout": 0}, "above 0"),
                       ({"request_timeout": 30.0}, "give --engine server or --server-check")):
        with pytest.raises(HarnessError, match=said):
            make_params({}, {"target": T} | opts)


RESUMED = {  # issue 57, case 183: (the versions of the finished rows, the binary's now, the words of the refusal)
    "183-another-version": (["version: 1 (a)"], "version: 2 (b)", ["measured in llama-server 1 (a)", "is 2 (b)",
                                                                   "restore that llama-server", "new run"]),
    "the-same-version": (["version: 2 (b)", "version: 2 (b)"], "version: 2 (b)", []),
    "no-finished-unit": ([], "version: 2 (b)", []),
}


@pytest.mark.parametrize("was, now, words", list(RESUMED.values()), ids=list(RESUMED))
def test_a_resume_on_another_llama_server_is_refused(tmp_path, was, now, words):
    rows = [{"config": f"c{k}", "unit": f"c{k}", "status": "ok", "llama_server_version": v} for k, v in enumerate(was)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not words:
        serverunit.same_server(tmp_path, tmp_path / "llama-server", now)
        return
    with pytest.raises(HarnessError) as e:
        serverunit.same_server(tmp_path, tmp_path / "llama-server", now)
    for w in words:
        assert w in str(e.value), str(e.value)


OFFLOAD = {  # issue 57, case 188: (the fake's devices, --skip-unsupported, what server_offload gives or the words)
    "188-ngl-on-a-cpu-llama-server": ("", False, ["asks llama-server for GPU offload", "lists no GPU device",
                                                  "--list-devices", "give --llama-server one built with GPU"]),
    "188-skip-unsupported": ("", True, "this llama-server has none"),
    "a-gpu-llama-server": ("CUDA0", False, None),
}


@pytest.mark.parametrize("devices, skip, want", list(OFFLOAD.values()), ids=list(OFFLOAD))
def test_offload_is_asked_of_llama_server_not_the_wheel(fake, monkeypatch, devices, skip, want):
    monkeypatch.setenv("FAKE_SERVER_DEVICES", devices)
    insts = expand(server_params(fake, ngl="5"))
    if isinstance(want, list):
        with pytest.raises(HarnessError) as e:
            serverunit.server_offload(insts, fake, skip)
        for w in want:
            assert w in str(e.value) and "llama-cpp-python" not in str(e.value), str(e.value)
    else:
        got = serverunit.server_offload(insts, fake, skip)
        assert got == ({} if want is None else {i.id: got[i.id] for i in insts}) and all(want in x for x in
                                                                                         got.values()), got


def test_bench_ngl_with_engine_server_names_llama_server(tmp_path, smol, fake):  # issue 57, case 188
    from tests.helpers import harness
    r = harness("bench", "--engine", "server", "--llama-server", fake, "--target", T, "--draft", "ngram-mod",
                "--ngl", "5", "--prompts", PROMPT_FILE, "--categories", "code", "--per-category", "1",
                "--max-tokens", "4", "--out", tmp_path / "out", "--allow-busy")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "lists no GPU device" in r.stderr and "llama-cpp-python" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "runs").exists()


def test_missing_binary_is_one_line(tmp_path, smol):
    from tests.helpers import harness
    _, _, row = run_unit(tmp_path, server_params(tmp_path / "nowhere" / "llama-server"))
    assert row["status"] == "error" and "no such file" in row["error"]
    r = harness("bench", "--engine", "server", "--llama-server", tmp_path / "nowhere" / "llama-server", "--target", T,
                "--draft", "ngram-mod", "--prompts", PROMPT_FILE, "--categories", "code", "--per-category", "1",
                "--max-tokens", "4", "--out", tmp_path / "out", "--allow-busy")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "no such file" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "runs").exists()  # refused before any run directory


@pytest.mark.slow  # about 100 s on the 2-core VM: a whole bench run (probes, three units, the drift check)
def test_bench_engine_server_end_to_end(tmp_path, smol, smol_q2k, fake, monkeypatch):
    """A failing configuration (a flag the binary lacks) leaves an error row; the rest of the sweep is reported
    with intervals, verdicts and the output check."""
    from tests.helpers import harness, only_run
    monkeypatch.setenv("FAKE_SERVER_LACKS", "--spec-ngram-mod-n-match")
    r = harness("bench", "--engine", "server", "--llama-server", fake, "--target", T, "--draft",
                f"none,{D},ngram-mod", "--gamma", "2", "--prompts", PROMPT_FILE, "--categories", "code",
                "--per-category", "2", "--max-tokens", "6", "--out", tmp_path / "out", "--allow-busy")
    assert r.returncode == 3, r.stderr  # a failed unit among measured ones (issue 57)
    assert "has no --spec-ngram-mod-n-match" in r.stderr and "1 unit(s) of the run failed" in r.stderr
    run = only_run(tmp_path / "out")
    rows = finished(run).values()  # the last row of each unit (one busy may have run again)
    assert sorted(x["status"] for x in rows) == ["error", "ok", "ok"]
    md = next((tmp_path / "out").glob("*.md")).read_text()
    assert "Measured in llama-server" in md and "ABBA" in md
    assert "1.5" in md  # the fake's speedup, about 1.5x, in the verdict table
    check = harness("report", run, "--check")
    assert check.returncode == 0, check.stderr  # every figure recomputed from the traces, every row as bench writes


@pytest.mark.slow  # about 30 s on the 2-core VM (4 min beside other tests): real llama-server starts, 2 prompts
def test_bench_engine_server_real_llama_server(tmp_path, smol, smol_q2k):
    from harness.crosscheck.binary import native_candidates
    from tests.helpers import harness, only_run
    binary = next((b for b in native_candidates() if b.is_file() and os.access(b, os.X_OK)), None)
    if binary is None:
        pytest.skip("needs `make native`'s llama-server")
    combo = f"ngram-simple:size-n=2:size-m=4+{D}"  # llama-server's comma list: ngram-simple first
    r = harness("bench", "--engine", "server", "--llama-server", binary, "--target", T, "--draft",
                f"none,{D},ngram-mod,{combo}", "--gamma", "3", "--prompts", PROMPT_FILE, "--categories", "code",
                "--per-category", "2", "--max-tokens", "8", "--threads", "2", "--out", tmp_path / "out",
                "--allow-busy")
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "out")
    rows = {x["draft"]: x for x in finished(run).values()}
    assert {d: x["status"] for d, x in rows.items()} == {"none": "ok", D: "ok", "ngram-mod": "ok", combo: "ok"}, rows
    assert rows[combo]["server_command"][rows[combo]["server_command"].index("--spec-type") + 1] == \
        "ngram-simple,draft-simple"
    spec = read_records(trace_path(run, rows[D]["config"]))
    assert sum(s["proposed"] for s in spec if s["type"] == "step") > 0  # draft-simple drafted
    plain = {g["prompt_id"]: g["tokens"] for g in read_records(trace_path(run / PAIRED_DIR, rows[D]["config"]))
             if g["type"] == "generation"}
    for g in (g for g in spec if g["type"] == "generation"):
        assert len(g["tokens"]) == 8 and len(plain[g["prompt_id"]]) == 8  # outputs kept; equality is the report's
