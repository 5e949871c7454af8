"""The answer (report.answer) and the predicted verdicts under it (report.replayed): no verdict rests on a busy
measurement, on a prediction beyond what its own costs allow, or on a prediction its timed run contradicts.
Synthetic replay records with the costs of the trust issue (a 2-row verification 1.90x one decode, a draft decode
0.45x): at gamma 1 nothing can beat 0.85x. The first screen's commands, and an adaptive best run in llama.cpp as
the best fixed gamma."""
from __future__ import annotations

import polars as pl

from harness.analysis.predict import predictions
from harness.instance import Instance
from harness.analysis.verdict import BEYOND, BUSY, INCONCLUSIVE, PLAIN, SPECULATE
from harness.report.answer import answers, sentence
from harness.report.replayed import predicted_verdicts
from harness.report.verdicts import LEVEL_BASELINE, LEVEL_REPLAY, replay_levels
from harness.specs import parse_draft

T1, DRAFT = 10.0, 4.5   # one target decode, one draft decode (ms)
VERIFY = [T1, 19.0, 24.0, 29.0, 34.0]  # a block of k rows: 2 rows at 1.90x one decode
CATS = ("code", "creative")
INSTANCE = {"target": "t", "draft": "none", "gamma": 0, "policy": {"temperature": 0.0}, "ngl": 0, "ngl_draft": 0,
            "threads": 2}
B = Instance.from_dict(INSTANCE).id  # the plain baseline


def _records(prompts: int = 6, n: int = 24) -> list[dict]:
    """A greedy baseline 'b' replayed through draft 'd': each prompt's draft matches 9 positions of 10."""
    recs = [{"type": "costs", "config": B, "policy": "greedy", "proposer": "d", "contexts": [100],
             "target_ms_by_context": [VERIFY], "draft_ms_by_context": [[DRAFT, 2 * DRAFT]], "overhead_ms": 0.0}]
    for cat in CATS:
        for i in range(prompts):
            pid = f"{cat}-{i}"
            recs.append({"type": "replay_prompt", "config": B, "policy": "greedy", "prompt_id": pid,
                         "category": cat, "tokens": list(range(n)), "prompt_tokens": list(range(90)),
                         "stop_token": None, "max_tokens": n})
            match = [(j + i) % 10 != 0 for j in range(n)]
            recs.append({"type": "replay", "config": B, "policy": "greedy", "prompt_id": pid, "proposer": "d",
                         "match": match, "alpha": [float(x) for x in match]})
    return recs


def _pred(plain_ms: dict, levelled: str = LEVEL_BASELINE) -> pl.DataFrame:
    rows = predictions(_records(), plain_ms, 4)
    return pl.DataFrame(rows, infer_schema_length=None).rename({"config": "base"}).with_columns(
        pl.lit("t").alias("target"), pl.lit(0).alias("ngl"), pl.lit(2).alias("threads"), pl.lit("").alias("setup"),
        pl.lit(levelled).alias("levelled"),
        *[pl.lit(None, pl.Float64).alias(c) for c in ("timed_speedup", "timed_speedup_lo", "timed_speedup_hi")])


def _answers(pred: pl.DataFrame, timed: pl.DataFrame | None = None) -> list[dict]:
    data = {"replay": pred, "replay_verdicts": predicted_verdicts(pred)}
    if timed is not None:
        data["verdicts"] = timed
    return answers(data, {"instances": [INSTANCE], "params": {"n_ctx": 2048}})


def test_the_replays_own_costs_allow_no_gain_at_these_prices():
    """Levelled to its own decode, the replay predicts what the costs allow: every gamma loses."""
    v = predicted_verdicts(_pred({}))
    assert set(v["verdict"]) == {PLAIN}
    assert all(x["speedup"] < 0.9 for x in v.iter_rows(named=True))


def test_a_halved_pace_from_a_busy_baseline_gives_no_speculate():
    """A baseline slowed to half its pace in one category would level the replay into a 'speculate' there: it is
    beyond the bound without the busy flag, and levelled to the replay's own costs with it."""
    halved = {(B, "code"): 2 * T1, (B, "creative"): T1}
    naive = {r["category"]: r for r in predicted_verdicts(_pred(halved)).iter_rows(named=True)}
    assert naive["code"]["verdict"] == BEYOND and "beyond the" in naive["code"]["why"]
    assert naive["creative"]["verdict"] == PLAIN
    # the run's levelling: the baseline is busy, the replay clean -> the replay's own decode, and said so
    levels = replay_levels([B], pl.DataFrame({"config": [B], "busy": [True]}),
                           {f"replay/{B}": {"shares": [0.0] * 20, "threshold": 0.05}})
    assert levels == {B: LEVEL_REPLAY}
    got = _answers(_pred({}, levels[B]))
    assert all(a["verdict"] != SPECULATE for a in got)
    assert all("as its plain baseline ran on a busy machine" in sentence(a) for a in got)
    # the replay itself busy: no verdict at all, with the reason on the answer's line
    levels = replay_levels([B], None, {f"replay/{B}": {"shares": [0.5] * 20, "threshold": 0.05}})
    got = _answers(_pred(halved, levels[B]))
    assert [a["verdict"] for a in got] == [BUSY, BUSY]
    assert all("no verdict" in sentence(a) and "replay ran while other processes" in sentence(a) and
               a["server"] is None for a in got)


def test_the_answer_line_says_why_a_prediction_beyond_its_bound_is_no_verdict():
    got = _answers(_pred({(B, "code"): 2 * T1, (B, "creative"): 2 * T1}))
    assert [a["verdict"] for a in got] == [BEYOND, BEYOND]
    line = sentence(got[0])
    assert line.startswith("code, greedy: **no verdict**") and "beyond the 0.96x its own measured costs allow" in line
    assert got[0]["server"] is None


def _fast_pred() -> pl.DataFrame:
    """Cheap verification (a 2-row block at 1.05x one decode): the draft speculates, well inside its bound."""
    recs = _records()
    recs[0] = recs[0] | {"target_ms_by_context": [[T1, 10.5, 11.0, 11.5, 12.0]], "draft_ms_by_context": [[1.0, 2.0]]}
    rows = predictions(recs, {}, 4)
    return pl.DataFrame(rows, infer_schema_length=None).rename({"config": "base"}).with_columns(
        pl.lit("t").alias("target"), pl.lit(0).alias("ngl"), pl.lit(2).alias("threads"), pl.lit("").alias("setup"),
        pl.lit(LEVEL_BASELINE).alias("levelled"))


def _timed(pred: pl.DataFrame, x: float, lo: float, hi: float) -> pl.DataFrame:
    return pred.with_columns(pl.lit(x).alias("timed_speedup"), pl.lit(lo).alias("timed_speedup_lo"),
                             pl.lit(hi).alias("timed_speedup_hi"))


def test_a_confirmed_speculate_says_what_it_rests_on_and_gives_the_command():
    got = _answers(_timed(_fast_pred(), 1.5, 1.3, 1.7))
    assert [a["verdict"] for a in got] == [SPECULATE, SPECULATE]
    line = sentence(got[0])
    assert "predicted from every prompt; timed check: confirmed: 1.50x [1.30, 1.70]" in line
    assert got[0]["server"] and "llama-server" in got[0]["server"]


def test_a_contradicted_prediction_is_no_answer_and_carries_no_command():
    pred = _timed(_fast_pred(), 0.60, 0.52, 0.69)
    got = _answers(pred)  # no timed verdict: inconclusive
    assert [a["verdict"] for a in got] == [INCONCLUSIVE, INCONCLUSIVE]
    line = sentence(got[0])
    assert "**inconclusive**: predicted speculate" in line and "its timed run contradicted it (0.60x [0.52, 0.69])" \
        in line
    assert all(a["server"] is None and a["speculative_simple"] is None for a in got)
    # a settled timed verdict decides instead
    timed = pl.DataFrame([{"target": "t", "policy": "greedy", "ngl": 0, "threads": 2, "setup": "", "category": c,
                           "verdict": PLAIN, "speedup": 0.6, "lo": 0.52, "hi": 0.69, "at_most": None,
                           "further": None, "min_gain": 0.05, "why": "", "config": B, "draft": "d",
                           "draft_label": "d", "gamma_label": "1", "prompts": 3} for c in CATS])
    got = _answers(pred, timed)
    assert [a["verdict"] for a in got] == [PLAIN, PLAIN]
    assert all(a["source"] == "timed on 3 prompt(s)" and "the timed run decides" in a["check"] for a in got)
    assert all(a["server"] is None for a in got)


def test_the_first_screen_gives_llama_servers_command_and_how_to_run_it_the_others():
    from harness.report.answer import how_to_run, section
    a = {"target": "t", "ngl": 0, "threads": 0, "setup": "", "category": "code", "policy": "greedy",
         "verdict": "speculate", "speedup": 1.5, "lo": 1.3, "hi": 1.7, "min_gain": 0.05, "levelled": None,
         "configuration": "d γ 3", "source": "timed on 3 prompt(s)", "check": "", "note": "A note.",
         "server": "llama-server -m t", "speculative_simple": "llama-speculative-simple -m t", "python": None,
         "exact_speedup": None}
    first, how = section([a]), how_to_run([a])
    assert "  llama-server -m t" in first and "  A note." in first
    assert not any("llama-speculative-simple" in x for x in first)
    assert how[0] == "## How to run it" and "  llama-speculative-simple -m t" in how and "  A note." not in how
    assert how_to_run([a | {"speculative_simple": None}]) == []


def test_an_adaptive_best_runs_the_best_fixed_gamma_in_llama_cpp():
    """llama.cpp has no adaptive draft length: the answer keeps the adaptive figure, but its commands (and the
    crosscheck's instance) run the best fixed gamma of the same draft, named with its own prediction."""
    import polars as pl

    from harness.analysis.verdict import SPECULATE
    from harness.instance import Instance
    from harness.report.answer import answers
    from harness.sampling import Policy
    base = Instance("tgt", parse_draft("none"), 0, Policy(), 0, 0, 0)
    row = {"target": "tgt", "ngl": 0, "threads": 0, "setup": "", "category": "code", "policy": "greedy",
           "verdict": SPECULATE, "speedup": 1.6, "lo": 1.3, "hi": 2.0, "at_most": None, "further": None,
           "min_gain": 0.05, "base": base.id, "draft": "dft", "gamma": 8, "adaptive": True, "verify": None,
           "proposer": "dft"}
    pred = pl.DataFrame([{"base": base.id, "category": "code", "draft": "dft", "gamma": g, "adaptive": a,
                          "verify": None, "speedup": s, "speedup_lo": s - 0.2, "speedup_hi": s + 0.2}
                         for g, a, s in ((8, True, 1.6), (3, False, 1.5), (8, False, 1.1), (1, False, 1.2))])
    (a,) = answers({"replay_verdicts": pl.DataFrame([row]), "replay": pred},
                   {"instances": [base.to_dict()], "params": {}})
    assert a["configuration"] == "dft γ auto<=8" and a["speedup"] == 1.6
    assert a["instance"].gamma == 3 and not a["instance"].adaptive
    assert "--spec-draft-n-max 3" in a["server"]
    assert "best fixed gamma, 3 (1.50x [1.30, 1.70] predicted)" in a["note"]


def test_a_timed_run_without_a_replay_gets_a_bottom_line_over_every_category():
    """A committed timed run of 4 categories: its bottom line pools them (category "all"), one per policy, on
    every prompt its categories ran, with the baseline's pace and the paired twins' beside it."""
    from pathlib import Path

    from harness.report.tables import compute
    from harness.rundir import read_plan
    run = Path(__file__).resolve().parent.parent / "reports" / "runs" / "20261202-054828-vm"
    data, plan = compute(run), read_plan(run)
    bottom, per_category = answers(data, plan, pooled=True), answers(data, plan)
    assert {a["category"] for a in bottom} == {"all"}
    assert sorted(a["policy"] for a in bottom) == sorted({a["policy"] for a in per_category})
    for b in bottom:
        mine = [a for a in per_category if a["policy"] == b["policy"]]
        assert b["prompts"] == sum(a["prompts"] for a in mine) and b["source"].startswith("timed")
        assert b["plain_tokens_per_s"] > 0 and b["twin_tokens_per_s"] > 0 and b["engine"] == "harness"
