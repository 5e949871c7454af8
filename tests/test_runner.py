"""`harness run` (runner.py) against issue 43's bad-input sweep: the values bench refuses are refused here by the
same checks (plan.check) before a model loads; a C locale and NO_COLOR are honoured without a traceback. Its
output and summary line, its prompt file and seed, and its bad input from the command line."""
from __future__ import annotations

import json

import pytest

from harness.plan import expand, make_params
from harness.runner import given_prompt, plan_one, use_color
from harness.trace import read_records
from tests.conftest import D, skip_on_gpu_build
from tests.helpers import harness, harness_process, one_line_error

T = "smollm2-135m-instruct-q4_1"

REFUSED = {
    "threads-beyond-cores": (["--threads", "100000"], ["--threads 100000", "logical cores"]),
    "seed-negative": (["--seed", "-1"], ["--seed", ">= 0"]),
    "temp-inf": (["--temp", "inf"], ["--temp", "finite"]),
    "draft-p-min-inf": (["--draft", "ngram:2", "--draft-p-min", "inf"], ["p-min"]),
    "max-tokens-beyond-n-ctx": (["--max-tokens", "5000"], ["--max-tokens 5000", "--n-ctx 2048"]),
    "ubatch-zero": (["--ubatch", "0"], ["--ubatch", ">= 1"]),
    "a-list": (["--draft", "d1,d2"], ["--draft d1,d2", "one value"]),
    "cache-type-unknown": (["--cache-type-k", "q9"], ["q9"]),
}


@pytest.mark.parametrize("args, words", list(REFUSED.values()), ids=list(REFUSED))
def test_run_refuses_what_bench_refuses_before_a_model_loads(args, words, monkeypatch):
    monkeypatch.setattr("harness.runner.open_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    one_line_error(harness("run", T, "--prompt", "hi", *args), *words)


def test_the_prompt_of_a_c_locale_command_line_is_read_as_utf8():
    """argv's UTF-8 bytes decoded as ASCII arrive as surrogates, which apply_chat_template could not encode."""
    as_c_locale = "…日本".encode().decode("ascii", "surrogateescape")
    assert given_prompt(as_c_locale, None, False, 8).text == "…日本"
    assert given_prompt("caf\udce9", None, False, 8).text == "caf\ufffd"  # a Latin-1 byte: replaced, not fatal


def test_run_under_a_c_locale_prints_without_a_traceback(smol):
    r = harness_process("run", T, "--prompt", "Say …日本 twice", "--max-tokens", "4",
                        env={"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "tokens 4" in r.stdout


class _Tty:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("env, color", [({}, True), ({"NO_COLOR": "1"}, False), ({"NO_COLOR": ""}, True)],
                         ids=["unset", "set", "set-but-empty"])
def test_no_color_is_honoured_on_a_terminal(monkeypatch, env, color):
    monkeypatch.delenv("NO_COLOR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert use_color(_Tty()) is color


@pytest.mark.parametrize("opts", [{}, {"draft": "ngram:3", "gamma": 2}, {"draft": "dft", "verify": "exact"},
                                  {"draft": "dft", "temp": 0.7, "verify": "exact", "draft_p_min": 0.5,
                                   "cache_type_k_draft": "q8_0"}])
def test_run_plans_the_instance_bench_would_with_bench_defaults(opts):
    """One parameter path: run's instance is bench's for the same values, ids and defaults included (under greedy
    decoding bench makes exact leviathan, as run does)."""
    inst, params = plan_one(target="tgt", **opts)
    bench = [i for i in expand(make_params({}, {"target": "tgt"} | {k: str(v) for k, v in opts.items()}))
             if i.baseline == ("draft" not in opts)]
    assert [i.id for i in bench] == [inst.id] and params.n_ctx == 2048
    assert inst.gamma == (0 if "draft" not in opts else opts.get("gamma", 4))


# -- `harness run` from the command line: output, summary line, bad input
def test_run_prints_marked_text_and_summary(smol, smol_q2k, tmp_path):
    trace = tmp_path / "t.jsonl"
    r = harness("run", T, "--draft", D, "--prompt", "List three colours.", "--gamma", "3", "--max-tokens", "24",
                "--baseline", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    text, summary = r.stdout.rstrip("\n").rsplit("\n", 1)
    assert "«" in text  # accepted draft tokens marked (not a terminal, so plain markers)
    for word in ("proposed", "accepted", "acceptance", "mean accepted/step", "alpha", "tok/s", "baseline",
                 "speedup", "outputs"):
        assert word in summary
    recs = [json.loads(x) for x in trace.read_text().splitlines()]
    assert {r["mode"] for r in recs} == {"speculative", "baseline"}
    assert sum(1 for r in recs if r["type"] == "generation") == 2


def test_run_ngram_sampled(smol):
    r = harness("run", T, "--draft", "ngram:2", "--prompt", "Count: one two three one two three one two",
                "--raw", "--temp", "0.8", "--top-p", "0.9", "--max-tokens", "12")
    assert r.returncode == 0, r.stderr
    assert "T=0.8 top_p=0.9" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--draft", D, "--gamma", "0"], ["gamma"]),
    (["--temp", "-1"], ["temperature"]),
    (["--top-p", "0"], ["top_p"]),
    (["--top-p", "1.5"], ["top_p"]),
    (["--top-k", "-2"], ["top_k"]),
    (["--min-p", "2"], ["min_p"]),
    (["--ngl", "99"], ["GPU", "CMAKE_ARGS"]),
    (["--draft", D, "--ngl-draft", "5"], ["GPU"]),
    (["--n-ctx", "256", "--max-tokens", "250"], ["n_ctx"]),
    (["--n-ctx", "128", "--max-tokens", "120"], ["n_ctx is 128"]),  # llama.cpp pads to 256: not what to report
    (["--n-ctx", "0"], ["--n-ctx", "64"]),
    (["--n-ctx", "-1"], ["--n-ctx", "64"]),
    (["--threads", "-1"], ["--threads", ">= 0"]),
    (["--bogus"], ["--bogus", "--help"]),  # a click usage error, in one line
    (["--max-tokens"], ["--max-tokens", "requires an argument"]),
    (["--draft", "gemma-3-270m-q4_k_m"], ["not aligned"]),
    (["--draft", "ngram:0"], ["n-gram size"]),
])
def test_run_bad_input(args, words, smol):
    if any(a.startswith("--ngl") for a in args):
        skip_on_gpu_build("the offload refusal of a CPU-only build")
    if "gemma-3-270m-q4_k_m" in args:
        from tests.conftest import MODELS
        if not (MODELS / "gemma-3-270m-q4_k_m.gguf").exists():
            pytest.skip("gemma not fetched")
    r = harness("run", T, "--prompt", "Hello there", *args)
    one_line_error(r, *words)


def test_run_empty_prompt_and_missing_model(tmp_path):
    one_line_error(harness("run", T, "--prompt", "   "), "empty")
    one_line_error(harness("run", "nope-model", "--prompt", "hi"), "unknown model")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOTGGUF" * 10)
    one_line_error(harness("run", str(bad), "--prompt", "hi"), "not a GGUF")


def test_run_trace_under_a_regular_file_is_one_line(smol, tmp_path):
    f = tmp_path / "FILE"
    f.write_text("x")
    one_line_error(harness("run", T, "--prompt", "hi", "--trace", str(f / "t.jsonl")), "cannot write the trace file")


# -- the prompt from a file, and the seed
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


def test_run_takes_a_draft_path_with_a_plus(tmp_path):  # case 60 (58, 59: the same parse, test_specs)
    inst, _ = plan_one(target="tgt", draft=str(tmp_path / "c++-draft.gguf"))
    assert inst.draft.model == str(tmp_path / "c++-draft.gguf")
