"""Quantization fidelity (harness/fidelity.py): the comparison maths, tokenizer refusal before any weights
load, worker crashes, the full path on tiny generated GGUFs, the real SmolLM2 Q4_1 / Q2_K pair
(skipped when absent), and `harness fidelity` from the command line."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

from harness import fidelity as F
from harness.errors import HarnessError
from harness.prompts import Prompt
from harness.sampling import Policy, process
from harness.verify import overlap
from tests.tiny_gguf import write_tiny_model
from tests.helpers import harness
from tests.conftest import D, T

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[1]
SMOL = ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf"
SMOL_Q2 = ROOT / "models" / "smollm2-135m-instruct-q2_k.gguf"
KEYS = {"model", "quant", "bytes", "tokens_per_s", "peak_rss_bytes", "alpha_vs_reference", "top1_agreement",
        "positions", "requantized", "note"}

PROMPTS = [
    Prompt("fid-1", "test", messages=(("user", "Write a Python function that reverses a string."),),
           max_tokens=16, chat=True),
    Prompt("fid-2", "test", messages=(("user", "Name three colours of the rainbow."),), max_tokens=16, chat=True),
]
TINY_PROMPTS = [
    Prompt("tiny-1", "test", messages=(("user", "the cat sat on the mat"),), max_tokens=16, chat=True),
    Prompt("tiny-2", "test", messages=(("user", "hello world, the dog is big"),), max_tokens=16, chat=True),
]


# -- the comparison maths -----------------------------------------------------------------------------------
def test_compare_logits_matches_sampling_and_overlap():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 300)).astype(np.float32) * 3
    b = (a + rng.normal(size=a.shape).astype(np.float32)).astype(np.float32)
    alpha, top1 = F.compare_logits(a, b)
    t1 = Policy(temperature=1.0)
    want = [overlap(process(x, t1), process(y, t1)) for x, y in zip(a, b)]
    np.testing.assert_allclose(alpha, want, rtol=1e-7)  # process() subtracts the max in float32
    assert list(top1) == [int(x.argmax()) == int(y.argmax()) for x, y in zip(a, b)]
    same_alpha, same_top1 = F.compare_logits(a, a)
    np.testing.assert_allclose(same_alpha, 1.0, atol=1e-12)
    assert same_top1.all()


def test_compare_logits_padding_ids_count_as_zero():
    a = np.log(np.array([[0.5, 0.5]], dtype=np.float32))
    b = np.log(np.array([[0.25, 0.25, 0.5]], dtype=np.float32))  # the extra id holds half the mass
    alpha, _ = F.compare_logits(a, b)
    assert alpha[0] == pytest.approx(0.5)


# -- refusal and failure ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fx(tiny_set) -> dict[str, Path]:
    """The tiny GGUF fixture set (tests/conftest.py): 'a', 'b' (same tokenizer, other weights), variants."""
    return tiny_set


def test_tokenizer_mismatch_refused_before_weights_load(fx, monkeypatch):
    def no_weights(*_a, **_k):
        raise AssertionError("weights were loaded before the tokenizer check")

    monkeypatch.setattr(F, "_spawn", no_weights)
    monkeypatch.setattr("harness.engine.Engine.__init__", no_weights)
    with pytest.raises(HarnessError) as e:
        F.fidelity(str(fx["a"]), [str(fx["b"]), str(fx["other_tokenizer"])], TINY_PROMPTS, max_tokens=4)
    assert e.value.exit_code == 2
    assert "not aligned" in str(e.value) and "\n" not in str(e.value)


def _crash(job, result_path):
    os.abort()


def test_crashed_worker_becomes_an_error(tmp_path):
    res = F._spawn(_crash, {}, tmp_path / "r.json")
    assert res["status"] == "error" and "signal" in res["error"]


def test_missing_model_is_a_one_line_error(fx, tmp_path):
    with pytest.raises(HarnessError) as e:
        F.fidelity(str(fx["a"]), [str(tmp_path / "nope.gguf")], TINY_PROMPTS)
    assert "does not exist" in str(e.value)


# -- tiny generated models: the whole path, quickly ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_rows(fx):
    # tiny-b, then the reference against itself: what the reference row states by definition, computed
    return F.fidelity(str(fx["a"]), [str(fx["b"]), str(fx["a"])], TINY_PROMPTS, max_tokens=8, threads=1)


def test_tiny_rows(tiny_rows, fx):
    ref, other, same = tiny_rows
    assert KEYS <= set(ref) and KEYS <= set(other)
    assert ref["model"] == "tiny-a" and other["model"] == "tiny-b"
    assert same["alpha_vs_reference"] == pytest.approx(1.0, abs=1e-6) and same["top1_agreement"] == 1.0
    assert ref["positions"] == other["positions"] == same["positions"] > 0
    assert 0 < other["alpha_vs_reference"] < 1  # other random weights, same tokenizer
    assert 0 <= other["top1_agreement"] <= 1
    for r in tiny_rows:
        assert r["error"] is None
        assert r["bytes"] == Path(fx["b"] if r is other else fx["a"]).stat().st_size
        assert r["peak_rss_bytes"] > 10 * 2**20 and r["tokens_per_s"] > 0
        assert r["requantized"] is False
    assert json.loads(json.dumps(tiny_rows)) == tiny_rows


def test_format_table(tiny_rows):
    text = F.format_table(tiny_rows)
    caption, blank, header, rule, *body = text.splitlines()
    assert "teacher-forced" in caption and "greedy" in caption
    assert "requantized file can never be better than its source" in caption
    assert blank == "" and header.startswith("| model") and rule.startswith("|--")
    assert len(body) == 3 and "tiny-a" in body[0] and "tiny-b" in body[1]


def test_fidelity_command(fx, tmp_path, monkeypatch):
    d = tmp_path / "prompts"
    d.mkdir()
    lines = [{"id": f"c-{i}", "category": "code", "messages": [{"role": "user", "content": f"the cat {i}"}]}
             for i in range(3)]
    (d / "code.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    monkeypatch.setenv("HARNESS_PROMPTS_DIR", str(d))
    monkeypatch.setenv("HARNESS_CATALOG", str(tmp_path / "no-catalog.toml"))
    c = write_tiny_model(tmp_path / "tiny-c.gguf", seed=2)
    text = F.fidelity_command(str(fx["a"]), str(c), "code", 1, 4, 1)
    assert "| tiny-a" in text and "| tiny-c" in text
    with pytest.raises(HarnessError, match="at least one model"):
        F.fidelity_command(str(fx["a"]), [], None, 1, 4, 1)


# -- the real SmolLM2 pair ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol_rows():
    for p in (SMOL, SMOL_Q2):
        if not p.exists():
            pytest.skip(f"{p.name} not present")
    # Q2_K, then the reference against itself (the teacher-forcing path must be self-consistent)
    return F.fidelity(str(SMOL), [str(SMOL_Q2), str(SMOL)], PROMPTS, max_tokens=16, threads=1)


@pytest.mark.slow
def test_smollm2_reference_row(smol_rows):
    ref = smol_rows[0]
    assert ref["model"] == "smollm2-135m-instruct-q4_1" and ref["quant"] == "Q4_1"
    # the reference row's 1.0 is set by definition; the reference compared against itself must compute it
    same = smol_rows[2]
    assert same["alpha_vs_reference"] == pytest.approx(ref["alpha_vs_reference"], abs=1e-3)
    assert 0 < ref["positions"] <= 2 * 16
    assert ref["bytes"] == SMOL.stat().st_size and ref["requantized"] is False


@pytest.mark.slow
def test_smollm2_q2k_row(smol_rows):
    ref, q2 = smol_rows[0], smol_rows[1]
    assert q2["model"] == "smollm2-135m-instruct-q2_k" and q2["quant"] == "Q2_K"
    assert q2["error"] is None
    assert q2["positions"] == ref["positions"]  # one position per generated reference token
    assert 0 < q2["alpha_vs_reference"] < 1
    assert 0 <= q2["top1_agreement"] <= 1
    assert q2["requantized"] is True  # the sidecar records the derivation even for a path reference
    assert q2["bytes"] < ref["bytes"]


@pytest.mark.slow
def test_smollm2_against_itself(smol_rows):
    same = smol_rows[2]
    assert same["positions"] == smol_rows[0]["positions"]
    assert same["alpha_vs_reference"] > 0.999
    assert same["top1_agreement"] == 1.0
    # the teacher-forced pass reproduces the reference's own greedy choices
    m = re.search(r"teacher-forced argmax = greedy output at (\d+)/(\d+) positions", smol_rows[0]["note"])
    assert m and int(m[2]) == smol_rows[0]["positions"]
    assert int(m[1]) >= 0.9 * int(m[2])  # batched vs one-token decodes may flip a rare near-tie


# -- `harness fidelity` from the command line
@pytest.mark.slow  # a whole run of its own: the fast tier stays under 8 minutes
def test_fidelity_cli(smol, smol_q2k):
    r = harness("fidelity", T, D, "--categories", "code", "--per-category", "1", "--max-tokens", "8",
                "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "top-1" in r.stdout.lower() or "top1" in r.stdout.lower()
    assert D in r.stdout and "requantized" in r.stdout.lower()
