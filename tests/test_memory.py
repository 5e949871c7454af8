"""Bad input: models too big for the machine's memory are refused before anything runs, in one line naming the
model, what it needs, what is available and what to do (bench.memory); the available memory is monkeypatched."""
from __future__ import annotations

import pytest

import harness.bench.memory as memory
from harness.bench.memory import check_memory, kv_bytes
from harness.errors import HarnessError
from harness.plan import Params, expand
from tests.conftest import PROMPT_FILE, D, T
from tests.helpers import harness, one_line_error

MIB = 2**20


def sizes(smol, smol_q2k) -> tuple[int, int]:
    """What the target alone needs, and the target with the draft: weights and 2048-position f16 KV caches."""
    alone = smol.stat().st_size + kv_bytes(smol, 2048, "f16", "f16")
    return alone, alone + smol_q2k.stat().st_size + kv_bytes(smol_q2k, 2048, "f16", "f16")


def test_the_kv_cache_is_what_llama_cpp_allocates(smol):
    from harness.engine import Engine, EngineConfig
    with Engine(smol, EngineConfig(n_ctx=2048, cache_v="q8_0")) as e:
        assert kv_bytes(smol, 2048, "f16", "q8_0") == e.kv_bytes()


def test_a_pair_that_does_not_fit_is_refused_in_one_line_before_anything_runs(tmp_path, monkeypatch, smol,
                                                                                 smol_q2k):
    alone, pair = sizes(smol, smol_q2k)
    monkeypatch.setattr(memory, "available_bytes", lambda: (alone + pair) // 2)  # the baseline fits, the pair not
    out = tmp_path / "r"
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "2", "--prompts", PROMPT_FILE, "--max-tokens", "8",
                "--dry-run", "--out", out)
    line = one_line_error(r, f"{T} does not fit in memory", f"with its draft {D}'s", "--n-ctx 2048",
                          f"need {pair / MIB:.0f} MiB", "available", "smaller quantization", "--ngl")
    assert r.returncode == 1 and not out.exists(), line
    assert "dry run" not in r.stderr  # refused before the estimate's probes


def test_a_model_alone_too_big_names_a_smaller_quantization_that_fits(monkeypatch, smol, smol_q2k):
    alone, _ = sizes(smol, smol_q2k)
    monkeypatch.setattr(memory, "available_bytes", lambda: alone - MIB)
    with pytest.raises(HarnessError) as e:
        check_memory(expand(Params(target=[T])), 2048)
    assert f"e.g. {D} (" in str(e.value)  # the Q2_K of the same model: its weights fit beside the KV cache
    monkeypatch.setattr(memory, "available_bytes", lambda: MIB)
    with pytest.raises(HarnessError) as e:
        check_memory(expand(Params(target=[T])), 2048)
    assert "quantization, lower --n-ctx" in str(e.value)  # none fits: no example


def test_what_fits_and_what_is_offloaded_pass(monkeypatch, smol, smol_q2k):
    _, pair = sizes(smol, smol_q2k)
    monkeypatch.setattr(memory, "available_bytes", lambda: pair)
    check_memory(expand(Params(target=[T], draft=["none", D, "ngram:3"])), 2048)
    # with offload the host's share is llama.cpp's to know: not checked
    monkeypatch.setattr(memory, "available_bytes", lambda: 0)
    check_memory(expand(Params(target=[T], draft=["none", D], ngl=[1], ngl_draft=[1])), 2048)
