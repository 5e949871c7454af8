"""`harness run` (runner.py) against issue 43's bad-input sweep: the values bench refuses are refused here by the
same checks (plan.check) before a model loads; a closed stdout, a C locale and NO_COLOR are honoured without a
traceback."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from harness.plan import expand, make_params
from harness.runner import given_prompt, plan_one, use_color
from tests.helpers import HARNESS, ROOT, harness, harness_process, one_line_error

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


def test_run_with_stdout_closed_writes_nothing_and_exits_0(smol):
    cmd = shlex.join([*HARNESS, "run", T, "--prompt", "hi", "--max-tokens", "4"]) + " >&-"
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=os.environ | {"CI": "true"}, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


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
