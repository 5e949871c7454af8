"""The context knobs llama.cpp users turn (engine.py): KV-cache types, flash attention and ubatch; their cache
bytes, what flash attention resolved to, and what llama.cpp cannot run refused before anything runs."""

import pytest

from harness.engine import EngineConfig, _flash_attn_used, cache_bytes
from harness.errors import HarnessError
from tests.conftest import D, T
from tests.helpers import harness, one_line_error


def test_what_flash_attention_resolved_to_is_read_from_the_log():
    assert _flash_attn_used("resolve_fused_ops: Flash Attention enabled\n", "auto") is True
    assert _flash_attn_used("resolve_fused_ops: Flash Attention disabled\n", "auto") is False  # "on" is refused
    assert _flash_attn_used("llama_context: flash_attn            = enabled\n", "auto") is True
    assert _flash_attn_used("", "auto") is None and _flash_attn_used("", "off") is False


def test_cache_bytes_follow_the_types():
    n = 2048 * 64
    assert cache_bytes("f16", n) == 2 * n and cache_bytes("bf16", n) == 2 * n and cache_bytes("f32", n) == 4 * n
    assert cache_bytes("q8_0", n) == n // 32 * 34 and cache_bytes("q4_0", n) == n // 32 * 18


@pytest.mark.parametrize("cfg, words", [
    (dict(cache_k="q3"), ("unknown K cache type 'q3'", "q8_0")),
    (dict(cache_v="q8_0", flash_attn="off"), ("quantized V cache", "flash attention")),
    (dict(flash_attn="maybe"), ("--flash-attn", "maybe")),
    (dict(n_ubatch=1024), ("--ubatch", "512")),
])
def test_engine_config_refuses_what_llamacpp_cannot_run(cfg, words):
    with pytest.raises(HarnessError) as e:
        EngineConfig(**cfg)
    assert all(w in str(e.value) for w in words)


def test_quantized_v_without_flash_attention_is_refused_before_anything_runs(tmp_path):
    r = harness("bench", "--target", T, "--draft", D, "--cache-type-v-draft", "q4_0", "--flash-attn", "off",
                "--categories", "code", "--per-category", "1", "--out", str(tmp_path))
    one_line_error(r, "quantized V cache", "flash attention")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    one_line_error(harness("bench", "--target", T, "--cache-type-k", "q3_k", "--out", str(tmp_path)),
                   "unknown K cache type")
    one_line_error(harness("run", T, "--prompt", "hi", "--flash-attn", "sometimes"), "--flash-attn")
