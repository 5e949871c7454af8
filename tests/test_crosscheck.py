"""`harness crosscheck`: a run's verdicts checked in llama.cpp's own llama-server. The fast tier runs a fake server
(tests/fake_llama_server.py: canned timings with a known ratio per prompt) on a copy of the session's timed run;
the slow tier runs the real llama-server that `make native` builds, on SmolLM2."""
from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest

from harness.analysis.verdict import INCONCLUSIVE, NO_GAIN, PLAIN, SPECULATE
from harness.analysis import serverstats as stats
from harness.crosscheck.checks import pooled_share, server_args
from tests.helpers import copy_run, harness, one_line_error


@pytest.fixture
def run(timed_run, tmp_path) -> Path:
    return copy_run(timed_run, tmp_path)


def rows(run: Path) -> list[dict]:
    return json.loads((run / "crosscheck.json").read_text())["rows"]


def requests(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


# -- pure parts ----------------------------------------------------------------------------------------------

def test_plain_command_drops_every_spec_flag():
    spec, plain = server_args("llama-server -m t.gguf -ngl 0 -c 2048 -np 1 --spec-type draft-simple "
                              "--spec-draft-model d.gguf --spec-draft-n-max 3 --spec-draft-p-min 0 "
                              "--spec-draft-ngl 0 --temp 0")
    assert spec[0] == "-m" and "--spec-draft-model" in spec
    assert plain == ["-m", "t.gguf", "-ngl", "0", "-c", "2048", "-np", "1", "--temp", "0"]


@pytest.mark.parametrize("verdict,lo,hi,want", [
    (SPECULATE, 1.10, 1.30, stats.HOLDS), (SPECULATE, 1.02, 1.30, stats.UNSETTLED),
    (SPECULATE, 0.80, 1.04, stats.CONTRADICTED), (NO_GAIN, 0.95, 1.04, stats.HOLDS),
    (NO_GAIN, 0.95, 1.20, stats.UNSETTLED), (NO_GAIN, 1.06, 1.20, stats.CONTRADICTED),
    (PLAIN, 0.80, 0.99, stats.HOLDS), (PLAIN, 0.95, 1.02, stats.UNSETTLED), (PLAIN, 1.01, 1.10, stats.CONTRADICTED),
    (INCONCLUSIVE, 1.10, 1.30, stats.NOT_CHECKED), (SPECULATE, None, None, stats.UNSETTLED)])
def test_holds_by_the_runs_rule(verdict, lo, hi, want):
    assert stats.holds(verdict, lo, hi, 0.05) == want


def test_one_prompt_gives_no_interval():
    p = [{"plain": {"predicted_n": 11, "predicted_ms": 20.0}, "speculative": {"predicted_n": 11, "predicted_ms": 10.0}}]
    s = stats.speedup(p)
    assert s["speedup"] == pytest.approx(2.0) and s["lo"] is None and s["prompts"] == 1
    assert stats.reading(s["lo"], s["hi"], 0.05) == INCONCLUSIVE


# -- the fake server -----------------------------------------------------------------------------------------

def test_pairs_per_prompt_with_a_t_interval(run, fake, tmp_path):
    """Every answer's configuration runs speculative and plain on the run's prompts as token ids, with its policy
    and max tokens; each prompt's pair has the fake's known ratio; the interval is the t interval of the log
    ratios; the table and the share are printed and written."""
    from scipy.stats import t as student_t

    from tests.fake_llama_server import factor
    log = tmp_path / "requests.jsonl"
    r = harness("crosscheck", run, "--llama-server", fake, env={"FAKE_SERVER_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    got = rows(run)
    plan = json.loads((run / "plan.json").read_text())
    # two categories x two policies, and each policy's bottom line (its categories pooled): one configuration each
    assert len(got) == 6 and sum(x["category"] == "all" for x in got) == 2
    for row in got:
        ids = [p["id"] for p in row["prompts"]]
        of: dict[str, list[str]] = {}
        for i in plan["prompt_ids"]:
            of.setdefault(i.rsplit("-", 1)[0], []).append(i)
        k = pooled_share(len(of))  # the bottom line's: the first of each category
        assert ids == (of[row["category"]] if row["category"] != "all" else [i for c in of for i in of[c][:k]])
        assert not any(a.startswith("--spec-") for a in row["plain_command"])
        assert "--spec-type" in row["speculative_command"]
        ratios = [1.5 * factor(p["n_prompt"]) for p in row["prompts"]]
        for p, want in zip(row["prompts"], ratios):
            got_ratio = stats.rate(p["speculative"]) / stats.rate(p["plain"])
            assert got_ratio == pytest.approx(want)
        logs = [math.log(x) for x in ratios]
        n, mean = len(logs), sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
        h = student_t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        x = row["llama"]
        assert x["speedup"] == pytest.approx(math.exp(mean))
        assert (x["lo"], x["hi"]) == (pytest.approx(math.exp(mean - h), rel=1e-6),
                                     pytest.approx(math.exp(mean + h), rel=1e-6))
        acc = sum(6 + p["n_prompt"] % 2 for p in row["prompts"]) / sum(10 + p["n_prompt"] % 3 for p in row["prompts"])
        assert x["acceptance"] == pytest.approx(acc)
        assert x["same_output"] == [len(ids), len(ids)]
        assert row["tool"] == "version: 4242 (fake0000)"
        assert row["harness"]["speedup"] is not None and row["harness"]["acceptance"] is not None
    sent = requests(log)
    # one server after the other, which goes first alternating
    pairs = [(["plain"] * len(x["prompts"]), ["speculative"] * len(x["prompts"])) for x in got]
    assert [x["role"] for x in sent] == [r for k, (p, q) in enumerate(pairs) for r in ((p + q) if k % 2 == 0
                                                                                        else (q + p))]
    for q in sent:
        b = q["body"]
        assert isinstance(b["prompt"], list) and all(isinstance(t, int) for t in b["prompt"])
        assert b["n_predict"] == 12 and b["cache_prompt"] is False
        assert b["temperature"] in (0.0, 0.8)
        assert ("--spec-type" in q["argv"]) == (q["role"] == "speculative")
    md = (run / "crosscheck.md").read_text()
    assert "| llama.cpp speedup [95% CI]" in md and "llama-server 4242 (fake0000)" in md
    assert "holds" in r.stdout and "llama.cpp speedup" in r.stdout


@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_a_rerun_keeps_finished_rows(run, fake, tmp_path):
    """A server that dies mid-run: one line, the configurations finished before it kept; a rerun measures only
    what is missing."""
    counter, log = tmp_path / "count", tmp_path / "requests.jsonl"
    # the two bottom lines first (4 prompts each, 2 requests a prompt), then it dies
    env = {"FAKE_SERVER_COUNTER": str(counter), "FAKE_SERVER_LIMIT": "17", "FAKE_SERVER_LOG": str(log)}
    r = harness("crosscheck", run, "--llama-server", fake, env=env)
    one_line_error(r, "died", "prompt", "GGML_ASSERT", "2 configuration(s) finished and kept")
    first = rows(run)
    assert len(first) == 2
    log.unlink()
    r = harness("crosscheck", run, "--llama-server", fake, env={"FAKE_SERVER_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    assert "kept from crosscheck.json" in r.stderr
    again = rows(run)
    assert len(again) == 6 and [x for x in again if x["key"] in {f["key"] for f in first}] == first
    assert len(requests(log)) == 4 * 2 * 2  # only the four missing configurations


def test_only_speculate_with_no_speculate_answer(run, fake):
    r = harness("crosscheck", run, "--llama-server", fake, "--only", "speculate")
    one_line_error(r, "no answer says speculate")


def test_a_server_that_exits_at_once(run, fake):
    r = harness("crosscheck", run, "--llama-server", fake, env={"FAKE_SERVER_MODE": "exit"})
    one_line_error(r, "exited with code 3", "failed to load model")


def test_a_server_that_never_answers(run, fake):
    r = harness("crosscheck", run, "--llama-server", fake, "--start-timeout", "1.5",
                env={"FAKE_SERVER_MODE": "silent"})
    one_line_error(r, "did not answer /health", "within 1.5 s")


def test_not_a_llama_server(run):
    one_line_error(harness("crosscheck", run, "--llama-server", "/bin/true"), "not llama.cpp's llama-server",
                   "make native")


def test_no_llama_server_anywhere(run, tmp_path):
    r = harness("crosscheck", run, env={"HOME": str(tmp_path), "PATH": str(tmp_path / "nowhere"),
                                        "HARNESS_NATIVE_BIN": ""})
    one_line_error(r, "no llama-server found", "make native")


def test_a_port_in_use(run, fake):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        one_line_error(harness("crosscheck", run, "--llama-server", fake, "--port", port), f"--port {port}",
                       "in use")


def test_a_missing_model(run, fake, tmp_path):
    r = harness("crosscheck", run, "--llama-server", fake, env={"HARNESS_MODELS_DIR": str(tmp_path / "none")})
    one_line_error(r, "smollm2-135m-instruct-q4_1", "not present")


# -- the real llama-server -----------------------------------------------------------------------------------

def native_server() -> Path | None:
    from harness.crosscheck.binary import native_candidates
    return next((p for p in native_candidates() if p.is_file()), None)


@pytest.mark.slow
def test_real_llama_server(run):
    """The real llama-server (make native) on SmolLM2 against its Q2_K and ngram:2, 2 prompts per category, 12
    tokens: the server's timings are read, the q2_k draft drafts, greedy outputs match plain decoding."""
    server = native_server()
    if server is None:
        pytest.skip("no llama-server built by `make native` (make test-all builds it)")
    r = harness("crosscheck", run, "--llama-server", server, "--per-category", "2")
    assert r.returncode == 0, r.stderr
    got = rows(run)
    assert len(got) == 6 and all(not x.get("skip") for x in got)  # with each policy's bottom line
    for row in got:
        assert row["tool"].startswith("version: ")
        for p in row["prompts"]:
            for role in ("plain", "speculative"):
                assert p[role]["predicted_n"] >= 1 and p[role]["predicted_ms"] > 0
        if "q2_k" in row["configuration"]:
            assert sum(p["speculative"]["draft_n"] for p in row["prompts"]) > 0
        if row["policy"] == "greedy":
            assert row["llama"]["same_output"][0] >= 1
    assert "Verdicts in llama.cpp" in (run / "crosscheck.md").read_text()


# -- bad input and a server's bad answers (issue 43): each one line, nothing stored that is not a measurement --

SMOKE = Path(__file__).resolve().parent.parent / "reports" / "runs" / "20261202-054828-vm"  # committed and small


@pytest.fixture
def smoke(tmp_path) -> Path:
    """A copy of a committed run: crosscheck's refusals need no sweep of their own."""
    import shutil
    return Path(shutil.copytree(SMOKE, tmp_path / SMOKE.name))


def test_each_answer_has_the_harness_figures_beside_it(smoke):
    """A timed answer's acceptance is its sweep row's (the answer's source reads "timed on N prompt(s)")."""
    from harness.crosscheck.checks import checks
    found, _ = checks(smoke, "all", 1)
    assert found and all(c.harness["acceptance"] is not None for c in found if not c.skip)
    assert all(c.answer["source"].startswith("timed") for c in found)


def test_a_run_measured_in_llama_server_is_not_checked_against_itself(smoke, fake):  # issue 57, case 180
    plan = json.loads((smoke / "plan.json").read_text())
    plan["params"]["engine"] = "server"
    (smoke / "plan.json").write_text(json.dumps(plan))
    one_line_error(harness("crosscheck", smoke, "--llama-server", fake), "measured in llama-server already",
                   "--engine server", "against itself", "the harness's own loop")
    assert not (smoke / "crosscheck.json").exists()


class Reply:
    """One server, answering every request with the given timings."""
    role, binary = "plain", Path("llama-server")

    def __init__(self, timings: dict, tokens=None):
        self.timings, self.tokens = timings, tokens

    def complete(self, payload, what, timeout_s):
        n = self.timings.get("predicted_n")
        tokens = list(range(n if isinstance(n, int) and 0 <= n <= 1000 else 11)) if self.tokens is None else self.tokens
        return {"timings": self.timings} | ({} if tokens == "absent" else {"tokens": tokens})


GOOD = {"predicted_n": 11, "predicted_ms": 20.0, "prompt_n": 7, "prompt_ms": 1.0, "draft_n": 10,
        "draft_n_accepted": 6}
# (what replaces the good timings, the words the refusal names)
NO_MEASUREMENT = {
    "nothing-generated": ({"predicted_n": 0, "predicted_ms": 0}, ["timings.predicted_n 0", "no token"]),
    "tokens-in-no-time": ({"predicted_ms": 0}, ["timings.predicted_ms 0 for 11 tokens"]),
    "more-accepted-than-drafted": ({"draft_n": 2, "draft_n_accepted": 10},
                                   ["timings.draft_n_accepted 10 above timings.draft_n 2"]),
    "negative-time": ({"predicted_ms": -4.0}, ["timings.predicted_ms -4.0", "below 0"]),
    "negative-count": ({"draft_n": -1, "draft_n_accepted": 0}, ["timings.draft_n -1", "below 0"]),
    "time-a-string": ({"predicted_ms": "12.5"}, ["timings.predicted_ms '12.5'", "not a finite number"]),
    "count-a-string": ({"predicted_n": "11"}, ["timings.predicted_n '11'", "not a whole number"]),
    "count-a-fraction": ({"draft_n": 2.5}, ["timings.draft_n 2.5", "not a whole number"]),
    "time-not-finite": ({"predicted_ms": math.inf}, ["timings.predicted_ms inf", "not a finite number"]),
    "prompt-count-a-string": ({"prompt_n": "7"}, ["timings.prompt_n '7'"]),
    "drafts-null": ({"draft_n": None}, ["timings.draft_n None"]),
}


# issue 57: what the counts and token ids must agree on (n_predict 16 asked; `tokens` replaces the token ids)
NO_MEASUREMENT |= {
    "15-predicted-n-above-n-predict": ({"predicted_n": 10**12}, ["timings.predicted_n 1000000000000 above the "
                                                                 "n_predict 16 asked"]),
    "15-tokens-fewer-than-predicted": ({"tokens": [1, 2, 3, 4]}, ["4 tokens for timings.predicted_n 11"]),
    "14-tokens-not-a-list": ({"tokens": "1 2 3"}, ["tokens '1 2 3' (not a list of token ids)"]),
    "14-tokens-absent": ({"tokens": "absent"}, ["no tokens (the output's token ids)"]),
    "17-tokens-strings": ({"tokens": ["a", "b"] * 5 + ["c"]}, ["tokens holding 'a'", "whole numbers"]),
    "17-tokens-bools": ({"tokens": [True] * 11}, ["tokens holding True"]),
    "accepted-above-generated": ({"predicted_n": 3, "draft_n": 10, "draft_n_accepted": 8},
                                 ["draft_n_accepted 8 above timings.predicted_n 3"]),
}


@pytest.mark.parametrize("change, words", list(NO_MEASUREMENT.values()), ids=list(NO_MEASUREMENT))
def test_timings_that_are_no_measurement_are_refused(change, words):
    from harness.crosscheck.run import ask
    from harness.errors import HarnessError
    change = dict(change)
    tokens = change.pop("tokens", None)
    with pytest.raises(HarnessError) as e:
        ask(Reply(GOOD | change, tokens), "code-01", {"n_predict": 16}, 1.0)
    for w in [*words, "llama-server (plain) answered prompt code-01", "not a measurement"]:
        assert w in str(e.value), str(e.value)


def test_timings_that_are_a_measurement_pass():
    """A plain server reports no draft fields, an older one no prompt fields: both are measurements."""
    from harness.crosscheck.run import ask
    assert ask(Reply(GOOD), "p", {}, 1.0)["draft_n_accepted"] == 6
    got = ask(Reply({"predicted_n": 1, "predicted_ms": 0.0}), "p", {}, 1.0)
    assert (got["draft_n"], got["prompt_n"]) == (0, None)


@pytest.mark.parametrize("timings, words", [
    ('{"predicted_n": 0, "predicted_ms": 0}', ["timings.predicted_n 0"]),
    ('{"predicted_ms": "12.5"}', ["timings.predicted_ms '12.5'"]),
    ('{"draft_n": 2, "draft_n_accepted": 10}', ["draft_n_accepted 10 above timings.draft_n 2"]),
], ids=["zero", "strings", "accepted-above-drafted"])
def test_a_server_reporting_no_measurement_stores_nothing(smoke, fake, timings, words):
    r = harness("crosscheck", smoke, "--llama-server", fake, "--per-category", "1",
                env={"FAKE_SERVER_TIMINGS": timings})
    one_line_error(r, *words, "not a measurement")
    assert not (smoke / "crosscheck.json").exists()


def test_stored_rows_that_are_no_measurement_are_dropped(tmp_path, capsys):
    """Rows stored before such answers were refused are not kept as finished: each is dropped, saying why."""
    from harness import checkrows
    from harness.crosscheck.run import kept_rows
    good = {"key": "a", "category": "code", "policy": "greedy", "configuration": "ngram:2 γ 3",
            "prompts": [{"id": "code-01", "plain": GOOD, "speculative": GOOD}]}
    zero = good | {"key": "b", "prompts": [{"id": "code-02", "plain": GOOD | {"predicted_n": 0, "predicted_ms": 0},
                                            "speculative": GOOD}]}
    half = good | {"key": "c", "prompts": [{"id": "code-03", "plain": GOOD}]}
    skip = {"key": "skip-chat", "category": "chat", "skip": "parallel 2: crosscheck sends one request at a time"}
    checkrows.save(tmp_path, [good, zero, half, skip])
    assert kept_rows(tmp_path) == [good, skip]
    err = capsys.readouterr().err
    assert "prompt code-02, plain: timings.predicted_n 0 (no token generated)" in err
    assert "prompt code-03, speculative: no timings" in err and err.count("dropped, measured again") == 2


# (crosscheck's options after RUN, its environment; {tmp} is the test's directory, whose home/ holds a cached
# `make native` build and whose empty/ holds nothing) and the words of the one line
REFUSED = {
    "start-timeout-nan": (["--start-timeout", "nan"], {}, ["--start-timeout", "above 0", "got nan"]),
    "start-timeout-inf": (["--start-timeout", "inf"], {}, ["--start-timeout", "above 0", "got inf"]),
    "request-timeout-nan": (["--request-timeout", "nan"], {}, ["--request-timeout", "above 0", "got nan"]),
    "request-timeout-zero": (["--request-timeout", "0"], {}, ["--request-timeout", "above 0", "got 0"]),
    "native-bin-without-server": ([], {"HARNESS_NATIVE_BIN": "{tmp}/empty"},
                                  ["HARNESS_NATIVE_BIN={tmp}/empty", "no executable llama-server in that folder"]),
    "native-bin-missing": ([], {"HARNESS_NATIVE_BIN": "{tmp}/nowhere"},
                           ["HARNESS_NATIVE_BIN={tmp}/nowhere", "does not exist"]),
    "native-bin-names-the-binary": ([], {"HARNESS_NATIVE_BIN": "{tmp}/home/.cache/harness/native/cpu/bin/llama-server"},
                                    ["is a file, not the bin folder"]),
    "llama-server-under-home": (["--llama-server", "~/.cache/harness/native/cpu/bin/llama-server"], {},
                                ["{tmp}/home/.cache/harness/native/cpu/bin/llama-server is not llama.cpp's"]),
}


@pytest.mark.parametrize("args, env, words", list(REFUSED.values()), ids=list(REFUSED))
def test_bad_options_and_environment_are_one_line(args, env, words, tmp_path):
    """Refused before any server starts; a HARNESS_NATIVE_BIN without llama-server is never passed over for the
    cached build."""
    cached = tmp_path / "home" / ".cache" / "harness" / "native" / "cpu" / "bin" / "llama-server"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\necho not a server\n")
    cached.chmod(0o755)
    (tmp_path / "empty").mkdir()
    (tmp_path / "run").mkdir()
    fill = {"tmp": str(tmp_path)}
    r = harness("crosscheck", tmp_path / "run", *args,
                env={"HOME": str(tmp_path / "home")} | {k: v.format(**fill) for k, v in env.items()})
    one_line_error(r, *(w.format(**fill) for w in words))
    assert not (tmp_path / "run" / "crosscheck.json").exists()
