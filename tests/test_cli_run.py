"""`harness run` and `harness check` from the command line: output, summary line, bad input."""
import json

import pytest

from tests.conftest import skip_on_gpu_build
from tests.helpers import harness, one_line_error

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"


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


def test_check_cli_verdicts(smol, smol_q2k):
    r = harness("check", T, D)
    assert r.returncode == 0 and "ALIGNED" in r.stdout
    r = harness("check", T, D, "--json")
    assert json.loads(r.stdout)["verdict"] == "ALIGNED"


def test_fidelity_cli(smol, smol_q2k):
    r = harness("fidelity", T, D, "--categories", "code", "--per-category", "1", "--max-tokens", "8",
                "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "top-1" in r.stdout.lower() or "top1" in r.stdout.lower()
    assert D in r.stdout and "requantized" in r.stdout.lower()


def test_misaligned_pair_is_refused_before_loading(smol, tiny_set, tmp_path):
    """Runs everywhere (the Gemma case above needs the Gemma file): a generated GGUF with its own tokenizer."""
    r = harness("run", T, "--draft", str(tiny_set["a"]), "--prompt", "hi")
    one_line_error(r, "not aligned")
    assert r.returncode == 2
    r = harness("bench", "--target", T, "--draft", str(tiny_set["a"]), "--categories", "code",
                "--per-category", "1", "--out", str(tmp_path / "runs"))
    one_line_error(r, "not aligned")
    assert r.returncode == 2 and not (tmp_path / "runs").exists()


def test_run_trace_under_a_regular_file_is_one_line(smol, tmp_path):
    f = tmp_path / "FILE"
    f.write_text("x")
    one_line_error(harness("run", T, "--prompt", "hi", "--trace", str(f / "t.jsonl")), "cannot write the trace file")
