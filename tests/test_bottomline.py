"""The bottom line (report.bottomline) on synthetic answer records: a lower precision run plainly against a higher
one's speculation, engines that disagree, too few prompts for an interval, a category that differs, and the reach
of "more prompts would settle it"."""
from __future__ import annotations

import polars as pl

from harness.analysis.verdict import BUSY, INCONCLUSIVE, NO_GAIN, SPECULATE
from harness.report import bottomline as bl

Q4, F16 = "model-q4_k_m", "model-f16"
MODELS = {Q4: {"quant": "Q4_K_M", "bytes": 1 << 30, "note": ""},
          F16: {"quant": "F16", "bytes": 3 << 30, "note": f"requantized from {Q4} (never better than its source)"}}


def _answer(target: str, verdict: str, speedup: float, plain: float, **kw) -> dict:
    a = {"target": target, "ngl": 0, "threads": 0, "setup": "", "category": "all", "policy": "greedy",
         "verdict": verdict, "speedup": speedup, "lo": speedup * 0.9, "hi": speedup * 1.1, "at_most": speedup * 1.1,
         "further": None, "min_gain": 0.05, "why": "", "prompts": 30, "accepted_len": 1.5,
         "configuration": "draft γ 3" if verdict == SPECULATE else "ngram:3 γ 1", "plain_tokens_per_s": plain,
         "server": "llama-server -m models/x.gguf --spec-type draft-simple" if verdict == SPECULATE else None,
         "instance": None}
    return a | {k: None for k in ("server_speedup", "server_lo", "server_hi", "server_prompts", "server_ratios",
                                  "server_plain_tps", "server_binary", "server_tool")} | kw


def test_a_lower_precision_run_plainly_beats_a_higher_one_speculating():
    q4 = _answer(Q4, NO_GAIN, 0.99, 30.0)
    f16 = _answer(F16, SPECULATE, 1.5, 10.0)
    lines = bl.section([q4, f16], [], MODELS, lambda b: [])
    text = "\n".join(lines)
    assert "**don't speculate**: plain 30.0 tok/s" in text
    assert "**speculate** with draft γ 3: 10.0 → 15.0 tok/s" in text
    assert "**Slower than Q4_K_M run plainly** (30.0 tok/s against 15.0), its source, of the same quality" in text
    table = "\n".join(bl.quantization([q4, f16], MODELS, None))
    assert "Fastest here: Q4_K_M run plainly, 30.0 tok/s." in table
    # said once, in the bottom line, not again under the table
    assert "derived from" not in table
    # no rival is faster than a plain Q4_K_M: no such line under it
    assert bl.faster(q4, [q4, f16], MODELS) is None


def test_engines_that_disagree_follow_the_command_s_engine():
    """The harness's loop says speculate; llama-server, over 6 prompts, reads inconclusive: the line follows
    llama-server, with the harness's figure beside it, labelled, and says they differ."""
    a = _answer(F16, SPECULATE, 1.9, 10.0, server_speedup=1.03, server_lo=0.9, server_hi=1.18, server_prompts=6,
                server_plain_tps=13.0, server_ratios=[1.0] * 6)
    e = bl.engine_figure(a)
    assert (e["engine"], e["verdict"], e["plain"]) == ("llama-server", INCONCLUSIVE, 13.0)
    line = bl.sentence(a)
    assert line.startswith("**inconclusive**: plain 13.0 tok/s") and "in llama-server" in line
    assert "The harness's own loop: 1.90x [1.71, 2.09]" in line and "it said speculate" in line
    assert bl.commands(a) == []  # an inconclusive line prints no command


def test_llama_servers_interval_settles_what_the_harness_left_inconclusive_but_not_what_it_withheld():
    """The harness's loop cannot tell (1.02x [0.98, 1.07]); llama-server, over 6 prompts, reads speculate: the line
    speculates, in llama-server, with the command; a verdict withheld over a busy machine stays withheld."""
    a = _answer(Q4, INCONCLUSIVE, 1.02, 18.8, lo=0.98, hi=1.07, server_speedup=1.15, server_lo=1.06,
                server_hi=1.24, server_prompts=6, server_plain_tps=18.3, server_ratios=[1.15] * 6,
                server="llama-server -m models/q4.gguf --spec-type ngram-simple")
    assert bl.engine_figure(a)["verdict"] == SPECULATE
    line = bl.sentence(a)
    assert line.startswith("**speculate** with ngram:3 γ 1: 18.3 → 21.0 tok/s in llama-server over 6 prompts, "
                           "1.15x [1.06, 1.24]")
    assert "it said inconclusive: llama-server's figure decides" in line
    assert "llama-server -m models/q4.gguf --spec-type ngram-simple" in bl.commands(a)
    busy = a | {"verdict": BUSY}
    assert bl.engine_figure(busy)["verdict"] == BUSY and bl.commands(busy) == []


def test_fewer_than_three_server_prompts_give_per_prompt_figures_not_an_interval():
    a = _answer(F16, SPECULATE, 1.5, 10.0, server_speedup=1.4, server_lo=0.05, server_hi=44.19, server_prompts=2,
                server_ratios=[1.87, 0.99])
    assert bl.engine_figure(a)["engine"] == "harness"
    line = bl.sentence(a)
    assert "in llama-server 2 prompts: 1.87x, 0.99x, too few for an interval" in line
    assert "44.19" not in line and "0.05" not in line


def test_a_category_that_differs_gets_a_line_and_inconclusive_ones_share_one():
    bottom = _answer(Q4, NO_GAIN, 0.99, 30.0)
    rows = [bottom | {"category": "code", "verdict": SPECULATE, "speedup": 1.3, "lo": 1.1, "hi": 1.5,
                      "prompts": 10, "configuration": "ngram:3 γ 2"},
            bottom | {"category": "creative", "verdict": NO_GAIN},
            bottom | {"category": "domain", "verdict": INCONCLUSIVE},
            bottom | {"category": "grounded", "verdict": INCONCLUSIVE}]
    lines = bl.section([bottom], rows, MODELS, lambda b: [])
    assert "  - code, greedy alone: speculate (ngram:3 γ 2, 1.30x [1.10, 1.50], 10 prompts)." in lines
    assert "  - Too close to call on their own prompts: domain, grounded (greedy)." in lines
    assert not any("creative" in x for x in lines)  # its answer is the bottom line's


def test_more_prompts_are_offered_only_within_reach():
    assert bl.further(_answer(Q4, INCONCLUSIVE, 1.02, 30.0, further=40, prompts=10)) == \
        "about 40 more prompts would settle it"
    far = bl.further(_answer(Q4, INCONCLUSIVE, 1.02, 30.0, further=1336, prompts=10))
    assert "1336" not in far and "too small" in far


def test_a_speculate_line_gives_the_acceptance_length_both_ways_and_the_commands():
    a = _answer(F16, SPECULATE, 1.5, 10.0, server_binary="/opt/llama/bin/llama-server",
                server_tool="llama-server 0.5.0-dev (build 1, commit 0c1e570)")
    assert "1.50 drafts accepted a step (2.50 tokens a step as llama.cpp and vLLM count it)" in bl.sentence(a)
    out = bl.commands(a)
    assert a["server"] in out and any("`/opt/llama/bin/llama-server`" in x and "commit 0c1e570" in x for x in out)


def test_plain_pace_is_tokens_over_time_across_categories():
    sweep = pl.DataFrame({"target": [Q4] * 3, "ngl": [0] * 3, "threads": [0] * 3, "setup": [""] * 3,
                          "policy": ["greedy"] * 3, "draft": ["none", "none", "d"], "tokens": [100, 300, 999],
                          "gen_ms": [10_000.0, 10_000.0, 1.0]})
    assert bl.plain_pace(sweep, _answer(Q4, NO_GAIN, 1.0, 0.0)) == 20.0


def test_evidence_warns_of_short_outputs_and_a_single_policy():
    plan = {"params": {"max_tokens": 16}, "models": MODELS, "took_s": {"total": 1200.0},
            "budget": {"cuts": [{"param": "max_tokens", "before": 32, "after": 16}]}}
    bottom = [_answer(Q4, NO_GAIN, 1.0, 30.0), _answer(Q4, NO_GAIN, 1.0, 28.0, policy="T=0.7 top_p=0.9"),
              _answer(F16, SPECULATE, 1.3, 10.0)]
    text = "\n".join(bl.evidence(plan, None, bottom))
    assert "16-token outputs (cut from 32 by the budget)" in text
    assert "**short outputs** (16 < 128 tokens)" in text and "**one policy** for F16" in text
    long = "\n".join(bl.evidence(plan | {"params": {"max_tokens": 128}, "budget": {}}, None, bottom[:2]))
    assert "Mind" not in long and "prompts cut" not in long
    cut = {"params": {"max_tokens": 128, "prompt_chars": 2048}, "budget": {"cuts": [{"param": "prompt_chars"}]}}
    assert "128-token outputs, prompts cut in the middle to 2048 characters by the budget;" in \
        "\n".join(bl.evidence(plan | cut, None, bottom[:2]))


def test_a_timed_bottom_line_says_so_and_a_server_engine_run_is_llama_servers_own():
    timed = _answer(F16, SPECULATE, 1.5, 10.0, source="timed on 5 prompt(s)", prompts=5)
    assert "(the harness's own loop, timed on 5 prompts; not run in llama-server)" in bl.sentence(timed)
    server = timed | {"engine": "server"}
    e = bl.engine_figure(server)
    assert e["engine"] == "llama-server" and e.get("own")
    line = bl.sentence(server)
    assert "10.0 → 15.0 tok/s in llama-server" in line and "(timed on 5 prompts)" in line
    assert "harness's own loop" not in line
    assert "(server)" in "\n".join(bl.quantization([server, _answer(Q4, NO_GAIN, 1.0, 30.0)], MODELS, None))


def test_evidence_states_the_plain_references_beside_the_baseline():
    """The baseline's pace, the paired twins' and llama-server's plain, and which of them a speedup is against."""
    plan = {"params": {"max_tokens": 128}, "models": MODELS}
    timed = _answer(F16, SPECULATE, 1.7, 9.0, source="timed on 5 prompt(s)", twin_tokens_per_s=9.5,
                    server_plain_tps=9.1)
    predicted = _answer(Q4, NO_GAIN, 1.0, 30.0, source="predicted from every prompt", twin_tokens_per_s=31.0)
    text = " ".join(bl.evidence(plan, None, [timed, predicted]))
    assert "F16 greedy: baseline 9.0, twins 9.5, llama-server 9.1" in text
    assert "Q4_K_M greedy: baseline 30.0, twins 31.0" in text
    assert "Timed speedups are against the paired twins" in text and "Predictions price plain decoding" in text
    alone = " ".join(bl.evidence(plan, None, [_answer(Q4, NO_GAIN, 1.0, 30.0)]))  # one pace: nothing beside it
    assert "Plain references" not in alone
