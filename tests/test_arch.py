"""models/arch.py: the architecture's facts from a GGUF header (dense, MoE with its experts and active parameters,
recurrent or hybrid memory, MTP heads, EAGLE-3 and DFlash heads), on tiny GGUFs the tests write with those keys;
the refusal of a model whose state the harness cannot roll back, before any model loads; the facts in `harness
drafts`, the report header and beside the answer."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.models import arch
from harness.models.header import read_header
from tests.conftest import PROMPT_FILE
from tests.helpers import harness, one_line_error
from tests.tiny_gguf import write_arch_header, write_tiny_model

gguf = pytest.importorskip("gguf")

E, FF, D = 8, 16, 32  # experts, their feed-forward width, the embedding width
DENSE = {"token_embd.weight": (64, D), "blk.0.attn_q.weight": (D, D), "blk.1.attn_q.weight": (D, D),
         "blk.0.ffn_up.weight": (FF, D), "blk.1.ffn_up.weight": (FF, D)}
EXPERTS = {f"blk.{i}.ffn_{k}_exps.weight": (E, FF, D) for i in (0, 1) for k in ("gate", "up", "down")}
MOE = {**DENSE, **EXPERTS, "blk.0.ffn_gate_inp.weight": (E, D), "blk.1.ffn_gate_inp.weight": (E, D)}
N_DENSE, N_MOE = sum(map(np.prod, DENSE.values())), sum(map(np.prod, MOE.values()))
N_EXPERT_LAYER = 3 * E * FF * D  # one layer's routed experts


def write(path: Path, name: str, keys: dict | None = None, tensors: dict | None = None) -> Path:
    return write_arch_header(path, name, keys, tensors or DENSE)


# file stem -> (architecture, keys, tensors)
MODELS = {
    "dense": ("llama", {}, DENSE),
    "moe": ("qwen3moe", {"expert_count": E, "expert_used_count": 2}, MOE),
    "moe_per_layer": ("qwen3moe", {"expert_count": E, "expert_used_count": [0, 4]}, MOE),
    "mtp": ("glm4moe", {"expert_count": E, "expert_used_count": 2, "nextn_predict_layers": 1}, MOE),
    "hybrid": ("qwen3next", {"expert_count": E, "expert_used_count": 2}, MOE),
    "hybrid_rs": ("lfm2", {}, DENSE),
    "recurrent": ("mamba", {}, DENSE),
    "eagle3": ("eagle3", {}, DENSE),
    "dflash": ("dflash", {}, DENSE),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("arch")
    return {k: write(d / f"{k}.gguf", a, keys, t) for k, (a, keys, t) in MODELS.items()}


def facts(files, k) -> dict:
    return arch.facts(read_header(files[k]))


def test_dense(files):
    f = facts(files, "dense")
    assert f == {"architecture": "llama", "memory": "kv cache", "experts": 0, "experts_used": 0, "params": N_DENSE,
                 "active_params": N_DENSE, "mtp_layers": 0, "head": None}
    assert arch.words(f) == f"dense, {N_DENSE / 1e3:.0f}K parameters in the file"
    assert arch.implications(f) == [] and arch.refusal("m", f) is None


def test_moe_counts_the_routed_experts_a_token_uses(files):
    f = facts(files, "moe")
    active = N_MOE - 2 * N_EXPERT_LAYER * (E - 2) // E  # two layers, 2 of 8 experts each
    assert (f["experts"], f["experts_used"], f["params"], f["active_params"]) == (E, 2, N_MOE, active)
    assert arch.words(f).startswith(f"MoE: 8 experts, 2 used per token, {active / 1e3:.0f}K of {N_MOE / 1e3:.0f}K")
    assert "more experts" in arch.implications(f)[0] and arch.refusal("m", f) is None


def test_moe_experts_used_per_layer_as_an_array(files):
    f = facts(files, "moe_per_layer")
    assert read_header(files["moe_per_layer"]).arrays["qwen3moe.expert_used_count"] == [0, 4]
    # layer 0 uses none of its experts, layer 1 half of them
    assert (f["experts_used"], f["active_params"]) == (4, N_MOE - N_EXPERT_LAYER - N_EXPERT_LAYER // 2)


def test_long_arrays_are_not_kept(files):
    h = read_header(files["dense"])
    assert "tokenizer.ggml.token_type" not in h.arrays and h.kv["tokenizer.ggml.token_type"] == len(h.tokens)


def test_mtp_heads(files):
    f = facts(files, "mtp")
    assert f["mtp_layers"] == 1 and arch.words(f).endswith("; MTP heads (1 layer)")
    assert any("--spec-type draft-mtp" in x for x in arch.implications(f))


@pytest.mark.parametrize("k, words", [
    ("hybrid", ["a hybrid (recurrent and attention) architecture 'qwen3next'"]),
    ("hybrid_rs", ["'lfm2'", "n_rs_seq, which the harness does not set"]),
    ("recurrent", ["a recurrent architecture 'mamba'"]),
])
def test_recurrent_and_hybrid_state_is_refused_with_llama_cpps_reason(files, k, words):
    f = facts(files, k)
    why = arch.refusal("m.gguf", f)
    for w in ["m.gguf: ", *words, "cannot be rolled back", "llama_memory_seq_rm on a partial range",
              "llama-server speculates on it with state checkpoints"]:
        assert w in why
    assert "\n" not in why
    assert f["memory"] in arch.words(f)
    assert ("MoE: 8 experts" in arch.words(f)) == (k == "hybrid")  # a hybrid MoE says both


@pytest.mark.parametrize("k, head, spec", [("eagle3", "EAGLE-3", "draft-eagle3"), ("dflash", "DFlash", "draft-dflash")])
def test_eagle3_and_dflash_heads(files, k, head, spec):
    f = facts(files, k)
    assert f["head"] == head and arch.words(f).startswith(f"an {head} head")
    assert f"--spec-type {spec}" in arch.refusal("m", f)


LLAMA_ARCH = Path("/root/.cache/harness/native/src/llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-arch.cpp")


@pytest.mark.skipif(not LLAMA_ARCH.is_file(), reason="llama.cpp's source is not at hand")
def test_the_sets_are_llama_cpps():
    src = LLAMA_ARCH.read_text()
    names = dict(re.findall(r"\{ (LLM_ARCH_\w+),\s+\"([^\"]+)\"", src))

    def cases(fn: str) -> set[str]:
        body = src[src.index(f"bool {fn}(const llm_arch & arch)"):]
        body = body[:body.index("default:")]
        return {names[c] for c in re.findall(r"case (LLM_ARCH_\w+):", body)}
    assert cases("llm_arch_is_recurrent") == arch.RECURRENT
    assert cases("llm_arch_is_hybrid") == arch.HYBRID
    assert cases("llm_arch_supports_rs_rollback") == arch.RS_ROLLBACK
    assert {names["LLM_ARCH_EAGLE3"], names["LLM_ARCH_DFLASH"]} == set(arch.HEADS)


# -- the refusal, before any model loads ------------------------------------------------------------------------
@pytest.mark.parametrize("role, k, words", [
    ("target", "hybrid", ["hybrid.gguf", "'qwen3next'", "cannot be rolled back"]),
    ("draft", "recurrent", ["recurrent.gguf", "a recurrent architecture 'mamba'"]),
    ("draft", "eagle3", ["eagle3.gguf", "an EAGLE-3 head", "draft-eagle3"]),
])
def test_bench_refuses_in_one_line_before_any_model_loads(files, tmp_path, role, k, words):
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    target, draft = (files[k], "ngram:3") if role == "target" else (tiny, files[k])
    r = harness("bench", "--target", target, "--draft", draft, "--prompts", PROMPT_FILE, "--per-category", "1",
                "--out", tmp_path / "reports")
    one_line_error(r, *words)
    assert r.returncode == 1 and not (tmp_path / "reports").exists()


def test_run_refuses_a_hybrid_target_with_a_draft_in_one_line_before_it_loads(files):
    """harness run goes through pair.open_pair, which refuses what the loop cannot roll back; plain decoding rolls
    nothing back, so only a run with a draft is refused."""
    one_line_error(harness("run", files["hybrid"], "--draft", "ngram:3", "--prompt", "hi"), "qwen3next",
                   "cannot be rolled back")


# -- where the facts are shown ----------------------------------------------------------------------------------
def test_drafts_shows_the_targets_architecture(files, tmp_path):
    (tmp_path / "none").mkdir()
    out = harness("drafts", files["mtp"], tmp_path / "none").stdout
    assert "Architecture: MoE: 8 experts, 2 used per token" in out and "draft-mtp" in out
    out = harness("drafts", files["hybrid"], tmp_path / "none").stdout
    assert "harness bench refuses it: a hybrid (recurrent and attention) architecture 'qwen3next'" in out
    j = harness("drafts", files["moe"], tmp_path / "none", "--json").stdout
    assert '"experts": 8' in j


def test_the_plan_records_the_facts_and_the_report_shows_them(files):
    from harness.bench.prepare import models_info
    from harness.report import answer, render
    name = str(files["mtp"])
    models = models_info({name, "ngram:3"})
    assert models[name]["arch"] == facts(files, "mtp") and "arch" not in models["ngram:3"]
    plan = {"system": {}, "params": {"target": [name], "draft": ["ngram:3"], "gamma": [4]}, "models": models}
    words = arch.words(models[name]["arch"])
    assert f"Target {name} ({words}); drafts ngram:3" in render._summary(plan)
    assert words in "\n".join(render._machine(plan, Path(".")))
    row = {"target": name, "ngl": 0, "threads": 2, "setup": "", "category": "code", "policy": "greedy",
           "verdict": "no gain", "speedup": 1.0, "at_most": 1.02, "min_gain": 0.05, "configuration": "ngram:3 γ 4"}
    lines = answer.section([row], models)
    said = next(x for x in lines if x.startswith(f"The target {name}: {words}."))  # one paragraph
    assert "more experts" in said and "draft-mtp" in said
    assert not any(x.startswith("The target") for x in answer.section([row], {}))  # a plan from before: nothing


def test_bench_picks_no_draft_the_loop_cannot_run(files, tmp_path, monkeypatch):
    """`bench --target PATH` without --draft (bench/autodraft.py) passes over a recurrent or hybrid candidate, or a
    head, however it ranks: the refusal above would stop the run it planned."""
    from harness.bench import autodraft

    def cand(k: str, rank: int) -> dict:
        return {"path": str(files[k]), "ref": str(files[k]), "rank": rank, "size_ratio": 0.1, "plausibly_faster": True,
                "llama_cpp": {"ok": True, "clause": None}, "harness": {"ok": True, "verdict": "ALIGNED"},
                "arch": facts(files, k)}
    found = [cand("hybrid", 1), cand("eagle3", 2), cand("recurrent", 3), cand("dense", 4)]
    monkeypatch.setattr(autodraft, "survey", lambda *a, **k: {"candidates": found})
    target = write_tiny_model(tmp_path / "t.gguf")
    drafts, _ = autodraft.pick([str(target)], roots=[])
    assert drafts[0] == str(files["dense"]) and str(files["hybrid"]) not in drafts


@pytest.mark.parametrize("kind, target, head, said", [
    ("draft-mtp", "mtp", None, None),  # the target's own MTP layers
    ("draft-mtp", "dense", "mtp", None),  # a sidecar carrying them
    ("draft-eagle3", "dense", "eagle3", None),
    ("draft-dflash", "dense", "dflash", None),
    ("draft-mtp", "dense", None, "(the target) carries no MTP layers (llama.nextn_predict_layers)"),
    ("draft-mtp", "dense", "dense", "(the head given) carries no MTP layers"),
    ("draft-eagle3", "dense", "dflash", "is a 'dflash' model, not the 'eagle3' head"),
    ("draft-dflash", "dense", "dense", "is a 'llama' model, not the 'dflash' head"),
    ("draft-eagle3", "dense", "missing", "no such file"),
    ("draft-eagle3", "dense", "folder", "not a file (a folder, FIFO or device)"),  # issue 57, case 46
])
def test_a_llama_server_head_is_read_from_its_file(files, tmp_path, kind, target, head, said):
    (tmp_path / "folder.gguf").mkdir(exist_ok=True)
    path = None if head is None else files.get(head, tmp_path / f"{head}.gguf")
    if said is None:
        arch.require_head(kind, files[target], path)
        return
    with pytest.raises(HarnessError) as e:
        arch.require_head(kind, files[target], path)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
