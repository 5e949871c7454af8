"""Tokenizer alignment (harness/align.py): tiny generated GGUF pairs that differ in exactly one thing,
real model pairs (skipped when the file is absent), bad input, and `harness check` from the command line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

from tests.tiny_gguf import build_tokenizer, make_fixture_set

from harness import align
from harness.errors import HarnessError
from harness.prompts import Prompt
from tests.helpers import harness, one_line_error
from tests.conftest import D, T

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
QWEN_15 = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_05 = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SMOL = MODELS / "smollm2-135m-instruct-q4_1.gguf"
SMOL_Q2 = MODELS / "smollm2-135m-instruct-q2_k.gguf"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    return make_fixture_set(tmp_path_factory.mktemp("align_fixtures"))


@pytest.fixture(scope="module")
def reports(fx) -> dict[str, dict]:
    """check_pair(a, X) for every fixture X, computed once."""
    return {k: align.check_pair(fx["a"], p) for k, p in fx.items()}


def _has(report: dict, *words: str) -> bool:
    return any(all(w in r for w in words) for r in report["reasons"])


# -- tiny fixtures ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a", "b"])
def test_same_tokenizer_is_aligned(reports, name):
    r = reports[name]
    assert r["verdict"] == align.ALIGNED, r["reasons"] + r["warnings"]
    assert r["reasons"] == [] and r["warnings"] == []
    assert r["tokens"]["differ"] == 0
    assert r["round_trip"]["source"] == "probes"
    assert r["round_trip"]["n"] >= 5 and r["round_trip"]["mismatched"] == 0


def test_report_is_json_serialisable(reports):
    for r in reports.values():
        assert json.loads(json.dumps(r))["verdict"] == r["verdict"]


def test_token_text(reports):
    r = reports["token_text"]
    extras = build_tokenizer("token_text").extras
    assert r["verdict"] == align.MISALIGNED
    assert r["tokens"]["differ"] == 1 and r["tokens"]["text_differ"] == 1
    first = r["tokens"]["first"][0]
    assert first["id"] == extras["changed_id"]
    assert (first["target_text"], first["draft_text"]) == (extras["old_text"], extras["new_text"])
    assert _has(r, "1 of 370 shared token ids differ", f"id {extras['changed_id']}", extras["new_text"])


def test_bos_id(reports):
    r = reports["bos_id"]
    assert r["verdict"] == align.MISALIGNED
    assert not r["specials"]["bos"]["equal"]
    assert _has(r, "BOS token id differs", "<|bos|>", "<|eos|>")
    # the BOS the draft prepends is another id: the round trip catches it at token 0
    assert r["round_trip"]["first_mismatch"]["offset"] == 0


def test_add_bos(reports):
    r = reports["add_bos"]
    assert r["verdict"] == align.MISALIGNED
    assert _has(r, "add_bos flag differs", "target True", "draft False")
    assert _has(r, "round trip", "at token 0")


def test_pre(reports):
    r = reports["pre"]
    assert r["verdict"] == align.MISALIGNED
    assert r["reasons"] == ["pre-tokenizer differs: target 'default', draft 'gpt-2'"]


def test_other_tokenizer(reports):
    r = reports["other_tokenizer"]
    assert r["verdict"] == align.MISALIGNED
    assert _has(r, "vocabulary sizes differ", "not padding")
    assert _has(r, "shared token ids differ")
    assert _has(r, "BOS token id differs")
    assert r["round_trip"]["mismatched"] == r["round_trip"]["n"]


def test_padding_draft_larger(reports):
    r = reports["padding"]
    assert r["verdict"] == align.ALIGNED_WITH_WARNINGS
    assert r["reasons"] == []
    size = r["vocab_size"]
    assert (size["extra_side"], size["extra"], size["extra_padding"], size["extra_not_padding"]) == ("draft", 8, 8, 0)
    assert any("8 extra draft ids" in w and "target can't produce them" in w for w in r["warnings"])


def test_padding_target_larger(fx):
    r = align.check_pair(fx["padding"], fx["a"])
    assert r["verdict"] == align.ALIGNED_WITH_WARNINGS
    assert r["vocab_size"]["extra_side"] == "target" and r["vocab_size"]["extra_padding"] == 8
    assert any("8 extra target ids" in w and "draft can never propose them" in w for w in r["warnings"])


def test_chat_template_difference_is_a_warning(tmp_path):
    from tests.tiny_gguf import write_tiny_model
    a = write_tiny_model(tmp_path / "a.gguf")
    b = write_tiny_model(tmp_path / "b.gguf", chat_template=None)
    r = align.check_pair(a, b)
    assert r["verdict"] == align.ALIGNED_WITH_WARNINGS
    assert r["chat_template"]["equal"] is False
    assert any("chat templates differ" in w for w in r["warnings"])


def test_given_prompts_are_rendered_with_the_target_template(fx):
    prompts = [Prompt("p1", "t", messages=(("user", "hello world, the cat sat"),)),
               Prompt("p2", "t", text="the dog is a big dog", chat=False)]
    r = align.check_pair(fx["a"], fx["b"], prompts)
    assert r["round_trip"]["source"] == "prompts"
    assert [p["id"] for p in r["round_trip"]["prompts"]] == ["p1", "p2"]
    assert r["verdict"] == align.ALIGNED
    r = align.check_pair(fx["a"], fx["bos_id"], prompts)
    m = r["round_trip"]["first_mismatch"]
    assert (m["id"], m["offset"]) == ("p1", 0)
    assert _has(r, "round trip: 2 of 2 prompts", "'p1' at token 0")


def test_format_report(reports):
    text = align.format_report(reports["token_text"])
    assert "tokenizer model" in text and "pre-tokenizer" in text and "round trip" in text
    assert "verdict: MISALIGNED" in text
    assert "reason: 1 of 370 shared token ids differ" in text
    assert "first differing shared ids" in text
    assert "verdict: ALIGNED WITH WARNINGS" in align.format_report(reports["padding"])
    assert "verdict: ALIGNED " in align.format_report(reports["a"])


def test_require_aligned(fx):
    assert align.require_aligned(fx["a"], fx["b"])["verdict"] == align.ALIGNED
    assert align.require_aligned(fx["a"], fx["padding"])["verdict"] == align.ALIGNED_WITH_WARNINGS
    with pytest.raises(HarnessError) as e:
        align.require_aligned(fx["a"], fx["bos_id"])
    msg = str(e.value)
    assert e.value.exit_code == 2
    assert "is not aligned with target" in msg and "BOS token id differs" in msg
    assert "harness check" in msg and "\n" not in msg


def test_check_command(fx, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CATALOG", str(ROOT / "models.toml"))
    text, code = align.check_command(str(fx["a"]), str(fx["b"]), None, as_json=False)
    assert code == 0 and "verdict: ALIGNED" in text
    text, code = align.check_command(str(fx["a"]), str(fx["pre"]), None, as_json=True)
    assert code == 2 and json.loads(text)["verdict"] == align.MISALIGNED
    pf = tmp_path / "p.jsonl"
    pf.write_text(json.dumps({"id": "x1", "category": "c", "messages": [{"role": "user", "content": "hello"}]}) + "\n")
    text, code = align.check_command(str(fx["a"]), str(fx["padding"]), str(pf), as_json=True)
    r = json.loads(text)
    assert code == 0 and r["verdict"] == align.ALIGNED_WITH_WARNINGS
    assert r["round_trip"]["source"] == "prompts" and r["round_trip"]["prompts"][0]["id"] == "x1"


def test_check_command_without_catalog_accepts_paths(fx, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CATALOG", str(tmp_path / "no-such-catalog.toml"))
    _, code = align.check_command(str(fx["a"]), str(fx["b"]), None, as_json=False)
    assert code == 0


# -- bad input ----------------------------------------------------------------------------------------------
def _one_line_error(fn, *args) -> str:
    with pytest.raises(HarnessError) as e:
        fn(*args)
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def test_missing_file(fx, tmp_path):
    msg = _one_line_error(align.check_pair, fx["a"], tmp_path / "nope.gguf")
    assert "draft model" in msg and "does not exist" in msg
    msg = _one_line_error(align.check_pair, tmp_path / "nope.gguf", fx["a"])
    assert "target model" in msg


def test_not_gguf(fx, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello, I am not a model\n")
    assert "not a GGUF file" in _one_line_error(align.check_pair, fx["a"], bad)


def test_gguf_magic_then_garbage(fx, tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    assert "could not load" in _one_line_error(align.check_pair, fx["a"], bad)


def test_truncated_tiny_gguf(fx, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(fx["a"].read_bytes()[:100_000])
    assert "truncated" in _one_line_error(align.check_pair, cut, fx["a"])


def test_truncated_real_gguf(fx, tmp_path):
    if not SMOL.exists():
        pytest.skip(f"{SMOL.name} not present")
    cut = tmp_path / "smol-1mb.gguf"
    with open(SMOL, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    assert "truncated" in _one_line_error(align.check_pair, fx["a"], cut)


def test_unknown_model_name(monkeypatch):
    monkeypatch.setenv("HARNESS_CATALOG", str(ROOT / "models.toml"))
    msg = _one_line_error(align.check_command, "no-such-model", "also-missing", None, False)
    assert "unknown model 'no-such-model'" in msg


def test_missing_path_via_command(fx, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CATALOG", str(ROOT / "models.toml"))
    msg = _one_line_error(align.check_command, str(fx["a"]), str(tmp_path / "gone.gguf"), None, False)
    assert "does not exist" in msg


# -- real models (skipped when a file is absent; only the SmolLM2 files are in CI) -------------------------
def _real(target: Path, draft: Path) -> dict:
    for p in (target, draft):
        if not p.exists():
            pytest.skip(f"{p.name} not present")
    return align.check_pair(target, draft)


def test_qwen_pair_aligned():
    r = _real(QWEN_15, QWEN_05)
    # the two Qwen2.5-Coder GGUFs share the tokenizer; their chat templates differ by a couple of characters
    assert r["verdict"] in (align.ALIGNED, align.ALIGNED_WITH_WARNINGS), r["reasons"]
    assert r["reasons"] == []
    assert all("chat template" in w for w in r["warnings"])
    assert r["vocab_size"]["shared"] == 151936 and r["tokens"]["differ"] == 0


@pytest.mark.parametrize("target,draft", [(QWEN_15, SMOL), (QWEN_15, GEMMA), (SMOL, GEMMA)],
                         ids=["qwen-smollm2", "qwen-gemma3", "smollm2-gemma3"])
def test_different_families_misaligned(target, draft):
    r = _real(target, draft)
    assert r["verdict"] == align.MISALIGNED
    assert _has(r, "pre-tokenizer differs")
    assert _has(r, "shared token ids differ")
    assert _has(r, "vocabulary sizes differ", "not padding")
    assert _has(r, "round trip")
    assert all("\n" not in x for x in r["reasons"])
    assert len(r["tokens"]["first"]) == 5
    text = align.format_report(r)
    assert "verdict: MISALIGNED" in text and "first differing shared ids" in text


@pytest.mark.parametrize("draft", [SMOL, SMOL_Q2], ids=["itself", "q2_k"])
def test_smollm2_aligned(draft):
    r = _real(SMOL, draft)
    assert r["verdict"] == align.ALIGNED, r["reasons"] + r["warnings"]
    assert r["round_trip"]["mismatched"] == 0


# -- `harness check` from the command line, and a misaligned pair refused before loading
def test_check_cli_verdicts(smol, smol_q2k):
    r = harness("check", T, D)
    assert r.returncode == 0 and "ALIGNED" in r.stdout
    r = harness("check", T, D, "--json")
    assert json.loads(r.stdout)["verdict"] == "ALIGNED"


def test_misaligned_pair_is_refused_before_loading(smol, tiny_set, tmp_path):
    """Runs everywhere (the Gemma case above needs the Gemma file): a generated GGUF with its own tokenizer."""
    r = harness("run", T, "--draft", str(tiny_set["a"]), "--prompt", "hi")
    one_line_error(r, "not aligned")
    assert r.returncode == 2
    r = harness("bench", "--target", T, "--draft", str(tiny_set["a"]), "--categories", "code",
                "--per-category", "1", "--out", str(tmp_path / "runs"))
    one_line_error(r, "not aligned")
    assert r.returncode == 2 and not (tmp_path / "runs").exists()
