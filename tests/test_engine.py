"""The context knobs llama.cpp users turn: KV-cache types for target and draft, flash attention, ubatch; the
memory llama.cpp allocates, per buffer and device; several targets in one sweep (the quantization ladder). Pure
checks first, then SmolLM2 end to end."""
import json
from dataclasses import replace

import pytest

from harness.engine import EngineConfig, _flash_attn_used, cache_bytes
from harness.errors import HarnessError
from harness.llamacpp import captured_log, memory_breakdown, on_host
from harness.plan import Instance, Params, check, expand
from harness.sampling import Policy
from harness.specs import DraftModel, NGram
from tests.conftest import PROMPT_FILE
from tests.helpers import harness, md_table, one_line_error

T, D = "smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q2_k"
GREEDY = Policy()

LOG = """load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
load_tensors:        CUDA0 model buffer size =  1000.50 MiB
llama_context:  CUDA_Host  output buffer size =     0.58 MiB
llama_kv_cache:      CUDA0 KV buffer size =    45.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =     3.00 MiB
sched_reserve:      CUDA0 compute buffer size =   300.00 MiB
sched_reserve:  CUDA_Host compute buffer size =    10.00 MiB
sched_reserve:      CUDA0 compute buffer size =   302.75 MiB
"""


def test_memory_breakdown_reads_llamacpp_buffer_lines():
    got = {(b["buffer"], b["kind"]): b["bytes"] for b in memory_breakdown(LOG)}
    assert got == {("CPU_Mapped", "model"): round(92.10 * 2**20), ("CUDA0", "model"): round(1000.5 * 2**20),
                   ("CUDA_Host", "output"): round(0.58 * 2**20), ("CUDA0", "kv"): 48 * 2**20,  # two caches: summed
                   ("CUDA0", "compute"): round(302.75 * 2**20),  # reserved again: the last size stands
                   ("CUDA_Host", "compute"): 10 * 2**20}
    assert [on_host(b) for b in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "CUDA0", "Vulkan0", "Metal")] == \
        [True, True, True, True, False, False, False]


def test_what_flash_attention_resolved_to_is_read_from_the_log():
    assert _flash_attn_used("resolve_fused_ops: Flash Attention enabled\n", "auto") is True
    assert _flash_attn_used("resolve_fused_ops: Flash Attention disabled\n", "auto") is False  # "on" is refused
    assert _flash_attn_used("llama_context: flash_attn            = enabled\n", "auto") is True
    assert _flash_attn_used("", "auto") is None and _flash_attn_used("", "off") is False


def test_a_nested_log_capture_keeps_its_lines_to_itself():
    import harness.llamacpp as lib
    with captured_log() as outer:
        lib._capture.append("a")
        with captured_log() as inner:  # the flash-attention probe's context: its buffers are not the engine's
            lib._capture.append("b")
        lib._capture.append("c")
    assert outer == ["a", "c"] and inner == ["b"] and lib._capture is None


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


def test_cache_types_flash_attention_and_ubatch_are_swept_and_labelled():
    p = Params(target=[T], draft=[D, "ngram:2"], gamma=[2], cache_type_k_draft=["f16", "q8_0"],
               cache_type_v_draft=["f16", "q8_0"], ubatch=[512, 64])
    inst = expand(p)
    base = [i for i in inst if i.baseline]
    assert sorted(i.ubatch for i in base) == [64, 512]
    model = [i for i in inst if i.draft == DraftModel(D)]
    assert len(model) == 2 * 4  # ubatch x (K, V) of the draft
    assert {i.cache_k_draft for i in inst if i.draft == NGram(2)} == {"f16"}  # a lookup has no cache
    q = next(i for i in model if (i.cache_k_draft, i.cache_v_draft, i.ubatch) == ("q8_0", "q8_0", 64))
    assert q.draft_label == f"{D} (KV q8_0/q8_0)" and q.setup == "ubatch 64"
    assert q.plain().setup == "ubatch 64" and q.plain().id in {i.id for i in base}
    d = q.draft_engine_config(2048)
    assert (d.cache_k, d.cache_v, d.n_ubatch, d.flash_attn) == ("q8_0", "q8_0", 64, "auto")
    one = Instance(T, DraftModel(D), 2, GREEDY, 0, 0, 2)
    assert one.setup == ""
    # a run from before these fields keeps its ids
    assert one.id == replace(one, cache_k="f16", ubatch=512).id
    assert replace(one, cache_k="q8_0").id != one.id


@pytest.mark.parametrize("params, words", [
    (dict(cache_type_k=["q8_0"], calibrate=True), ("calibrations", "without --calibrate")),
    (dict(flash_attn=["off"], gamma=["auto:4"]), ("auto gamma", "fixed gammas")),
    (dict(cache_type_v_draft=["f16", "q8_0"], replay=True), ("replay", "--cache-type-k-draft/-v-draft")),
    (dict(ngl_draft=[0, 99], replay=True), ("replay", "--ngl-draft")),
    (dict(ubatch=[0]), ("--ubatch", ">= 1")),
])
def test_plan_refuses_knobs_it_cannot_measure_honestly(params, words):
    with pytest.raises(HarnessError) as e:
        check(Params(target=[T], **params))
    assert all(w in str(e.value) for w in words)


def test_quantized_v_without_flash_attention_is_refused_before_anything_runs(tmp_path):
    r = harness("bench", "--target", T, "--draft", D, "--cache-type-v-draft", "q4_0", "--flash-attn", "off",
                "--categories", "code", "--per-category", "1", "--out", str(tmp_path))
    one_line_error(r, "quantized V cache", "flash attention")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    one_line_error(harness("bench", "--target", T, "--cache-type-k", "q3_k", "--out", str(tmp_path)),
                   "unknown K cache type")
    one_line_error(harness("run", T, "--prompt", "hi", "--flash-attn", "sometimes"), "--flash-attn")


@pytest.fixture(scope="module")
def knobs_run(tmp_path_factory, smol, smol_q2k):
    out = tmp_path_factory.mktemp("knobs")
    r = harness("bench", "--target", T, "--draft", D, "--gamma", "2", "--cache-type-k-draft", "f16,q4_0",
                "--cache-type-v-draft", "f16,q4_0", "--flash-attn", "on", "--ubatch", "512,32", "--prompts",
                str(PROMPT_FILE), "--categories", "code", "--per-category", "1", "--max-tokens", "12", "--paired",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (out / "runs").iterdir() if not d.is_symlink())
    return run, (out / f"{run.name}.md").read_text()


@pytest.mark.slow  # the knobs' sweep of its own, 10 configurations paired: 40-45 s of setup
def test_memory_is_broken_down_per_buffer_and_follows_the_knobs(knobs_run):
    run, md = knobs_run
    res = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    by = {(r["ubatch"], r["draft"], r.get("cache_k_draft"), r.get("cache_v_draft")): r for r in res}
    assert all(r["flash_attn"] == ({"target": True} | ({"draft": True} if r["draft"] != "none" else {}))
               for r in res)

    def total(r, kind, model=None):
        return sum(b["bytes"] for b in r["memory"] if b["kind"] == kind and model in (None, b["model"]))
    f16, q4 = by[(512, D, "f16", "f16")], by[(512, D, "q4_0", "q4_0")]
    # llama.cpp's own KV figure (2 decimals of MiB) against the one computed from the types
    for r in (f16, q4):
        assert abs(total(r, "kv") - r["kv_bytes"]) < 2 * 2**20 * 0.01
    assert total(q4, "kv", "draft") == pytest.approx(total(f16, "kv", "draft") * 18 / 64, rel=0.01)
    assert total(q4, "kv", "target") == total(f16, "kv", "target")
    small = by[(32, D, "f16", "f16")]  # a smaller ubatch shrinks the compute buffer (ubatch x vocabulary logits)
    assert total(small, "compute") < total(f16, "compute") / 4
    table = md_table(md, "## Memory")
    assert {row["draft"] for row in table} == {"none", D} | {f"{D} (KV {kv})" for kv in ("q4_0/q4_0", "q4_0/f16",
                                                                                         "f16/q4_0")}
    assert {row["ubatch"] for row in table} == {"512", "32"}
    for row in table:
        rss, own = (int(row[k].split()[0]) for k in ("peak RSS", "harness's own"))
        assert 0 < own < rss  # the process before any weights loaded
    assert "Devices: no device" in md


@pytest.mark.slow  # the knobs' sweep of its own, 10 configurations paired: 40-45 s of setup
def test_knobs_name_their_rows_and_pair_with_their_own_plain_twins(knobs_run):
    run, md = knobs_run
    plan = json.loads((run / "plan.json").read_text())
    assert plan["params"]["ubatch"] == [512, 32] and plan["params"]["flash_attn"] == ["on"]
    verdict_rows = md_table(md, "## Verdict per category")
    assert {r["setup"] for r in verdict_rows} == {"FA on", "FA on, ubatch 32"}
    assert f"{D} (KV q4_0/q4_0)" in md
    assert harness("report", str(run), "--check").returncode == 0


@pytest.mark.slow  # two targets' sweep and their fidelity, run for real: 15 s
def test_several_targets_get_a_quantization_table_with_their_fidelity(tmp_path, smol, smol_q2k):
    r = harness("bench", "--target", f"{T},{D}", "--draft", "ngram:2", "--gamma", "2", "--prompts", str(PROMPT_FILE),
                "--per-category", "1", "--max-tokens", "12", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.is_symlink())
    fid = {x["model"]: x for x in json.loads((run / "fidelity.json").read_text())}
    assert fid[T]["alpha_vs_reference"] == 1.0 and 0 < fid[D]["alpha_vs_reference"] < 1
    md = (tmp_path / f"{run.name}.md").read_text()
    targets = {row["target"]: row for row in md_table(md, "## Quantization")}
    assert set(targets) == {T, D}
    assert targets[D]["alpha"] == f"{fid[D]['alpha_vs_reference']:.4f}"
    assert float(targets[D]["plain tok/s"]) > 0 and targets[D]["peak RSS"].endswith("MiB")
    assert {row["target"] for row in md_table(md, "## Verdict per category")} == {T, D}
