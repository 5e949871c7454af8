"""`harness server-check COMMAND`: is speculation running in a user's own llama-server command line? The fast tier
runs the fake server (tests/fake_llama_server.py: it speculates only where --spec-type names a type, as llama.cpp
does) with SmolLM2's vocabulary for the prompts; the slow tier runs the real llama-server `make native` builds, on
SmolLM2 Q4_1 with its Q2_K as the draft."""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from harness.crosscheck.servercheck import parse
from tests.helpers import harness, one_line_error


def cmd(*words) -> str:
    return shlex.join(map(str, words))


def requests(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


# -- the command line, split -----------------------------------------------------------------------------------

def test_the_plain_twin_drops_every_speculative_flag():
    """Speculative flags by any alias, underscores and switches included, go; --host and --port are replaced;
    -np 1 is added where the command sets none; the twin runs --spec-type none."""
    c = parse("./llama-server -m t.gguf -c 2048 --spec-type draft-simple -md d.gguf --spec-draft-n-max 3 -ngld 0 "
              "--spec_draft_p_min 0.5 --spec-draft-cpu-moe -ctkd q8_0 --port 8080 --host 0.0.0.0 --temp 0 -t 2")
    assert c.program == "./llama-server" and c.target == "t.gguf" and c.draft == ("-md", "d.gguf")
    assert c.types == ["draft-simple"] and c.temp == "0" and c.greedy()
    assert c.plain == ["-m", "t.gguf", "-c", "2048", "--temp", "0", "-t", "2", "-np", "1", "--spec-type", "none"]
    assert c.spec == ["-m", "t.gguf", "-c", "2048", "--spec-type", "draft-simple", "-md", "d.gguf",
                      "--spec-draft-n-max", "3", "-ngld", "0", "--spec_draft_p_min", "0.5", "--spec-draft-cpu-moe",
                      "-ctkd", "q8_0", "--temp", "0", "-t", "2", "-np", "1"]
    assert any("--port 8080 dropped" in x for x in c.changes) and any("-np 1 added" in x for x in c.changes)


def test_a_given_np_and_a_sampled_temperature_are_kept():
    c = parse("~/bin/llama-server -m ~/t.gguf --parallel 4 --temperature 0.7 --spec-type ngram-mod,ngram-map-k")
    assert c.spec.count("--parallel") == 1 and "-np" not in c.spec and c.plain[-2:] == ["--spec-type", "none"]
    assert c.types == ["ngram-mod", "ngram-map-k"] and not c.greedy()
    assert c.program == str(Path.home() / "bin" / "llama-server") and c.target == str(Path.home() / "t.gguf")


BAD = {
    "not-llama-server": ("python -m http.server", ["not a llama-server command", "'python'"]),
    "llama-cli": ("/opt/llama-cli -m t.gguf", ["not a llama-server command", "'llama-cli'"]),
    "empty": ("  ", ["the command is empty"]),
    "quotes": ("llama-server -m 'unclosed", ["cannot be split", "quotes"]),
    "no-value": ("llama-server -m t.gguf --spec-draft-model", ["ends with --spec-draft-model"]),
    "no-model": ("llama-server -hf someone/model", ["names no model file (-m FILE)"]),
    "missing-model": ("llama-server -m nowhere.gguf", ["model file nowhere.gguf (-m) does not exist"]),
}


@pytest.mark.parametrize("command, words", list(BAD.values()), ids=list(BAD))
def test_bad_commands_are_one_line(command, words):
    one_line_error(harness("server-check", command), *words)


TEMPLATES = {  # issue 57, case 78: a target whose chat template llama.cpp cannot apply to the chat prompts
    "78-no-chat-template": (None, ["tiny.gguf (-m) cannot render server-check's prompts (the model has no chat "
                                   "template)", "chat conversations (prompts/code.jsonl)",
                                   "give -m an instruct model"]),
    "78-a-template-llama-cpp-lacks": ("{{ no template llama.cpp knows }}", ["does not support this model's chat "
                                                                           "template", "give -m an instruct model"]),
}


@pytest.mark.parametrize("template, words", list(TEMPLATES.values()), ids=list(TEMPLATES))
def test_a_target_without_a_usable_chat_template_is_named(fake, tmp_path, template, words):
    from tests.tiny_gguf import write_tiny_model
    target = write_tiny_model(tmp_path / "tiny.gguf", chat_template=template)
    log = tmp_path / "requests.jsonl"
    r = harness("server-check", cmd(fake, "-m", target, "--spec-type", "ngram-mod"), env={"FAKE_SERVER_LOG": str(log)})
    line = one_line_error(r, *words)
    assert "chat: false" not in line and not requests(log)  # no server started


def test_a_missing_draft_model(fake, smol):
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple", "-md", "no/draft.gguf"))
    one_line_error(r, "draft model file no/draft.gguf (-md) does not exist")


# -- the fake server ---------------------------------------------------------------------------------------------

def test_a_speculating_command(fake, smol, smol_q2k, tmp_path):
    """It drafts: the drafted tokens summed over requests, the pooled acceptance, the speedup's t interval over
    the prompts' known ratios; each request on a server of its own, in ABBA order, with cache_prompt false and
    temperature 0, on a port of the harness's."""
    from scipy.stats import t as student_t

    from tests.fake_llama_server import factor
    log = tmp_path / "requests.jsonl"
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple", "--spec-draft-model", smol_q2k,
                                    "--port", "8080"), "--max-tokens", "12", env={"FAKE_SERVER_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    sent = requests(log)
    assert [x["role"] for x in sent] == ["speculative", "plain", "plain", "speculative", "speculative", "plain"]
    for q in sent:
        assert q["body"]["cache_prompt"] is False and q["body"]["temperature"] == 0.0
        assert q["body"]["n_predict"] == 12
        assert q["argv"].count("--port") == 1 and "8080" not in q["argv"] and q["argv"][-4:-2] == ["--host",
                                                                                                    "127.0.0.1"]
        assert ("--spec-draft-model" in q["argv"]) == (q["role"] == "speculative")
        assert q["argv"][q["argv"].index("-np") + 1] == "1"
    n = [len(q["body"]["prompt"]) for q in sent if q["role"] == "plain"]
    drafted, accepted = sum(10 + k % 3 for k in n), sum(6 + k % 2 for k in n)
    assert f"Yes: it drafted {drafted} tokens over 3 requests" in r.stdout
    assert f"- Acceptance: {accepted / drafted:.0%} [" in r.stdout and f"({accepted} of {drafted}" in r.stdout
    logs = [math.log(1.5 * factor(k)) for k in n]
    mean = sum(logs) / 3
    h = student_t.ppf(0.975, 2) * math.sqrt(sum((x - mean) ** 2 for x in logs) / 2) / math.sqrt(3)
    assert f"- Speedup: {math.exp(mean):.2f}x [{math.exp(mean - h):.2f}, {math.exp(mean + h):.2f}] over 3 prompts" \
        in r.stdout
    assert "equal token for token on 3 of 3 prompts" in r.stdout and "(ABBA)" in r.stdout
    assert "--port 8080 dropped" in r.stdout and "--spec-type none" in r.stdout
    assert r.stderr.count("server-check: code-") == 3


def test_a_draft_model_without_spec_type_does_not_speculate(fake, smol, smol_q2k):
    """llama.cpp issue #25345: -md alone leaves the type at none; named as such, with the fix; exit 2."""
    r = harness("server-check", cmd(fake, "-m", smol, "-md", smol_q2k), "--per-category", "2")
    assert r.returncode == 2, r.stderr
    assert "does not speculate: drafted 0 tokens over 2 requests" in r.stdout
    assert f"a draft model (-md {smol_q2k}) but no --spec-type" in r.stdout and "#25345" in r.stdout
    assert "- Fix: add `--spec-type draft-simple`" in r.stdout
    assert "- Speedup: 1.00x" in r.stdout


def test_a_type_that_drafts_nothing(fake, smol):
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "ngram-mod"), "--per-category", "2",
                env={"FAKE_SERVER_DRAFTS": "none"})
    assert r.returncode == 2, r.stderr
    assert "drafted 0 tokens over 2 requests" in r.stdout and "drafts only where the output repeats" in r.stdout


def test_a_sampled_command_keeps_its_temperature(fake, smol, tmp_path):
    log = tmp_path / "requests.jsonl"
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "ngram-simple", "--temp", "0.7"),
                "--per-category", "1", env={"FAKE_SERVER_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    assert all("temperature" not in q["body"] for q in requests(log))
    assert "Outputs: not compared: sampled at --temp 0.7" in r.stdout and "one prompt gives no interval" in r.stdout


def test_a_server_that_dies_at_start(fake, smol):
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple"),
                env={"FAKE_SERVER_MODE": "exit"})
    one_line_error(r, "llama-server (your command) exited with code 3", "failed to load model 'nowhere.gguf'")


def test_an_unknown_type_is_the_servers_one_line(fake, smol):
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "ngram-mod,ngram-foo"))
    one_line_error(r, "exited with code 1", "unknown speculative type: ngram-foo")


def test_a_server_that_never_answers(fake, smol):
    r = harness("server-check", cmd(fake, "-m", smol), "--start-timeout", "1", env={"FAKE_SERVER_MODE": "silent"})
    one_line_error(r, "did not answer /health", "within 1 s")


def test_a_server_that_answers_without_timings(fake, smol):
    r = harness("server-check", cmd(fake, "-m", smol), env={"FAKE_SERVER_MODE": "notimings"})
    one_line_error(r, "llama-server (your command) answered prompt code-01 without timings")


def test_the_binary_run(fake, smol, tmp_path):
    """--llama-server overrides the command's program; a program that is not here gives way to the harness's own,
    saying so; a binary that is not llama-server is refused."""
    r = harness("server-check", cmd("/nowhere/llama-server", "-m", smol), "--per-category", "1",
                env={"HARNESS_NATIVE_BIN": str(fake.parent)})
    assert r.returncode == 2, r.stderr
    assert f"the command's /nowhere/llama-server is not an executable file here: ran {fake}" in r.stdout
    r = harness("server-check", cmd("llama-server", "-m", smol), "--llama-server", "/bin/true")
    one_line_error(r, "not llama.cpp's llama-server")


@pytest.mark.parametrize("args, words", [(["--per-category", "0"], ["--per-category must be 1 or more"]),
                                         (["--max-tokens", "1"], ["--max-tokens must be 2 or more"]),
                                         (["--category", "nope"], ["unknown prompt category 'nope'"])])
def test_bad_options(fake, smol, args, words):
    one_line_error(harness("server-check", cmd(fake, "-m", smol), *args), *words)


# -- the real llama-server ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_llama_server(smol, smol_q2k):
    """SmolLM2 Q4_1 with its Q2_K as draft-simple, 2 prompts, 16 tokens: it speculates, and greedy outputs equal
    plain decoding's; the same draft model without --spec-type drafts nothing (llama.cpp issue #25345)."""
    from harness.crosscheck.binary import native_candidates
    server = next((p for p in native_candidates() if p.is_file()), None)
    if server is None:
        pytest.skip("no llama-server built by `make native` (make test-all builds it)")
    opts = ("--per-category", "2", "--max-tokens", "16", "--llama-server", server)
    r = harness("server-check", cmd("llama-server", "-m", smol, "--spec-type", "draft-simple", "-md", smol_q2k), *opts)
    assert r.returncode == 0, r.stderr
    assert "Is speculation running? Yes: it drafted" in r.stdout and "over 2 requests" in r.stdout
    assert "equal token for token on 2 of 2 prompts" in r.stdout
    r = harness("server-check", cmd("llama-server", "-m", smol, "-md", smol_q2k), *opts)
    assert r.returncode == 2, r.stderr
    assert "does not speculate: drafted 0 tokens over 2 requests" in r.stdout and "#25345" in r.stdout


# -- synthetic acceptance (crosscheck.synth) ---------------------------------------------------------------------

@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_synthetic_acceptance_finds_the_break_even(fake, smol, smol_q2k, tmp_path):
    """--synth 5 at a longest draft of 3: lengths 1 to 4, each beside its plain twin; the fake runs at 0.6 + 0.4
    (L - 1) times plain and accepts (L - 1) / 3 of its drafts, so 1x falls between 25% (0.9x) and 50% (1.2x)."""
    from harness.crosscheck.synth import crossing
    log = tmp_path / "requests.jsonl"
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple", "--spec-draft-model", smol_q2k),
                "--max-tokens", "12", "--per-category", "2", "--synth", "5", env={"FAKE_SERVER_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    synth = [q for q in requests(log) if "--spec-synth-len" in q["argv"]]
    assert sorted({q["argv"][q["argv"].index("--spec-synth-len") + 1] for q in synth}) == \
        ["1", "1.75", "2.5", "3.25", "4"]
    assert len(synth) == 5 * 2 and len(requests(log)) == 6 * 2 * 2  # the real run, then five lengths, with twins
    table = r.stdout.split("## What acceptance pays here", 1)[1]
    for length, acc in (("1", "0%"), ("1.75", "25%"), ("2.5", "50%"), ("3.25", "75%"), ("4", "100%")):
        assert f"| {length} " in table and f"| {acc} " in table
    assert crossing([(0.25, 0.9), (0.5, 1.2)]) == pytest.approx(1 / 3)
    assert "- Break-even: 3" in table and "your command's own: 6" in table and "(above it)" in table


@pytest.mark.parametrize("command, env, words", [
    (["--spec-type", "ngram-mod"], {}, ["ngram-mod drafts only where the output repeats", "draft model"]),
    (["--spec-type", "draft-simple"], {"FAKE_SERVER_LACKS": "--spec-synth-len"}, ["no --spec-synth-len"]),
    (["--spec-type", "none"], {}, ["give the command a --spec-type that drafts"])])
def test_synthetic_acceptance_refusals_are_one_line(fake, smol, command, env, words, tmp_path):
    log = tmp_path / "requests.jsonl"
    r = harness("server-check", cmd(fake, "-m", smol, *command), "--synth", "3",
                env=env | {"FAKE_SERVER_LOG": str(log)})
    one_line_error(r, *words)
    assert not requests(log)  # refused before any server started


def test_synth_needs_two_lengths(fake, smol):
    one_line_error(harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple"), "--synth", "1"),
                   "--synth N needs N >= 2")


def test_synth_is_capped(fake, smol, tmp_path):  # issue 57, case 198
    log = tmp_path / "requests.jsonl"
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple"), "--synth", "1000",
                env={"FAKE_SERVER_LOG": str(log)})
    one_line_error(r, "--synth 1000: at most 16 lengths", "2000 per prompt", "give fewer")
    assert not requests(log)


# -- issue 57: what the servers said, and what they answered -------------------------------------------------------
SAID = {  # case: (the command's words after -m TARGET, the fake's environment, exit code, words on stdout or stderr)
    "82-a-flag-it-rejects": (["--spec-type", "ngram-mod"], {"FAKE_SERVER_MODE": "badarg"}, 1,
                             ['error while handling argument "--temp"']),
    "83-an-unknown-type": (["--spec-type", "bogus"], {}, 1, ['"--spec-type": unknown speculative type: bogus']),
    "84-draft-simple-without-a-model": (["--spec-type", "draft-simple"], {"FAKE_SERVER_DRAFTS": "none"}, 2,
                                        ["--spec-type draft-simple but gives no draft model",
                                         "add `--spec-draft-model DRAFT.gguf`"]),
    "79-the-log-names-why": (["--spec-type", "draft-simple", "-md", "{smol}"],
                             {"FAKE_SERVER_DRAFTS": "none",
                              "FAKE_SERVER_SAYS": "srv load_model: the draft model is not compatible with the target"},
                             2, ["the server's log says: srv load_model: the draft model is not compatible"]),
    "92-counts-above-n-predict": (["--spec-type", "ngram-mod"],
                                  {"FAKE_SERVER_TIMINGS": '{"predicted_n": 1000000000000, "predicted_ms": 1e-9}'}, 1,
                                  ["predicted_n 1000000000000 above the n_predict 64", "not a measurement"]),
}


def test_a_foreign_tokenizer_draft_that_drafts_nothing_is_named(fake, smol, tiny_set):  # issue 57, case 79
    r = harness("server-check", cmd(fake, "-m", smol, "--spec-type", "draft-simple", "-md", tiny_set["a"]),
                "--per-category", "1", env={"FAKE_SERVER_DRAFTS": "none"})
    assert r.returncode == 2, r.stdout + r.stderr
    for w in (f"the draft model {tiny_set['a']} does not share the target's tokenizer (", "`harness drafts TARGET`"):
        assert w in r.stdout, r.stdout


@pytest.mark.parametrize("words_, env, code, words", list(SAID.values()), ids=list(SAID))
def test_what_the_servers_say_is_read_for_why(fake, smol, words_, env, code, words):
    r = harness("server-check", cmd(fake, "-m", smol, *(w.format(smol=smol) for w in words_)), "--per-category", "1",
                env=env)
    assert r.returncode == code, r.stdout + r.stderr
    if code == 1:
        line = one_line_error(r, *words)
        assert "to show complete usage" not in line
    else:
        for w in words:
            assert w in r.stdout, r.stdout
